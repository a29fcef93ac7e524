"""The live capture loops of `meridian syscalls`: `capture()` drains the ring into the
recording (-w) and the plain view; `CaptureFeed` does it for the terminal UI, from a
drain thread when recording. Ctrl-C ends a capture with everything drained shown."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from ...errors import MeridianError
from .backlog import BACKLOG_BYTES, VIEW_SLICE, Backlog
from .kernel import Capture
from .launcher import Launcher
from .options import Options
from .record import Syscall
from .recording import Recorder
from .spool import SpooledJsonRecorder
from .text import Pipeline, summary

__all__ = ["CaptureFeed", "capture", "capture_tui", "signals_held"]


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends (then interrupt as usual)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def capture(opts: Options, out: TextIO, err: TextIO) -> int:
    launcher: Launcher | None = None
    recorder: Recorder | None = None
    p = Pipeline(opts, out)
    status = 0
    backlog: Backlog | None = None
    with Capture(opts) as cap:
        if opts.verbose:
            print(f"strategy: {cap.strategy.name}", file=err)

        def take(timeout: float) -> int:
            """Drain the ring: to the recording and the view's backlog, or decoded
            and shown at once when nothing is recorded. Returns the bytes drained."""
            if recorder is not None:
                with signals_held():  # drained is recorded and counted, whole
                    chunk, n = cap.poll_raw(timeout)
                    recorder.write_raw(chunk, n)
                if backlog is not None:
                    backlog.push(chunk, n)
                return len(chunk)
            chunk, n = cap.poll_raw(timeout)
            for sc in cap.decode(chunk):
                p.add(sc)
            return len(chunk)

        def show(seconds: float | None) -> None:
            """Let the view work through the backlog for a while (None: all of it)."""
            if backlog is None:
                return
            until = None if seconds is None else time.monotonic() + seconds
            while backlog and (until is None or time.monotonic() < until):
                rows = backlog.take(cap, 256)
                for sc in rows:
                    p.add(sc)
                p.flush()
                p.trim()

        try:
            if opts.write:
                recorder = cap.recorder(opts.write, sys.argv[1:], opts.raw_recording())
                if not opts.quiet:
                    backlog = Backlog(BACKLOG_BYTES)
            if opts.command:
                launcher = Launcher(opts.command)
                cap.add_pid(launcher.pid)
                launcher.go()
            elif not opts.json and not opts.quiet:
                print("Tracing file-system syscalls... Hit Ctrl-C to end.", file=err)
            end = time.monotonic() + opts.duration if opts.duration else None
            freeze = time.monotonic()
            try:
                while True:
                    if time.monotonic() >= freeze:
                        # The rows the view holds, out of the collector's full passes,
                        # which grow with them past what the ring holds (~80 ms of a
                        # full-speed loop in 16 MB): the drain never waits that long.
                        gc.freeze()
                        freeze = time.monotonic() + 0.25
                    done = launcher is not None and launcher.poll() is not None
                    if opts.pids and not any(os.path.exists(f"/proc/{pid}") for pid in opts.pids):
                        done = True  # every process asked for has exited (as strace -p)
                    take(0 if done or backlog else 0.05)
                    show(VIEW_SLICE)
                    p.flush()
                    p.trim()
                    if done or (end is not None and time.monotonic() >= end):
                        break
            except KeyboardInterrupt:
                take(0)
            # The capture is over: its counters, then nothing runs or is traced while
            # the view catches up and a JSON lines recording is converted (a ring that
            # nobody reads would count drops that are not the capture's).
            counters = cap.counters()
            if launcher is not None:
                code = launcher.poll() or 0
                status = 128 - code if code < 0 else code  # killed by a signal: 128 + signo
                launcher.kill()
            assert cap.obj is not None
            cap.obj.detach()
            show(None)
            p.finish()
            unconverted: MeridianError | None = None
            if isinstance(recorder, SpooledJsonRecorder):
                try:
                    recorder.close(err)
                except MeridianError as exc:
                    unconverted = exc  # the spool is kept: the summary still counts
            not_shown = backlog.skipped if backlog is not None else 0
            summary(p, counters, err, not_shown, recorder)
            if unconverted is not None:
                raise unconverted
        finally:
            if launcher is not None:
                launcher.kill()
            if recorder is not None:
                recorder.close()
    return status


def capture_tui(opts: Options, show: Callable[[CaptureFeed], None]) -> int:
    """The live capture behind the terminal UI: `show(feed)` runs the screen until the
    user quits; then the drain stops, the command is killed, the recording closed."""
    launcher: Launcher | None = None
    recorder: Recorder | None = None
    feed: CaptureFeed | None = None
    with Capture(opts) as cap:
        try:
            if opts.write:
                recorder = cap.recorder(opts.write, sys.argv[1:], opts.raw_recording())
            if opts.command:
                launcher = Launcher(opts.command)
                cap.add_pid(launcher.pid)
                launcher.go()
            feed = CaptureFeed(cap, recorder)
            show(feed)
        finally:
            if feed is not None:
                feed.stop()
            if launcher is not None:
                launcher.kill()
            if isinstance(recorder, SpooledJsonRecorder):
                if cap.obj is not None:
                    cap.obj.detach()  # nothing traced while converting
                recorder.close(sys.stderr)
            elif recorder is not None:
                recorder.close()
    return 0


class CaptureFeed:
    """The live capture as the TUI's feed. With -w a thread drains the ring into the
    recording and a backlog, and the screen takes from the backlog a slice of time per
    poll: the screen's pace never makes the kernel drop what the recording needs."""

    def __init__(self, cap: Capture, recorder: Recorder | None) -> None:
        self.cap = cap
        self.recorder = recorder
        self.backlog = Backlog(BACKLOG_BYTES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # the drain's, raised in poll()
        if recorder is not None:
            self._thread = threading.Thread(target=self._drain, name="drain", daemon=True)
            self._thread.start()

    def _drain(self) -> None:
        assert self.recorder is not None and self.cap.ring is not None
        ring = self.cap.ring
        try:
            while not self._stop.is_set() and not ring.closed:
                chunk, n = self.cap.poll_raw(0.02)
                self.recorder.write_raw(chunk, n)
                with self._lock:
                    self.backlog.push(chunk, n)
        except BaseException as exc:  # e.g. the disk is full: not silent
            self._error = exc

    def stop(self) -> None:
        """End the drain thread (before the recording is closed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def poll(self) -> list[Syscall]:
        if self._thread is None:
            return self.cap.decode(self.cap.poll_raw(0)[0])
        if self._error is not None:
            raise self._error
        out: list[Syscall] = []
        until = time.monotonic() + VIEW_SLICE
        with self._lock:
            while self.backlog and time.monotonic() < until:
                out += self.backlog.take(self.cap, 256)
        return out

    def counters(self) -> dict[str, int]:
        out = self.cap.counters()
        if self._thread is not None:
            out["not_shown"] = self.backlog.skipped
        return out
