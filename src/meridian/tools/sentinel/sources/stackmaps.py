"""The kernel's two stack maps used in turn (bpf/sentinel.bpf.c: ms_stacks and
ms_stacks_b). A BPF_MAP_TYPE_STACK_TRACE map is never emptied by the kernel: once
full, every new stack fails for the rest of the run. So the program writes one side
while user space empties the other: past a fill mark the side is switched, and the
old one is emptied once every sample that may name it has been read (two polls and
STACK_RETIRE_S later), one delete per id the samples named. An id asked after that
is counted as gone (the caller labels its samples), never given another's frames:
an id is reused only after its side was switched away from and emptied.

One race is the kernel's own: a lookup takes the bucket out of its slot while it
copies it (kernel/bpf/stackmap.c, bpf_stackmap_copy), and a new stack hashed to
that slot meanwhile is written there, given the id, and then lost when the copy
puts the old bucket back: its sample names another stack's frames. A caller that
knows where the stack must start (the sample's ip: the kernel stack of a sample in
the kernel, the user stack of a sample in user space) passes it as `first`; a
stack that starts elsewhere is counted as raced and treated as gone. The user stack
of a sample taken in the kernel has no such check; the race needs a new stack in
the very slot being copied within the copy's microsecond, so it is rare.
Seen once in CI with 64-entry maps at 5 kHz."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np

from ....bpf import BpfObject

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
        self.used[old] = 0
        self.cache[old].clear()
        self.retiring = None

    def after_poll(self, obj: BpfObject, samples: np.ndarray[Any, Any], began: float) -> None:
        """Note the ids the samples name; switch sides past the fill mark."""
        if self.retiring is not None and began > self.switched_at:
            self.polls += 1
        if len(samples):
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

    def ips(self, obj: BpfObject, stack_id: int, first: int | None = None) -> tuple[int, ...]:
        """The frames of `stack_id`; () if gone, or if they do not start at `first`
        (the kernel's lookup race gave the sample another stack's id)."""
        side = 1 if stack_id & STACK_SIDE_B else 0
        idx = stack_id & (STACK_SIDE_B - 1)
        cache = self.cache[side]
        found = cache.get(idx)
        if found is not None:
            cache.move_to_end(idx)
        else:
            val = obj.maps[STACK_MAPS[side]].lookup(idx)
            if val is None:
                self.gone += 1
                return ()
            ips = np.frombuffer(val.tobytes(), dtype="<u8", count=STACK_DEPTH)
            n = int(np.argmin(ips != 0)) if ips[-1] == 0 else STACK_DEPTH
            found = cache[idx] = tuple(ips[:n].tolist())
            if len(cache) > STACKS_KEPT:
                cache.popitem(last=False)
        if first is not None and found and found[0] != first:
            self.raced += 1
            return ()
        return found
