"""ClickHouse storage of meridian sentinel: the schema and the line format of the rows
(rollups, raw samples with their LBR, call stacks)."""

from __future__ import annotations

import json

import numpy as np
from sentinel_store import SAMPLE_DTYPE, rollups

from meridian.tools.sentinel.model.rollup import ROLLUP_DTYPE, Rollup
from meridian.tools.sentinel.storage import TABLES, statements
from meridian.tools.sentinel.storage.rows import DAY_NS, raw_lines, rollup_lines, stack_lines
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
