"""ClickHouse storage of `meridian sentinel` (part 2): the seed's four tables
(schema.sql), in chDB in process or on a ClickHouse server over HTTP, written in
batches by one thread, spooled to disk while the store cannot take them.

Modules, each importing only those above it:
- schema.py        the tables, from schema.sql
- backend.py       the Backend protocol, BatchInfo, StoreUnavailable
- rows.py          rollups, raw samples, stacks, data objects -> JSONEachRow lines
- report.py        once-a-minute messages on stderr
- lockfile.py      one process per directory (a lock file with the holder's pid)
- spool.py         the bounded on-disk queue of batches
- chdb_backend.py  chDB in a data directory
- http_backend.py  a server over HTTP
- sender.py        batches to the store exactly once, via the spool; the counters
- sink.py          Sink (the runtime's interface) and BatchingSink (the batcher)
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
