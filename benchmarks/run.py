"""Run every benchmark in this directory, one after another, with its default rounds.

Each script prints its own table; copy the tables worth keeping into RESULTS.md
with the command, the machine and whether the cores were quiet. Benchmarks need
root and a quiet machine: other load shows up as noise in every ratio.

Run as root from the repository: .venv/bin/python benchmarks/run.py [NAME ...]
(NAME: biolat, memlat, runqlat, io, syscalls, ringbuf; default: all)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("*_bench.py"))
    known = {s.name.removesuffix("_bench.py"): s for s in scripts}
    unknown = [n for n in names if n not in known]
    if unknown:
        have = ", ".join(known)
        print(f"error: no benchmark named {', '.join(unknown)} (have: {have})", file=sys.stderr)
        return 2
    failed = []
    for name in names or list(known):
        print(f"== {name}: {known[name].name}", flush=True)
        if subprocess.run([sys.executable, str(known[name])], cwd=HERE.parent).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
