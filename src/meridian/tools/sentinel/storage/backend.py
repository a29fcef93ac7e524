"""What a store does for the batcher: apply the schema, insert one batch of
JSONEachRow lines, tell whether a batch whose insert had no answer was stored, and run
a query. Two stores implement it: chDB in process (chdb_backend.py) and a ClickHouse
server over HTTP (http_backend.py). Opened read-only (`meridian sentinel query`), a
store only reads: a server's user may have readonly=1, which refuses DDL and every
setting sent with a query."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ....errors import EnvironmentProblem
from .schema import TIMED, schema_problem, seed_names_missing, ttl_changes, ttl_sql

__all__ = [
    "UNKNOWN_DATABASE",
    "Backend",
    "BatchInfo",
    "StoreUnavailable",
    "add_seed_names",
    "error_code",
    "found_tables_problem",
    "no_tables",
    "one_line",
    "set_retention",
    "stored_rows_sql",
]

UNKNOWN_DATABASE = 81  # ClickHouse's code for a database that does not exist
# a column added meanwhile (another agent starting): 44 in ClickHouse 18.16, 15 later
DUPLICATE_COLUMN = frozenset((15, 44))


class StoreUnavailable(EnvironmentProblem):
    """The store refused or could not be reached; the message is one line.

    `ambiguous`: the rows may have been stored all the same (the connection broke after
    they were sent), so the batch is looked for before it is sent again. `kind` names
    the cause for the once-a-minute report: "unreachable", "auth", "server", "store",
    "schema".
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "server",
        ambiguous: bool = False,
        code: int | None = None,
    ) -> None:
        super().__init__(one_line(message))
        self.kind = kind
        self.ambiguous = ambiguous
        self.code = code  # ClickHouse's error code, when it said one


def one_line(text: str, limit: int = 500) -> str:
    """The first line of a store's message, without ClickHouse's stack trace."""
    first = " ".join(text.strip().split("\n", 1)[0].split())
    for cut in (", Stack trace", " Stack trace", ", e.what() = "):
        first = first.split(cut, 1)[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


_CODE = re.compile(r"Code: (\d+)")


def error_code(text: str) -> int | None:
    """ClickHouse's error code in a message ("Code: 60. DB::Exception: ...")."""
    m = _CODE.search(text)
    return int(m.group(1)) if m else None


def no_tables(database: str, where: str) -> StoreUnavailable:
    """What a reader is told when the store has none of our tables (or not the
    database): no agent has stored there yet, or it stores in another database."""
    return StoreUnavailable(
        f"no sentinel tables in database {database} at {where}: has an agent stored there yet?",
        kind="schema",
    )


def found_tables_problem(
    found: list[dict[str, Any]], database: str, where: str, read_only: bool
) -> str | None:
    """What is wrong with the columns a store has (`columns_sql()`'s rows), None if
    nothing; a reader finding no table at all is told `no_tables`."""
    if read_only and not found:
        raise no_tables(database, where)
    return schema_problem(found)


def add_seed_names(run: Callable[[str], object], found: list[dict[str, Any]]) -> str:
    """Add the column names of docs/requirements/sentinel.md ("Names kept from the
    document") as ALIAS columns where the tables lack them (`found`: rows of
    columns_sql), by running each ALTER with `run`; "" when done, else what could not be
    added and why, one line (a user that may not ALTER: the store works all the same, by
    our names). A store that stops answering meanwhile raises."""
    failed: dict[str, list[str]] = {}
    why = ""
    for table, column, sql in seed_names_missing(found):
        try:
            run(sql)
        except StoreUnavailable as exc:
            if exc.kind == "unreachable":
                raise
            if exc.code in DUPLICATE_COLUMN:
                continue
            failed.setdefault(table, []).append(column)
            why = why or str(exc)
        except Exception as exc:  # chDB raises its own kinds
            if error_code(str(exc)) in DUPLICATE_COLUMN:
                continue
            failed.setdefault(table, []).append(column)
            why = why or one_line(str(exc))
    if not failed:
        return ""
    lacking = "; ".join(f"{t}: {', '.join(cs)}" for t, cs in failed.items())
    return (
        f"could not add the seed's column names ({lacking}): {why}; the store is used by "
        "meridian's names, and a writer that may ALTER adds them at its start"
    )


def set_retention(
    run: Callable[[str], object], query: Callable[[str], list[dict[str, Any]]], days: int
) -> str:
    """Give the timed tables the TTL of `days` (0: none) where they have another, by
    running each ALTER with `run`; "" when done, else why not, one line (a user that
    may not ALTER TTL: rows are kept until someone drops them). A store that stops
    answering meanwhile raises."""
    try:
        for sql in ttl_changes(query(ttl_sql()), days):
            run(sql)
    except StoreUnavailable as exc:
        if exc.kind == "unreachable":
            raise
        why = str(exc)
    except Exception as exc:  # chDB raises its own kinds
        why = one_line(str(exc))
    else:
        return ""
    return f"could not set clickhouse.retention_days ({days}) as the tables' TTL: {why}"


@dataclass(frozen=True)
class BatchInfo:
    """One insert: the table, its id (in every row), its rows, and where to look for
    it: `day` (the partition of a timed table) or the run id (the others)."""

    table: str
    batch_id: int
    rows: int
    day: int
    run_id: int


class Backend(Protocol):
    name: str  # where the rows go, for messages: "chdb:/var/lib/x" or "http://h:8123"

    def open(self) -> None:
        """Connect and apply the schema (idempotently), or, opened read-only, only
        check it (no_tables when there is none); raises StoreUnavailable. What the
        writer could not do but the store works without (add_seed_names' message) is
        left in the backend's `notice` ("" when none; the sender says it)."""
        ...

    def insert(self, info: BatchInfo, payload: bytes) -> None:
        """Store one batch (JSONEachRow lines) whole, or raise StoreUnavailable."""
        ...

    def stored_rows(self, info: BatchInfo) -> int:
        """How many rows of this batch the store holds (0, or all of them)."""
        ...

    def query(self, sql: str) -> list[dict[str, Any]]:
        """Rows of a SELECT (without FORMAT), 64-bit integers as numbers."""
        ...

    def close(self) -> None: ...


def stored_rows_sql(info: BatchInfo) -> str:
    """The count of a batch's rows, reading only where the batch can be: its day's
    partition (timed tables) or its run's key range."""
    if info.table in TIMED:
        lo, hi = info.day * 86_400, (info.day + 1) * 86_400
        where = f"ts >= toDateTime({lo}) AND ts < toDateTime({hi})"
    else:
        where = f"run_id = {int(info.run_id)}"
    where += f" AND batch_id = {int(info.batch_id)}"
    return f"SELECT count() AS n FROM {info.table} WHERE {where}"
