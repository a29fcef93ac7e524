"""The Syscall event: one start or end of a system call, as in Mortadelo's
syscall.cs, or (in the compact log) a start and its end merged into one row.

-1 means "unknown" for every index. A start has have_result False; an end has the
result (except calls that never return). `args` are already decoded to text; `paths`
are the path strings among them (for path filters) and `raw` keeps the raw values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["NO_RETURN", "Syscall"]

# Calls that do not return to the caller: their start stays open. rt_sigreturn goes
# back to the code the signal interrupted, and its end is never seen: restoring the
# signal frame sets the syscall number the exit hook reads to -1.
NO_RETURN = frozenset({"exit", "exit_group", "rt_sigreturn"})


@dataclass(eq=True)
class Syscall:
    index: int
    name: str
    timestamp_ns: int  # wall clock, ns since the epoch
    comm: str
    pid: int
    tid: int
    args: tuple[str, ...] = ()
    result: int = 0
    have_result: bool = False
    is_start: bool = False
    is_end: bool = False
    start_index: int = -1
    end_index: int = -1
    paths: tuple[str, ...] = ()
    fd_path: str = ""  # the path of the fd argument, resolved in the kernel
    result_text: str = ""  # decoded result ("3", "-2 ENOENT", "0x7f..."), "" if none
    duration_ns: int = -1  # compact rows: end - start; -1 when unknown
    raw: tuple[int, ...] = field(default=(), compare=False)
    # the text fields joined, for text filters (filters.TextFilter); None: not built
    # yet, or the row changed since (whoever changes a row after it is logged clears it)
    hay: str | None = field(default=None, compare=False, repr=False)

    def copy(self) -> Syscall:
        """A shallow copy (faster than dataclasses.replace on the hot path, and a copied
        __dict__ twice as fast as an updated one)."""
        new = object.__new__(Syscall)
        new.__dict__ = self.__dict__.copy()
        return new

    @property
    def arguments(self) -> str:
        return ", ".join(self.args)

    @property
    def failed(self) -> bool:
        return self.have_result and -4095 <= self.result < 0

    @property
    def no_return(self) -> bool:
        """A start that will never get an end: exit, exit_group, rt_sigreturn."""
        return self.name in NO_RETURN

    @property
    def is_open(self) -> bool:
        """A start (or compact row) whose end has not been seen."""
        return self.is_start and self.end_index == -1
