"""Output arguments as strace prints them: the bytes the kernel program read at a
successful exit from the user pointer a call fills in (bpf/syscalls_out.bpf.h, enum
syscalls_out: the pieces back to back) to `[3, 4]` for an fd pair and
`{st_mode=S_IFREG|0644, st_size=123, ...}` for a stat buffer. Pure functions."""

from __future__ import annotations

import struct

__all__ = ["file_mode", "output_text"]

_S_IFMT = 0o170000
_FILE_TYPES = {
    0o140000: "S_IFSOCK",
    0o120000: "S_IFLNK",
    0o100000: "S_IFREG",
    0o060000: "S_IFBLK",
    0o040000: "S_IFDIR",
    0o020000: "S_IFCHR",
    0o010000: "S_IFIFO",
}
_SPECIAL = ((0o4000, "S_ISUID"), (0o2000, "S_ISGID"), (0o1000, "S_ISVTX"))


def file_mode(mode: int) -> str:
    """`S_IFREG|0644`, `S_IFDIR|S_ISVTX|0777`, as strace prints st_mode."""
    parts = []
    ftype = mode & _S_IFMT
    if ftype:
        parts.append(_FILE_TYPES.get(ftype, f"{ftype:#o}"))
    parts += [name for bit, name in _SPECIAL if mode & bit]
    parts.append(f"0{mode & 0o777:03o}")
    return "|".join(parts)


def output_text(kind: str, data: bytes) -> str | None:
    """The text of output `kind` (signatures.OUT_KINDS) from the kernel's bytes, None
    when they are not what that kind sends (then the address is shown)."""
    if kind == "fds" and len(data) == 8:
        a, b = struct.unpack("<ii", data)
        return f"[{a}, {b}]"
    if kind == "statbuf" and len(data) == 12:
        mode, size = struct.unpack("<Iq", data)
        return f"{{st_mode={file_mode(mode)}, st_size={size}, ...}}"
    if kind == "statxbuf" and len(data) == 10:
        mode, size = struct.unpack("<HQ", data)
        return f"{{stx_mode={file_mode(mode)}, stx_size={size}, ...}}"
    return None
