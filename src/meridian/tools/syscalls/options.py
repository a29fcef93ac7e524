"""What the user asked of `meridian syscalls` (the command line as one value, from
`cli.options_from_args`), and the filters built from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .filters import (
    Filter,
    PathFilter,
    PidFilter,
    ResultFilter,
    SyscallFilter,
    TextFilter,
    all_of,
)
from .numbers import FILE_SYSCALLS
from .recording_file import is_jsonl_name

__all__ = ["COMM_LEN", "Options", "build_filter"]

COMM_LEN = 16  # SYSCALLS_COMM_LEN in bpf/syscalls.h


@dataclass
class Options:
    names: list[str] = field(default_factory=list)  # -e: the traced set ([] = file syscalls)
    all: bool = False
    pids: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    follow: bool = True
    full: bool = False
    json: bool = False
    summary: bool = False  # -c: calls, errors and time per syscall, no rows
    write: str | None = None
    record_format: str | None = None  # "raw" | "jsonl"; None: by the file name
    quiet: bool = False  # -q with -w: record only, no view (as perf record)
    read: str | None = None
    text: str | None = None
    regex: bool = False
    comm: str | None = None
    path: str | None = None
    failed: bool = False
    errnos: list[str] = field(default_factory=list)
    duration: float | None = None
    strategy: str | None = None
    ring_mb: int = 16
    cgroup: tuple[int, int] | None = None  # --cgroup, --container, --pod: (id, depth)
    max_rows: int = 200_000  # live views: events kept in memory (open calls always are)
    tui: bool = False
    verbose: bool = False

    def traced_names(self) -> frozenset[str]:
        return frozenset(self.names) if self.names else FILE_SYSCALLS

    def raw_recording(self) -> bool:
        if self.record_format is not None:
            return self.record_format == "raw"
        return self.write is not None and not is_jsonl_name(self.write)

    def kernel_comm(self) -> tuple[bytes, bool] | None:
        """--comm as the kernel matches it (a substring, ASCII case folded when the
        pattern is all lower case), or None when user space alone can (a regex, a
        pattern longer than a process name)."""
        c = self.comm
        if not c or self.regex or len(c.encode()) >= COMM_LEN or not c.isascii():
            return None
        return c.encode(), c == c.lower()


def build_filter(opts: Options, replay: bool) -> Filter | None:
    """The filters asked for; in replay, -e and -p filter the recording too."""
    parts: list[Filter] = []
    if opts.text:
        parts.append(TextFilter(opts.text, opts.regex))
    if opts.comm:
        parts.append(TextFilter(opts.comm, opts.regex, fields=("comm",)))
    if opts.path:
        parts.append(PathFilter(opts.path, opts.regex))
    if opts.failed or opts.errnos:
        parts.append(ResultFilter(opts.errnos))
    if replay and opts.names:
        parts.append(SyscallFilter(opts.names))
    if replay and opts.pids:
        parts.append(PidFilter(opts.pids))
    return all_of(parts)
