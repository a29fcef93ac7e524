"""The only place that knows libbpf: objects, programs, links, maps, the ring buffer
reader, perf events, feature probes and BTF layouts."""

from .btf import Btf
from .features import Probe, Strategy, choose, hook_exists, object_path, probe, require
from .maps import Map, MapType
from .object import BpfObject, Link, Program
from .perf import PerfEvent, open_per_cpu
from .ringbuf import RingBuffer

__all__ = [
    "BpfObject",
    "Btf",
    "Link",
    "Map",
    "MapType",
    "PerfEvent",
    "Probe",
    "Program",
    "RingBuffer",
    "Strategy",
    "choose",
    "hook_exists",
    "object_path",
    "open_per_cpu",
    "probe",
    "require",
]
