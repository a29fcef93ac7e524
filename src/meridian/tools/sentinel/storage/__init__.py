"""ClickHouse storage of `meridian sentinel` (part 2): the four tables of
docs/requirements/sentinel.md §4.1 (schema.sql), in chDB in process or on a ClickHouse
server over HTTP: batches go to an on-disk spool first, and from it to the store, so an
outage or a crash loses nothing that reached the spool.

Modules, each importing only those above it:
- schema.py        the tables, from schema.sql
- backend.py       the Backend protocol, BatchInfo, StoreUnavailable
- rows.py          rollups, raw samples, stacks, data objects -> JSONEachRow lines
- report.py        once-a-minute messages on stderr
- lockfile.py      one process per directory (a lock file with the holder's pid)
- spool.py         the bounded on-disk queue every batch passes through
- chdb_backend.py  chDB in a data directory
- http_backend.py  a server over HTTP
- sender.py        the spool to the store exactly once, with backoff; the counters
- sink.py          Sink (the runtime's interface) and BatchingSink (its two threads)
- factory.py       the backend and sink a ClickHouseConfig names
"""

from __future__ import annotations

from .backend import Backend, BatchInfo, StoreUnavailable
from .chdb_backend import ChdbBackend, holder_pid
from .factory import default_state_dir, open_backend, open_sink, open_store, spool_dir_for
from .http_backend import HttpBackend
from .report import Reporter
from .schema import TABLES, statements
from .sender import SinkStats
from .sink import BatchingSink, Sink

__all__ = [
    "TABLES",
    "Backend",
    "BatchInfo",
    "BatchingSink",
    "ChdbBackend",
    "HttpBackend",
    "Reporter",
    "Sink",
    "SinkStats",
    "StoreUnavailable",
    "default_state_dir",
    "holder_pid",
    "open_backend",
    "open_sink",
    "open_store",
    "spool_dir_for",
    "statements",
]
