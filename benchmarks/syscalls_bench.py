"""syscalls overhead: iterations/s of a C loop of openat + fstat (newfstatat) + close
on one file, untraced, under `meridian syscalls -w FILE.jsonl -- loop` (every call
recorded, spooled raw and written as JSON lines when the loop ends; printed to
/dev/null as far as the view keeps up), under `meridian syscalls
-q -w FILE.raw -- loop` (every record streamed raw to a file, nothing decoded), under
`strace -f -e trace=openat,newfstatat,close -o /dev/null`, under bpftrace
printing the same calls (enter and exit), and with meridian's programs attached but
filtering the loop out in the kernel (`-p` of an idle process): the floor that the
raw syscall hooks alone set for any tracer on them; and floor.py's empty programs on
the same hooks (and reserving and discarding a ring record at each exit). Interleaved
round by round in the same run. Ratios are medians of traced / untraced of the
neighbouring rounds; meridian's lost events (ring buffer full) are reported.

Run as root from the repository: .venv/bin/python benchmarks/syscalls_bench.py [rounds] [seconds]
"""

from __future__ import annotations

import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _rounds import floor, under

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = [str(ROOT / ".venv" / "bin" / "meridian"), "syscalls"]
# What both syscalls benchmarks' C programs start with (`build` puts it first).
C_PRELUDE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}
"""
LOOP_C = r"""
int main(int argc, char **argv)
{
	double seconds = atof(argv[2]), t0 = now(), t;
	unsigned long n = 0;
	struct stat st;

	do {
		for (int i = 0; i < 256; i++) {
			int fd = openat(AT_FDCWD, argv[1], O_RDONLY);
			fstat(fd, &st);
			close(fd);
		}
		n += 256;
		t = now();
	} while (t - t0 < seconds);
	printf("%.0f\n", n / (t - t0));
	return 0;
}
"""
_ENTER = {
    "openat": '"%s(%d) openat(%d, %s, %d)\\n", comm, tid, args->dfd, str(args->filename), '
    "args->flags",
    "newfstatat": '"%s(%d) newfstatat(%d, %s)\\n", comm, tid, args->dfd, str(args->filename)',
    "close": '"%s(%d) close(%d)\\n", comm, tid, args->fd',
}
BPFTRACE = "".join(
    f'tracepoint:syscalls:sys_enter_{n} /comm == "scloop"/ {{ printf({fmt}); }}\n'
    f'tracepoint:syscalls:sys_exit_{n} /comm == "scloop"/ '
    f'{{ printf("%s(%d) {n} = %d\\n", comm, tid, args->ret); }}\n'
    for n, fmt in _ENTER.items()
)


def build(tmp: Path, name: str, source: str) -> tuple[Path, Path]:
    """C_PRELUDE + `source` compiled as `tmp/name`, and the file the program opens."""
    c = tmp / f"{name}.c"
    c.write_text(C_PRELUDE + source)
    subprocess.run(["gcc", "-O2", "-o", str(tmp / name), str(c)], check=True)
    target = tmp / "file"
    target.write_text("x")
    return tmp / name, target


def run_loop(cmd: list[str]) -> tuple[float, str]:
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rate = float(re.findall(r"^(\d+)$", p.stdout, re.M)[-1])
    return rate, p.stderr


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = sys.argv[2] if len(sys.argv) > 2 else "3"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        loop, target = build(tmp, "scloop", LOOP_C)
        base = [str(loop), str(target), seconds]
        rec = tmp / "rec.jsonl"
        (tmp / "trace.bt").write_text(BPFTRACE)
        raw = tmp / "rec.raw"
        results: dict[str, list[float]] = {
            "untraced": [],
            "meridian": [],
            "meridian_raw": [],
            "strace": [],
            "bpftrace": [],
            "hooks_only": [],
            "floor": [],
            "floor_reserve": [],
        }
        ratios: dict[str, list[float]] = {k: [] for k in results if k != "untraced"}
        lost: list[str] = []
        noise: list[float] = []  # |1 - u2/u1|: the untraced runs around each round
        strace = ["strace", "-f", "-e", "trace=openat,newfstatat,close", "-o", "/dev/null"]
        with open(tmp / "out", "w") as devnull:
            for r in range(rounds):
                u1, _ = run_loop(base)
                m, err = run_loop([*MERIDIAN, "-w", str(rec), "--", *base])
                found = re.search(r"(\d+ events recorded.*)", err)
                lost.append(found.group(1) if found else err.strip())
                mr, err = run_loop([*MERIDIAN, "-q", "-w", str(raw), "--", *base])
                found = re.search(r"(\d+ events recorded.*)", err)
                lost.append(found.group(1) if found else err.strip())
                st, _ = run_loop([*strace, *base])
                bt = subprocess.Popen(
                    ["bpftrace", str(tmp / "trace.bt")], stdout=devnull, stderr=subprocess.DEVNULL
                )
                time.sleep(3)  # compiled and attached (its ready line is in what it prints)
                b, _ = run_loop(base)
                bt.terminate()
                bt.wait()
                idle = subprocess.Popen(["sleep", "1000"])
                try:  # the hooks attached, tracing a process that makes no calls
                    hooks = [*MERIDIAN, "-v", "-q", "-w", "/dev/null", "-p", str(idle.pid)]
                    h = under(hooks, lambda: run_loop(base)[0])
                finally:
                    idle.kill()
                    idle.wait()
                fl = under(floor("syscalls"), lambda: run_loop(base)[0])
                fr = under(floor("syscalls", reserve=True), lambda: run_loop(base)[0])
                u2, _ = run_loop(base)
                noise.append(abs(1 - u2 / u1))
                u = (u1 + u2) / 2
                for k, v in (
                    ("untraced", u),
                    ("meridian", m),
                    ("meridian_raw", mr),
                    ("strace", st),
                    ("bpftrace", b),
                    ("hooks_only", h),
                    ("floor", fl),
                    ("floor_reserve", fr),
                ):
                    results[k].append(v)
                    if k != "untraced":
                        ratios[k].append(v / u)
                print(
                    f"round {r + 1}: untraced {u:.0f}/s meridian {m:.0f}/s raw {mr:.0f}/s "
                    f"strace {st:.0f}/s bpftrace {b:.0f}/s hooks only {h:.0f}/s "
                    f"floor {fl:.0f}/s floor reserving {fr:.0f}/s; "
                    f"meridian: {lost[-2]}; raw: {lost[-1]}",
                    flush=True,
                )
    print(
        f"\nmachine: {platform.node()} {platform.release()} {platform.machine()}, "
        f"{rounds} rounds of {seconds} s; noise (the untraced runs of a round): median "
        f"{100 * statistics.median(noise):.1f} %, max {100 * max(noise):.1f} %"
    )
    print("iterations/s (openat+fstat+close = 3 calls, 6 events), median of rounds:")
    for k, rates in results.items():
        ratio = f"  ratio {statistics.median(ratios[k]):.3f}" if k in ratios else ""
        print(f"  {k:<12} {statistics.median(rates):>10.0f}{ratio}")
    rm, rs = statistics.median(ratios["meridian"]), statistics.median(ratios["strace"])
    rb = statistics.median(ratios["bpftrace"])
    print(f"meridian / strace: {rm / rs:.1f}x;  meridian / bpftrace: {rm / rb:.2f}x")
    rr = statistics.median(ratios["meridian_raw"])
    print(f"meridian -q -w raw / strace: {rr / rs:.1f}x;  / bpftrace: {rr / rb:.2f}x")
    rh = statistics.median(ratios["hooks_only"])
    print(f"hooks only / strace: {rh / rs:.1f}x (the most a tracer on these hooks can reach)")
    # Added time per call, in untraced call times: 1 / ratio - 1.
    cost = {k: 1 / statistics.median(ratios[k]) - 1 for k in ("meridian_raw", "strace")}
    print(
        f"per call: strace adds {cost['strace']:.2f} untraced call times, meridian -q -w raw "
        f"{cost['meridian_raw']:.2f}: {cost['strace'] / cost['meridian_raw']:.1f}x less"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
