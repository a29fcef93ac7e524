"""Small built-in workloads whose answer is known, for demos, `validate` and tests.

Run as `python -m meridian.workloads NAME ...` so a tool can start one in a child
process and stop it when it is done.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import sys
import tempfile
import time

__all__ = ["direct_io", "file_io", "page_touch", "pingpong", "spin"]

PAGE = mmap.PAGESIZE


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


def file_io(path: str, seconds: float, block: int = 64 << 10, period: float = 0.1) -> int:
    """A light mix for `meridian io --workload`: every `period`, a buffered write and a
    cached read back of `block` bytes; every fifth round an fsync and an O_DIRECT 4 KiB
    read (a disk read, where the file system allows O_DIRECT). Returns operations done."""
    data = os.urandom(block)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        direct: int | None = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        direct = None  # tmpfs and some others refuse O_DIRECT
    buf = mmap.mmap(-1, 4096)
    done = rounds = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            off = (rounds % 64) * block
            os.pwrite(fd, data, off)
            os.pread(fd, block, off)
            done += 2
            if rounds % 5 == 4:
                os.fsync(fd)
                if direct is not None:
                    os.preadv(direct, [buf], off)
                    done += 1
            rounds += 1
            time.sleep(period)
    finally:
        os.close(fd)
        if direct is not None:
            os.close(direct)
    return done


def page_touch(megabytes: int, seconds: float | None = None, rounds: int | None = None) -> int:
    """Touch a fresh private anonymous region of `megabytes` page by page (one write per
    page, so one minor fault each; huge pages are refused with MADV_NOHUGEPAGE), unmap
    it, and again: for `rounds` passes, or until `seconds` have passed (at least one).
    Returns the number of pages touched."""
    size = megabytes << 20
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    end = time.monotonic() + seconds if seconds is not None else None
    touched = done = 0
    while True:
        m = mmap.mmap(-1, size, flags=flags)
        try:
            if hasattr(mmap, "MADV_NOHUGEPAGE"):
                m.madvise(mmap.MADV_NOHUGEPAGE)
            for off in range(0, size, PAGE):
                m[off] = 1
            touched += size // PAGE
        finally:
            m.close()
        done += 1
        if rounds is not None and done >= rounds:
            return touched
        if end is not None and time.monotonic() >= end:
            return touched
        if rounds is None and end is None:
            return touched


def _spin_child(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def spin(workers: int, seconds: float) -> None:
    """`workers` processes, each one busy thread spinning on the CPU for `seconds`.
    SIGTERM stops them all (none is left spinning behind)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            try:
                _spin_child(seconds)
            finally:
                os._exit(0)
        pids.append(pid)
    print(json.dumps({"pids": pids}), flush=True)
    try:
        for pid in pids:
            os.waitpid(pid, 0)
    finally:
        for pid in pids:
            try:
                os.kill(pid, 15)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def pingpong(seconds: float) -> int:
    """Two processes bouncing one byte over a pair of pipes: every round trip is two
    wake-ups and two context switches. Returns round trips done."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            while os.read(a_r, 1) == b"x":
                os.write(b_w, b"x")
        finally:
            os._exit(0)
    trips = 0
    end = time.monotonic() + seconds
    try:
        while True:
            for _ in range(256):
                os.write(a_w, b"x")
                os.read(b_r, 1)
            trips += 256
            if time.monotonic() >= end:
                break
    finally:
        os.write(a_w, b"q")
        os.waitpid(pid, 0)
        for fd in (a_r, a_w, b_r, b_w):
            os.close(fd)
    return trips


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meridian.workloads")
    sub = ap.add_subparsers(dest="name", required=True)
    d = sub.add_parser("direct-io", help="O_DIRECT 4 KiB reads and writes on a temporary file")
    d.add_argument("--seconds", type=float, default=10.0)
    d.add_argument("--dir", default="/var/tmp")
    fi = sub.add_parser("file-io", help="buffered writes, cached reads, fsync, O_DIRECT reads")
    fi.add_argument("--seconds", type=float, default=10.0)
    fi.add_argument("--dir", default="/var/tmp")
    t = sub.add_parser("page-touch", help="touch fresh anonymous memory page by page")
    t.add_argument("--mb", type=int, default=64, help="region size in MiB")
    t.add_argument("--seconds", type=float, help="repeat for this long")
    t.add_argument("--rounds", type=int, help="passes over a fresh region (default 1)")
    t.add_argument("--wait", action="store_true", help="print ready, start on a line of stdin")
    s = sub.add_parser("spin", help="busy processes spinning on the CPU")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--seconds", type=float, default=10.0)
    pp = sub.add_parser("pingpong", help="two processes bouncing a byte over pipes")
    pp.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.name == "page-touch":
        if args.wait:
            print("ready", flush=True)
            sys.stdin.readline()
        rounds = args.rounds if args.rounds or args.seconds else 1
        start, cpu = time.monotonic(), time.process_time()
        pages = page_touch(args.mb, args.seconds, rounds)
        secs, cpu = time.monotonic() - start, time.process_time() - cpu
        result = {"pid": os.getpid(), "pages": pages, "seconds": secs, "cpu_seconds": cpu}
        print(json.dumps(result), flush=True)
    elif args.name == "spin":
        spin(args.workers, args.seconds)
    elif args.name == "pingpong":
        trips = pingpong(args.seconds)
        print(json.dumps({"round_trips": trips}), flush=True)
    if args.name in ("file-io", "direct-io"):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the file is removed
        fd, path = tempfile.mkstemp(prefix="meridian-io-", dir=args.dir)
        os.close(fd)
        try:
            (file_io if args.name == "file-io" else direct_io)(path, args.seconds)
        except KeyboardInterrupt:
            pass
        finally:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
