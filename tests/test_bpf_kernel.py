"""The libbpf layer against the real kernel: maps, perf events, feature probes that
tell the truth, and errors a person can act on."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bpfbuild import compile_bpf
from children import patience

from meridian.bpf import BpfObject, PerfEvent, object_path, open_per_cpu, probe
from meridian.bpf.perf import online_cpus
from meridian.errors import MapFull, NotSupported, VerifierError

pytestmark = pytest.mark.kernel


def test_hash_map_lookup_update_delete_iterate_batch() -> None:
    with BpfObject(object_path("features")) as obj:
        obj.select(["probe_tracepoint"])
        obj.load()
        m = obj.maps["probe_hash"]  # u32 -> u64, 4 entries
        for k in (1, 2, 3):
            m.update(k, k * 100)
        assert m.lookup(2) == 200
        assert m.lookup(9) is None
        assert sorted(m.keys().tolist()) == [1, 2, 3]
        keys, vals = m.items()
        assert dict(zip(keys.tolist(), vals.tolist(), strict=True)) == {1: 100, 2: 200, 3: 300}
        assert m.delete(2) and not m.delete(2)
        m.update(4, 4)
        m.update(5, 5)
        with pytest.raises(MapFull):
            m.update(6, 6)
        keys, vals = m.pop_all()
        assert sorted(keys.tolist()) == [1, 3, 4, 5]
        assert len(m.keys()) == 0
        for k in (1, 2, 3):
            m.update(k, k)
        # the keys that were there are counted, an absent one (9) is not an error
        assert m.delete_many(np.array([1, 9, 3], dtype=np.uint32)) == 2
        assert m.keys().tolist() == [2]


class _CtrlCOnFirstPrint:
    """libbpf's echo: Ctrl-C sent to this process at the first line it prints."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, line: str) -> None:
        if not self.sent:
            self.sent.append(line)
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("phase", ["open", "load"])
def test_ctrl_c_while_libbpf_prints_still_ends_the_run(phase: str) -> None:
    """A signal whose Python handler runs inside libbpf's print callback would raise
    there, where ctypes swallows the exception, and the tool would run on: opening and
    loading hold Ctrl-C back, and it interrupts once libbpf returns."""
    from meridian.bpf import _libbpf

    echo = _CtrlCOnFirstPrint()
    obj = None
    try:
        if phase == "open":
            _libbpf.set_echo(echo)
            with pytest.raises(KeyboardInterrupt):
                BpfObject(object_path("features"))
        else:
            obj = BpfObject(object_path("features"))
            obj.select(["probe_tracepoint"])
            _libbpf.set_echo(echo)
            with pytest.raises(KeyboardInterrupt):
                obj.load()
        assert echo.sent, f"libbpf printed nothing during {phase}: the test proves nothing"
    finally:
        _libbpf.set_echo(None)
        if obj is not None:
            obj.close()


def test_ctrl_c_during_an_attach_leaves_the_link_with_the_object() -> None:
    """A Ctrl-C held while libbpf attaches is delivered only once the object keeps the
    link, so closing the object detaches it (none is left behind, unreachable)."""
    from meridian.bpf import _libbpf

    with BpfObject(object_path("features")) as obj:
        obj.select(["probe_tracepoint"])
        obj.load()
        prog = obj.programs["probe_tracepoint"]

        def interrupted_attach() -> int:
            os.kill(os.getpid(), signal.SIGINT)  # held: the attach goes on
            return int(_libbpf.lib().bpf_program__attach(prog._handle) or 0)

        with pytest.raises(KeyboardInterrupt):
            prog._attached("(test)", interrupted_attach)
        assert [link.program for link in obj.links] == ["probe_tracepoint"]


def test_percpu_values_come_one_per_cpu() -> None:
    with BpfObject(object_path("biolat")) as obj:
        obj.select(["btf_rq_issue", "btf_rq_complete"])
        obj.load()
        counters = obj.maps["counters"]
        value = counters.lookup(0)
        assert value.shape == (counters.ncpus,)
        assert value.dtype.names is not None and "unmatched" in value.dtype.names
        one = np.zeros((), dtype=counters.value_dtype)
        one["requeued"] = 7
        counters.update(0, one)
        assert counters.lookup(0)["requeued"].tolist() == [7] * counters.ncpus


def test_perf_events_open_on_every_cpu() -> None:
    fds = open_per_cpu(PerfEvent.CPU_CLOCK, sample_period=10_000_000)
    try:
        assert len(fds) == len(online_cpus())
    finally:
        for fd in fds:
            os.close(fd)


def test_hardware_events_fail_as_not_supported_when_the_probe_says_so() -> None:
    if probe("hw_perf").ok:
        fds = open_per_cpu(PerfEvent.CPU_CYCLES, sample_period=1_000_000)
        for fd in fds:
            os.close(fd)
    else:
        with pytest.raises(NotSupported, match="hardware perf events"):
            open_per_cpu(PerfEvent.CPU_CYCLES, sample_period=1_000_000)


def test_every_feature_probe_equals_the_independent_fact() -> None:
    """Each probe against a fact found apart: bpftool loading a program compiled here,
    tracefs (kprobe_events) and bpftool's own feature probe."""
    from host_facts import bpftool_probe, features

    for name, fact in features().items():
        assert probe(name).ok == fact, (name, probe(name))
    assert probe("fentry").ok == ("program_type tracing is available" in bpftool_probe())


def test_every_tool_chooses_the_strategy_the_host_facts_predict() -> None:
    """choose() on each tool's list equals the first strategy whose needs the
    independent facts grant (tp_btf here: fentry refused, no kprobes)."""
    from host_facts import expected_strategy

    from meridian.bpf import choose
    from meridian.tools import biolat, io, memlat, runqlat, syscalls

    for tool in (biolat, io, memlat, runqlat, syscalls):
        assert choose(tool.STRATEGIES).name == expected_strategy(tool.STRATEGIES), tool


def test_doctor_says_why_fentry_and_kprobes_are_refused() -> None:
    """doctor names the lockdown mode as /sys/kernel/security/lockdown states it, and
    for a refused kprobe the missing kprobe support, as tracefs and the kernel config
    state it; its strategy lines are the ones the host facts predict."""
    from host_facts import config_kprobes, expected_strategy, features, lockdown_mode

    from meridian.tools import io, memlat, runqlat, syscalls

    d = subprocess.run(
        [sys.executable, "-m", "meridian", "doctor"],
        capture_output=True,
        text=True,
        timeout=patience(60),
    )
    assert d.returncode == 0, d.stderr
    lines = d.stdout.splitlines()
    mode = lockdown_mode()
    assert f"lockdown    {mode}" in lines
    whys = {}
    for prev, line in itertools.pairwise(lines):
        if line.strip().startswith("why: "):
            whys[prev.split()[0]] = line.strip()[5:]
    if features()["fentry"]:
        assert "fentry" not in whys
    else:
        assert "fentry" in whys
        locked = f"the kernel is locked down ({mode}," if mode != "none" else "not locked down"
        assert locked in whys["fentry"]
    kprobe_events = Path("/sys/kernel/tracing/kprobe_events")
    if kprobe_events.exists():
        assert "kprobe" not in whys or "no kprobe support" not in whys["kprobe"]
    else:
        assert whys["kprobe"].startswith(
            f"this kernel has no kprobe support: {kprobe_events} does not exist"
        )
        config = config_kprobes()
        if config == "# CONFIG_KPROBES is not set":
            assert "CONFIG_KPROBES is not set (" in whys["kprobe"]
    for tool in (io, memlat, runqlat, syscalls):
        name = tool.__name__.rsplit(".", 1)[1]
        assert [name, expected_strategy(tool.STRATEGIES)] in [ln.split()[:2] for ln in lines]
    j = json.loads(
        subprocess.run(
            [sys.executable, "-m", "meridian", "doctor", "--json"],
            capture_output=True, text=True, timeout=patience(60),
        ).stdout
    )  # fmt: skip
    assert j["lockdown"] == mode
    assert j["features"]["kprobe"]["ok"] == kprobe_events.exists()
    assert bool(j["features"]["kprobe"]["why"]) != kprobe_events.exists()
    # which strategies need tracefs (a container without it runs the others), each
    # tool's in the order tried, as its declaration says; marked * in the text
    assert (j["tracefs"], j["tracefs_mounted"]) == ("/sys/kernel/tracing", True)
    for tool in (io, memlat, runqlat, syscalls):
        name = tool.__name__.rsplit(".", 1)[1]
        listed = [(s["name"], s["needs_tracefs"]) for s in j["strategy_needs"][name]]
        assert listed == [(s.name, s.needs_tracefs) for s in tool.STRATEGIES]
        marked = ", ".join(s.name + "*" * s.needs_tracefs for s in tool.STRATEGIES)
        assert any(ln.split()[:1] == [name] and ln.endswith(f" [{marked}]") for ln in lines)


def test_probes_agree_with_the_kernel() -> None:
    """kprobes need kprobe_events in tracefs; fentry needs the `tracing` program type,
    which bpftool's own probe reports."""
    assert probe("tracepoint").ok and probe("tp_btf").ok and probe("ringbuf").ok
    assert probe("kprobe").ok == Path("/sys/kernel/tracing/kprobe_events").exists()
    if shutil.which("bpftool"):
        out = subprocess.run(
            ["bpftool", "feature", "probe", "kernel"], capture_output=True, text=True
        ).stdout
        tracing = "eBPF program_type tracing is available" in out
        assert probe("fentry").ok == tracing
    assert probe("fentry") is probe("fentry")  # cached: one answer per process


BAD_PROG = r"""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
SEC("tracepoint/syscalls/sys_enter_getppid")
int reads_past_its_stack(void *ctx)
{
	volatile char buf[8];
	return buf[*(volatile int *)ctx + 64];
}
char LICENSE[] SEC("license") = "GPL";
"""


def test_verifier_rejection_names_the_program_and_quotes_the_log(tmp_path: Path) -> None:
    src = tmp_path / "bad.bpf.c"
    src.write_text(BAD_PROG)
    obj_path = compile_bpf(src, tmp_path / "bad.bpf.o")
    with BpfObject(obj_path) as obj, pytest.raises(VerifierError) as info:
        obj.load()
    assert info.value.program == "reads_past_its_stack"
    assert "verifier said" in str(info.value)
    assert info.value.log_tail


BIG_MAPS = """
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 8192);
         __type(key, __u32); __type(value, __u64); } big SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_HASH); __uint(max_entries, 8192);
         __type(key, __u32); __type(value, __u64); } big_percpu SEC(".maps");
SEC("tracepoint/syscalls/sys_enter_getppid") int touch(void *ctx) { return 0; }
char LICENSE[] SEC("license") = "GPL";
"""


def test_batch_reads_of_maps_bigger_than_a_chunk(tmp_path: Path) -> None:
    # 3,000 elements come back in chunks of BATCH_CHUNK (1,024), every one once
    src = tmp_path / "big.bpf.c"
    src.write_text(BIG_MAPS)
    with BpfObject(compile_bpf(src, tmp_path / "big.bpf.o")) as obj:
        obj.load()
        for name in ("big", "big_percpu"):
            m = obj.maps[name]
            for k in range(3000):
                m.update(k, k * 7)
            keys, vals = m.items()
            got = vals if vals.ndim == 1 else vals[:, 0]
            pairs = sorted(zip(keys.tolist(), got.tolist(), strict=True))
            assert pairs == [(k, k * 7) for k in range(3000)]
            keys, _ = m.pop_all()
            assert sorted(keys.tolist()) == list(range(3000)) and len(m.keys()) == 0


def test_without_privileges_the_tools_say_what_to_do() -> None:
    if not shutil.which("setpriv"):
        pytest.skip("setpriv not installed")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

    def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*nobody, sys.executable, "-m", "meridian", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=patience(60),
        )

    p = as_nobody("biolat", "1", "1")
    assert p.returncode == 2
    assert "needs root or CAP_BPF+CAP_PERFMON" in p.stderr
    assert "Traceback" not in p.stderr
    d = as_nobody("doctor")
    assert d.returncode == 1
    assert "nothing can run here" in d.stdout


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_descriptor_leaks_on_success_or_failure(tmp_path: Path) -> None:
    from meridian.tools.biolat import Biolat, Options

    before = _open_fds()
    for _ in range(3):
        with Biolat(Options(slow_ms=5.0, depth=True)) as tool:
            tool.snapshot()
    assert _open_fds() == before
    with BpfObject(object_path("biolat")) as obj:
        obj.select(["btf_rq_issue"])
        obj.set_rodata({"slow_on": True})
        with pytest.raises(KeyError):
            obj.set_rodata({"no_such_global": 1})
    assert _open_fds() == before
    test_verifier_rejection_names_the_program_and_quotes_the_log(tmp_path)
    assert _open_fds() == before


NESTED_SRC = r"""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile __u32 target_tgid = 0;
__u64 triggers = 0;

/* Each system call of the test process prints once... */
SEC("tp_btf/sys_enter")
int BPF_PROG(trigger, struct pt_regs *regs, long id)
{
	if (bpf_get_current_pid_tgid() >> 32 != target_tgid)
		return 0;
	__sync_fetch_and_add(&triggers, 1);
	bpf_printk("meridian test: trigger");
	return 0;
}

/* ...which runs this program, whose own print fires its tracepoint again, inside it:
 * the kernel skips that nested run and counts one recursion miss. */
SEC("tp_btf/bpf_trace_printk")
int BPF_PROG(nested, const char *text)
{
	bpf_printk("meridian test: nested");
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
"""


def test_recursion_misses_are_counted(tmp_path: Path) -> None:
    """Events the kernel never hands to a program (it was running on that CPU already)
    are read from bpf_prog_info: exactly one per trigger here, none for the trigger."""
    src = tmp_path / "nested.bpf.c"
    src.write_text(NESTED_SRC)
    with BpfObject(compile_bpf(src, tmp_path / "nested.bpf.o")) as obj:
        obj.set_rodata({"target_tgid": os.getpid()})
        obj.load()
        assert obj.recursion_misses() == 0
        # nested first and gone last: every trigger, the system calls that attach and
        # detach included, finds it attached
        nested, trigger = obj.attach(["nested", "trigger"])
        for _ in range(50):
            os.getppid()
        obj.drop([trigger])
        obj.drop([nested])
        triggers = int(obj.read_globals()["triggers"])
        assert triggers >= 50
        assert obj.programs["nested"].recursion_misses == triggers
        assert obj.programs["trigger"].recursion_misses == 0
        assert obj.recursion_misses() == triggers
