"""BTF, read from raw bytes: the layouts of records, keys and globals, so Python
decodes exactly what the C header declares (no offsets typed twice by hand).

Pure functions of bytes; the format is the kernel's Documentation/bpf/btf.rst.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Btf", "BtfFormatError", "BtfType"]

BTF_MAGIC = 0xEB9F
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_FWD, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT = 7, 8, 9, 10, 11
KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_FLOAT = 12, 13, 14, 15, 16
KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 17, 18, 19
_QUALIFIERS = {KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG}
INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4


class BtfFormatError(ValueError):
    pass


@dataclass
class BtfType:
    kind: int
    name: str
    size_or_type: int
    kind_flag: bool
    # INT: (encoding, bit offset, bits); ARRAY: (elem type, index type, nelems)
    info: tuple[int, ...] = ()
    # STRUCT/UNION: (name, type, bit offset, bitfield size); ENUM: (name, value);
    # DATASEC: (var type, offset, size); FUNC_PROTO: (name, type)
    members: list[tuple[object, ...]] = field(default_factory=list)


class Btf:
    """The types of one BTF blob, indexed by id (0 is void) and by name."""

    def __init__(self, raw: bytes) -> None:
        if len(raw) < 24:
            raise BtfFormatError("BTF blob shorter than its header")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", raw, 0)
        if magic != BTF_MAGIC:
            raise BtfFormatError(f"bad BTF magic {magic:#x}")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", raw, 8)
        self._strings = raw[hdr_len + str_off : hdr_len + str_off + str_len]
        self.types: list[BtfType] = [BtfType(0, "void", 0, False)]
        self._parse(raw[hdr_len + type_off : hdr_len + type_off + type_len])
        self._by_name: dict[tuple[str, int], int] = {}
        for tid, t in enumerate(self.types):
            if t.name:
                self._by_name.setdefault((t.name, t.kind), tid)

    def _str(self, off: int) -> str:
        end = self._strings.index(b"\0", off)
        return self._strings[off:end].decode()

    def _parse(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            name_off, info, size_or_type = struct.unpack_from("<III", data, pos)
            pos += 12
            vlen = info & 0xFFFF
            kind = (info >> 24) & 0x1F
            t = BtfType(kind, self._str(name_off), size_or_type, bool(info >> 31))
            if kind == KIND_INT:
                (enc,) = struct.unpack_from("<I", data, pos)
                t.info = ((enc >> 24) & 0xF, (enc >> 16) & 0xFF, enc & 0xFF)
                pos += 4
            elif kind == KIND_ARRAY:
                t.info = struct.unpack_from("<III", data, pos)
                pos += 12
            elif kind in (KIND_STRUCT, KIND_UNION):
                for _ in range(vlen):
                    m_name, m_type, m_off = struct.unpack_from("<III", data, pos)
                    bits, off = (m_off >> 24, m_off & 0xFFFFFF) if t.kind_flag else (0, m_off)
                    t.members.append((self._str(m_name), m_type, off, bits))
                    pos += 12
            elif kind == KIND_ENUM:
                for _ in range(vlen):
                    e_name, e_val = struct.unpack_from("<Ii", data, pos)
                    t.members.append((self._str(e_name), e_val))
                    pos += 8
            elif kind == KIND_ENUM64:
                for _ in range(vlen):
                    e_name, lo, hi = struct.unpack_from("<III", data, pos)
                    t.members.append((self._str(e_name), (hi << 32) | lo))
                    pos += 12
            elif kind == KIND_FUNC_PROTO:
                for _ in range(vlen):
                    p_name, p_type = struct.unpack_from("<II", data, pos)
                    t.members.append((self._str(p_name), p_type))
                    pos += 8
            elif kind in (KIND_VAR, KIND_DECL_TAG):
                pos += 4
            elif kind == KIND_DATASEC:
                for _ in range(vlen):
                    t.members.append(struct.unpack_from("<III", data, pos))
                    pos += 12
            elif kind not in (KIND_PTR, KIND_FWD, KIND_FUNC, KIND_FLOAT) and (
                kind not in _QUALIFIERS
            ):
                raise BtfFormatError(f"unknown BTF kind {kind}")
            self.types.append(t)

    # ---- lookups ------------------------------------------------------------------

    def find(self, name: str, kind: int) -> int:
        try:
            return self._by_name[(name, kind)]
        except KeyError:
            raise KeyError(f"no BTF type {name!r} of kind {kind}") from None

    def resolve(self, tid: int) -> int:
        """Skip typedefs and qualifiers."""
        while self.types[tid].kind in _QUALIFIERS:
            tid = self.types[tid].size_or_type
        return tid

    def size(self, tid: int) -> int:
        t = self.types[self.resolve(tid)]
        if t.kind == KIND_ARRAY:
            return self.size(t.info[0]) * t.info[2]
        if t.kind == KIND_PTR:
            return 8
        return t.size_or_type

    def enum(self, name: str) -> dict[str, int]:
        try:
            tid = self.find(name, KIND_ENUM)
        except KeyError:
            tid = self.find(name, KIND_ENUM64)
        return {str(m[0]): _int(m[1]) for m in self.types[tid].members}

    def datasec(self, name: str) -> dict[str, tuple[int, int, int]]:
        """Variables of a data section: name -> (offset, size, type id)."""
        sec = self.types[self.find(name, KIND_DATASEC)]
        out = {}
        for member in sec.members:
            var_tid, off, size = map(_int, member)
            var = self.types[var_tid]
            out[var.name] = (off, size, var.size_or_type)
        return out

    # ---- numpy dtypes -------------------------------------------------------------

    def struct_dtype(self, name: str) -> np.dtype[np.void]:
        return self.dtype(self.find(name, KIND_STRUCT))  # type: ignore[return-value]

    def dtype(self, tid: int) -> np.dtype[np.generic]:
        tid = self.resolve(tid)
        t = self.types[tid]
        if t.kind == KIND_INT:
            enc, _, bits = t.info
            if enc & INT_BOOL:
                return np.dtype("?")
            signed = "i" if enc & INT_SIGNED else "u"
            return np.dtype(f"<{signed}{bits // 8}")
        if t.kind in (KIND_ENUM, KIND_ENUM64):
            signed = "i" if t.kind_flag else "u"
            return np.dtype(f"<{signed}{t.size_or_type}")
        if t.kind == KIND_PTR:
            return np.dtype("<u8")
        if t.kind == KIND_FLOAT:
            return np.dtype(f"<f{t.size_or_type}")
        if t.kind == KIND_ARRAY:
            elem_tid, _, n = t.info
            elem = self.types[self.resolve(elem_tid)]
            if (
                elem.kind == KIND_INT
                and elem.size_or_type == 1
                and (elem.info[0] & INT_CHAR or elem.name == "char")
            ):
                return np.dtype(f"S{n}")  # C strings decode as bytes
            return np.dtype((self.dtype(elem_tid), (n,)))
        if t.kind == KIND_STRUCT:
            names: list[str] = []
            formats: list[np.dtype[Any]] = []
            offsets: list[int] = []
            for member in t.members:
                m_name, m_type, bit_off, bits = (str(member[0]), *map(_int, member[1:]))
                if bits or bit_off % 8:
                    raise BtfFormatError(f"{t.name}.{m_name}: bitfields cannot be decoded")
                m_dt = self.dtype(m_type)
                if m_dt.itemsize == 0:
                    continue  # flexible array member
                names.append(m_name or f"_anon{len(names)}")
                formats.append(m_dt)
                offsets.append(bit_off // 8)
            return np.dtype(
                {"names": names, "formats": formats, "offsets": offsets, "itemsize": t.size_or_type}
            )
        if t.kind == KIND_UNION:
            return np.dtype(f"V{t.size_or_type}")
        raise BtfFormatError(f"type {t.name or tid} (kind {t.kind}) has no numpy dtype")


def _int(x: object) -> int:
    assert isinstance(x, int)
    return x
