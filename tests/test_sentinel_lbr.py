"""Branch records (LBR) of `meridian sentinel --lbr` (issue 25): the key perf.lbr and
the flag, the probe that refuses them in one line where the CPU has no LBR (this
project's VMs), the events opened with a branch stack, the mock's synthetic branch
stacks, each batch carrying the records of its own samples through the skew
adjuster, and the whole path to ms_raw_samples.lbr_from / lbr_to without a PMU."""

from __future__ import annotations

import argparse
import errno
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from children import meridian, wait_until
from test_cli import one_line_exit_2

from meridian.cli import main
from meridian.errors import MeridianError, NoLBR, NotSupported, PermissionProblem, UsageError
from meridian.tools.sentinel.config.load import SentinelConfig, dump_config, merge_args
from meridian.tools.sentinel.config.load import parse_config as parse
from meridian.tools.sentinel.pipeline.branches import BranchJoin, member
from meridian.tools.sentinel.sources import lbr as lbr_mod
from meridian.tools.sentinel.sources.lbr import (
    LBR_BRANCH_STACK,
    LBR_OFF,
    LBR_SNAPSHOT,
    MODES,
    probe_lbr,
    require_lbr,
)
from meridian.tools.sentinel.sources.mock import FUNC_SIZE, FUNCTIONS, MockSource
from meridian.tools.sentinel.sources.mock_branches import (
    CALL_BYTES,
    LOOP_FROM,
    LOOP_TO,
    branch_stacks,
)
from meridian.tools.sentinel.sources.pmu_events import LOGICAL

Array = np.ndarray[Any, Any]
BRANCH_TYPE_AT, SAMPLE_TYPE_AT = 72, 24  # struct perf_event_attr offsets
SAMPLE_BRANCH_STACK = 1 << 11


AGENT = [sys.executable, "-m", "meridian", "sentinel", "--perf-mock", "--json"]
AGENT += ["--prometheus", "127.0.0.1:0"]


def sentinel(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return meridian("sentinel", *args, timeout=timeout)


# ---- perf.lbr and --lbr ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", "off"),
        ("perf:\n  lbr: off\n", "off"),  # YAML's off is false
        ("perf:\n  lbr: false\n", "off"),
        ("perf:\n  lbr: on\n", "branch-stack"),  # on: the sample's own records
        ("perf:\n  lbr: true\n", "branch-stack"),
        ("perf:\n  lbr: branch-stack\n", "branch-stack"),
        ("perf:\n  lbr: snapshot\n", "snapshot"),
    ],
)
def test_the_key(text: str, want: str) -> None:
    assert parse(text).perf.lbr == want
    assert set(MODES) == {"off", "branch-stack", "snapshot"}  # the key's names, the kernel's


@pytest.mark.parametrize("value", ["fast", "3", "[on]"])
def test_a_bad_value_is_one_line(value: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse(f"perf:\n  lbr: {value}\n", "config x.yaml")
    msg = str(exc.value)
    assert msg.startswith("config x.yaml: perf.lbr: ") and "\n" not in msg
    assert "off, branch-stack or snapshot" in msg or "expected" in msg


def flags(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**given)


def test_the_flag_over_the_file() -> None:
    snap = parse("perf:\n  lbr: snapshot\n")
    assert merge_args(snap, flags()).perf.lbr == "snapshot"  # not given: the file's
    assert merge_args(snap, flags(lbr="on")).perf.lbr == "branch-stack"  # a bare --lbr
    assert merge_args(SentinelConfig(), flags(lbr="snapshot")).perf.lbr == "snapshot"
    assert merge_args(snap, flags(lbr="off")).perf.lbr == "off"
    with pytest.raises(UsageError, match=r"^--lbr: must be off, branch-stack or snapshot"):
        merge_args(SentinelConfig(), flags(lbr="sometimes"))


def test_dump_reads_back() -> None:
    cfg = SentinelConfig()
    cfg.perf.lbr = "snapshot"
    assert parse(dump_config(cfg)) == cfg
    cfg.perf.lbr = True  # type: ignore[assignment]  # as YAML's on
    assert cfg.perf.lbr == "branch-stack"


def printed_lbr(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, p.stderr
    value = yaml.safe_load(p.stdout)["perf"]["lbr"]
    assert isinstance(value, str)
    return value


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`meridian sentinel ARGS` through the same main() in this process: the flags and
    the printed configuration without a Python start-up (0.7 s) for each."""
    capsys.readouterr()
    code = main(["sentinel", *args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["meridian", "sentinel", *args], code, out, err)


def test_print_config_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert printed_lbr(sentinel("--print-config")) == "off"  # as a person runs it

    def printed(*args: str) -> subprocess.CompletedProcess[str]:
        return in_process(capsys, *args)

    bare = printed("--lbr", "--print-config")  # a bare --lbr before another flag
    assert printed_lbr(bare) == "branch-stack"
    assert "branch records (LBR)" in bare.stdout  # the key's description
    assert printed_lbr(printed("--print-config", "--lbr")) == "branch-stack"
    assert printed_lbr(printed("--print-config", "--lbr", "snapshot")) == "snapshot"
    assert printed_lbr(printed("--print-config", "--lbr=off")) == "off"
    cfg = tmp_path / "s.yaml"
    cfg.write_text(printed("--print-config", "--lbr=snapshot").stdout)
    assert printed_lbr(printed("--config", str(cfg), "--print-config")) == "snapshot"
    cfg.write_text("perf:\n  lbr: on\n")
    assert printed_lbr(printed("--config", str(cfg), "--print-config")) == "branch-stack"


def test_help_names_it() -> None:
    p = sentinel("--help")
    assert p.returncode == 0 and "--lbr [MODE]" in p.stdout


def test_a_bad_flag_value() -> None:
    p = sentinel("--perf-mock", "--duration", "1", "--lbr", "fast")
    one_line_exit_2(p, "--lbr: must be off, branch-stack or snapshot, got 'fast'")


# ---- the probe and the refusal ---------------------------------------------------------


class FakeOpen:
    """perf_event_open's seam: returns `result` (an fd, or -errno) and keeps the calls."""

    def __init__(self, result: int) -> None:
        self.result = result
        self.calls: list[tuple[bytes, int, int]] = []

    def __call__(self, attr: bytes, pid: int, cpu: int, group: int, flags: int) -> int:
        self.calls.append((attr, pid, cpu))
        return self.result


@pytest.mark.parametrize(
    ("err", "said"),
    [
        (errno.ENOENT, "ENOENT: no hardware PMU here"),
        (errno.EOPNOTSUPP, "EOPNOTSUPP: the PMU records no branches (no LBR)"),
        (errno.EINVAL, "EINVAL: the PMU takes no branch stack"),
    ],
)
def test_the_probe_says_why(err: int, said: str) -> None:
    fake = FakeOpen(-err)
    why = probe_lbr(fake, cpu=1)
    assert why is not None and said in why
    assert why.startswith("perf_event_open of cycles with branch_sample_type failed with ")
    ((attr, pid, cpu),) = fake.calls  # once, CPU-wide on one CPU
    assert (pid, cpu) == (-1, 1)
    (branches,) = struct.unpack_from("<Q", attr, BRANCH_TYPE_AT)
    (sample_type,) = struct.unpack_from("<Q", attr, SAMPLE_TYPE_AT)
    assert branches and sample_type & SAMPLE_BRANCH_STACK
    assert attr == LOGICAL["cycles"].attr(freq=1, lbr=True)  # as the events are opened


def test_the_probe_passes_and_closes() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    assert probe_lbr(FakeOpen(fd), cpu=0) is None
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


def test_the_probe_without_the_right() -> None:
    with pytest.raises(PermissionProblem, match="needs root"):
        probe_lbr(FakeOpen(-errno.EACCES), cpu=0)


def test_require_lbr(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def problem() -> str:
        asked.append(1)
        return "perf_event_open ... failed with ENOENT: no hardware PMU here"

    monkeypatch.setattr(lbr_mod, "lbr_problem", problem)
    require_lbr("off")  # nothing asked
    assert asked == []
    with pytest.raises(NoLBR) as exc:
        require_lbr("snapshot")
    msg = str(exc.value)
    assert exc.value.exit_code == 2 and "\n" not in msg
    assert msg.startswith("--lbr snapshot: this host records no branches (perf_event_open")
    assert msg.endswith("or drop --lbr (perf.lbr: off)") and "bare metal" in msg
    monkeypatch.setattr(lbr_mod, "lbr_problem", lambda: None)
    require_lbr("branch-stack")  # an LBR: nothing said


def why_no_lbr() -> str:
    """Why this host records no branches; skips where it does (or cannot be asked)."""
    try:
        why = probe_lbr()
    except MeridianError as exc:
        pytest.skip(f"the LBR probe cannot run here: {exc}")
    if why is None:
        pytest.skip("this CPU records branches (LBR): --lbr is not refused here")
    return why


@pytest.mark.parametrize("how", [["--lbr"], ["--lbr", "snapshot"], ["--config", "FILE"]])
def test_refused_where_the_cpu_has_no_lbr(tmp_path: Path, how: list[str]) -> None:
    """This project's VMs: no PMU, so no LBR. Refused at start, before anything loads:
    one line saying why and what to do, exit 2."""
    why = why_no_lbr()
    if how[0] == "--config":
        (tmp_path / "s.yaml").write_text("perf:\n  lbr: on\n")
        how = ["--config", str(tmp_path / "s.yaml")]
    p = sentinel(*how, "--duration", "1")
    one_line_exit_2(p, why)
    mode = "snapshot" if "snapshot" in how else "branch-stack"
    assert p.stderr.startswith(f"meridian sentinel: error: --lbr {mode}: this host records no")
    assert "bare metal" in p.stderr and "drop --lbr" in p.stderr
    assert p.stdout == ""


def test_the_kernel_source_refuses_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from meridian.tools.sentinel.sources.kernel import KernelSource

    monkeypatch.setattr(lbr_mod, "lbr_problem", lambda: "no hardware PMU here")
    with pytest.raises(NoLBR, match=r"^--lbr snapshot: .*no hardware PMU here"):
        KernelSource(lbr=LBR_SNAPSHOT)
    with pytest.raises(ValueError, match="lbr 7"):
        KernelSource(lbr=7)


def branch_type(attr: bytes) -> int:
    (value,) = struct.unpack_from("<Q", attr, BRANCH_TYPE_AT)
    return int(value)


@pytest.mark.parametrize(
    ("mode", "branches"),
    [(LBR_OFF, False), (LBR_BRANCH_STACK, True), (LBR_SNAPSHOT, True)],
)
def test_events_opened_with_a_branch_stack(
    monkeypatch: pytest.MonkeyPatch, mode: int, branches: bool
) -> None:
    """Both modes open the hardware events with a branch stack (the snapshot needs the
    LBR recording too); software events never. An event that takes none is sampled
    without, said once."""
    from meridian.tools.sentinel.sources import kernel, perf_open

    opened: list[bytes] = []

    def fake_open(attr: bytes, pid: int = -1, cpus: list[int] | None = None) -> list[int]:
        opened.append(attr)
        config = struct.unpack_from("<Q", attr, 8)[0]
        if branch_type(attr) and config == LOGICAL["llc-misses"].config:
            raise NotSupported("hardware perf events", "perf_event_open refused (EOPNOTSUPP)")
        return [100 + len(opened)]

    monkeypatch.setattr(lbr_mod, "lbr_problem", lambda: None)
    monkeypatch.setattr(perf_open, "open_attr_per_cpu", fake_open)
    said: list[str] = []
    src = kernel.KernelSource(lbr=mode, warn=said.append)
    for name in ("cycles", "cpu-clock"):
        opened.clear()
        fds, used = src._perf.open(LOGICAL[name], cpus=[0])
        assert used is LOGICAL[name] and len(fds) == 1
        assert [bool(branch_type(a)) for a in opened] == [branches and name == "cycles"]
    for _ in range(2):
        opened.clear()
        fds, used = src._perf.open(LOGICAL["llc-misses"], cpus=[0])
        assert used is LOGICAL["llc-misses"]  # still sampled, not the cpu-clock fallback
        assert [bool(branch_type(a)) for a in opened] == ([True, False] if branches else [False])
    assert len(said) == (1 if branches else 0)  # said once
    if branches:
        assert said[0].startswith("llc-misses takes no branch stack (") and "without" in said[0]


@pytest.mark.kernel
@pytest.mark.parametrize("mode", [LBR_BRANCH_STACK, LBR_SNAPSHOT])
def test_both_modes_load_and_sample(monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    """The program with lbr_mode on passes the verifier and samples; its branch ring
    is sized for the samples' rate. Past the probe (patched: this VM has no LBR), a
    software event has no branch stack: each record has its sample, none here."""
    from meridian.tools.sentinel.sources.kernel import LBR_RING_RATIO, KernelSource

    no_lbr = probe_lbr() is not None
    monkeypatch.setattr(lbr_mod, "lbr_problem", lambda: None)
    with KernelSource([LOGICAL["cpu-clock"]], frequency=999, lbr=mode) as src:
        assert src.obj is not None
        assert src.obj.maps["ms_lbr_events"].max_entries == src.ring_bytes * LBR_RING_RATIO
        samples: list[Array] = []
        records: list[Array] = []

        def polled() -> bool:
            s, r = src.poll(0)
            samples.append(s)
            records.append(r)
            return sum(len(x) for x in samples) > 50

        wait_until(polled, 10, "samples")
    got, lbr = np.concatenate(samples), np.concatenate(records)
    # (with an LBR, a snapshot may find what another user of it recorded)
    assert member(lbr, got).all() and len(lbr) == int((got["lbr_nr"] > 0).sum())
    if no_lbr:
        assert len(lbr) == 0


# ---- the mock's branch stacks ------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.ns = 1_000 * 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def sleep(self, s: float) -> None:
        self.ns += int(s * 1e9)


def polls(src: MockSource, t: FakeTime, n: int = 20) -> list[tuple[Array, Array]]:
    out = []
    for _ in range(n):
        t.ns += 25_000_000
        out.append(src.poll(0))
    return out


def test_mock_records_join_their_samples() -> None:
    t = FakeTime()
    src = MockSource(25, 1, t, sleep=t.sleep, rate=20_000, lbr=True)
    total = 0
    for samples, lbr in polls(src, t):
        total += len(samples)
        # one record per sample, in its order, its count in lbr_nr
        assert len(lbr) == len(samples)
        assert (lbr["cpu"] == samples["cpu"]).all() and (lbr["time_ns"] == samples["time_ns"]).all()
        assert (samples["lbr_nr"] == lbr["nr"]).all() and (lbr["nr"] >= 1).all()
        col = np.arange(lbr["entries"].shape[1])
        unused = col[None, :] >= lbr["nr"][:, None]
        assert (lbr["entries"]["from"][unused] == 0).all()
        assert (lbr["entries"]["from"][~unused] != 0).all()
        keys = set(zip(samples["cpu"].tolist(), samples["time_ns"].tolist(), strict=True))
        assert len(keys) == len(samples)  # (cpu, time_ns) is a key, as in the kernel
    assert total > 5000
    off = MockSource(25, 1, t, sleep=t.sleep, rate=20_000)
    for samples, lbr in polls(off, t, 3):
        assert len(lbr) == 0 and len(samples) and (samples["lbr_nr"] == 0).all()


def test_mock_records_only_for_samples_kept() -> None:
    """The kernel takes a sample's branches after its token: dropped samples have none."""
    t = FakeTime()
    src = MockSource(25, 2, t, sleep=t.sleep, rate=20_000, cpus=2, lbr=True)
    src.set_budget(100, 0)
    seen = 0
    for samples, lbr in polls(src, t):
        assert member(lbr, samples).all() and len(lbr) == len(samples)
        seen += len(samples)
    assert src.dropped()["token_bucket"] > 0 and seen > 0


def region_of(src: MockSource) -> Any:
    regions = src.symbols()

    def region(pid: int, ip: int) -> tuple[int, str]:
        return next((lo, n) for p, lo, hi, n in regions if p == pid and lo <= ip < hi)

    return region


def test_mock_branches_walk_the_sample_stack() -> None:
    """Loop back-edges in the sample's function, then the calls that led to it: from
    each caller's frame in the sample's stack (less a call's bytes) to its callee."""
    t = FakeTime()
    src = MockSource(25, 3, t, sleep=t.sleep, rate=5000, lbr=True)
    region = region_of(src)
    callers = {name: c for name, c, _ in FUNCTIONS}
    checked = 0
    for samples, lbr in polls(src, t, 4):
        for s, r in zip(samples[:100], lbr[:100], strict=False):
            pid, ip = int(s["pid"]), int(s["ip"])
            frames = src.stack_ips(int(s["user_stack_id"]))
            start, name = region(pid, ip)
            nr = int(r["nr"])
            frm = r["entries"]["from"][:nr].tolist()
            to = r["entries"]["to"][:nr].tolist()
            loops = nr - (len(frames) - 1)
            assert 1 <= loops <= 6
            assert frm[:loops] == [start + LOOP_FROM] * loops
            assert to[:loops] == [start + LOOP_TO] * loops
            assert frm[loops:] == [f - CALL_BYTES for f in frames[1:]]
            assert to[loops:] == [region(pid, f)[0] for f in frames[:-1]]
            assert region(pid, frames[-1])[1] == "mock_main"
            assert (callers[name] < 0) == (nr == loops)
            checked += 1
    assert checked > 100
    assert FUNC_SIZE > LOOP_FROM  # every address in the function's region


def test_branch_stacks_outside_the_mock_functions() -> None:
    t = FakeTime()
    src = MockSource(25, 4, t, sleep=t.sleep, rate=2000, lbr=True)
    samples = polls(src, t, 2)[-1][0].copy()
    samples["ip"][::2] = 0x1000  # not a mock function
    samples["pid"][1::4] = 1  # not a mock process
    records = branch_stacks(samples)
    outside = np.zeros(len(samples), dtype=bool)
    outside[::2] = outside[1::4] = True
    assert (records["nr"][outside] == 0).all() and (records["nr"][~outside] > 0).all()
    assert (records["time_ns"] == samples["time_ns"]).all()


# ---- each batch with the records of its own samples -----------------------------------

REC = np.dtype([("time_ns", "<u8"), ("cpu", "<u4"), ("nr", "<u4")])
SMP = np.dtype([("time_ns", "<u8"), ("cpu", "<u4"), ("flow_id", "<u8")])


def recs(*keys: tuple[int, int]) -> Array:
    out = np.zeros(len(keys), dtype=REC)
    for i, (cpu, t) in enumerate(keys):
        out[i] = (t, cpu, 1 + i)
    return out


def smps(*keys: tuple[int, int]) -> Array:
    out = np.zeros(len(keys), dtype=SMP)
    for i, (cpu, t) in enumerate(keys):
        out[i] = (t, cpu, 0)
    return out


def keys(a: Array) -> list[tuple[int, int]]:
    return sorted(zip(a["cpu"].tolist(), a["time_ns"].tolist(), strict=True))


def test_member() -> None:
    r = recs((0, 10), (1, 10), (0, 20), (2, 5))
    s = smps((1, 10), (0, 20), (0, 11), (3, 5))
    assert member(r, s).tolist() == [False, True, True, False]
    assert member(r, s[:0]).tolist() == [False] * 4
    assert member(r[:0], s).tolist() == []


def test_join_through_the_stages() -> None:
    j = BranchJoin()
    # poll 1: three samples with records; (0, 20) waits for its packet; (1, 30) filtered;
    # the record of (0, 50) came before its sample (reserved, not yet committed)
    polled = smps((0, 10), (0, 20), (1, 30))
    j.add(recs((0, 10), (0, 20), (1, 30), (0, 50)), polled)
    out = j.take(polled[:1], waiting=polled[1:2])
    assert keys(out) == [(0, 10)]
    assert j.held == 2  # (0, 20) for its sample held; (0, 50) for its sample to come
    # poll 2: (0, 50) arrives; (0, 20) got its packet
    later = smps((0, 50))
    j.add(recs()[:0], later)
    out = j.take(np.concatenate([later, polled[1:2]]), waiting=None)
    assert keys(out) == [(0, 20), (0, 50)] and j.held == 0
    # nothing waits forever: a record older than its CPU's newest sample whose sample
    # was filtered goes
    j.add(recs((3, 7)), smps((3, 7), (3, 9)))
    assert len(j.take(smps((3, 9)))) == 0 and j.held == 0


def test_join_without_records_costs_nothing() -> None:
    j = BranchJoin()
    none = recs()[:0]
    j.add(none, smps((0, 1), (1, 2)))
    out = j.take(smps((0, 1)), smps((1, 2)))
    assert len(out) == 0 and out.dtype == REC and j.held == 0
    assert len(j._newest) == 0  # no times kept without records


class Batches:
    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.lock = threading.Lock()

    def on_samples(self, batch: Any) -> None:
        with self.lock:
            self.batches.append(batch)

    def on_window(self, window: Any) -> None:
        pass

    def close(self) -> None:
        pass


def lbr_config() -> SentinelConfig:
    cfg = SentinelConfig()
    cfg.metrics.enabled = cfg.anomaly.enabled = cfg.mode.auto = False
    cfg.aggregator.flush_interval = 0.2
    cfg.mock.enabled = True
    cfg.perf.lbr = "branch-stack"
    return cfg


def test_runtime_batches_carry_their_own_records() -> None:
    """Through the consumer: a flow-0 sample the skew adjuster holds for its packet
    goes on with the next poll's batch, and its branch record with it."""
    from meridian.tools.sentinel.agent.run import Runtime
    from meridian.tools.sentinel.sources.mock import JIT_BASE, PIDS, make_samples

    at = time.monotonic_ns() + 60 * 10**9  # ahead of the runtime's clock: nothing expires
    ip = JIT_BASE + 2 * FUNC_SIZE + 0x20  # in mock_tcp_recv
    first = make_samples(2, cpu=[0, 1], time_ns=[at, at], flow_id=[0, 5], pid=PIDS[0], ip=ip)
    # CPU 0's time passes the first sample's window: it goes on, as flow 0
    second = make_samples(1, cpu=0, time_ns=at + 10**6, flow_id=5, pid=PIDS[0], ip=ip)
    src = MockSource.from_samples([first, second])
    src.lbr = True
    rec = Batches()
    rt = Runtime(lbr_config(), src, observers=[rec], log=lambda line: None)
    rt.start()
    try:
        wait_until(lambda: sum(len(b.samples) for b in rec.batches) >= 3, 20, "3 samples")
    finally:
        rt.stop()
    got = [(keys(b.samples), keys(b.lbr)) for b in rec.batches]
    assert got == [([(1, at)], [(1, at)]), ([(0, at), (0, at + 10**6)],) * 2], got
    for b in rec.batches:
        want = branch_stacks(b.samples)
        order = np.lexsort((b.lbr["time_ns"], b.lbr["cpu"]))
        assert (
            b.lbr["entries"][order].tobytes()
            == want["entries"][np.lexsort((want["time_ns"], want["cpu"]))].tobytes()
        )


def test_runtime_with_generated_samples() -> None:
    from meridian.tools.sentinel.agent.run import Runtime

    src = MockSource(period_ms=10, rng_seed=5, rate=4000, lbr=True)
    rec = Batches()
    rt = Runtime(lbr_config(), src, observers=[rec], log=lambda line: None)
    rt.start()
    try:
        wait_until(lambda: sum(len(b.samples) for b in rec.batches) > 2000, 20, "samples")
    finally:
        rt.stop()
    for b in rec.batches:
        assert len(b.lbr) == len(b.samples) and member(b.lbr, b.samples).all()


# ---- the whole path to the store -----------------------------------------------------------


def test_mock_lbr_stored_in_raw_samples(tmp_path: Path) -> None:
    """`meridian sentinel --perf-mock --lbr --raw-samples --data-dir DIR`: every raw
    sample stored has the branch stack the mock generated for it."""
    pytest.importorskip("chdb", reason="chDB is not installed (the clickhouse extra)")
    from meridian.tools.sentinel.storage import ChdbBackend

    store = tmp_path / "store"
    p = subprocess.run(
        [*AGENT, "--lbr", "--raw-samples", "--data-dir", str(store), "--duration", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.splitlines()[-1])
    db = ChdbBackend(store)
    db.open()
    try:
        rows = db.query(
            "SELECT cpu, ktime_ns, pid, ip, flow_source, lbr_from, lbr_to FROM ms_raw_samples"
        )
    finally:
        db.close()
    assert len(rows) == summary["samples"] > 500
    samples = np.zeros(len(rows), dtype=[(k, "<u8") for k in ("time_ns", "cpu", "pid", "ip")])
    for name, key in (("time_ns", "ktime_ns"), ("cpu", "cpu"), ("pid", "pid"), ("ip", "ip")):
        samples[name] = [int(r[key]) for r in rows]
    want = branch_stacks(samples)
    for r, w in zip(rows, want, strict=True):
        nr = int(w["nr"])
        assert nr > 0 and r["lbr_from"] and len(r["lbr_from"]) == len(r["lbr_to"]) == nr
        assert [int(x) for x in r["lbr_from"]] == w["entries"]["from"][:nr].tolist()
        assert [int(x) for x in r["lbr_to"]] == w["entries"]["to"][:nr].tolist()
    assert any(int(r["flow_source"]) == 1 for r in rows)  # held by the skew adjuster too
