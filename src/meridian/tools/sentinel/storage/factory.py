"""The store the configuration names: a remote server when `clickhouse.url` is set,
else chDB in `clickhouse.data_dir`; and where the spool of each lives by default."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Protocol

from ....errors import UsageError
from .backend import Backend, StoreUnavailable
from .chdb_backend import ChdbBackend
from .http_backend import HttpBackend
from .report import Reporter
from .sink import BatchingSink

__all__ = [
    "SinkSettings",
    "StoreSettings",
    "data_dir_for",
    "default_state_dir",
    "open_backend",
    "open_sink",
    "open_store",
    "spool_dir_for",
]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class StoreSettings(Protocol):
    """What open_backend, open_store and data_dir_for read of a ClickHouseConfig."""

    @property
    def data_dir(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def user(self) -> str: ...
    @property
    def password_file(self) -> str | None: ...
    @property
    def database(self) -> str: ...
    @property
    def retention_days(self) -> int: ...


class SinkSettings(StoreSettings, Protocol):
    """What open_sink and spool_dir_for read besides: the spool and the batching."""

    @property
    def spool_dir(self) -> str | None: ...
    @property
    def spool_max_bytes(self) -> int: ...
    @property
    def batch_rows(self) -> int: ...
    @property
    def flush_interval(self) -> float: ...
    @property
    def max_backoff(self) -> float: ...


def default_state_dir() -> Path:
    """/var/lib/meridian/sentinel for root, else $XDG_STATE_HOME/meridian/sentinel."""
    if os.geteuid() == 0:
        return Path("/var/lib/meridian/sentinel")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "meridian" / "sentinel"


def data_dir_for(cfg: StoreSettings) -> Path:
    """The embedded store's directory: clickhouse.data_dir, or `store` in the state
    directory."""
    return Path(cfg.data_dir).expanduser() if cfg.data_dir else default_state_dir() / "store"


def open_backend(cfg: StoreSettings, *, read_only: bool = False) -> Backend:
    """The backend of a ClickHouseConfig, not yet opened (`read_only`: for queries, see
    open_store). A data directory that is a file, or a database name that is not an
    identifier, is a UsageError here, at start."""
    if not _IDENT.match(str(cfg.database)):
        raise UsageError(
            f"clickhouse.database: expected letters, digits and _, got {cfg.database!r}"
        )
    days = cfg.retention_days
    if cfg.url:
        return HttpBackend(
            cfg.url,
            cfg.user,
            cfg.password_file,
            cfg.database,
            read_only=read_only,
            retention_days=days,
        )
    path = data_dir_for(cfg)
    if path.exists() and not path.is_dir():
        raise UsageError(f"clickhouse.data_dir (--data-dir): {path} is not a directory")
    return ChdbBackend(path, cfg.database, read_only=read_only, retention_days=days)


def spool_dir_for(cfg: SinkSettings) -> Path:
    """clickhouse.spool_dir when the config has it; else `spool` in the embedded
    store's directory, or one directory per server URL in the state directory."""
    if cfg.spool_dir:
        return Path(cfg.spool_dir).expanduser()
    if cfg.url:
        tag = hashlib.sha256(str(cfg.url).encode()).hexdigest()[:12]
        return default_state_dir() / f"spool-{tag}"
    return data_dir_for(cfg) / "spool"


def open_sink(
    cfg: SinkSettings,
    *,
    reporter: Reporter | None = None,
    run_id: int | None = None,
) -> BatchingSink:
    """The agent's writer for a ClickHouseConfig. The store is opened (and the schema
    applied) by the writer thread: a store that is down or broken at start is said
    and retried, and the agent runs on."""
    return BatchingSink(
        open_backend(cfg),
        spool_dir=str(spool_dir_for(cfg)),
        spool_max_bytes=cfg.spool_max_bytes,
        batch_rows=cfg.batch_rows,
        flush_interval=cfg.flush_interval,
        max_backoff=cfg.max_backoff,
        reporter=reporter,
        run_id=run_id,
    )


def open_store(cfg: StoreSettings) -> Backend:
    """An opened backend for queries (`meridian sentinel query`), read-only: it runs no
    DDL and sends no setting, so a server user with readonly=1 can query, and a store no
    agent has written is said (no_tables) rather than made. StoreUnavailable, one line,
    when it cannot be opened (chdb_backend.holder_pid tells which agent holds an
    embedded store, whose API then answers instead)."""
    backend = open_backend(cfg, read_only=True)
    try:
        backend.open()
    except StoreUnavailable:
        backend.close()
        raise
    return backend
