"""Branch records (LBR) of `meridian sentinel --lbr` (issue 25), up to the kernel source:
the key perf.lbr and the flag, the probe that refuses them in one line where the CPU has
no LBR (this project's VMs), and the events opened with a branch stack. The mock's
branch stacks and their join with the samples: test_sentinel_lbr_join.py."""

from __future__ import annotations

import argparse
import errno
import os
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from children import meridian, wait_until
from sentinel_values import Array
from test_cli import one_line_exit_2

from meridian.cli import main
from meridian.errors import MeridianError, NoLBR, NotSupported, PermissionProblem, UsageError
from meridian.tools.sentinel.config.load import SentinelConfig, dump_config, merge_args
from meridian.tools.sentinel.config.load import parse_config as parse
from meridian.tools.sentinel.pipeline.branches import member
from meridian.tools.sentinel.sources import lbr as lbr_mod
from meridian.tools.sentinel.sources.lbr import (
    LBR_BRANCH_STACK,
    LBR_OFF,
    LBR_SNAPSHOT,
    MODES,
    probe_lbr,
    require_lbr,
)
from meridian.tools.sentinel.sources.pmu_events import LOGICAL

BRANCH_TYPE_AT, SAMPLE_TYPE_AT = 72, 24  # struct perf_event_attr offsets
SAMPLE_BRANCH_STACK = 1 << 11


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
