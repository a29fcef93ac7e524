"""The anomaly monitor over a fixture /proc tree and an injected clock: a sequence of
/proc/net/dev snapshots gives an exact trigger."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sentinel_modes import Clock

from meridian.errors import UsageError
from meridian.tools.sentinel.config.load import SentinelConfig
from meridian.tools.sentinel.pipeline.anomaly import (
    AnomalyGauges,
    AnomalyMonitor,
    AnomalySignal,
    Ewma,
    read_net_dev,
)

SEC = 1_000_000_000
HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
)


def net_dev(root: Path, counters: dict[str, tuple[int, int]]) -> None:
    """Write /proc/net/dev as the kernel does: name, 8 receive and 8 transmit columns."""
    (root / "net").mkdir(exist_ok=True)
    lines = [
        f"{name:>6}: {rx:>8} 10 0 0 0 0 0 0 {tx:>8} 10 0 0 0 0 0 0\n"
        for name, (rx, tx) in counters.items()
    ]
    (root / "net" / "dev").write_text(HEADER + "".join(lines))


def config(**anomaly: object) -> SentinelConfig:
    cfg = SentinelConfig()
    cfg.anomaly.throughput_ewma_alpha = 0.5
    cfg.anomaly.latency_ewma_alpha = 0.5
    for k, v in anomaly.items():
        setattr(cfg.anomaly, k, v)
    return cfg


def feed(
    mon: AnomalyMonitor, root: Path, clock: Clock, rx: list[int], name: str = "eth0"
) -> list[list[AnomalySignal]]:
    out = []
    for i, b in enumerate(rx, start=1):
        net_dev(root, {"lo": (5, 5), name: (b, 0)})
        clock.now = i * SEC
        out.append(mon.poll())
    return out


def test_read_net_dev(tmp_path: Path) -> None:
    net_dev(tmp_path, {"lo": (1, 2), "eth0": (300, 400), "veth-a1": (5, 6)})
    assert read_net_dev(str(tmp_path)) == {"lo": (1, 2), "eth0": (300, 400), "veth-a1": (5, 6)}


def test_ewma() -> None:
    e = Ewma(0.25)
    assert [e.update(x) for x in (8.0, 4.0, 0.0)] == [None, 8.0, 7.0]
    assert e.value == 5.25


def test_a_throughput_drop_triggers_once(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"lo": (5, 5), "eth0": (0, 0)})
    mon = AnomalyMonitor(config(interfaces=["eth0"]), str(tmp_path), clock)
    # 8 Mbit/s for three seconds, then 2.4 Mbit/s (0.3 of the baseline), then 8 again
    got = feed(mon, tmp_path, clock, [1_000_000, 2_000_000, 3_000_000, 3_300_000, 4_300_000])
    assert [len(s) for s in got] == [0, 0, 0, 1, 0]
    (sig,) = got[3]
    assert (sig.kind, sig.subject, sig.time_ns) == ("throughput_drop", "eth0", 4 * SEC)
    assert sig.value == pytest.approx(2.4e6)
    assert sig.baseline == pytest.approx(8e6)
    assert sig.ratio == pytest.approx(0.3)
    assert str(sig) == ("throughput of eth0 fell to 0.30 of its baseline (2.400 vs 8.000 Mbit/s)")
    g = mon.gauges()
    assert g.throughput_bps == {"eth0": pytest.approx(8e6)}
    # the drop joined the baseline: 0.5 x 2.4 + 0.5 x 8 = 5.2 Mbit/s
    assert g.throughput_ratio == {"eth0": pytest.approx(8 / 5.2)}
    assert g.latency_ratio is None and g.latency_us is None


def test_a_ratio_at_the_trigger_does_not_fire(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(interfaces=["eth0"]), str(tmp_path), clock)
    got = feed(mon, tmp_path, clock, [1_000_000, 1_500_000, 1_749_999])
    # 4 Mbit/s is exactly 0.5 of 8: no trigger; then 2 Mbit/s is 0.33 of 6: one
    assert [len(s) for s in got] == [0, 0, 1]


def test_an_idle_link_has_nothing_to_lose(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(interfaces=["eth0"]), str(tmp_path), clock)
    # 80 kbit/s then nothing: below throughput_min_bps (1 Mbit/s)
    assert feed(mon, tmp_path, clock, [10_000, 20_000, 20_000]) == [[], [], []]
    assert mon.gauges().throughput_ratio == {"eth0": 0.0}


def test_a_counter_reset_restarts_the_baseline(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(interfaces=["eth0"]), str(tmp_path), clock)
    got = feed(mon, tmp_path, clock, [1_000_000, 2_000_000, 100, 200, 1_000_200])
    assert got == [[], [], [], [], []]  # 100 B after a reset is no drop: no baseline yet
    assert mon.gauges().throughput_ratio == {"eth0": pytest.approx(8e6 / 800)}


def test_unknown_interfaces_are_named(tmp_path: Path) -> None:
    net_dev(tmp_path, {"lo": (0, 0), "eth0": (0, 0)})
    with pytest.raises(UsageError) as exc:
        AnomalyMonitor(config(interfaces=["eth0", "eth9", "wlan0"]), str(tmp_path), Clock())
    assert str(exc.value) == (
        "--interface / anomaly.interfaces: no interfaces 'eth9', 'wlan0' on this host "
        "(it has: eth0, lo)"
    )


def test_no_interfaces_watches_all_but_lo(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"lo": (0, 0), "eth0": (0, 0)})
    mon = AnomalyMonitor(config(throughput_direction="both"), str(tmp_path), clock)
    clock.now = SEC
    net_dev(tmp_path, {"lo": (10**9, 0), "eth0": (500, 500), "veth0": (7, 7)})
    assert mon.poll() == []
    g = mon.gauges()
    assert g.throughput_bps == {"eth0": 8000.0}  # veth0 appeared: its first reading
    clock.now = 2 * SEC
    net_dev(tmp_path, {"lo": (10**9, 0), "veth0": (1007, 7)})
    mon.poll()
    assert mon.gauges().throughput_bps == {"veth0": 8000.0}  # eth0 went away


def test_transmit_direction(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(throughput_direction="tx"), str(tmp_path), clock)
    clock.now = SEC // 2
    net_dev(tmp_path, {"eth0": (999, 1000)})
    mon.poll()
    assert mon.gauges().throughput_bps == {"eth0": 16000.0}


def test_latency_spike(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0)})
    probe = tmp_path / "latency_us"
    mon = AnomalyMonitor(config(latency_probe_path=str(probe)), str(tmp_path), clock)
    kinds = []
    for i, text in enumerate(["100\n", "100", "150", "300", "bogus", "", "-3", "120"], 1):
        probe.write_text(text)
        clock.now = i * SEC
        kinds.append([(s.kind, s.value, s.baseline) for s in mon.poll()])
    # baselines: 100, 100, 125 (150 is 1.5x: no spike), then 300 is 2.4x 125: a spike
    assert kinds == [[], [], [], [("latency_spike", 300.0, 125.0)], [], [], [], []]
    assert mon.last_error is not None and "-3" in mon.last_error
    g = mon.gauges()
    assert g.latency_us == 120.0
    assert g.latency_ratio == pytest.approx(120 / 212.5)
    probe.unlink()
    clock.now = 20 * SEC
    assert mon.poll() == []
    assert mon.last_error is not None and "No such file" in mon.last_error


def test_gauges_are_a_copy(tmp_path: Path) -> None:
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(), str(tmp_path), Clock())
    g = mon.gauges()
    g.throughput_bps["x"] = 1.0
    assert mon.gauges() == AnomalyGauges()
