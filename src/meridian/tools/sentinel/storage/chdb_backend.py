"""The embedded store: chDB (ClickHouse in process) with its data in a local directory,
so one host needs no server.

chDB runs one embedded server per process, on one directory at a time, and a
directory cannot be opened by two processes; this backend takes a lock file in the
directory first, so a second agent is told which process holds it instead of chDB's
empty "Error initializing EmbeddedServer". A directory chDB cannot open or use (not a
directory, a damaged catalog) is a one-line StoreUnavailable naming it. Opened
read-only (`meridian sentinel query`), it applies no schema: a query changes nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from ....errors import ExtraMissing
from . import lockfile
from .backend import (
    UNKNOWN_DATABASE,
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
from .schema import columns_sql, statements, ttl_missing, ttl_supported

__all__ = ["LOCK_NAME", "ChdbBackend", "holder_pid"]

LOCK_NAME = ".meridian-sentinel.lock"


def _chdb_session() -> Any:
    try:
        return importlib.import_module("chdb.session")
    except ImportError:
        raise ExtraMissing("the embedded store (chDB)", "clickhouse") from None


def holder_pid(data_dir: str | os.PathLike[str]) -> int | None:
    """The pid of the process holding the store's lock file, None when free (a query
    command asks that process's API instead)."""
    return lockfile.holder(Path(data_dir) / LOCK_NAME)


class ChdbBackend:
    """chDB in a data directory; thread-safe (one lock around the session).
    `read_only`: open checks the schema instead of applying it."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        database: str = "default",
        *,
        read_only: bool = False,
        retention_days: int = 0,
    ) -> None:
        self.session_module = _chdb_session()
        self.path = Path(data_dir).expanduser().absolute()
        self.database = database
        self.read_only = read_only
        self.retention_days = retention_days  # the timed tables' TTL in days; 0: none
        self.name = f"chdb:{self.path}"
        self.notice = ""  # what open() could not do but the store works without
        self._session: Any = None
        self._lock_fd: int | None = None
        self._mu = threading.Lock()

    def _fail(self, what: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"embedded store {self.path} {what}; move it aside or choose another --data-dir",
            kind="store",
        )

    def _take_lock(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise self._fail("is not a directory")
        try:
            self._lock_fd = lockfile.take(self.path / LOCK_NAME)
        except lockfile.LockHeld as held:
            raise StoreUnavailable(
                f"embedded store {self.path} is in use by another process (pid {held.pid})",
                kind="store",
            ) from None
        except OSError as exc:
            raise self._fail(f"cannot be created: {exc.strerror or exc}") from None

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def open(self) -> None:
        with self._mu:
            if self._session is not None:
                return
            self._take_lock()
            try:
                self._session = self.session_module.Session(str(self.path))
            except Exception as exc:
                self._release_lock()
                raise self._fail(f"cannot be opened: {one_line(str(exc))}") from None
            try:
                self._prepare()
            except StoreUnavailable:
                self._close_locked()
                raise

    def _prepare(self) -> None:
        """Apply the schema in the session just opened (a reader only looks for it)."""
        try:
            self._run("SET output_format_json_quote_64bit_integers = 0")
            if self.database != "default":
                if not self.read_only:
                    self._run(f"CREATE DATABASE IF NOT EXISTS {self.database}")
                self._run(f"USE {self.database}")
            version = str(self._rows("SELECT version() AS v")[0]["v"])
            ttl = ttl_supported(version)
            if not self.read_only:
                for sql in statements(self.retention_days if ttl else 0):
                    self._run(sql)
            found = self._rows(columns_sql())
            if not self.read_only:
                notices = [add_seed_names(self._run, found)]
                if ttl:
                    notices.append(set_retention(self._run, self._rows, self.retention_days))
                notices.append(ttl_missing(version, self.retention_days))
                self.notice = "; ".join(n for n in notices if n)
        except Exception as exc:
            if self.read_only and error_code(str(exc)) == UNKNOWN_DATABASE:
                raise no_tables(self.database, self.name) from None
            raise self._fail(f"cannot be used: {one_line(str(exc))}") from None
        problem = found_tables_problem(found, self.database, self.name, self.read_only)
        if problem:
            raise self._fail(f"cannot be used: {problem}")

    def _run(self, sql: str) -> Any:
        return self._session.query(sql, "JSONEachRow")

    def _rows(self, sql: str) -> list[dict[str, Any]]:
        text = self._run(sql).data()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def insert(self, info: BatchInfo, payload: bytes) -> None:
        with self._mu:
            if self._session is None:
                raise self._fail("is not open")
            try:
                self._run(f"INSERT INTO {info.table} FORMAT JSONEachRow\n{payload.decode()}")
            except Exception as exc:
                raise StoreUnavailable(
                    f"embedded store {self.path}: {one_line(str(exc))}",
                    kind="store",
                    code=error_code(str(exc)),
                ) from None

    def stored_rows(self, info: BatchInfo) -> int:
        return int(self.query(stored_rows_sql(info))[0]["n"])

    def query(self, sql: str) -> list[dict[str, Any]]:
        with self._mu:
            if self._session is None:
                raise self._fail("is not open")
            try:
                return self._rows(sql)
            except Exception as exc:
                raise StoreUnavailable(
                    f"embedded store {self.path}: {one_line(str(exc))}", kind="store"
                ) from None

    def _close_locked(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):  # a broken session: nothing more to do
                self._session.close()
            self._session = None
        self._release_lock()

    def close(self) -> None:
        with self._mu:
            self._close_locked()
