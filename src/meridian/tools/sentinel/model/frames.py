"""A resolved address, `Frame`: what the symbolizer makes, storage writes and people
read. Its own module so that the readers (storage, views) need not load the
symbolizer's machinery."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["JIT", "KERNEL", "KERNEL_START", "UNKNOWN", "Frame"]

UNKNOWN = "[unknown]"
KERNEL = "[kernel]"
JIT = "[jit]"
# Every kernel text address on 64-bit Linux lies in the upper half (x86-64, arm64).
KERNEL_START = 1 << 63


@dataclass(frozen=True, slots=True)
class Frame:
    """One resolved address. `offset` is from the function's start when `function` is
    a symbol; for "[unknown]" it is the address inside `binary` (its ELF address, or
    the file offset), so `binary+offset` still finds the code later. `file` and `line`
    come from DWARF when the binary carries a line table (of at most 16 MiB), else ""
    and 0. `addr` is the runtime address this frame was made from: it does not take
    part in equality, so the same code in two processes (or two ASLR layouts) is one
    frame.
    """

    binary: str
    function: str
    file: str
    line: int
    addr: int = field(compare=False)
    offset: int = 0

    def __str__(self) -> str:
        where = os.path.basename(self.binary) if self.binary.startswith("/") else self.binary
        if self.function == KERNEL:
            return KERNEL  # kallsyms hidden: no offset worth showing
        if self.function == UNKNOWN:
            return f"{UNKNOWN} ({where}+{self.offset:#x})" if where else UNKNOWN
        text = f"{self.function}+{self.offset:#x}"
        if where and where != self.function:
            text += f" ({where})"
        return f"{text} {self.file}:{self.line}" if self.line else text
