"""Tests written against the survivors of mutation testing of sentinel's plain data
(`tools/sentinel/model`: data objects, flows, frames, groups, interference, records,
rollups) (issue 36; docs/testing.md): each pins an exact value that a changed
comparison, bound, default or order would change."""

from __future__ import annotations

import numpy as np
import pytest
from sentinel_values import Array, u64

from meridian.tools.sentinel.model.dataobjects import DataIndex, DataObject, DataObjects
from meridian.tools.sentinel.model.flows import (
    AF_INET,
    AF_INET6,
    FNV_OFFSET,
    FNV_PRIME,
    KEY_SIZE,
    FlowKey,
    FlowNames,
    fnv1a64,
)
from meridian.tools.sentinel.model.frames import JIT, KERNEL, KERNEL_START, UNKNOWN, Frame
from meridian.tools.sentinel.model.groups import group, in_order, row_hash
from meridian.tools.sentinel.model.interference import CLASS_NAMES, InterferenceClass, classify
from meridian.tools.sentinel.model.records import (
    FLOW_HISTORY_NS,
    RACED_STACK_ID,
    Event,
    concat,
    copy_records,
    decode_lbr,
    decode_samples,
    empty_lbr,
    empty_samples,
    event_key,
    lbr_dtype,
    sample_dtype,
    take,
)
from meridian.tools.sentinel.model.rollup import (
    GONE_STACK,
    KEY_DTYPE,
    PROVISIONAL_BASE,
    PROVISIONAL_END,
    ROLLUP_DTYPE,
    SKIPPED_STACK,
    STACK_LABELS,
    UNRESOLVED,
    UNRESOLVED_LABEL,
    Rollup,
    as_rows,
    is_provisional,
    rollups,
)
from meridian.tools.sentinel.sources.mock import make_samples

# ---- model/dataobjects.py --------------------------------------------------------------


def test_data_index_finds_the_innermost_object_up_to_its_last_byte() -> None:
    """Nested objects: an address in the inner one is the inner's, its end and past
    it the outer's; an object without a size is one byte; the longest object sets
    how far below an address the search looks."""
    idx = DataIndex()
    outer = DataObject(1, 7, 0x1000, "outer", None, 0x100)
    inner = DataObject(2, 7, 0x1040, "inner", None, 0x10)
    byte = DataObject(3, 7, 0x2000, "byte")
    for o in (inner, byte, outer):
        idx.add(o)
    assert idx.starts == [0x1000, 0x1040, 0x2000] and idx.longest == 0x100
    assert [idx.find(a) for a in (0xFFF, 0x1000, 0x1040, 0x104F, 0x1050, 0x10FF, 0x1100)] == [
        None, outer, inner, inner, outer, outer, None
    ]  # fmt: skip
    assert (idx.find(0x2000), idx.find(0x2001)) == (byte, None)
    idx.remove(2)
    assert idx.objects == [outer, byte] and idx.starts == [0x1000, 0x2000]
    assert idx.find(0x1048) is outer
    idx.remove(99)  # not there: nothing removed
    assert idx.objects == [outer, byte]
    assert DataIndex().longest == 1 and DataIndex().find(5) is None


def test_data_index_keeps_objects_at_one_address_in_registration_order() -> None:
    """Two objects at one address: the later one is found (bisect_right places it
    after the first)."""
    idx = DataIndex()
    first = DataObject(1, 7, 0x100, "first", None, 8)
    second = DataObject(2, 7, 0x100, "second", None, 8)
    idx.add(first)
    idx.add(second)
    assert idx.objects == [first, second] and idx.find(0x104) is second


def test_data_objects_ids_bound_and_lookup() -> None:
    """Ids count from 1, the same registration has the same id; past max_objects
    the oldest goes (its id and its key forgotten); a process whose last object went
    has none found, another process keeps its own."""
    objs = DataObjects(max_objects=2, max_pending=8)
    k1, k2, k3 = (7, 0x1000, "a", "t", 16), (8, 0x2000, "b", None, None), (7, 0x3000, "c", None, 4)
    assert objs.register(k1) == 1 and objs.register(k1) == 1 and len(objs) == 1
    assert objs.register(k2) == 2 and objs.register(k3) == 3
    assert len(objs) == 2 and objs.get(1) is None
    assert objs.find(7, 0x1000) == 0 and objs.find(7, 0x3003) == 3 and objs.find(8, 0x2000) == 2
    assert objs.get(3) == DataObject(3, 7, 0x3000, "c", None, 4)
    assert objs.register(k1) == 4  # its key went with it: a new registration
    assert [o.object_id for o in objs.objects()] == [3, 4]
    assert objs.find(8, 0x2000) == 0 and objs.find(9, 0x2000) == 0
    assert [o.object_id for o in objs.objects(7)] == [3, 4] and list(objs.objects(8)) == []
    assert DataObjects(0, 1).max_data_objects == 1


def test_data_objects_pending_are_consumed_once_and_bounded() -> None:
    """consume(): the registrations since the last call, at most max_pending (the
    newest), then nothing."""
    objs = DataObjects(max_objects=10, max_pending=2)
    for i in range(3):
        objs.register((1, 0x100 * (i + 1), f"o{i}", None, None))
    assert [o.name for o in objs.consume()] == ["o1", "o2"]
    assert objs.consume() == []


def test_forget_drops_a_processes_lookups_but_keeps_its_ids() -> None:
    """forget(pid): its addresses are found no more and registering again gives a
    new id, but the objects stay readable by id (ids already given stay valid);
    other processes are untouched."""
    objs = DataObjects(max_objects=10, max_pending=8)
    a = objs.register((7, 0x1000, "a", None, 16))
    b = objs.register((8, 0x1000, "b", None, 16))
    objs.forget(7)
    objs.forget(99)  # nothing of it: nothing happens
    assert objs.find(7, 0x1000) == 0 and objs.find(8, 0x1000) == b
    assert objs.get(a) is not None and len(objs) == 2
    assert objs.register((7, 0x1000, "a", None, 16)) == 3
    assert objs.register((8, 0x1000, "b", None, 16)) == b


def test_an_object_pushed_out_after_forget_leaves_its_new_registration_alone() -> None:
    """Registered, forgotten, registered again: when the first registration is pushed
    out by the size limit, the second keeps its id (the same key again gives it, not a
    third id while the second is live)."""
    objs = DataObjects(max_objects=4, max_pending=10)
    assert objs.register((7, 0x1000, "a", None, 16)) == 1
    objs.forget(7)
    assert objs.register((7, 0x1000, "a", None, 16)) == 2
    for i, name in enumerate("xyz"):
        objs.register((8, 0x2000 + 0x100 * i, name, None, 16))  # 3, 4, 5: pushes out 1
    assert objs.get(1) is None and objs.find(7, 0x1000) == 2
    assert objs.register((7, 0x1000, "a", None, 16)) == 2


# ---- model/flows.py --------------------------------------------------------------------


def test_fnv1a64_of_nothing_is_the_offset_basis_and_stays_64_bit() -> None:
    """The empty input hashes to the offset basis; every hash fits in 64 bits."""
    assert fnv1a64(b"") == FNV_OFFSET == 0xCBF29CE484222325
    assert FNV_PRIME == 0x100000001B3
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(bytes(range(256))) < 1 << 64


def test_protocols_by_name_or_number() -> None:
    """Names are case-blind, numbers with a name print as it, others stay numbers,
    and a number given as text is read as one."""
    assert FlowKey("1.1.1.1", "2.2.2.2", 1, 2, "UDP").proto == "udp"
    assert FlowKey("1.1.1.1", "2.2.2.2", 1, 2, 6).proto == "tcp"
    assert FlowKey("1.1.1.1", "2.2.2.2", 1, 2, "17").proto == "udp"
    assert FlowKey("1.1.1.1", "2.2.2.2", 1, 2, "47").proto == 47
    assert FlowKey("1.1.1.1", "2.2.2.2", 1, 2, 132).proto == "sctp"
    icmp = FlowKey("fe80::1", "fe80::2", 0, 0, "icmpv6")
    assert (icmp.proto_number, FlowKey("1.1.1.1", "2.2.2.2", 0, 0, 47).proto_number) == (58, 47)
    assert FlowKey("1.1.1.1", "2.2.2.2", 0, 0, "icmp").proto_number == 1


def test_flow_keys_are_normalised_and_checked() -> None:
    """Addresses as Python prints them, the family from them; a family that does
    not match or mixed versions are refused with their messages."""
    k = FlowKey("2001:DB8::0001", "2001:db8::2", 443, 50000)
    assert (k.src, k.family, k.proto) == ("2001:db8::1", AF_INET6, "tcp")
    assert FlowKey("10.0.0.1", "10.0.0.2", 1, 2, family=AF_INET).family == 2
    with pytest.raises(ValueError, match=r"^flow 10\.0\.0\.1 -> ::1 mixes IPv4 and IPv6$"):
        FlowKey("10.0.0.1", "::1", 1, 2)
    with pytest.raises(ValueError, match=r"^family 10 does not match address 10\.0\.0\.1$"):
        FlowKey("10.0.0.1", "10.0.0.2", 1, 2, family=AF_INET6)


def test_flow_keys_from_bytes_check_size_and_family() -> None:
    """from_bytes round-trips both families and refuses a wrong size or family."""
    v4 = FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012, "udp")
    assert FlowKey.from_bytes(v4.to_bytes()) == v4
    v6 = FlowKey("::1", "fe80::2", 1, 2, 47)
    assert FlowKey.from_bytes(v6.to_bytes()) == v6 and len(v6.to_bytes()) == KEY_SIZE == 40
    with pytest.raises(ValueError, match=r"^a flow key is 40 bytes, got 39$"):
        FlowKey.from_bytes(v4.to_bytes()[:39])
    raw = bytearray(v4.to_bytes())
    raw[37] = 7  # the family byte
    with pytest.raises(ValueError, match=r"^flow key of unknown address family 7$"):
        FlowKey.from_bytes(bytes(raw))


def test_a_reversed_flow_swaps_its_ends_and_prints_ipv6_in_brackets() -> None:
    """reversed() swaps addresses and ports, keeps protocol and family."""
    k = FlowKey("::1", "::2", 10, 20, "udp")
    assert k.reversed() == FlowKey("::2", "::1", 20, 10, "udp")
    assert str(k) == "[::1]:10 -> [::2]:20 udp"
    assert str(FlowKey("1.2.3.4", "5.6.7.8", 1, 2, 47)) == "1.2.3.4:1 -> 5.6.7.8:2 47"


def test_flow_names_drop_the_least_recently_added() -> None:
    """Past max_flows the oldest name goes; adding a name again makes it the newest;
    an unknown id is labelled as 16 hex digits."""
    keys = [FlowKey("10.0.0.1", "10.0.0.2", 1000 + i, 80) for i in range(3)]
    names = FlowNames(max_flows=2)
    assert names.max_flows == 2 and FlowNames().max_flows == 65536
    names.add(keys[:2])
    names.add([keys[0]])  # refreshed
    names.add({keys[2].flow_id: keys[2]})
    assert names.ids() == [keys[0].flow_id, keys[2].flow_id] and len(names) == 2
    assert names.get(keys[1].flow_id) is None
    assert names.label(keys[1].flow_id) == f"{keys[1].flow_id:016x}"
    assert names.label(0xAB) == "00000000000000ab"
    assert names.label(keys[0].flow_id) == "10.0.0.1:1000 -> 10.0.0.2:80 tcp"


# ---- model/frames.py -------------------------------------------------------------------


def test_frames_print_as_people_read_them() -> None:
    """A symbol with offset and binary's base name, its file and line when known; the
    binary left out when it is the function's name; [unknown] with binary+offset;
    [kernel] alone."""
    assert str(Frame("/usr/bin/app", "main", "app.c", 12, 0, 0x1F)) == "main+0x1f (app) app.c:12"
    assert str(Frame("/usr/bin/app", "main", "", 0, 0, 0x1F)) == "main+0x1f (app)"
    assert str(Frame("vmlinux", "tcp_sendmsg", "", 0, 0, 4)) == "tcp_sendmsg+0x4 (vmlinux)"
    assert str(Frame("/x/foo", "foo", "", 0, 0)) == "foo+0x0"
    assert str(Frame("", "f", "", 0, 0, 2)) == "f+0x2"
    assert str(Frame("/lib/libc.so.6", UNKNOWN, "", 0, 0, 0x10)) == "[unknown] (libc.so.6+0x10)"
    assert str(Frame("", UNKNOWN, "", 0, 0, 0x10)) == "[unknown]"
    assert str(Frame("vmlinux", KERNEL, "k.c", 3, 0, 8)) == "[kernel]"
    assert (UNKNOWN, KERNEL, JIT, KERNEL_START) == ("[unknown]", "[kernel]", "[jit]", 1 << 63)


def test_frames_are_equal_whatever_their_runtime_address() -> None:
    """addr takes no part in equality or hashing: the same code at two addresses is
    one frame."""
    a, b = Frame("/bin/x", "f", "", 0, 0x1000, 4), Frame("/bin/x", "f", "", 0, 0x9000, 4)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Frame("/bin/x", "f", "", 0, 0x1000, 5)


# ---- model/groups.py -------------------------------------------------------------------


def colliding_rows() -> tuple[Array, Array]:
    """Two different rows of two columns with the same row_hash: (0, 0) and (1, x),
    x chosen to cancel the first column's difference."""
    seed, mix = 0xCBF29CE484222325, 0x100000001B3
    mask = (1 << 64) - 1

    def after_first(c: int) -> int:
        h = ((seed ^ c) * mix) & mask
        return h ^ (h >> 29)

    x = after_first(0) ^ after_first(1)
    return u64([0, 1, 0, 1]), u64([0, x, 0, x])


def test_row_hash_is_fnv_like_per_column() -> None:
    """row_hash of one column, one row: seed ^ value, times the prime, xorshift 29."""
    h = ((0xCBF29CE484222325 ^ 5) * 0x100000001B3) & ((1 << 64) - 1)
    assert row_hash(u64([5])).tolist() == [h ^ (h >> 29)]
    a, b = colliding_rows()
    hashes = row_hash(a, b).tolist()
    assert hashes[0] == hashes[1] and row_hash(a[:2]).tolist()[0] != row_hash(a[:2]).tolist()[1]


def test_group_falls_back_to_exact_rows_on_a_hash_collision() -> None:
    """Two rows with one hash are still two groups; each group's index is its first
    row, and the inverse maps every row to its group."""
    a, b = colliding_rows()
    first, inverse = group(a, b)
    assert sorted(first.tolist()) == [0, 1]
    assert [first[i] for i in inverse.tolist()] == [0, 1, 0, 1]
    first, inverse = in_order(a, b)
    assert (first.tolist(), inverse.tolist()) == ([0, 1], [0, 1, 0, 1])


def test_group_without_collisions_gives_first_rows_and_inverse() -> None:
    """Rows (a, b): the index of each group's first occurrence, and in_order numbers
    the groups as they first occur."""
    a = u64([3, 1, 3, 2, 1, 3])
    b = u64([0, 0, 0, 0, 0, 1])
    first, inverse = group(a, b)
    assert sorted(first.tolist()) == [0, 1, 3, 5]
    assert [first[i] for i in inverse.tolist()] == [0, 1, 0, 3, 1, 5]
    first, inverse = in_order(a, b)
    assert (first.tolist(), inverse.tolist()) == ([0, 1, 3, 5], [0, 1, 0, 2, 1, 3])
    assert inverse.dtype == np.int64
    empty_first, empty_inverse = in_order(u64([]))
    assert (empty_first.tolist(), empty_inverse.tolist(), empty_first.dtype) == ([], [], np.int64)
    assert empty_inverse.dtype == np.int64


# ---- model/interference.py -------------------------------------------------------------


def test_events_classify_one_at_a_time_and_as_arrays() -> None:
    """Every event's class, an unknown id as none, ids past 16 bits taken modulo
    2^16, arrays as uint8 the same."""
    want = {
        Event.CYCLES: InterferenceClass.CPU,
        Event.INSTRUCTIONS: InterferenceClass.CPU,
        Event.LLC_MISS: InterferenceClass.CACHE,
        Event.BRANCH_MISS: InterferenceClass.BRANCH,
        Event.REMOTE_DRAM: InterferenceClass.MEMORY_REMOTE,
        Event.XSNP_HITM: InterferenceClass.FALSE_SHARING,
        Event.CPU_CLOCK: InterferenceClass.CPU,
        Event.RAW: InterferenceClass.NONE,
    }
    assert {e: classify(int(e)) for e in Event} == want
    assert classify(999) is InterferenceClass.NONE
    assert classify(0x10000 + Event.LLC_MISS) is InterferenceClass.CACHE
    arr = classify(np.array([0, 2, 3, 4, 5, 6, 7, 300], dtype=np.int64))
    assert arr.dtype == np.uint8 and arr.tolist() == [5, 1, 2, 3, 4, 5, 0, 0]
    assert [CLASS_NAMES[c] for c in (1, 3, 4)] == ["cache", "memory-remote", "false-sharing"]
    assert [int(c) for c in InterferenceClass] == [0, 1, 2, 3, 4, 5]


# ---- model/records.py ------------------------------------------------------------------


def test_event_keys_put_the_raw_code_over_the_event() -> None:
    """event_key: raw code << 16 | event."""
    assert event_key(Event.RAW, 0x1234) == 0x1234_0007
    assert event_key(Event.LLC_MISS) == 2
    assert RACED_STACK_ID == -116 and FLOW_HISTORY_NS == 16 * 200_000


def test_take_copy_and_concat_keep_whole_records() -> None:
    """take by mask and by index, copy_records independent of its source, concat a
    new array even of one part, and of parts of different types numpy's way."""
    s = make_samples(3, pid=[1, 2, 3], time_ns=[10, 20, 30])
    assert take(s, np.array([True, False, True]))["pid"].tolist() == [1, 3]
    assert take(s, np.array([2, 0]))["time_ns"].tolist() == [30, 10]
    c = copy_records(s)
    c["pid"][0] = 9
    assert s["pid"][0] == 1 and c.dtype == s.dtype
    one = concat([s])
    one["pid"][1] = 7
    assert s["pid"][1] == 2 and one["pid"].tolist() == [1, 7, 3]
    assert concat([s, s[:1]])["time_ns"].tolist() == [10, 20, 30, 10]
    mixed = concat([np.array([1], dtype=np.int32), np.array([2**40], dtype=np.int64)])
    assert mixed.dtype == np.int64 and mixed.tolist() == [1, 2**40]


def test_empty_records_are_zero_but_gso_segs() -> None:
    """empty_samples: zeros, gso_segs 1 (a cost divides by it); empty_lbr zeros; the
    decoders read records laid end to end."""
    s = empty_samples(2)
    assert s.dtype == sample_dtype() and s["gso_segs"].tolist() == [1, 1]
    assert s["pid"].tolist() == [0, 0] and len(empty_samples()) == 0
    lbr = empty_lbr(3)
    assert lbr.dtype == lbr_dtype() and lbr["nr"].tolist() == [0, 0, 0] and len(empty_lbr()) == 0
    assert decode_samples(s.tobytes())["gso_segs"].tolist() == [1, 1]
    assert len(decode_lbr(lbr.tobytes())) == 3


# ---- model/rollup.py -------------------------------------------------------------------


def test_provisional_ids_are_from_2_62_below_2_63() -> None:
    """is_provisional at and around both bounds; the labels' ids sit above."""
    assert [is_provisional(i) for i in (PROVISIONAL_BASE - 1, PROVISIONAL_BASE)] == [False, True]
    assert [is_provisional(i) for i in (PROVISIONAL_END - 1, PROVISIONAL_END)] == [True, False]
    assert (PROVISIONAL_BASE, PROVISIONAL_END) == (1 << 62, 1 << 63)
    assert (UNRESOLVED, GONE_STACK, SKIPPED_STACK) == (2**64 - 1, 2**64 - 2, 2**64 - 3)
    assert STACK_LABELS[UNRESOLVED] == UNRESOLVED_LABEL == "[unresolved: symbols not read yet]"


def test_rollups_and_rows_convert_every_field() -> None:
    """rollups() reads every column into its field; as_rows() writes them back and
    hands an array through as it is."""
    r = Rollup(1, 2, 3, 4, 5, 6, 1, 3, 7_000, 8, 0.25, 99)
    rows = as_rows([r, r])
    assert rows.dtype == ROLLUP_DTYPE and len(rows) == 2
    assert rows[0].tolist() == (1, 2, 3, 4, 7_000, 6, 5, 1, 3, 8, 0.25, 99)
    assert rollups(rows) == [r, r] and rollups(rows)[0].as_dict()["pid"] == 99
    assert as_rows(rows) is rows and len(as_rows([])) == 0
    assert KEY_DTYPE.names == (
        "flow_id", "function_id", "callstack_id", "data_object_id", "time_bucket",
        "numa_node", "event", "direction", "interference_class",
    )  # fmt: skip
