"""A ClickHouse server (or a cluster's load balancer) over its HTTP interface, with the
standard library only: every statement is one POST, rows go as
`INSERT INTO t FORMAT JSONEachRow`, the password travels in a Basic header (never in
the URL, which servers log) and is read from a file again after a refusal, so fixing
the file needs no restart.

An insert carries `query_id = meridian-<batch id>`: after a broken connection the
batch is looked for under the same query id first, which the server refuses (code
216) while the first insert still runs, so a batch is never counted missing while it
is being stored.

Rows come back as `FORMAT JSON`, whose header names each column's type: 64-bit
integers, which ClickHouse quotes, are made numbers here rather than with
output_format_json_quote_64bit_integers, a setting a readonly=1 user may not send. So
no request carries a setting, and a read-only backend (`meridian sentinel query`) runs
no DDL either: a user with readonly=1 can query.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from functools import partial
from typing import Any

from ....errors import UsageError
from .backend import (
    UNKNOWN_DATABASE,
    BatchInfo,
    StoreUnavailable,
    add_seed_names,
    error_code,
    found_tables_problem,
    one_line,
    set_retention,
    stored_rows_sql,
)
from .schema import columns_sql, statements, ttl_missing, ttl_supported

__all__ = ["HttpBackend"]

AUTH_CODES = frozenset((192, 193, 194, 195, 516))  # unknown user, wrong/required password, ...
_QUOTED_INT = re.compile(r"U?Int(?:64|128|256)")  # JSON quotes these by default
_WRAPPER = re.compile(r"(?:Nullable|LowCardinality)\((.*)\)")

Decode = Callable[[Any], Any]


class HttpBackend:
    """ClickHouse over HTTP(S): `url` such as http://127.0.0.1:8123; `read_only`: open
    checks the schema instead of applying it."""

    def __init__(
        self,
        url: str,
        user: str = "default",
        password_file: str | None = None,
        database: str = "default",
        timeout: float = 10.0,
        *,
        read_only: bool = False,
        retention_days: int = 0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"clickhouse.url: expected http://HOST:PORT, got {url!r}")
        self.base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))
        self.name = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        self.user = user
        self.password_file = password_file
        self.database = database
        self.timeout = timeout
        self.read_only = read_only
        self.retention_days = retention_days  # the timed tables' TTL in days; 0: none
        self.server_version = ""
        self.notice = ""  # what open() could not do but the store works without
        self._password: str | None = None

    # -- one request ----------------------------------------------------------------

    def _auth(self) -> str:
        if self._password is None:
            self._password = ""
            if self.password_file:
                try:
                    with open(self.password_file, encoding="utf-8") as f:
                        self._password = f.read().rstrip("\r\n")
                except OSError as exc:
                    self._password = None
                    raise StoreUnavailable(
                        f"cannot read clickhouse.password_file {self.password_file}: "
                        f"{exc.strerror or exc}",
                        kind="auth",
                    ) from None
        token = base64.b64encode(f"{self.user}:{self._password}".encode()).decode()
        return f"Basic {token}"

    def _post(
        self,
        body: bytes,
        params: dict[str, str] | None = None,
        *,
        insert: bool = False,
    ) -> bytes:
        # "database": "" leaves it to the user's default (before the database exists)
        query = {k: v for k, v in {"database": self.database, **(params or {})}.items() if v}
        url = f"{self.base}?{urllib.parse.urlencode(query)}"
        headers = {"Authorization": self._auth(), "Content-Type": "text/plain; charset=utf-8"}
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data: bytes = resp.read()
                return data
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            code = error_code(text)
            msg = one_line(text) or f"HTTP {exc.code}"
            if exc.code in (401, 403) or code in AUTH_CODES:
                self._password = None  # read the file again next time
                raise StoreUnavailable(
                    f"ClickHouse at {self.name} refused user {self.user!r} ({msg}): "
                    "check clickhouse.user and clickhouse.password_file",
                    kind="auth",
                ) from None
            raise StoreUnavailable(
                f"ClickHouse at {self.name} answered {exc.code}: {msg}", kind="server", code=code
            ) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            sure = isinstance(reason, (ConnectionRefusedError, socket.gaierror))
            raise StoreUnavailable(
                f"ClickHouse at {self.name} is unreachable ({_reason(reason)})",
                kind="unreachable",
                ambiguous=insert and not sure,
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            # the request went out, the answer did not come back
            raise StoreUnavailable(
                f"ClickHouse at {self.name} did not answer ({_reason(exc)})",
                kind="unreachable",
                ambiguous=insert,
            ) from None

    # -- Backend --------------------------------------------------------------------

    def open(self) -> None:
        bare = {"database": ""}
        self.server_version = self._post(b"SELECT version()", bare).decode().strip()
        ttl = ttl_supported(self.server_version)
        if not self.read_only:
            if self.database != "default":
                self._post(f"CREATE DATABASE IF NOT EXISTS {self.database}".encode(), bare)
            for sql in statements(self.retention_days if ttl else 0):
                self._post(sql.encode())
        try:
            found = self.query(columns_sql())
        except StoreUnavailable as exc:
            if not (self.read_only and exc.code == UNKNOWN_DATABASE):
                raise
            found = []
        problem = found_tables_problem(found, self.database, self.name, self.read_only)
        if problem:
            raise StoreUnavailable(f"ClickHouse at {self.name}: {problem}", kind="schema")
        if not self.read_only:
            notices = [add_seed_names(self._run, found)]
            if ttl:
                notices.append(set_retention(self._run, self.query, self.retention_days))
            notices.append(ttl_missing(self.server_version, self.retention_days))
            self.notice = "; ".join(n for n in notices if n)

    def _run(self, sql: str) -> None:
        self._post(sql.encode())

    def insert(self, info: BatchInfo, payload: bytes) -> None:
        params = {
            "query": f"INSERT INTO {info.table} FORMAT JSONEachRow",
            "query_id": _query_id(info),
        }
        self._post(payload, params, insert=True)

    def stored_rows(self, info: BatchInfo) -> int:
        # refused with code 216 while the batch's own insert still runs
        self._post(b"SELECT 1", {"query_id": _query_id(info)})
        return int(self.query(stored_rows_sql(info))[0]["n"])

    def query(self, sql: str) -> list[dict[str, Any]]:
        body = self._post(f"{sql} FORMAT JSON".encode())
        if not body.strip():
            return []  # a statement without a result (DDL): no JSON at all
        got = json.loads(body)
        columns = [(c["name"], _decoder(c["type"])) for c in got["meta"]]
        return [
            {name: row[name] if dec is None else dec(row[name]) for name, dec in columns}
            for row in got["data"]
        ]

    def close(self) -> None:
        pass  # one connection per request: nothing held


def _decoder(kind: str) -> Decode | None:
    """How a value of ClickHouse type `kind` is read from FORMAT JSON; None: as it is."""
    wrapped = _WRAPPER.fullmatch(kind)
    if wrapped:
        return _decoder(wrapped.group(1))
    if kind.startswith("Array(") and kind.endswith(")"):
        inner = _decoder(kind[len("Array(") : -1])
        return None if inner is None else partial(_array, inner)
    return _int if _QUOTED_INT.fullmatch(kind) else None


def _int(value: Any) -> Any:
    return value if value is None else int(value)  # None: a Nullable's NULL


def _array(inner: Decode, values: list[Any]) -> list[Any]:
    return [inner(v) for v in values]


def _query_id(info: BatchInfo) -> str:
    return f"meridian-{info.table}-{info.batch_id:016x}"


def _reason(reason: object) -> str:
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host: {reason.strerror or reason}"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    if isinstance(reason, TimeoutError):
        return "timed out"
    return str(reason) or type(reason).__name__
