"""The tables, read from schema.sql (the one definition both stores apply), split into
statements a store runs one at a time: the CREATEs, then the column names of
docs/requirements/sentinel.md ("Names kept from the document") as ALIAS columns where a
table lacks them; and the retention (clickhouse.retention_days) as the timed tables'
TTL, on a server that has TTL."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

__all__ = [
    "DATA_OBJECTS",
    "FLOWS",
    "FUNCTIONS",
    "RAW",
    "ROLLUP",
    "STACKS",
    "TABLES",
    "TIMED",
    "TTL_SINCE",
    "columns",
    "columns_sql",
    "schema_problem",
    "seed_names",
    "seed_names_missing",
    "statements",
    "ttl_changes",
    "ttl_expression",
    "ttl_missing",
    "ttl_sql",
    "ttl_supported",
]

ROLLUP = "ms_flow_rollup"
RAW = "ms_raw_samples"
STACKS = "ms_callstacks"
DATA_OBJECTS = "ms_data_objects"
FLOWS = "ms_flows"
FUNCTIONS = "ms_functions"
TABLES = (ROLLUP, RAW, STACKS, DATA_OBJECTS, FLOWS, FUNCTIONS)
# Tables partitioned by day of `ts`: a batch never spans two days, so it is one part,
# stored whole or not at all.
TIMED = frozenset((ROLLUP, RAW))
# Table TTL came in ClickHouse 19.6 (Debian 12's clickhouse-server is 18.16). Only the
# timed tables get one, on the day of `ts`: they hold nearly every row. The names
# (stacks, flows, functions, data objects) are written once per run, when first used,
# so a TTL on them would take names that a run's recent rollups still refer to.
TTL_SINCE = (19, 6)

_COMMENT = re.compile(r"--[^\n]*")
_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")
_COLUMN = re.compile(r"(?:^|,)\s+(\w+) [A-Z]", re.MULTILINE)  # a line may hold several
_ALIAS = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+) ")
_TTL = re.compile(r" TTL (.+?)(?: SETTINGS |$)")
_VERSION = re.compile(r"(\d+)\.(\d+)")


@cache
def _all() -> tuple[str, ...]:
    """Every statement of schema.sql, comments removed, without the `;`."""
    here = resources.files(__name__.rpartition(".")[0])
    text = here.joinpath("schema.sql").read_text(encoding="utf-8")
    text = _COMMENT.sub("", text)
    return tuple(s.strip() for s in text.split(";") if s.strip())


def statements(retention_days: int = 0) -> tuple[str, ...]:
    """The CREATE statements of schema.sql (the names of docs/requirements/sentinel.md
    are `seed_names`), the timed tables' with a TTL of `retention_days` (0: none; only
    for a server that ttl_supported)."""
    out = []
    for sql in _all():
        m = _TABLE.match(sql)
        if m:
            if retention_days and m.group(1) in TIMED:
                sql += f"\nTTL {ttl_expression(retention_days)}"
            out.append(sql)
    return tuple(out)


def ttl_supported(version: str) -> bool:
    """Whether a server of this version (`SELECT version()`) has table TTL."""
    m = _VERSION.match(version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= TTL_SINCE


def ttl_expression(days: int) -> str:
    """The TTL of a timed table, as the server writes it back in system.tables."""
    return f"ts + toIntervalDay({int(days)})"


def ttl_sql() -> str:
    """The engine (with its TTL) of each timed table in the current database."""
    names = ", ".join(f"'{t}'" for t in sorted(TIMED))
    return (
        "SELECT name, engine_full FROM system.tables "
        f"WHERE database = currentDatabase() AND name IN ({names})"
    )


def ttl_changes(found: list[dict[str, object]], days: int) -> list[str]:
    """The ALTERs that give the timed tables (rows of ttl_sql) the TTL of `days`: a
    table made before, or with another retention, keeps its TTL through CREATE IF NOT
    EXISTS. The server applies a new TTL to the rows it has (materialize_ttl_after_modify)."""
    out = []
    for row in sorted(found, key=lambda r: str(r["name"])):
        m = _TTL.search(str(row["engine_full"]))
        have = m.group(1) if m else ""
        want = ttl_expression(days) if days else ""
        if have != want:
            change = f"MODIFY TTL {want}" if want else "REMOVE TTL"
            out.append(f"ALTER TABLE {row['name']} {change}")
    return out


def ttl_missing(version: str, days: int) -> str:
    """What the agent says when the server cannot keep `days` of rows ("" if it can)."""
    if not days or ttl_supported(version):
        return ""
    return (
        f"ClickHouse {version} has no table TTL (19.6 and later have): clickhouse."
        f"retention_days ({days}) is not applied, drop old days by hand "
        "(ALTER TABLE ms_flow_rollup DROP PARTITION YYYYMMDD, and ms_raw_samples)"
    )


@cache
def seed_names() -> tuple[tuple[str, str, str], ...]:
    """(table, column, ALTER TABLE ... ADD COLUMN) of each name of
    docs/requirements/sentinel.md ("Names kept from the document") that is an ALIAS of
    one of ours."""
    out = []
    for sql in _all():
        m = _ALIAS.match(sql)
        if m:
            out.append((m.group(1), m.group(2), sql))
    return tuple(out)


def seed_names_missing(found: list[dict[str, object]]) -> list[tuple[str, str, str]]:
    """The seed_names() whose table exists (rows of columns_sql) without the column."""
    have: dict[str, set[str]] = {}
    for row in found:
        have.setdefault(str(row["table"]), set()).add(str(row["name"]))
    return [n for n in seed_names() if n[0] in have and n[1] not in have[n[0]]]


@cache
def columns() -> dict[str, tuple[str, ...]]:
    """table -> its column names, as schema.sql declares them."""
    out = {}
    for sql in statements():
        m = _TABLE.match(sql)
        if m:
            body = sql[sql.index("(") : sql.index("ENGINE")]
            out[m.group(1)] = tuple(_COLUMN.findall(body))
    return out


def columns_sql() -> str:
    """The columns the store has for our tables, in the current database."""
    names = ", ".join(f"'{t}'" for t in TABLES)
    return (
        "SELECT table, name FROM system.columns "
        f"WHERE database = currentDatabase() AND table IN ({names})"
    )


def schema_problem(found: list[dict[str, object]]) -> str:
    """What is wrong with the tables the store has (rows of columns_sql), or "": a
    table that is missing, or that lacks columns (made by another version: CREATE IF
    NOT EXISTS leaves it as it is). The names of docs/requirements/sentinel.md are not
    needed: a store without them is used by ours."""
    have: dict[str, set[str]] = {}
    for row in found:
        have.setdefault(str(row["table"]), set()).add(str(row["name"]))
    problems = []
    for table, cols in columns().items():
        if table not in have:
            problems.append(f"table {table} is missing")
            continue
        lacking = [c for c in cols if c not in have[table]]
        if lacking:
            problems.append(f"table {table} lacks columns {', '.join(lacking)}")
    if not problems:
        return ""
    return (
        "; ".join(problems)
        + " (made by another version of the schema? add the columns with ALTER TABLE, "
        "or rename the table so it is made anew)"
    )
