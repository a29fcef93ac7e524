"""syscalls sustained capture: a C program drives a known rate of file-system syscalls
(openat + fstat + close on one file, 3 calls = 6 events per iteration, paced every
millisecond with an absolute-time sleep), for N seconds, and `meridian syscalls`
records it raw (`-w FILE.zst`). Reported per condition: the events/s the program
reached, the events recorded, the kernel's lost count, and a check of the recording
(every index from the first to the last present once: no gap, no drop).

Conditions, in one run:
  untraced         the program alone (what rate this VM reaches)
  record -q        `meridian syscalls -w rec.zst -q -- prog` (record only)
  record + view    `meridian syscalls -w rec.zst -- prog > /dev/null` (plain lines too,
                   best effort: the view skips what it cannot keep up with, counted)

Run as root from the repository:
  .venv/bin/python benchmarks/syscalls_rate_bench.py [events_per_s] [seconds]
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from syscalls_bench import MERIDIAN, build  # noqa: E402

from meridian.tools.syscalls.ring_records import dtype_from_json, frames  # noqa: E402

RATE_C = r"""
int main(int argc, char **argv)
{
	double events = atof(argv[2]), seconds = atof(argv[3]);
	double per_ms = events / 6.0 / 1000.0, owed = 0, t0 = now(), t;
	unsigned long n = 0;
	struct timespec next;
	struct stat st;

	clock_gettime(CLOCK_MONOTONIC, &next);
	do {
		owed += per_ms;
		while (owed >= 1) {
			int fd = openat(AT_FDCWD, argv[1], O_RDONLY);
			fstat(fd, &st);
			close(fd);
			n++;
			owed -= 1;
		}
		next.tv_nsec += 1000000;
		if (next.tv_nsec >= 1000000000) {
			next.tv_nsec -= 1000000000;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
		t = now();
	} while (t - t0 < seconds);
	printf("%.0f\n", 6.0 * n / (t - t0));
	return 0;
}
"""


def check_recording(path: Path) -> tuple[int, int, int]:
    """(records, index gaps, bytes after decompression) of a raw recording."""
    import json

    proc = subprocess.Popen(["zstd", "-q", "-d", "-c", str(path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    header = json.loads(proc.stdout.readline())
    dtype_from_json(header["record"])  # a raw recording (the layout is checked)
    size = 0
    pending = b""
    indices = []
    while True:
        block = proc.stdout.read(8 << 20)
        buf = pending + block
        if not buf:
            break
        size += len(block)
        fr = frames(buf)
        raw = np.frombuffer(buf, dtype=np.uint8)
        at = np.asarray(fr.offsets, dtype=np.int64)
        idx = raw[at[:, None] + np.arange(8)].view("<u8").ravel()
        indices.append(idx)
        pending = buf[fr.used :]
        if not block:
            break
    proc.wait()
    if not indices:
        return 0, 0, size
    all_idx = np.sort(np.concatenate(indices))
    n = len(all_idx)
    gaps = int(all_idx[-1] - all_idx[0] + 1 - len(np.unique(all_idx))) if n else 0
    return n, gaps, size


def main() -> int:
    rate = sys.argv[1] if len(sys.argv) > 1 else "200000"
    seconds = sys.argv[2] if len(sys.argv) > 2 else "60"
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        tmp = Path(d)
        prog, target = build(tmp, "scrate", RATE_C)
        base = [str(prog), str(target), rate, seconds]
        rows = []
        for name, extra in (
            ("untraced", None),
            ("record -q", ["-q"]),
            ("record + view", []),
        ):
            rec = tmp / "rec.zst"
            cmd = base if extra is None else [*MERIDIAN, "-w", str(rec), *extra, "--", *base]
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, check=True)
            wall = time.monotonic() - t0
            reached = float(re.findall(r"^(\d+)$", p.stdout, re.M)[-1])
            row = {"name": name, "reached": reached, "wall": wall}
            if extra is not None:
                summary = p.stderr.strip().splitlines()[-1]
                lost = re.search(r"(\d+) lost", summary)
                recorded = re.search(r"(\d+) events recorded", summary)
                skipped = re.search(r"(\d+) not shown live", summary)
                n, gaps, size = check_recording(rec)
                row.update(
                    lost=int(lost.group(1)) if lost else -1,
                    recorded=int(recorded.group(1)) if recorded else -1,
                    skipped=int(skipped.group(1)) if skipped else 0,
                    in_file=n,
                    gaps=gaps,
                    raw_mb=size / 1e6,
                    zst_mb=rec.stat().st_size / 1e6,
                )
                rec.unlink()
            rows.append(row)
            print(row, flush=True)
    print(
        f"\nmachine: {platform.node()} {platform.release()} {platform.machine()}; "
        f"target {rate} events/s for {seconds} s"
    )
    print("| condition | events/s reached | recorded | lost (kernel) | index gaps in file "
          "| not shown live | raw MB | zstd MB |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "recorded" in r:
            print(
                f"| {r['name']} | {r['reached']:,.0f} | {r['recorded']:,} | {r['lost']:,} | "
                f"{r['gaps']:,} | {r['skipped']:,} | {r['raw_mb']:.0f} | {r['zst_mb']:.1f} |"
            )
        else:
            print(f"| {r['name']} | {r['reached']:,.0f} | - | - | - | - | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
