"""ClickHouse storage of meridian sentinel: the schema and the line format of the rows
(rollups, raw samples with their LBR, call stacks)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from sentinel_store import SAMPLE_DTYPE, rollups

from meridian.tools.sentinel.model.dataobjects import DataObject
from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, Rollup
from meridian.tools.sentinel.storage import TABLES, statements
from meridian.tools.sentinel.storage.rows import (
    DAY_NS,
    RAW_FIELDS,
    data_object_lines,
    flow_lines,
    function_lines,
    raw_lines,
    rollup_lines,
    stack_lines,
)
from meridian.tools.sentinel.symbols.symbolizer import Frame

LBR_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("cpu", "<u4"),
        ("nr", "<u4"),
        ("entries", [("from", "<u8"), ("to", "<u8")], (32,)),
    ]
)


def test_schema_has_the_six_tables_with_sorting_keys() -> None:
    sql = statements()
    assert len(sql) == 6
    for table, stmt in zip(TABLES, sql, strict=True):
        assert stmt.startswith(f"CREATE TABLE IF NOT EXISTS {table}")
        assert "ENGINE = MergeTree()" in stmt and "ORDER BY" in stmt
    # time range first (5-minute slots), then the flow
    assert "ORDER BY (toStartOfFiveMinute(ts), flow_id, time_bucket" in sql[0]


def test_rollup_lines_are_json_with_every_field() -> None:
    a = rollups(10, 3)
    a["norm_cost"][1] = np.inf
    a["flow_id"][2] = 2**64 - 1
    chunks = rollup_lines(a, run_id=5, host='h"1')
    assert len(chunks) == 1
    rows = [json.loads('{"batch_id":1,' + line) for line in chunks[0][1]]
    assert rows[0]["flow_id"] == 10 and rows[0]["norm_cost"] == 0.5
    assert rows[1]["norm_cost"] == 0.0  # JSON has no inf
    assert rows[2]["flow_id"] == 2**64 - 1
    assert rows[0]["host"] == 'h"1' and rows[0]["run_id"] == 5
    assert set(rows[0]) >= set(ROLLUP_DTYPE.names or ())


def test_rollup_objects_and_midnight_split() -> None:
    def at(flow_id: int, time_bucket: int) -> Rollup:
        return Rollup(flow_id, 0, 0, 0, 0, 0, 0, 0, time_bucket, samples=1, norm_cost=1.0, pid=0)

    day = 20_000
    chunks = rollup_lines([at(1, day * DAY_NS - 1), at(2, day * DAY_NS)], run_id=1, host="h")
    assert [(d, len(lines)) for d, lines in chunks] == [(day - 1, 1), (day, 1)]


def test_raw_lines_join_lbr_and_cost() -> None:
    s = np.zeros(3, dtype=SAMPLE_DTYPE)
    s["time_ns"] = [100, 200, 300]
    s["cpu"] = [0, 1, 0]
    s["gso_segs"] = [0, 4, 2]
    lbr = np.zeros(1, dtype=LBR_DTYPE)
    lbr["time_ns"], lbr["cpu"], lbr["nr"] = 200, 1, 2
    lbr["entries"]["from"][0, :2] = [10, 11]
    lbr["entries"]["to"][0, :2] = [20, 21]
    wall = np.array([5, 6, 7], dtype=np.uint64) + 3 * DAY_NS
    (chunk,) = raw_lines(s, 9, "h", lbr=lbr, scale=2.0, wall_ns=wall)
    assert chunk[0] == 3
    rows = [json.loads("{" + line) for line in chunk[1]]
    assert [r["norm_cost"] for r in rows] == [2.0, 0.5, 1.0]
    assert rows[1]["lbr_from"] == [10, 11] and rows[1]["lbr_to"] == [20, 21]
    assert rows[0]["lbr_from"] == [] and rows[0]["ktime_ns"] == 100
    assert rows[2]["time_ns"] == 3 * DAY_NS + 7


def test_stack_lines_escape_names() -> None:
    frames = (Frame("/bin/x", 'f"\\n\u00e9', "x.c", 3, 2**64 - 1, 8),)
    (chunk,) = stack_lines([(4, frames)], 1, "h", seen_ns=5)
    row = json.loads("{" + chunk[1][0])
    assert row["functions"] == ['f"\\n\u00e9'] and row["addrs"] == [2**64 - 1]
    assert row["offsets"] == [8] and row["stack_id"] == 4


def parsed(chunks: list[tuple[int, list[str]]]) -> list[tuple[int, list[dict[str, Any]]]]:
    return [(day, [json.loads("{" + line) for line in lines]) for day, lines in chunks]


def test_rows_of_names_objects_and_stacks_are_exact() -> None:
    """Every field of the name tables' rows (a line lacks only its batch id); a line or
    offset below 0 stored as 0, an address as its 64 bits; no rows, no chunk."""
    tail = {"run_id": 3, "host": "h"}
    objects = [DataObject(7, 11, 0x1000, "arena", "struct x", 64), DataObject(8, 12, 5, "t")]
    assert parsed(data_object_lines(objects, 3, "h", seen_ns=9)) == [
        (0, [
            {"object_id": 7, "pid": 11, "address": 0x1000, "size": 64, "name": "arena",
             "type": "struct x", "seen_ns": 9, **tail},
            {"object_id": 8, "pid": 12, "address": 5, "size": 0, "name": "t", "type": "",
             "seen_ns": 9, **tail},
        ])
    ]  # fmt: skip
    flows = [(2**64 - 1, "10.0.0.1", "::1", 40000, 53, "udp")]
    assert parsed(flow_lines(flows, 3, "h", seen_ns=9)) == [
        (0, [{"flow_id": 2**64 - 1, "src": "10.0.0.1", "dst": "::1", "sport": 40000,
              "dport": 53, "proto": "udp", "seen_ns": 9, **tail}])
    ]  # fmt: skip
    assert parsed(function_lines([(4, "/bin/x", "main")], 3, "h", seen_ns=9)) == [
        (0, [{"function_id": 4, "binary": "/bin/x", "function": "main", "seen_ns": 9, **tail}])
    ]
    frames = (Frame("/bin/x", "f", "x.c", -1, -1, -2), Frame("[k]", "g", "", 7, 0x10, 3))
    assert parsed(stack_lines([(4, frames)], 3, "h", seen_ns=9)) == [
        (0, [{"stack_id": 4, "binaries": ["/bin/x", "[k]"], "functions": ["f", "g"],
              "files": ["x.c", ""], "lines": [0, 7], "offsets": [0, 3],
              "addrs": [2**64 - 1, 0x10], "seen_ns": 9, **tail}])
    ]  # fmt: skip
    for lines in (data_object_lines, flow_lines, function_lines, stack_lines):
        assert lines([], 3, "h", seen_ns=9) == []


def test_one_rollup_object_exact_and_costs_that_are_no_number() -> None:
    """A single Rollup's row, its fraction of a cost kept; NaN and infinities stored
    as 0 (JSON has none of them)."""
    r = Rollup(1, 2, 3, 4, 5, 6, 7, 8, 9, samples=10, norm_cost=0.25, pid=11)
    ((day, (row,)),) = parsed(rollup_lines([r], run_id=1, host="h"))
    assert day == 0 and row == {
        "time_bucket": 9, "flow_id": 1, "function_id": 2, "callstack_id": 3,
        "data_object_id": 4, "event": 5, "numa_node": 6, "direction": 7,
        "interference_class": 8, "samples": 10, "norm_cost": 0.25, "pid": 11,
        "run_id": 1, "host": "h",
    }  # fmt: skip
    a = rollups(10, 3)
    a["norm_cost"] = [np.nan, -np.inf, np.inf]
    ((_, rows),) = parsed(rollup_lines(a, run_id=1, host="h"))
    assert [x["norm_cost"] for x in rows] == [0.0, 0.0, 0.0]


def test_lines_of_days_apart_are_grouped_by_day_in_their_order() -> None:
    a = rollups(1, 4)
    a["time_bucket"] = np.array([5, 4, 5, 6], dtype=np.uint64) * np.uint64(DAY_NS)
    a["flow_id"] = [0, 1, 2, 3]
    got = [(day, [x["flow_id"] for x in rows]) for day, rows in parsed(rollup_lines(a, 1, "h"))]
    assert got == [(4, [1]), (5, [0, 2]), (6, [3])]


def test_one_raw_sample_of_another_layout_exact() -> None:
    """A record with only some of the columns stores 0 for the others; times past 2**53
    exact; the stack ids given; the cost at the default scale of 1."""
    layout = np.dtype([("time_ns", "<u8"), ("cpu", "<u4"), ("pid", "<u4"), ("gso_segs", "<u2")])
    s = np.zeros(1, dtype=layout)
    s[0] = (10**18 + 1, 1, 42, 2)
    wall = np.array([10**18 + 3], dtype=np.uint64)
    ids = np.array([2**63 + 5], dtype=np.uint64)
    ((day, (row,)),) = parsed(raw_lines(s, 3, "h", wall_ns=wall, callstack_ids=ids))
    zero = {f: 0 for f in RAW_FIELDS}
    assert day == (10**18 + 3) // DAY_NS and row == {
        **zero, "time_ns": 10**18 + 3, "ktime_ns": 10**18 + 1, "cpu": 1, "pid": 42,
        "gso_segs": 2, "callstack_id": 2**63 + 5, "norm_cost": 0.5, "lbr_from": [],
        "lbr_to": [], "run_id": 3, "host": "h",
    }  # fmt: skip
