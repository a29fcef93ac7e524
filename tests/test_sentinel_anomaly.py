"""The anomaly monitor over a fixture /proc tree and an injected clock: a sequence of
/proc/net/dev snapshots gives an exact trigger."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sentinel_modes import Clock

from meridian.errors import EnvironmentProblem, UsageError
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


def test_signals_say_what_and_by_how_much() -> None:
    drop = AnomalySignal("throughput_drop", "eth0", 2e12, 8e12, 0.25, 1)
    assert str(drop) == (
        "throughput of eth0 fell to 0.25 of its baseline (2000000.000 vs 8000000.000 Mbit/s)"
    )
    spike = AnomalySignal("latency_spike", "/run/lat", 300.0, 100.0, 3.0, 1)
    assert str(spike) == "latency from /run/lat rose to 3.00 x its baseline (300.0 vs 100.0 µs)"


def test_read_net_dev_skips_lines_it_cannot_read(tmp_path: Path) -> None:
    """A line without a colon or with too few columns is skipped, not the rest; a name
    that is not ASCII is read, its bytes replaced."""
    net_dev(tmp_path, {"eth0": (300, 400)})
    path = tmp_path / "net" / "dev"
    text = path.read_bytes()
    head, body = text[: len(HEADER)], text[len(HEADER) :]
    weird = b" \xc3\xa9th1: 1 0 0 0 0 0 0 0 2 0 0 0 0 0 0 0\n"
    path.write_bytes(head + b"bad0: 1 2 3\nno colon here\n" + weird + body)
    assert read_net_dev(str(tmp_path)) == {"\ufffd\ufffdth1": (1, 2), "eth0": (300, 400)}


def test_the_monitor_s_start(tmp_path: Path) -> None:
    """No /proc/net/dev is an environment problem naming the path; one missing interface
    is named in the singular; a host with no interface says none."""
    with pytest.raises(EnvironmentProblem, match=r"^the anomaly monitor cannot read .*/net/dev: "):
        AnomalyMonitor(config(), str(tmp_path), Clock())
    net_dev(tmp_path, {})
    with pytest.raises(UsageError) as exc:
        AnomalyMonitor(config(interfaces=["eth9"]), str(tmp_path), Clock())
    assert str(exc.value) == (
        "--interface / anomaly.interfaces: no interface 'eth9' on this host (it has: none)"
    )
    mon = AnomalyMonitor(config(poll_interval=2.5), str(tmp_path), Clock())
    assert mon.interval_s == 2.5 and mon.last_error is None


def test_named_interfaces_only_and_receive_bytes_by_default(tmp_path: Path) -> None:
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0), "veth0": (0, 0)})
    mon = AnomalyMonitor(config(interfaces=["eth0"]), str(tmp_path), clock)
    clock.now = SEC
    net_dev(tmp_path, {"eth0": (1000, 5000), "veth0": (7000, 7000)})
    mon.poll()
    g = mon.gauges()
    assert g.throughput_bps == {"eth0": 8000.0}  # rx only, and not veth0
    assert g.throughput_ratio == {"eth0": 1.0}  # the first reading is its own baseline


def test_poll_at_a_given_time_with_both_kinds_of_signal(tmp_path: Path) -> None:
    """poll(now) uses that time, not the clock's; a throughput drop and a latency spike
    in one reading are both returned."""
    clock = Clock()
    probe = tmp_path / "lat"
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(latency_probe_path=str(probe)), str(tmp_path), clock)
    for i, (rx, us) in enumerate([(10**6, "100"), (2 * 10**6, "100"), (2 * 10**6 + 1, "900")]):
        net_dev(tmp_path, {"eth0": (rx, 0)})
        probe.write_text(us)
        got = mon.poll((i + 1) * SEC)
    assert clock.now == 0
    assert got == [
        AnomalySignal("throughput_drop", "eth0", 8.0, 8e6, 1e-6, 3 * SEC),
        AnomalySignal("latency_spike", str(probe), 900.0, 100.0, 9.0, 3 * SEC),
    ]


def test_readings_that_cannot_give_a_rate(tmp_path: Path) -> None:
    """A reading at the same time as the last gives no rate (no division by zero); a
    counter reset before any baseline, or a new interface, does not stop the readings
    of the interfaces after it; a /proc/net/dev gone is said."""
    clock = Clock()
    net_dev(tmp_path, {"a0": (1000, 0), "eth0": (0, 0)})
    mon = AnomalyMonitor(config(), str(tmp_path), clock)
    assert mon.poll() == []  # time 0 again
    clock.now = SEC
    net_dev(tmp_path, {"a0": (10, 0), "a1": (5, 0), "eth0": (1000, 0)})
    assert mon.poll() == []
    assert mon.gauges().throughput_bps == {"eth0": 8000.0}
    (tmp_path / "net" / "dev").unlink()
    clock.now = 2 * SEC
    assert mon.poll() == []
    assert mon.last_error is not None and mon.last_error.startswith(f"cannot read {tmp_path}")


def test_the_drop_trigger_at_its_edges(tmp_path: Path) -> None:
    """A baseline exactly at throughput_min_bps can drop; so can a baseline of 1 bit/s
    when the minimum is 0."""
    for min_bps, rx in ((8000.0, [1000, 2000, 2000]), (0.0, [1, 2, 2])):
        clock = Clock()
        net_dev(tmp_path, {"eth0": (0, 0)})
        mon = AnomalyMonitor(
            config(interfaces=["eth0"], throughput_min_bps=min_bps), str(tmp_path), clock
        )
        step = SEC if min_bps else 8 * SEC  # 1 byte in 8 s: 1 bit/s
        signals = []
        for i, b in enumerate(rx, start=1):
            net_dev(tmp_path, {"eth0": (b, 0)})
            clock.now = i * step
            signals += mon.poll()
        assert [(s.kind, s.value, s.baseline) for s in signals] == [
            ("throughput_drop", 0.0, 8000.0 if min_bps else 1.0)
        ]


def test_an_interface_gone_and_back_starts_again(tmp_path: Path) -> None:
    """An interface that goes away is forgotten (its reading, baseline and gauges): back,
    its first reading is a new start, and a lower rate than before is no drop."""
    clock = Clock()
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(), str(tmp_path), clock)
    readings = [
        {"eth0": (10**7, 0), "new0": (0, 0)},  # 80 Mbit/s: eth0's baseline; new0 appears
        {},  # both gone (new0 had no baseline or gauges of its own to forget)
        {"eth0": (10**7, 0)},  # back: a first reading
        {"eth0": (10**7 + 1000, 0)},  # 8 kbit/s: a start, not a drop
    ]
    for i, counters in enumerate(readings, start=1):
        net_dev(tmp_path, counters)
        clock.now = i * SEC
        assert mon.poll() == []
        if i in (2, 3):  # gone; back, its first reading gives no rate yet
            assert mon.gauges() == AnomalyGauges()
    assert mon.gauges().throughput_ratio == {"eth0": 1.0}


def test_latency_readings_at_their_edges(tmp_path: Path) -> None:
    """0 µs is a latency; an empty probe is not (said so); a long bad text is cut at 40
    characters; the first reading's ratio is 1; exactly at the trigger is no spike."""
    clock = Clock()
    probe = tmp_path / "lat"
    net_dev(tmp_path, {"eth0": (0, 0)})
    mon = AnomalyMonitor(config(latency_probe_path=str(probe)), str(tmp_path), clock)
    probe.write_text("")
    assert mon.poll() == []
    assert mon.last_error == f"latency probe {probe}: not a latency in µs: ''"
    probe.write_text("-" + "1" * 60)
    mon.poll()
    assert mon.last_error == f"latency probe {probe}: not a latency in µs: {'-' + '1' * 39!r}"
    probe.write_text("0.5")
    mon.poll()
    assert (mon.gauges().latency_us, mon.gauges().latency_ratio) == (0.5, 1.0)
    probe.write_text("1.0")  # 2.0 x the baseline of 0.5: the trigger, not above it
    assert mon.poll() == []
    probe.write_text("0")
    mon.poll()
    assert mon.gauges().latency_us == 0.0
