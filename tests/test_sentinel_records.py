"""Sample and LBR layouts come from the object's BTF and match bpf/sentinel.h as a
compiler lays it out; event ids mirror enum ms_event."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from bpfbuild import compile_bpf

from meridian.bpf import BpfObject, object_path
from meridian.tools.sentinel.agent.run import RECORD_BYTES, ring_bytes
from meridian.tools.sentinel.model import records
from meridian.tools.sentinel.model.records import EVENT_NAMES, Event, FlowSource

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
#include "sentinel.h"
struct ms_sample *keep_sample __attribute__((unused));
struct ms_lbr *keep_lbr __attribute__((unused));
enum ms_event keep_event __attribute__((unused));
enum ms_flow_source keep_source __attribute__((unused));
"""


@pytest.fixture(scope="module")
def header_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bpf/sentinel.h alone, compiled to BPF with BTF (independent of sentinel.bpf.c)."""
    if shutil.which("clang") is None:
        pytest.skip("clang not installed")
    tmp = tmp_path_factory.mktemp("sentinel_h")
    src = tmp / "probe.bpf.c"
    src.write_text(PROBE)
    out = compile_bpf(src, tmp / "probe.bpf.o")
    return out


def test_the_header_layout(header_object: Path) -> None:
    sample, lbr = records.load_dtypes(header_object)
    assert sample.itemsize == 80
    assert sample.fields is not None
    offsets = {name: sample.fields[name][1] for name in ("time_ns", "flow_id", "pid", "event")}
    assert offsets == {"time_ns": 0, "flow_id": 24, "pid": 40, "event": 64}
    assert sample["user_stack_id"] == np.dtype("<i4")
    assert lbr.itemsize == 8 + 4 + 4 + 32 * 16
    assert lbr["entries"].shape == (32,)


def test_sample_dtype_reads_the_built_object(header_object: Path) -> None:
    """The cached dtypes are the real object's, and equal the header's."""
    if not object_path(records.OBJECT).exists():
        pytest.skip("sentinel.bpf.o not built (make bpf)")
    assert records.sample_dtype() == records.load_dtypes(header_object)[0]
    assert records.lbr_dtype() == records.load_dtypes(header_object)[1]
    assert records.sample_dtype() is records.sample_dtype()  # cached


def test_enums_mirror_the_header(header_object: Path) -> None:
    obj = BpfObject(header_object)
    try:
        assert obj.btf is not None
        events = obj.btf.enum("ms_event")
        sources = obj.btf.enum("ms_flow_source")
    finally:
        obj.close()
    assert {e.name: e.value for e in Event} == {
        k.removeprefix("MS_EVT_"): v for k, v in events.items()
    }
    assert [s.value for s in FlowSource] == sorted(sources.values())
    assert len(EVENT_NAMES) == len(Event)
    assert EVENT_NAMES[Event.LLC_MISS] == "llc-misses"
    assert EVENT_NAMES[Event.XSNP_HITM] == "hitm"


def test_decode_a_batch_without_a_python_call_per_record() -> None:
    if not object_path(records.OBJECT).exists():
        pytest.skip("sentinel.bpf.o not built (make bpf)")
    batch = records.empty_samples(3)
    assert batch["gso_segs"].tolist() == [1, 1, 1]
    batch["pid"] = [1, 2, 3]
    batch["flow_id"] = 0xFFFF_FFFF_FFFF_FFFF
    back = records.decode_samples(batch.tobytes())
    assert back["pid"].tolist() == [1, 2, 3]
    assert int(back["flow_id"][2]) == 0xFFFF_FFFF_FFFF_FFFF
    assert len(records.decode_lbr(records.empty_lbr(2).tobytes())) == 2


def test_take_concat_copy_as_numpy() -> None:
    """take/concat/copy_records move whole records: the same bytes as numpy's own."""
    from meridian.tools.sentinel.model.records import concat, copy_records, take
    from meridian.tools.sentinel.sources.mock import make_samples

    a = make_samples(10, cpu=np.arange(10), time_ns=np.arange(10) * 7, pid=3)
    mask = a["cpu"] % 3 == 0
    assert take(a, mask).tobytes() == a[mask].tobytes()
    assert take(a, np.array([4, 1])).tobytes() == a[[4, 1]].tobytes()
    assert concat([a, a[:3]]).tobytes() == np.concatenate([a, a[:3]]).tobytes()
    assert concat([a[:0]]).dtype == a.dtype
    c = copy_records(a)
    c["pid"] = 9
    assert (a["pid"] == 3).all() and c.dtype == a.dtype


def test_the_ring_holds_three_seconds_of_samples() -> None:
    # struct ms_sample and its 8-byte ring header fit the record size the ring is
    # sized by; three seconds at 100,000 samples/s, within the 4-64 MiB bounds
    assert records.sample_dtype().itemsize + 8 <= RECORD_BYTES
    assert ring_bytes(100_000) == 32 << 20 >= 3 * 100_000 * RECORD_BYTES
    assert ring_bytes(1_000) == 4 << 20  # the smallest
