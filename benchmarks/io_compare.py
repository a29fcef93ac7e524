"""io before and after a change, in the same run: the io of another checkout (`BASE`, a
git worktree with its BPF objects built) and of this one, interleaved with untraced
runs of io_bench.py's cached 4 KiB pread loop, as ratios to the neighbouring untraced
runs. A change that moves io's cost by less than the run's noise is not told apart.

usage: sudo .venv/bin/python benchmarks/io_compare.py BASE [ROUNDS] [SECONDS]
  e.g. git worktree add /var/tmp/base HEAD~3 && make -C /var/tmp/base bpf
       sudo .venv/bin/python benchmarks/io_compare.py /var/tmp/base 5 3
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path

from _rounds import compile_c, interleaved, print_ratios
from io_bench import LOOP_C, loop

ROOT = Path(__file__).resolve().parent.parent


def io_of(checkout: Path, events: bool) -> list[str]:
    """`meridian io -v` as `checkout`'s source and BPF objects have it: its events as
    JSON to /dev/null, or none (--no-events)."""
    cmd = f"exec env PYTHONPATH={shlex.quote(str(checkout / 'src'))} {sys.executable}"
    cmd += " -m meridian io -v" + (" > /dev/null" if events else " --no-events")
    return ["sh", "-c", cmd]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not (Path(argv[1]) / "src" / "meridian" / "bpfobj").is_dir():
        print("usage: io_compare.py BASE [ROUNDS] [SECONDS] (BASE: a checkout after make bpf)")
        return 2
    base = Path(argv[1]).resolve()
    rounds = int(argv[2]) if len(argv) > 2 else 5
    seconds = float(argv[3]) if len(argv) > 3 else 3.0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = compile_c(LOOP_C, work, "preadloop")
        data = work / "data.bin"
        data.write_bytes(os.urandom(1 << 20))
        loop(exe, data, 0.5)  # warm the page cache
        results = interleaved(
            lambda: loop(exe, data, seconds),
            {
                "io --no-events, base": io_of(base, events=False),
                "io --no-events, this checkout": io_of(ROOT, events=False),
                "io JSON to /dev/null, base": io_of(base, events=True),
                "io JSON to /dev/null, this checkout": io_of(ROOT, events=True),
            },
            rounds,
        )
    print_ratios(results, f"cached 4 KiB pread loop, {seconds:g} s per run", "preads/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
