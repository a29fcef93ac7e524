"""What the user asked `meridian io` for: the kernel side's filters and sizes, the
event stream's format, and the agent side's PID table, --top and --workload."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...export import ExportOptions

__all__ = ["DEFAULT_METRICS_MAX_PIDS", "Options"]

# Process series groups in the exported metrics by default (--metrics-max-pids): a
# scrape of 1,000 processes is then no bigger than one of 100.
DEFAULT_METRICS_MAX_PIDS = 100


@dataclass
class Options:
    pids: list[int] = field(default_factory=list)
    comms: list[str] = field(default_factory=list)
    cgroup: tuple[int, int] | None = None  # cgroup v2 (id, depth), see cli.cgroup_id()
    host_root: str = "/"  # the node's / (in a pod, where its hostPath volumes are)
    format: str = "json"
    min_latency_ns: int = 0
    disk_only: bool = False
    no_events: bool = False
    duration: float | None = None
    strategy: str | None = None
    max_pids: int = 8192
    thread_slots: int = 0  # in-flight slots (a power of two); 0: sized to pid_max
    export: ExportOptions | None = None
    verbose: bool = False
    # The agent side: PID table, --top, demo workload (pid_table.py, top.py).
    interval: float = 1.0  # seconds between reads of the aggregate map
    grace: float = 30.0  # seconds an exited process stays before it is retired
    max_series: int | None = None  # --max-pids: rows of their own, then comm, then other
    # --metrics-max-pids: process series groups in the exports (None: no cap).
    metrics_max_series: int | None = DEFAULT_METRICS_MAX_PIDS
    top: bool = False
    sort: str = "bytes"
    workload: bool = False
