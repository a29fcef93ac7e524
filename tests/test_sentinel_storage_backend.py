"""storage/backend.py without a store: a store's message cut to one line, its error
code, what a reader finding no tables is told, the seed's column names added where
they can be (a duplicate column is no failure, an unreachable store raises), the
retention's ALTERs, and where a batch is looked for."""

from __future__ import annotations

from typing import Any

import pytest

from meridian.tools.sentinel.storage.backend import (
    BatchInfo,
    StoreUnavailable,
    add_seed_names,
    error_code,
    found_tables_problem,
    no_tables,
    one_line,
    set_retention,
    stored_rows_sql,
)
from meridian.tools.sentinel.storage.schema import (
    RAW,
    ROLLUP,
    columns,
    seed_names,
    ttl_expression,
    ttl_sql,
)


def test_one_line_and_the_error_code() -> None:
    trace = "Code: 60. DB::Exception: Table x doesn't exist, Stack trace (when copying):\n0. f"
    assert one_line(trace) == "Code: 60. DB::Exception: Table x doesn't exist"
    assert one_line("  a \n b") == "a"
    assert one_line("a\nb\nc") == "a"
    assert one_line("x Stack trace y Stack trace z") == "x"
    assert one_line("bad. Stack trace: 1") == "bad."
    assert one_line("e, e.what() = boom") == "e"
    assert one_line("x" * 500) == "x" * 500
    assert one_line("x" * 501) == "x" * 497 + "..."
    assert one_line("x" * 20, limit=10) == "x" * 7 + "..."
    assert error_code(trace) == 60 and error_code("no code here") is None
    assert error_code("Code: 516. DB::Exception: auth") == 516
    e = StoreUnavailable("first\nsecond")
    assert (str(e), e.kind, e.ambiguous, e.code) == ("first", "server", False, None)


def test_a_reader_with_no_tables_is_told_why() -> None:
    e = no_tables("db", "http://h:8123")
    assert e.kind == "schema" and str(e) == (
        "no sentinel tables in database db at http://h:8123: has an agent stored there yet?"
    )
    with pytest.raises(StoreUnavailable, match=r"^no sentinel tables in database db at w:"):
        found_tables_problem([], "db", "w", read_only=True)
    said = found_tables_problem([], "db", "w", read_only=False)  # a writer makes them
    assert said is not None and said.startswith("table ms_flow_rollup is missing;")
    whole = [{"table": t, "name": c} for t, cs in columns().items() for c in cs]
    assert found_tables_problem(whole, "db", "w", read_only=True) == ""


def found_without(*missing: tuple[str, str]) -> list[dict[str, Any]]:
    """Columns rows (columns_sql) of tables that lack the seed names given."""
    rows = [{"table": t, "name": "flow_id"} for t in {t for t, _, _ in seed_names()}]
    rows += [{"table": t, "name": c} for t, c, _ in seed_names() if (t, c) not in missing]
    return rows


def test_seed_names_added_where_missing() -> None:
    """Only the missing ones are run; a duplicate column (another agent added it
    meanwhile, code 15 or 44, ours or chDB's exception) is no failure; others are said
    per table with the first reason; an unreachable store raises."""
    (t1, c1, sql1), (t2, c2, sql2), (t3, c3, sql3) = seed_names()[1:4]
    ran: list[str] = []

    def run(sql: str) -> None:
        ran.append(sql)
        if sql == sql1:
            raise StoreUnavailable("Code: 497. Not enough privileges\nmore", code=497)
        if sql == sql2:
            raise StoreUnavailable("exists", code=44)
        if sql == sql3:
            raise RuntimeError("Code: 15. DB::Exception: duplicate column, Stack trace")

    assert add_seed_names(run, found_without()) == "" and ran == []
    said = add_seed_names(run, found_without((t1, c1), (t2, c2), (t3, c3)))
    assert ran == [sql1, sql2, sql3]
    assert said == (
        f"could not add the seed's column names ({t1}: {c1}): Code: 497. Not enough "
        "privileges; the store is used by meridian's names, and a writer that may ALTER "
        "adds them at its start"
    )

    def chdb(sql: str) -> None:
        raise RuntimeError("Code: 48. not implemented, Stack trace: x")

    assert (t1, t2) == (t1, t1) and t3 != t1  # two of one table, one of another
    said = add_seed_names(chdb, found_without((t1, c1), (t2, c2), (t3, c3)))
    lacking = f"{t1}: {c1}, {c2}; {t3}: {c3}"
    assert said.startswith(f"could not add the seed's column names ({lacking}): Code: 48. ")

    def dup_then_refused(sql: str) -> None:
        raise StoreUnavailable("exists", code=15) if sql == sql1 else StoreUnavailable("no")

    said = add_seed_names(dup_then_refused, found_without((t1, c1), (t2, c2)))
    assert said.startswith(f"could not add the seed's column names ({t2}: {c2}): no;")

    def chdb_dup_then_refused(sql: str) -> None:
        raise RuntimeError("Code: 44. duplicate") if sql == sql1 else RuntimeError("no")

    said = add_seed_names(chdb_dup_then_refused, found_without((t1, c1), (t2, c2)))
    assert said.startswith(f"could not add the seed's column names ({t2}: {c2}): no;")

    def down(sql: str) -> None:
        raise StoreUnavailable("connection refused", kind="unreachable")

    with pytest.raises(StoreUnavailable, match="connection refused"):
        add_seed_names(down, found_without((t1, c1)))


def test_retention_set_where_it_differs() -> None:
    engines = [
        {
            "name": RAW,
            "engine_full": "MergeTree ORDER BY ts TTL ts + toIntervalDay(7) SETTINGS x = 1",
        },
        {
            "name": ROLLUP,
            "engine_full": f"MergeTree ORDER BY ts TTL {ttl_expression(3)} SETTINGS x = 1",
        },
    ]
    ran: list[str] = []
    asked: list[str] = []

    def query(sql: str) -> list[dict[str, Any]]:
        asked.append(sql)
        return engines

    assert set_retention(ran.append, query, 3) == "" and asked == [ttl_sql()]
    assert ran == [f"ALTER TABLE {RAW} MODIFY TTL {ttl_expression(3)}"]

    def refused(sql: str) -> None:
        raise StoreUnavailable("Code: 497. no ALTER\ntrace")

    assert set_retention(refused, lambda sql: engines, 0) == (
        "could not set clickhouse.retention_days (0) as the tables' TTL: Code: 497. no ALTER"
    )

    def chdb(sql: str) -> None:
        raise RuntimeError("boom\nline 2")

    assert set_retention(chdb, lambda sql: engines, 5).endswith("TTL: boom")

    def down(sql: str) -> list[dict[str, Any]]:
        raise StoreUnavailable("gone", kind="unreachable")

    with pytest.raises(StoreUnavailable, match="gone"):
        set_retention(ran.append, down, 5)


def test_a_batch_is_looked_for_in_its_day_or_its_run() -> None:
    day = BatchInfo(ROLLUP, batch_id=7, rows=3, day=2, run_id=9)
    assert stored_rows_sql(day) == (
        f"SELECT count() AS n FROM {ROLLUP} WHERE ts >= toDateTime(172800) AND "
        "ts < toDateTime(259200) AND batch_id = 7"
    )
    run = BatchInfo("ms_flows", batch_id=7, rows=3, day=2, run_id=9)
    assert (
        stored_rows_sql(run)
        == "SELECT count() AS n FROM ms_flows WHERE run_id = 9 AND batch_id = 7"
    )
