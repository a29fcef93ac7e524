"""The live capture loops of `meridian syscalls`: `capture()` drains the ring into the
recording (-w) and the plain view; `CaptureFeed` does it for the terminal UI, from a
drain thread when recording. Ctrl-C ends a capture with everything drained shown."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from ...errors import MeridianError
from ...signals import signals_held
from .event import Syscall
from .jsonl_spool import SpooledJsonRecorder
from .kernel import Capture
from .launcher import Launcher
from .options import Options
from .plain_view import Pipeline, summary
from .recording_file import Recorder
from .view_backlog import BACKLOG_BYTES, VIEW_SLICE, Backlog

__all__ = ["CaptureFeed", "capture", "capture_tui"]


def capture(opts: Options, out: TextIO, err: TextIO) -> int:
    """Trace until the command or every process asked for exits, --duration passes
    or Ctrl-C; print each row once it is complete, then the summary line. Returns
    the command's exit status."""
    with Capture(opts) as cap:
        if opts.verbose:
            print(f"strategy: {cap.strategy.name}", file=err)
            print(f"fd path cache: {cap.path_cache_text()}", file=err)
        live = _PlainCapture(opts, cap, Pipeline(opts, out))
        try:
            try:
                live.start(err)
                live.drain()
            except KeyboardInterrupt:  # from the moment it traces: what it traced, shown
                live.take(0)
            return live.finish(err)
        finally:
            live.close()


class _PlainCapture:
    """A live capture for the plain views. With -w the ring is drained into the
    recording and a backlog the view works through a slice of time at a time, so a
    slow view never makes the kernel drop what the recording needs; without it each
    drained chunk is decoded and shown at once."""

    def __init__(self, opts: Options, cap: Capture, pipeline: Pipeline) -> None:
        self.opts = opts
        self.cap = cap
        self.pipeline = pipeline
        self.launcher: Launcher | None = None
        self.recorder: Recorder | None = None
        self.backlog: Backlog | None = None

    def start(self, err: TextIO) -> None:
        """Open the recording, start the command (held until the kernel traces it)."""
        opts = self.opts
        if opts.write:
            self.recorder = self.cap.recorder(opts.write, sys.argv[1:], opts.raw_recording())
            if not opts.quiet:
                self.backlog = Backlog(BACKLOG_BYTES)
        if opts.command:
            self.launcher = Launcher(opts.command, exec_traced(opts))
            self.cap.add_pid(self.launcher.pid)
            self.launcher.go()
        elif not opts.json and not opts.quiet:
            print("Tracing file-system syscalls... Hit Ctrl-C to end.", file=err)

    def take(self, timeout: float) -> None:
        """Drain the ring: to the recording and the view's backlog, or decoded and
        shown at once when nothing is recorded."""
        if self.recorder is None:
            events = self.cap.decode(self.cap.poll_raw(timeout)[0])
            for sc in command_calls(self.launcher, events):
                self.pipeline.add(sc)
            return
        with signals_held():  # drained is recorded and counted, whole
            chunk, n = self.cap.poll_raw(timeout)
            self.recorder.write_raw(chunk, n)
        if self.backlog is not None:
            self.backlog.push(chunk, n)

    def show(self, seconds: float | None) -> None:
        """Let the view work through the backlog for a while (None: all of it)."""
        if self.backlog is None:
            return
        until = None if seconds is None else time.monotonic() + seconds
        while self.backlog and (until is None or time.monotonic() < until):
            for sc in command_calls(self.launcher, self.backlog.take(self.cap, 256)):
                self.pipeline.add(sc)
            self.pipeline.flush()
            self.pipeline.trim()

    def traced_gone(self) -> bool:
        """The command exited, or every process asked for did (as strace -p)."""
        if self.launcher is not None and self.launcher.poll() is not None:
            return True
        pids = self.opts.pids
        return bool(pids) and not any(os.path.exists(f"/proc/{pid}") for pid in pids)

    def drain(self) -> None:
        """Drain and show until the traced are gone or --duration passes (Ctrl-C: see
        `capture`)."""
        end = time.monotonic() + self.opts.duration if self.opts.duration else None
        freeze = time.monotonic()
        while True:
            if time.monotonic() >= freeze:
                # The rows the view holds, out of the collector's full passes, which
                # grow with them past what the ring holds (~80 ms of a full-speed loop
                # in 16 MB): the drain never waits that long.
                gc.freeze()
                freeze = time.monotonic() + 0.25
            done = self.traced_gone()
            self.take(0 if done or self.backlog else 0.05)
            self.show(VIEW_SLICE)
            self.pipeline.flush()
            self.pipeline.trim()
            if done or (end is not None and time.monotonic() >= end):
                break

    def finish(self, err: TextIO) -> int:
        """The capture is over: its counters, then nothing runs or is traced while the
        view catches up and a JSON lines recording is converted (a ring that nobody
        reads would count drops that are not the capture's); the summary line. Returns
        the command's exit status."""
        counters = self.cap.counters()
        status = 0
        if self.launcher is not None:
            code = self.launcher.poll() or 0
            status = 128 - code if code < 0 else code  # killed by a signal: 128 + signo
            self.launcher.kill()
        assert self.cap.obj is not None
        self.cap.obj.detach()
        self.show(None)
        self.pipeline.finish()
        unconverted: MeridianError | None = None
        if isinstance(self.recorder, SpooledJsonRecorder):
            try:
                self.recorder.close(err)
            except MeridianError as exc:
                unconverted = exc  # the spool is kept: the summary still counts
        not_shown = self.backlog.skipped if self.backlog is not None else 0
        self.pipeline.print_counts(counters, not_shown)
        summary(self.pipeline, counters, err, not_shown, self.recorder)
        if unconverted is not None:
            raise unconverted
        return status

    def close(self) -> None:
        """Whatever happened: the command killed, the recording closed."""
        if self.launcher is not None:
            self.launcher.kill()
        if self.recorder is not None:
            self.recorder.close()


def exec_traced(opts: Options) -> bool:
    """Whether the launcher's exec is traced, which marks where the command's calls start."""
    return opts.all or "execve" in opts.traced_names()


def command_calls(launcher: Launcher | None, events: list[Syscall]) -> list[Syscall]:
    """The events, less the launcher's own calls before its exec (if it is there)."""
    return events if launcher is None else launcher.command_calls(events)


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
                launcher = Launcher(opts.command, exec_traced(opts))
                cap.add_pid(launcher.pid)
                launcher.go()
            feed = CaptureFeed(cap, recorder, launcher)
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

    def __init__(
        self, cap: Capture, recorder: Recorder | None, launcher: Launcher | None = None
    ) -> None:
        self.cap = cap
        self.recorder = recorder
        self.launcher = launcher
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
            return command_calls(self.launcher, self.cap.decode(self.cap.poll_raw(0)[0]))
        if self._error is not None:
            raise self._error
        out: list[Syscall] = []
        until = time.monotonic() + VIEW_SLICE
        with self._lock:
            while self.backlog and time.monotonic() < until:
                out += self.backlog.take(self.cap, 256)
        return command_calls(self.launcher, out)

    def counters(self) -> dict[str, int]:
        out = self.cap.counters()
        if self._thread is not None:
            out["not_shown"] = self.backlog.skipped
        return out
