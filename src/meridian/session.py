"""The lifecycle every tool shares: open its BPF object, set it up, close it on failure.

A tool subclasses `Session`, names its object in `OBJECT` and writes `setup(obj)`
(globals, map sizes, program selection, load, map contents, attach, ring buffer).
Whatever step fails, the object (and so every link and map it made) is closed before
the error goes on; `__exit__` closes the ring buffer and the object.
"""

from __future__ import annotations

from typing import TypeVar

from .bpf import BpfObject, RingBuffer, object_path
from .system import ensure_ready

__all__ = ["RECURSION_MISSES", "Session"]

S = TypeVar("S", bound="Session")

# counters(): events the kernel did not hand to a program at all (it was running on
# that CPU already, as when a tracepoint fires inside another BPF program)
RECURSION_MISSES = "recursion_misses"


class Session:
    OBJECT: str
    BAD_RECORDS: str = "bad_records"  # the name `counters()` gives the ring's bad records
    obj: BpfObject | None = None
    ring: RingBuffer | None = None

    def setup(self, obj: BpfObject) -> None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        ensure_ready()
        obj = BpfObject(object_path(self.OBJECT))
        try:
            self.setup(obj)
        except BaseException:
            if self.ring is not None:
                self.ring.close()
                self.ring = None
            obj.close()
            raise
        self.obj = obj
        return self

    def counters(self) -> dict[str, int]:
        """The object's per-CPU `counters` map summed over the CPUs, plus the ring's
        records of an unexpected size: everything the tool drops, by reason."""
        assert self.obj is not None
        out: dict[str, int] = self.obj.maps["counters"].summed()
        if self.ring is not None:
            out[self.BAD_RECORDS] = self.ring.bad_records
        out[RECURSION_MISSES] = self.obj.recursion_misses()
        return out

    def __exit__(self, *exc: object) -> None:
        if self.ring is not None:
            self.ring.close()
        if self.obj is not None:
            self.obj.close()
