"""The kernel's per-CPU cache of aggregates in front of the `stats` hash (io.bpf.c,
`stats_cache`): which entries hold a live process's numbers, and those numbers added
to the hash's as more per-CPU columns of their keys, so that summarize() and all
after it see one snapshot per key. Entries never move into the hash: an entry's
numbers are counted once, from the entry. A process user space has retired (gone,
summarized) has its entries marked in `stats_retired`: the kernel may claim them
again, and they are no longer read. An exited owner's entries are marked as soon as
it is seen gone, their final numbers kept in user space until its retirement
(FileIO._fold_exited), so that a short-lived process (a compiler, bpftool) does not
keep its ways from the next one for the whole grace period."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["CACHE_WAYS", "CLAIMING", "entry_keys", "exited", "live", "merge"]

Array = np.ndarray[Any, Any]

CACHE_WAYS = 8  # entries per CPU and (op, cached): 8 x 4 x 4.2 KB = 135 KB a CPU
CLAIMING = np.uint64(2**64 - 1)  # STATS_CLAIMING: a claim in progress


def live(idx: Array, entries: Array, retired: Array) -> Array:
    """Which entries (fileio_cached, by index `idx`) hold a live process's numbers:
    owned, not being claimed, not retired (`retired`: stats_retired, by index)."""
    tags = entries["tag"]
    out: Array = (tags != 0) & (tags != CLAIMING) & (tags != retired[idx])
    return out


def exited(tags: Array, alive: Callable[[int, int], bool]) -> Array:
    """Which entries' owners (by their tags, pid << 32 | start) have exited, as
    `alive(pid, start)` tells, asked once a process."""
    answer: dict[int, bool] = {}
    for tag in set(tags.tolist()):
        answer[tag] = not alive(tag >> 32, tag & 0xFFFFFFFF)
    out: Array = np.array([answer[t] for t in tags.tolist()], dtype=bool)
    return out


def entry_keys(idx: Array, tags: Array, key_dtype: np.dtype[Any]) -> Array:
    """The fileio_key of each entry: the process from its tag (pid << 32 | start),
    op and cached from its index (... << 2 | op << 1 | cached)."""
    keys = np.zeros(len(idx), dtype=key_dtype)
    keys["pid"] = tags >> np.uint64(32)
    keys["start"] = tags & np.uint64(0xFFFFFFFF)
    keys["op"] = (idx >> 1) & 1
    keys["cached"] = idx & 1
    return keys


def merge(keys: Array, vals: Array, idx: Array, entries: Array, ways: int) -> tuple[Array, Array]:
    """The hash's (keys, per-CPU values) with the live cache entries (`idx`, `entries`)
    added: each as the column ncpus + its CPU of its key's row (a new row for a key the
    hash does not have)."""
    if not len(idx):
        return keys, vals
    ncpus = vals.shape[1] if vals.ndim == 2 and len(vals) else int(idx.max() // (4 * ways)) + 1
    ekeys = entry_keys(idx, entries["tag"], keys.dtype)
    rows = {k.tobytes(): i for i, k in enumerate(keys)}
    extra: list[Array] = []
    where = np.empty(len(idx), dtype=np.int64)
    for j, k in enumerate(ekeys):
        b = k.tobytes()
        if b not in rows:
            rows[b] = len(keys) + len(extra)
            extra.append(k)
        where[j] = rows[b]
    out_keys = np.concatenate([keys, np.array(extra, dtype=keys.dtype)]) if extra else keys
    out = np.zeros((len(out_keys), 2 * ncpus), dtype=entries["s"].dtype)
    if len(vals):
        out[: len(keys), :ncpus] = vals
    out[where, ncpus + (idx // (4 * ways)).astype(np.int64)] = entries["s"]
    return out_keys, out
