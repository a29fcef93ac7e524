"""x86_64 system call numbers, the default file-system set, and name lookup with
close matches for `-e` mistakes."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from ...errors import UsageError
from ._x86_64 import X86_64
from .signatures import SIGNATURES

__all__ = ["BY_NAME", "FILE_SYSCALLS", "NUMBERS", "generate", "resolve_names"]

NUMBERS: dict[int, str] = X86_64
BY_NAME: dict[str, int] = {name: nr for nr, name in NUMBERS.items()}

# The file-system syscalls of the issue: every call with a signature that exists here.
FILE_SYSCALLS: frozenset[str] = frozenset(n for n in SIGNATURES if n in BY_NAME)

_DEFINE = re.compile(r"^#define __NR_(\w+)\s+(\d+)\s*$", re.M)


def generate(header_text: str) -> dict[int, str]:
    """The table from <asm/unistd_64.h> text (how _x86_64.py was made)."""
    return {int(nr): name for name, nr in _DEFINE.findall(header_text)}


def resolve_names(names: Iterable[str]) -> list[str]:
    """Validate syscall names; an unknown one raises UsageError with close matches."""
    out = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name not in BY_NAME:
            close = difflib.get_close_matches(name, list(BY_NAME), n=4, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"unknown syscall {name!r}{hint}")
        out.append(name)
    return out
