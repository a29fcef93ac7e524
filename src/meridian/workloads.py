"""Small built-in workloads whose answer is known, for demos, `validate` and tests.

Run as `python -m meridian.workloads NAME ...` so a tool can start one in a child
process and stop it when it is done.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile
import time

__all__ = ["direct_io"]


def direct_io(path: str, seconds: float, block: int = 4096, file_size: int = 16 << 20) -> int:
    """O_DIRECT reads and writes of `block` bytes on a file at `path` (the page cache is
    bypassed, so each one is a block request). Returns the number of I/Os done."""
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
    buf.write(os.urandom(block))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    done = 0
    try:
        blocks = file_size // block
        for i in range(blocks):  # lay the file out first so reads hit allocated blocks
            os.pwritev(fd, [buf], i * block)
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            off = (i * 7919 % blocks) * block
            if i % 4 == 3:
                os.pwritev(fd, [buf], off)
            else:
                os.preadv(fd, [buf], off)
            i += 1
            done += 1
            if i % 64 == 0:
                time.sleep(0.002)  # a light load: a demo, not a benchmark
    finally:
        os.close(fd)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meridian.workloads")
    sub = ap.add_subparsers(dest="name", required=True)
    d = sub.add_parser("direct-io", help="O_DIRECT 4 KiB reads and writes on a temporary file")
    d.add_argument("--seconds", type=float, default=10.0)
    d.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args(argv)
    if args.name == "direct-io":
        fd, path = tempfile.mkstemp(prefix="meridian-io-", dir=args.dir)
        os.close(fd)
        try:
            direct_io(path, args.seconds)
        except KeyboardInterrupt:
            pass
        finally:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
