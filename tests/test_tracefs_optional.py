"""tracefs only where a strategy needs it (issue 35): tp_btf, fentry and perf events
run in a container whose mount namespace has no tracefs; a strategy with tracepoint/
programs (or legacy kprobes) is refused there, with the fix, and the next one tried.

The kernel tests run the tools in a private mount namespace whose tracefs is
unmounted, as root (then nothing may mount it) or without CAP_SYS_ADMIN, as a
Kubernetes pod with CAP_BPF and CAP_PERFMON runs (then it cannot be mounted)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from children import patience, reap
from test_cli import one_line_exit_2

from meridian import system
from meridian.bpf import BpfObject, Strategy, features, object_path, refusals
from meridian.errors import NotSupported, TracefsMissing

FIX = "mount -t tracefs tracefs /sys/kernel/tracing, or mount the host's into the container"
MOUNT_REFUSED = "mount: /sys/kernel/tracing: permission denied"

# ---- unit: the refusal and the declarations ----------------------------------------


def test_the_refusal_is_one_line_naming_the_strategies_and_the_fix() -> None:
    one = TracefsMissing(MOUNT_REFUSED, ["tracepoint"])
    assert str(one) == (
        "strategy tracepoint needs tracefs at /sys/kernel/tracing, which is not mounted "
        f"and could not be ({MOUNT_REFUSED}): {FIX}"
    )
    many = TracefsMissing(MOUNT_REFUSED, ["kprobe", "tracepoint"], "fentry: load refused")
    assert str(many).startswith("strategies kprobe, tracepoint need tracefs at ")
    assert str(many).endswith(f"{FIX} (the others are refused: fentry: load refused)")
    bare = TracefsMissing("mount: not found")
    assert str(bare) == (
        f"tracefs is not mounted at /sys/kernel/tracing and could not be (mount: not found): {FIX}"
    )
    for exc in (one, many, bare):
        assert exc.exit_code == 2 and "\n" not in str(exc)


def test_only_tracepoints_and_legacy_kprobes_need_tracefs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pmu = tmp_path / "kprobe_type"
    monkeypatch.setattr(features, "KPROBE_PMU", pmu)
    assert features.needs_tracefs("tracepoint")
    for feature in ("tp_btf", "fentry", "perf_event", "hw_perf", "ringbuf"):
        assert not features.needs_tracefs(feature), feature
    assert features.needs_tracefs("kprobe")  # no kprobe PMU: libbpf's kprobe_events
    pmu.write_text("6\n")
    assert not features.needs_tracefs("kprobe")  # perf_event_open's kprobe PMU
    assert Strategy("x", (), ("tp_btf", "perf_event")).needs_tracefs is False
    assert Strategy("x", (), ("tp_btf", "tracepoint")).needs_tracefs is True


def _tool_strategies() -> dict[str, list[tuple[Strategy, tuple[str, ...]]]]:
    """Each tool's strategies, each with every program it loads (io's with the disk
    signals it adds)."""
    from meridian.tools import biolat, io, memlat, runqlat, sentinel, syscalls
    from meridian.tools.io.kernel import signals

    tools = {"biolat": biolat, "memlat": memlat, "runqlat": runqlat}
    tools |= {"sentinel": sentinel, "syscalls": syscalls}
    out = {name: [(s, s.programs) for s in t.STRATEGIES] for name, t in tools.items()}
    out["io"] = [(s, (*s.programs, *signals(s))) for s in io.STRATEGIES]
    return out


@pytest.mark.parametrize("tool", sorted(_tool_strategies()))
def test_each_strategy_declares_the_features_of_its_programs(tool: str) -> None:
    """A strategy needs tracefs by its declared features: every tracepoint/ or kprobe
    program it loads must be declared, or a container without tracefs would choose it
    and fail at attach (io's disk signals are tracepoints under its tracepoint
    strategy only)."""
    if not object_path(tool).exists():
        pytest.skip("BPF objects not built (make bpf)")
    kinds = {"tracepoint": "tracepoint", "tp": "tracepoint", "kprobe": "kprobe"}
    kinds |= {"kretprobe": "kprobe", "ksyscall": "kprobe", "kretsyscall": "kprobe"}
    with BpfObject(object_path(tool)) as obj:
        for s, programs in _tool_strategies()[tool]:
            sections = [obj.programs[p].section for p in programs]
            used = {kinds[sec.split("/")[0]] for sec in sections if sec.split("/")[0] in kinds}
            assert used <= set(s.needs), (tool, s.name, used)


def _fake_probes(monkeypatch: pytest.MonkeyPatch, refused: dict[str, features.Probe]) -> None:
    monkeypatch.setattr(
        features, "probe", lambda f: refused.get(f, features.Probe(f, True, "fake"))
    )


def _no_tracefs(feature: str) -> features.Probe:
    return features.Probe(
        feature, False, features.NOT_MOUNTABLE, FIX, MOUNT_REFUSED, tracefs_missing=True
    )


def test_a_strategy_refused_for_tracefs_falls_back_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = Strategy("tracepoint", (), ("tracepoint",))
    second = Strategy("tp_btf", (), ("tp_btf",))
    _fake_probes(monkeypatch, {"tracepoint": _no_tracefs("tracepoint")})
    assert features.choose([first, second]) is second
    with pytest.raises(TracefsMissing) as info:
        features.choose([first, second], "tracepoint")
    assert str(info.value) == str(TracefsMissing(MOUNT_REFUSED, ["tracepoint"]))


def test_when_only_tracefs_strategies_remain_the_error_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fentry = Strategy("fentry", (), ("fentry", "tracepoint"))
    tp_btf = Strategy("tp_btf", (), ("tp_btf", "tracepoint"))
    refused = features.Probe("fentry", False, "load refused with EPERM")
    _fake_probes(monkeypatch, {"fentry": refused, "tracepoint": _no_tracefs("tracepoint")})
    assert fentry.missing()[0] is refused  # the kernel's own refusal comes first
    with pytest.raises(TracefsMissing) as info:
        features.choose([fentry, tp_btf])
    assert str(info.value) == str(
        TracefsMissing(MOUNT_REFUSED, ["tp_btf"], "fentry: load refused with EPERM")
    )
    _fake_probes(monkeypatch, {"fentry": refused, "tp_btf": refused})
    with pytest.raises(NotSupported, match=r"^every strategy is not supported here: fentry"):
        features.choose([fentry, tp_btf])


def test_a_tracepoint_probe_without_tracefs_loads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unmountable() -> Path:
        raise TracefsMissing(MOUNT_REFUSED)

    def no_load(program: str) -> None:
        raise AssertionError(f"{program} loaded without tracefs")

    monkeypatch.setattr(features, "ensure_tracefs", unmountable)
    monkeypatch.setattr(features, "_load_alone", no_load)
    monkeypatch.setattr(features, "KPROBE_PMU", Path("/nonexistent/kprobe/type"))
    features.probe.cache_clear()
    try:
        for feature in ("tracepoint", "kprobe"):
            p = features.probe(feature)
            assert (p.ok, p.tracefs_missing, p.why) == (False, True, MOUNT_REFUSED), p
            assert (p.detail, p.fix) == (features.NOT_MOUNTABLE, FIX)
    finally:
        features.probe.cache_clear()  # the real answers for the tests that follow


def test_ensure_tracefs_says_why_the_mount_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(system, "TRACEFS_UNDER_DEBUGFS", tmp_path / "debug" / "tracing")
    said = f"{MOUNT_REFUSED}.\n       dmesg(1) may have more information after failed mount."

    def refused(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 32, "", said)

    monkeypatch.setattr(subprocess, "run", refused)
    with pytest.raises(TracefsMissing) as info:
        system.ensure_tracefs(tmp_path / "tracing")
    assert info.value.detail == MOUNT_REFUSED  # its first line

    def no_mount(*args: Any, **kwargs: Any) -> None:
        raise FileNotFoundError(2, "No such file or directory", "mount")

    monkeypatch.setattr(subprocess, "run", no_mount)
    with pytest.raises(TracefsMissing, match=r"\(mount: No such file or directory\)"):
        system.ensure_tracefs(tmp_path / "tracing")
    (tmp_path / "tracing" / "events").mkdir(parents=True)
    assert system.ensure_tracefs(tmp_path / "tracing") == tmp_path / "tracing"


def test_ensure_ready_leaves_tracefs_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What every tool needs (privileges, BTF) is checked; tracefs is not mounted."""
    (tmp_path / "vmlinux").write_bytes(b"")
    monkeypatch.setattr(system, "has_bpf_privileges", lambda: True)
    monkeypatch.setattr(system, "KERNEL_BTF", tmp_path / "vmlinux")

    def no_tracefs(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ensure_ready looked for tracefs")

    monkeypatch.setattr(system, "ensure_tracefs", no_tracefs)
    monkeypatch.setattr(system, "tracefs_mounted", no_tracefs)
    monkeypatch.setattr(subprocess, "run", no_tracefs)
    system.ensure_ready()


def test_kprobe_reason_without_tracefs_claims_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(refusals, "kernel_config", lambda: None)
    assert refusals.kprobe_reason(tmp_path) == (
        f"tracefs is not mounted at {tmp_path}: whether {tmp_path}/kprobe_events exists is unknown"
    )


# ---- kernel: the tools in a mount namespace without tracefs --------------------------

# Unmount every tracefs (and debugfs, whose tracing/ is a tracefs automount) in the new
# namespace, make sure none is left, run the command, then record the tracefs mounts the
# namespace has at the end: none may have been made.
SCRIPT = r"""
findmnt -rn -o TARGET -t tracefs,debugfs | sort -r | xargs -r -n1 umount -l
grep " - tracefs " /proc/self/mountinfo && exit 98
if [ -n "$WORKLOAD" ]; then sh -c "$WORKLOAD" >/dev/null 2>&1 & fi
"$@"
rc=$?
if [ -n "$WORKLOAD" ]; then kill $!; fi
grep " - tracefs " /proc/self/mountinfo > "$TRACEFS_AFTER"
exit $rc
"""
NO_SYS_ADMIN = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    tracefs_after: str  # the namespace's tracefs mounts once the command ended


def without_tracefs(
    tmp_path: Path, *args: str, can_mount: bool = True, workload: str = "", timeout: float = 60
) -> Run:
    """`meridian ARGS` in a private mount namespace without tracefs: as root (which may
    mount it) or, with can_mount=False, without CAP_SYS_ADMIN (which cannot). The
    namespace ends with its processes, all killed here whatever the outcome."""
    for tool in ("unshare", "setpriv", "findmnt"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (util-linux)")
    after = tmp_path / "tracefs_after"
    after.unlink(missing_ok=True)
    caps = [] if can_mount else NO_SYS_ADMIN
    env = {**os.environ, "TRACEFS_AFTER": str(after), "WORKLOAD": workload}
    namespace = ["unshare", "--mount", "--propagation", "private", "bash", "-c", SCRIPT, "ns"]
    proc = subprocess.Popen(
        [*namespace, *caps, sys.executable, "-m", "meridian", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # one process group: the namespace's every process
    )
    try:
        out, err = proc.communicate(timeout=patience(timeout))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        reap(proc)
    assert proc.returncode != 98, "tracefs still mounted in the new namespace"
    return Run(proc.returncode, out, err, after.read_text() if after.exists() else "?")


@pytest.mark.kernel
def test_biolat_tp_btf_counts_direct_writes_without_tracefs(tmp_path: Path) -> None:
    """As root in a namespace without tracefs: tp_btf runs, counts the O_DIRECT writes
    of a workload on this disk, and mounts no tracefs (ensure_ready used to)."""
    target = tmp_path / "direct.bin"
    dd = f"dd if=/dev/zero of={target} bs=4k count=16 oflag=direct status=none"
    r = without_tracefs(
        tmp_path, "biolat", "--strategy", "tp_btf", "--json", "2", "1",
        workload=f"while :; do {dd}; sleep 0.05; done",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    writes = sum(d["count"] for d in report["devices"] if d["op"] == "write")
    assert writes > 0, report
    assert r.tracefs_after == ""


@pytest.mark.kernel
@pytest.mark.parametrize(("tool", "strategy"), [("runqlat", "tp_btf"), ("memlat", "tp_btf+perf")])
def test_latency_tools_run_without_tracefs(tmp_path: Path, tool: str, strategy: str) -> None:
    r = without_tracefs(tmp_path, tool, "--strategy", strategy, "--json", "1", "1")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    assert report["strategy"] == strategy
    assert sum(h["count"] for h in report["histograms"]) > 0, report
    assert r.tracefs_after == ""


@pytest.mark.kernel
def test_syscalls_tp_btf_traces_a_command_without_tracefs(tmp_path: Path) -> None:
    target = tmp_path / "read-me.txt"
    target.write_text("hello\n")
    r = without_tracefs(
        tmp_path, "syscalls", "--strategy", "tp_btf", "--json", "--", "cat", str(target)
    )
    assert r.returncode == 0, r.stderr
    calls = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    opened = [c for c in calls if c["syscall"] == "openat" and c["paths"] == [str(target)]]
    assert opened and opened[0]["result"] >= 0, calls[-5:]
    assert r.tracefs_after == ""


@pytest.mark.kernel
def test_where_tracefs_cannot_be_mounted_tp_btf_runs_and_tracepoint_says_why(
    tmp_path: Path,
) -> None:
    """Without CAP_SYS_ADMIN (a pod with CAP_BPF and CAP_PERFMON): biolat's tp_btf runs;
    its tracepoint strategy is one line naming tracefs and the fix, exit code 2."""
    ok = without_tracefs(tmp_path, "biolat", "--strategy", "tp_btf", "1", "1", can_mount=False)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("Tracing block device I/O")
    refused = without_tracefs(
        tmp_path, "biolat", "--strategy", "tracepoint", "1", "1", can_mount=False
    )
    one_line_exit_2(
        subprocess.CompletedProcess([], refused.returncode, refused.stdout, refused.stderr),
        "strategy tracepoint needs tracefs at /sys/kernel/tracing, which is not mounted "
        "and could not be (mount: /sys/kernel/tracing: permission denied): " + FIX,
    )
    assert refused.tracefs_after == ""


@pytest.mark.kernel
def test_io_tp_btf_counts_disk_bytes_without_tracefs(tmp_path: Path) -> None:
    """io's disk signals are raw tracepoints under tp_btf: without tracefs and without
    CAP_SYS_ADMIN (a pod), every 256 KiB O_DIRECT write is 256 KiB of bios, and every
    cat of the file after it (no page cached) reads 256 KiB from the disk."""
    target = tmp_path / "cold.bin"
    loop = (
        f"while :; do dd if=/dev/zero of={target} bs=64k count=4 oflag=direct status=none;"
        f" cat {target}; sleep 0.05; done"
    )
    r = without_tracefs(
        tmp_path, "io", "--strategy", "tp_btf", "--no-events", "--duration", "3",
        can_mount=False, workload=loop,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    sums = [row for row in rows if row["type"] == "summary"]
    reads = [row["read"] for row in sums if row["comm"] == "cat" and "read" in row]
    writes = [row["write"] for row in sums if row["comm"] == "dd" and "write" in row]
    whole = 256 << 10
    full_reads = [x for x in reads if x["bytes"] >= whole]  # the file, and ld.so's (cached)
    full_writes = [x for x in writes if x["bytes"] == whole]
    assert len(full_reads) >= 3 and len(full_writes) >= 3, sums
    assert {x["disk_bytes"] for x in full_reads} == {whole}, full_reads
    assert {x["disk_bytes"] for x in full_writes} == {whole}, full_writes
    assert r.tracefs_after == ""


@pytest.mark.kernel
def test_doctor_without_tracefs_says_what_still_runs(tmp_path: Path) -> None:
    r = without_tracefs(tmp_path, "doctor", "--json", can_mount=False)
    assert r.returncode == 0, r.stderr  # tp_btf runs: ready
    j = json.loads(r.stdout)
    assert (j["tracefs"], j["tracefs_mounted"]) == (None, False)
    assert FIX in j["tracefs_error"] and "permission denied" in j["tracefs_error"]
    assert j["features"]["tracepoint"]["ok"] is False
    assert j["features"]["tracepoint"]["detail"] == features.NOT_MOUNTABLE
    assert j["strategies"]["biolat"] == "tp_btf" and j["strategies"]["runqlat"] == "tp_btf"
    assert j["strategies"]["io"] == "tp_btf"
    needs = {s["name"]: s["needs_tracefs"] for s in j["strategy_needs"]["biolat"]}
    assert needs == {"tp_btf": False, "tracepoint": True}
    text = without_tracefs(tmp_path, "doctor", can_mount=False).stdout.splitlines()
    tracefs_line = next(line for line in text if line.startswith("tracefs "))
    assert tracefs_line.split()[1] == "no" and FIX in tracefs_line
    assert "  biolat      tp_btf          [tp_btf, tracepoint*]" in text
