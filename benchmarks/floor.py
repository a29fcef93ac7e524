"""The floor under a tool's overhead: the attach points the tool picks on this kernel,
with empty programs. What no implementation of the tool can avoid here (the hook's
dispatch: a raw tracepoint's call, a perf record's copy for a plain tracepoint, a
trampoline for fentry), so that a benchmark can say how far above it the tool is.

The programs are generated from the tool's own choice (its strategy and the programs
it selects with default options), compiled with clang, loaded and attached; with
--reserve, each exit-side program also reserves a ring-buffer record and discards it
(the floor of a tool that streams events). Perf-event programs (memlat's fault
counters, sentinel's sampling) get the same software events, empty.

With --clock, the programs do what any latency tool must at these hooks and nothing
more: each entry-side program reads the clock into its thread's slot (a global indexed
by the thread id, no map call), each exit-side one (perf-event programs included:
memlat's fault ends) reads it again and adds the difference to that slot's sum; the
tool's other hooks stay empty. The latency floor: below it, a tool would have to time
its operations without two clock reads. The slot is the thread's, not the CPU's: a
syscall or a fault may sleep, and another thread's on the same CPU would then
overwrite a start kept per CPU (a per-CPU floor, which earlier RESULTS used, is about
10 ns a program cheaper here: the thread id is a helper call). For sentinel, whose
packets carry the time they were seen, each packet hook reads the clock once into its
CPU's slot (and its sampling program, which reads it too).

Prints "strategy: floor of TOOL (...)" on stderr once attached (the line the
benchmarks wait for, as for `meridian TOOL -v`), then waits for SIGINT or SIGTERM.

Run as root from the repository:
    .venv/bin/python benchmarks/floor.py io|memlat|runqlat|syscalls|biolat|sentinel \
        [--reserve | --clock]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from bpfbuild import compile_bpf  # noqa: E402

from meridian.bpf import BpfObject, PerfEvent, choose, object_path, open_per_cpu  # noqa: E402

TOOLS = ("io", "memlat", "runqlat", "syscalls", "biolat", "sentinel")
RESERVE_BYTES = 64


def tool_programs(tool: str) -> tuple[str, list[str], list[tuple[str, tuple[int, int], int]]]:
    """(strategy, sections of the hooks it attaches, perf programs as (section, event,
    frequency or 0 for every event)) of `tool` on this kernel, default options."""
    if tool == "io":
        from meridian.tools.io.kernel import FileIO
        from meridian.tools.io.options import Options

        session = FileIO(Options())
        with BpfObject(object_path("io")) as obj:
            names = session.programs(obj)
            return session.strategy.name, [obj.programs[p].section for p in names], []
    if tool == "biolat":
        from meridian.tools.biolat.kernel import Biolat
        from meridian.tools.biolat.model import Options as BiolatOptions

        bio = Biolat(BiolatOptions())
        with BpfObject(object_path("biolat")) as obj:
            names = bio.programs(obj)
            return bio.strategy.name, [obj.programs[p].section for p in names], []
    if tool == "sentinel":
        from meridian.tools.sentinel.config.schema import PerfConfig
        from meridian.tools.sentinel.sources.kernel import NET_PROGRAMS, STRATEGIES

        strategy = choose(STRATEGIES)
        freq = PerfConfig().frequency
        sections = [NET_PROGRAMS[p] for p in strategy.programs if p in NET_PROGRAMS]
        return strategy.name, sections, [("perf_event", PerfEvent.CPU_CLOCK, freq)]
    module = {
        "memlat": "meridian.tools.memlat.kernel",
        "runqlat": "meridian.tools.runqlat.kernel",
        "syscalls": "meridian.tools.syscalls.kernel",
    }[tool]
    strategies = __import__(module, fromlist=["STRATEGIES"]).STRATEGIES
    strategy = choose(strategies)
    with BpfObject(object_path(tool)) as obj:
        sections = [obj.programs[p].section for p in strategy.programs]
    perf = []
    if tool == "memlat" and "perf_event" in sections:
        sections = [s for s in sections if s != "perf_event"]
        perf = [
            ("perf_event", e, 0) for e in (PerfEvent.PAGE_FAULTS_MIN, PerfEvent.PAGE_FAULTS_MAJ)
        ]
    return strategy.name, sections, perf


def emits(section: str) -> bool:
    """A hook where a streaming tool writes its event: a syscall's or request's end."""
    return (
        "sys_exit" in section
        or section.endswith("rq_complete")
        or section.startswith(("fexit/", "kretprobe/"))
    )


THREAD = "(__u32)bpf_get_current_pid_tgid() & 63"
CLOCK_START = f"t0[{THREAD}] = bpf_ktime_get_ns(); return 0;"
CLOCK_END = f"__u32 c = {THREAD}; sum[c] += bpf_ktime_get_ns() - t0[c]; return 0;"
STAMP = "t0[bpf_get_smp_processor_id() & 63] = bpf_ktime_get_ns(); return 0;"


def starts(section: str) -> bool:
    """A hook where a latency tool starts its clock: a syscall's, fault's or request's
    start (the other hooks stay empty with --clock)."""
    return (
        "sys_enter" in section
        or "page_fault" in section
        or section.endswith("rq_issue")
        or section.startswith(("fentry/", "kprobe/"))
    )


PACKET_HOOKS = (
    "xdp",
    "fentry/__dev_queue_xmit",
    "tp_btf/netif_receive_skb",
    "tp_btf/net_dev_start_xmit",
)


def stamps(section: str) -> bool:
    """A packet hook of sentinel's: every packet carries the time it was seen (the
    seed's <tsc, flow> history, which samples match within the skid window), so its
    floor with --clock reads the clock once a packet."""
    return section in PACKET_HOOKS


def source(sections: list[str], perf: int, reserve: bool, clock: bool = False) -> str:
    """One empty program per section (XDP passes the packet), `perf` perf-event ones;
    `clock`: the latency floor (module docstring)."""
    out = ['#include "vmlinux.h"', "#include <bpf/bpf_helpers.h>"]
    if reserve:
        out.append(
            "struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 22); } rb"
            ' SEC(".maps");'
        )
    if clock:
        out.append("__u64 t0[64], sum[64];")
    for i, sec in enumerate(sections):
        body = "return 0;"
        if reserve and emits(sec):
            body = f"void *r = bpf_ringbuf_reserve(&rb, {RESERVE_BYTES}, 0);"
            body += " if (r) bpf_ringbuf_discard(r, 0); return 0;"
        elif clock:
            if emits(sec):
                body = CLOCK_END
            elif stamps(sec):  # before starts(): fentry/__dev_queue_xmit is a packet's
                body = STAMP
            elif starts(sec):
                body = CLOCK_START
        if sec == "xdp":
            body = body.replace("return 0;", "return XDP_PASS;")
        out.append(f'SEC("{sec}") int floor_{i}(void *ctx) {{ {body} }}')
    for i in range(perf):
        body = CLOCK_END if clock else "return 0;"
        out.append(f'SEC("perf_event") int floor_perf_{i}(void *ctx) {{ {body} }}')
    out.append('char LICENSE[] SEC("license") = "GPL";')
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tool", choices=TOOLS)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--reserve", action="store_true", help="exit hooks reserve and discard")
    how.add_argument("--clock", action="store_true", help="the latency floor: two clock reads")
    ap.add_argument("-v", action="store_true", help="ignored: it always says when attached")
    args = ap.parse_args(argv)
    strategy, sections, perf = tool_programs(args.tool)
    stop = False

    def halt(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, halt)
    signal.signal(signal.SIGTERM, halt)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "floor.bpf.c"
        src.write_text(source(sections, len(perf), args.reserve, args.clock))
        with BpfObject(compile_bpf(src, Path(tmp) / "floor.bpf.o")) as obj:
            obj.load()
            obj.attach([f"floor_{i}" for i in range(len(sections))])
            for i, (_, event, freq) in enumerate(perf):
                for fd in open_per_cpu(event, sample_period=0 if freq else 1, freq=freq):
                    obj.programs[f"floor_perf_{i}"].attach_perf_event(fd)
            hooks = ", ".join(sections + [f"perf {e}" for _, e, _ in perf])
            what = " reserving" if args.reserve else " timing" if args.clock else ""
            print(f"strategy: floor of {args.tool} ({strategy}{what}): {hooks}", file=sys.stderr)
            sys.stderr.flush()
            while not stop:
                time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
