"""The kernel's two stack maps used in turn (bpf/sentinel.bpf.c: ms_stacks and
ms_stacks_b). A BPF_MAP_TYPE_STACK_TRACE map is never emptied by the kernel: once
full, every new stack fails for the rest of the run. So the program writes one side
while user space empties the other: past a fill mark the side is switched, and the
old one is emptied once every sample that may name it has been read (two polls and
STACK_RETIRE_S later), one delete per id the samples named. An id asked after that
is counted as gone (the caller labels its samples), never given another's frames:
an id is reused only after its side was switched away from and emptied.

One race is the kernel's own: a lookup takes the bucket out of its slot while it
copies it (kernel/bpf/stackmap.c, bpf_stackmap_copy), and a new stack hashed to that
slot meanwhile is written there, given the id, and then lost when the copy puts the
old bucket back: its sample names another stack's frames. Such a sample comes in a
later batch than the one whose lookup raced it (its record was reserved before its
stack was taken, and a reserved record stops the reader), so by then the slot's frames
are known here: a sample whose ip is not the first frame of the stack taken in its own
mode (the kernel stack of a sample in the kernel, the user stack of one in user space)
gets RACED_STACK_ID for both ids, and is counted. The user stack of a sample in the
kernel has no such check of its own, and is dropped with its kernel stack's. Seen once
in CI with 64-entry maps at 5 kHz; with the default maps, rarer still."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np

from ....bpf import BpfObject
from ..model.frames import KERNEL_START
from ..model.records import RACED_STACK_ID

__all__ = ["STACK_ENTRIES", "STACK_MAPS", "StackSides"]

STACK_DEPTH = 127  # PERF_MAX_STACK_DEPTH: the ms_stacks value
STACKS_KEPT = 4096  # stack ids whose frames are kept, per side
STACK_ENTRIES = 16384  # each of ms_stacks and ms_stacks_b
STACK_SIDE_B = 1 << 30  # MS_STACK_SIDE_B: set in the ids of ms_stacks_b
STACK_MAPS = ("ms_stacks", "ms_stacks_b")
# The side in use is switched when it holds this share of its entries: a new stack
# whose hash bucket is taken is lost (-EEXIST), so the fuller, the more are lost.
STACK_FILL = 0.25
# The old side is emptied this long after the switch, and after two polls: by then
# every sample that names it has been read (and resolved, or counted as gone).
STACK_RETIRE_S = 0.05


class StackSides:
    """The two stack maps in turn (see bpf/sentinel.bpf.c): which side the program
    writes, which ids of each side the samples named (so that emptying a side is one
    delete per id, no walk of the map), and the frames already read, per side."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self.side = 0
        self.seen = [np.zeros(entries, dtype=bool), np.zeros(entries, dtype=bool)]
        self.used = [0, 0]  # ids seen per side
        # per side, the first frame of each id read (0: not read): the race check
        self.lead = [np.zeros(entries, dtype=np.uint64), np.zeros(entries, dtype=np.uint64)]
        self.cache: list[OrderedDict[int, tuple[int, ...]]] = [OrderedDict(), OrderedDict()]
        self.retiring: int | None = None
        self.switched_at = 0.0
        self.polls = 0  # polls since the switch
        self.switches = 0
        self.deleted = 0
        self.gone = 0
        self.raced = 0

    def counts(self) -> dict[str, int]:
        return {
            "switches": self.switches,
            "deleted": self.deleted,
            "gone": self.gone,
            "raced": self.raced,
        }

    def before_poll(self, obj: BpfObject, now: float) -> None:
        """Empty the retiring side once every sample naming it has been taken: the
        previous polls' batches are resolved by now (the consumer resolves a batch
        before it polls again)."""
        old = self.retiring
        if old is None or self.polls < 2 or now - self.switched_at < STACK_RETIRE_S:
            return
        m = obj.maps[STACK_MAPS[old]]
        self.deleted += m.delete_many(np.flatnonzero(self.seen[old]))
        self.seen[old][:] = False
        self.lead[old][:] = 0
        self.used[old] = 0
        self.cache[old].clear()
        self.retiring = None

    def after_poll(self, obj: BpfObject, samples: np.ndarray[Any, Any], began: float) -> None:
        """Mark the samples whose ids name another's frames; note the ids the samples
        name; switch sides past the fill mark."""
        if self.retiring is not None and began > self.switched_at:
            self.polls += 1
        if len(samples):
            self._mark_raced(samples)
            ids = np.concatenate([samples["user_stack_id"], samples["kernel_stack_id"]])
            ids = ids[ids >= 0].astype(np.int64)
            if len(ids):
                side = (ids & STACK_SIDE_B) != 0
                for s in (0, 1):
                    idx = ids[side == bool(s)] & (STACK_SIDE_B - 1)
                    if len(idx):
                        seen = self.seen[s]
                        idx = idx[idx < self.entries]
                        seen[idx] = True
                        self.used[s] = int(np.count_nonzero(seen))
        if self.retiring is None and self.used[self.side] >= STACK_FILL * self.entries:
            new = 1 - self.side
            obj.maps["ms_stack_side"].update(0, new)
            self.retiring, self.side = self.side, new
            self.switched_at = time.monotonic()
            self.polls = 0
            self.switches += 1

    def _mark_raced(self, samples: np.ndarray[Any, Any]) -> None:
        """RACED_STACK_ID for both stack ids of each sample whose ip is not the first
        frame (already read) of the stack taken in its own mode."""
        ip = samples["ip"]
        in_kernel = ip >= np.uint64(KERNEL_START)
        sid = np.where(in_kernel, samples["kernel_stack_id"], samples["user_stack_id"])
        sid = sid.astype(np.int64)
        idx = sid & (STACK_SIDE_B - 1)
        lead = np.zeros(len(samples), dtype=np.uint64)
        for s in (0, 1):
            at = np.flatnonzero((sid >= 0) & (((sid & STACK_SIDE_B) != 0) == bool(s)))
            at = at[idx[at] < self.entries]
            lead[at] = self.lead[s][idx[at]]
        raced = (lead != 0) & (lead != ip)
        if raced.any():
            samples["user_stack_id"][raced] = RACED_STACK_ID
            samples["kernel_stack_id"][raced] = RACED_STACK_ID
            self.raced += int(np.count_nonzero(raced))

    def ips(self, obj: BpfObject, stack_id: int) -> tuple[int, ...]:
        side = 1 if stack_id & STACK_SIDE_B else 0
        idx = stack_id & (STACK_SIDE_B - 1)
        cache = self.cache[side]
        found = cache.get(idx)
        if found is not None:
            cache.move_to_end(idx)
            return found
        val = obj.maps[STACK_MAPS[side]].lookup(idx)
        if val is None:
            self.gone += 1
            return ()
        ips = np.frombuffer(val.tobytes(), dtype="<u8", count=STACK_DEPTH)
        n = int(np.argmin(ips != 0)) if ips[-1] == 0 else STACK_DEPTH
        out = tuple(ips[:n].tolist())
        cache[idx] = out
        if len(cache) > STACKS_KEPT:
            cache.popitem(last=False)
        if out and idx < self.entries:
            self.lead[side][idx] = out[0]
        return out
