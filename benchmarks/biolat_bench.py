"""biolat overhead: IOPS of a 4 KiB O_DIRECT random-read fio job on a loop device,
untraced, with `meridian biolat` attached, and with bpftrace running the equivalent
biolatency script, interleaved round by round in the same run. Ratios are medians of
traced / untraced IOPS of the neighbouring rounds.

Run as root from the repository: .venv/bin/python benchmarks/biolat_bench.py [rounds]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from _rounds import fio_randread_iops, floor, interleaved, print_ratios

ROOT = Path(__file__).resolve().parent.parent
MERIDIAN = [str(ROOT / ".venv" / "bin" / "meridian")]
BPFTRACE = """
tracepoint:block:block_rq_issue { @start[args->dev, args->sector] = nsecs; }
tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ {
  @usecs[args->dev] = hist((nsecs - @start[args->dev, args->sector]) / 1000);
  delete(@start[args->dev, args->sector]);
}
"""


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = 5
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        img = Path(d) / "disk.img"
        with open(img, "wb") as f:
            f.truncate(1 << 30)
        subprocess.run(
            [
                "dd",
                "if=/dev/urandom",
                f"of={img}",
                "bs=1M",
                "count=256",
                "conv=notrunc",
                "status=none",
            ],
            check=True,
        )
        dev = subprocess.run(
            ["losetup", "--find", "--show", str(img)], check=True, capture_output=True, text=True
        ).stdout.strip()
        script = Path(d) / "biolatency.bt"
        script.write_text(BPFTRACE)
        tracers = {
            "floor (biolat's hooks, empty)": floor("biolat"),
            "meridian biolat": [*MERIDIAN, "biolat", "-D", "-v"],
            "bpftrace biolatency": ["bpftrace", str(script)],
        }
        try:
            results = interleaved(lambda: fio_randread_iops(dev, seconds), tracers, rounds)
        finally:
            subprocess.run(["losetup", "-d", dev], check=False)
    print_ratios(
        results,
        f"fio 4k randread O_DIRECT psync QD1 on a loop device, {seconds} s per run",
        "IOPS",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
