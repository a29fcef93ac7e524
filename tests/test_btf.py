"""BTF decoding: a hand-built blob (no kernel, no compiler), and the real objects."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from meridian.bpf import object_path
from meridian.bpf.btf import Btf, BtfFormatError


def blob() -> bytes:
    """BTF for: struct rec { __u32 pid; char comm[4]; __u64 ns; }; enum op { R, W=5 };"""
    strings = b"\0unsigned int\0char\0unsigned long long\0rec\0pid\0comm\0ns\0op\0R\0W\0"

    def s(name: str) -> int:
        return strings.index(b"\0" + name.encode() + b"\0") + 1

    types = b""
    types += struct.pack("<IIII", s("unsigned int"), 1 << 24, 4, 32)  # 1: u32
    types += struct.pack("<IIII", s("char"), 1 << 24, 1, (1 << 24) | 8)  # 2: char (signed)
    types += struct.pack("<IIII", s("unsigned long long"), 1 << 24, 8, 64)  # 3: u64
    types += struct.pack("<III", 0, 3 << 24, 0) + struct.pack("<III", 2, 1, 4)  # 4: char[4]
    types += struct.pack("<III", s("rec"), (4 << 24) | 3, 16)  # 5: struct rec
    types += struct.pack("<III", s("pid"), 1, 0)
    types += struct.pack("<III", s("comm"), 4, 32)
    types += struct.pack("<III", s("ns"), 3, 64)
    types += struct.pack("<III", s("op"), (6 << 24) | 2, 4)  # 6: enum op
    types += struct.pack("<Ii", s("R"), 0) + struct.pack("<Ii", s("W"), 5)
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings


def test_struct_dtype_has_the_c_offsets() -> None:
    dt = Btf(blob()).struct_dtype("rec")
    assert dt.names == ("pid", "comm", "ns")
    assert dt.fields is not None
    assert [dt.fields[n][1] for n in ("pid", "comm", "ns")] == [0, 4, 8]
    assert dt.itemsize == 16
    rec = np.frombuffer(struct.pack("<I4sQ", 42, b"dd\0\0", 7), dtype=dt)[0]
    assert (rec["pid"], rec["comm"], rec["ns"]) == (42, b"dd", 7)


def test_enum_values() -> None:
    assert Btf(blob()).enum("op") == {"R": 0, "W": 5}


def test_bad_magic_is_rejected() -> None:
    with pytest.raises(BtfFormatError):
        Btf(b"\0" * 32)


def test_biolat_records_decode_from_the_object_btf() -> None:
    """The object's own BTF gives the layouts of biolat.h (opening needs no root)."""
    path = object_path("biolat")
    if not path.exists():
        pytest.skip("BPF objects not built")
    from meridian.bpf import BpfObject

    with BpfObject(path) as obj:
        assert obj.btf is not None
        ev = obj.btf.struct_dtype("biolat_event")
        assert {"ts_ns", "latency_ns", "dev", "bytes", "pid", "comm", "rwbs", "op"} <= set(
            ev.names or ()
        )
        assert ev["comm"] == np.dtype("S16")
        assert obj.maps["hists"].key_dtype.names == ("dev", "op", "kind", "slot")
        assert obj.maps["hists"].value_dtype["buckets"].shape == (464,)  # BIOLAT_BUCKETS
        assert obj.maps["sizes"].key_dtype.names == ("dev", "op", "bytes")
        assert obj.btf.enum("biolat_op")["BIOLAT_OP_WRITE"] == 1
        assert "slow_ns" in obj.btf.datasec(".rodata")
