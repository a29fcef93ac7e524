"""A slow disk for alert tests: a loop device whose backing file lives on a FUSE file
system that sleeps before answering each read. This VM has no dm-delay, null_blk, nbd
or ublk; FUSE works (CONFIG_FUSE_FS=y, /dev/fuse), through libfuse 3 (Debian's
libfuse3-3) and mfusepy (PyPI).

Run as a script, it serves at MOUNTPOINT, until unmounted, one file, disk.img, held in
memory, and a control file, delay: a read of disk.img sleeps the seconds last written
to delay (0 at first, so that mkfs and mount are quick); writes never sleep.
`direct_io`: no page cache on the FUSE side, so every read of the loop device reaches
the sleep, however often its pages were read before."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NAME = "disk.img"
DELAY = "delay"


def serve(mountpoint: str, size: int) -> None:
    import mfusepy  # type: ignore[import-untyped]

    data = bytearray(size)
    delay = [0.0]
    lock = threading.Lock()  # libfuse's threads write the one buffer

    class SlowFile(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            now = time.time_ns()
            times = {"st_atime": now, "st_mtime": now, "st_ctime": now}
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, **times}
            if path == "/" + NAME:
                return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": size, **times}
            if path == "/" + DELAY:
                return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": 0, **times}
            raise mfusepy.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", NAME, DELAY]

        def read(self, path: str, length: int, offset: int, fh: int) -> bytes:
            if path != "/" + NAME:
                return b""
            time.sleep(delay[0])
            return bytes(data[offset : offset + length])

        def write(self, path: str, buf: bytes, offset: int, fh: int) -> int:
            if path == "/" + DELAY:
                delay[0] = float(buf)
            else:
                with lock:
                    data[offset : offset + len(buf)] = buf
            return len(buf)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            return 0  # disk.img's size is fixed; delay is truncated when written

    mfusepy.FUSE(SlowFile(), mountpoint, foreground=True, direct_io=True)


class SlowLoop:
    """/dev/loopN over disk.img; `slow(seconds)` sets the delay of its reads."""

    def __init__(self, device: str, control: Path):
        self.device = device
        self.name = Path(device).name
        self._control = control

    def slow(self, seconds: float) -> None:
        self._control.write_text(f"{seconds}")


@contextlib.contextmanager
def slow_loop_device(root: Path, size: int) -> Iterator[SlowLoop]:
    """A SlowLoop of `size` bytes, its FUSE file system mounted at root/fuse; detached
    and unmounted at the end."""
    mnt = root / "fuse"
    mnt.mkdir()
    args = [sys.executable, __file__, str(mnt), str(size)]
    server = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            assert server.poll() is None, f"slowdisk exited: {server.communicate()[1]}"
            assert time.monotonic() < deadline, "slowdisk did not mount in 10 s"
            time.sleep(0.05)
        device = subprocess.run(
            ["losetup", "--find", "--show", str(mnt / NAME)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        try:
            yield SlowLoop(device, mnt / DELAY)
        finally:
            subprocess.run(["losetup", "-d", device], check=False)
            # the detach waits for the last user of the device; the file system
            # cannot be unmounted while the device holds its file
            backing = Path("/sys/block", Path(device).name, "loop", "backing_file")
            deadline = time.monotonic() + 10
            while backing.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)  # ends the server's loop
        try:
            server.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
