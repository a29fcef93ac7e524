"""The kernel side of `meridian syscalls`: the probe strategies, the per-syscall table
the program reads (`meta_table`) and the Session (`Capture`) that loads bpf/syscalls.bpf.c
with the options as read-only data and reads its ring buffer."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from ...bpf import BpfObject, RingBuffer, Strategy, choose
from ...proc import kernel_data_addresses
from ...session import Session
from .event import Syscall
from .jsonl_spool import SpooledJsonRecorder
from .numbers import NUMBERS
from .options import Options
from .recording_file import Recorder
from .ring_records import decode_frames, frames
from .signatures import fd_position, out_position, string_positions

__all__ = ["MAX_NR", "STRATEGIES", "Capture", "meta_table"]

STRATEGIES = (
    Strategy("tp_btf", ("btf_sys_enter", "btf_sys_exit", "btf_fork", "btf_exit"), ("tp_btf",)),
    Strategy("tracepoint", ("tp_sys_enter", "tp_sys_exit", "tp_fork", "tp_exit"), ("tracepoint",)),
)
MAX_NR = 512  # SYSCALLS_MAX_NR in bpf/syscalls.h
# The kernel's sequence counts that validate the fd path cache (bpf/syscalls_path.bpf.h).
PATH_CACHE_LOCKS = ("rename_lock", "mount_lock")


def meta_table(names: Iterable[str], anon_mmap: bool = False) -> list[dict[str, Any]]:
    """One `struct syscalls_meta` per syscall number: traced, string, fd and output
    positions. mmap is traced for files only, unless `anon_mmap` (asked for by name
    with -e, or --all): then anonymous maps (fd -1) too."""
    traced = set(names)
    rows = []
    for nr in range(MAX_NR):
        name = NUMBERS.get(nr, "")
        pos = list(string_positions(name)) if name else []
        pos += [-1] * (2 - len(pos))
        out_pos, out_kind = out_position(name) if name else (-1, 0)
        rows.append(
            {
                "traced": int(name in traced),
                "str_pos": pos,
                "fd_pos": fd_position(name) if name else -1,
                "need_fd": int(name == "mmap" and not anon_mmap),
                "out_pos": out_pos,
                "out_kind": out_kind,
            }
        )
    return rows


class Capture(Session):
    """The loaded program and its ring buffer. `poll_raw()` returns the records as the
    ring holds them (variable size: strings packed behind each header), `decode()`
    turns them into events, `poll()` does both."""

    OBJECT = "syscalls"

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy = choose(STRATEGIES, opts.strategy)
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        self.dtype: Any = None
        self._pids_epoch = 0  # pids_epoch's value: user space alone writes it
        self.path_cache = False  # fd paths cached in the kernel (kallsyms lists the locks)

    def setup(self, obj: BpfObject) -> None:
        o = self.opts
        size = max(1, o.ring_mb) << 20
        size = 1 << (size - 1).bit_length()  # a power of 2
        obj.resize("events", size)
        obj.set_rodata(
            {
                "filter_pids": bool(o.pids or o.command),
                "follow_children": o.follow,
                "trace_all": o.all,
                "self_tgid": os.getpid(),
                "filter_cgroup": o.cgroup is not None,
                "cgroup_id": o.cgroup[0] if o.cgroup else 0,
                "cgroup_level": o.cgroup[1] if o.cgroup else 0,
                "wakeup_bytes": size // 4,
                "ring_bytes": size,
            }
        )
        locks = kernel_data_addresses(PATH_CACHE_LOCKS)
        self.path_cache = all(locks.values())  # else every fd's path is walked
        comm = o.kernel_comm()
        if comm is not None:
            pat, fold = comm
            obj.set_rodata(
                {
                    "filter_comm": True,
                    "comm_fold": fold,
                    "comm_pat_len": len(pat),
                    "comm_pat": pat,
                }
            )
        obj.select(self.strategy.programs)
        obj.load()
        meta = obj.maps["sc_meta"]
        anon_mmap = o.all or "mmap" in o.names
        for nr, row in enumerate(meta_table(o.traced_names(), anon_mmap)):
            meta.update(nr, row)
        for pid in o.pids:
            self.add_pid(pid, obj)
        if self.path_cache:
            for i, addr in enumerate(locks.values()):
                obj.maps["path_locks"].update(i, addr)
        obj.attach()
        assert obj.btf is not None
        self.dtype = obj.btf.struct_dtype("syscalls_event")
        self.ring = RingBuffer.of_map(obj.maps["events"], self.dtype)

    def path_cache_text(self) -> str:
        """Whether fd paths are cached, said for -v."""
        if self.path_cache:
            return "on (checked against rename_lock and mount_lock)"
        return (
            "off: /proc/kallsyms does not list rename_lock and mount_lock (a kernel "
            "without CONFIG_KALLSYMS_ALL, or kptr_restrict); every fd path is walked"
        )

    def add_pid(self, pid: int, obj: BpfObject | None = None) -> None:
        """Trace `pid` from its next syscall: added to the set, then the set's epoch
        bumped, which turns the CPUs' memos of "not traced" stale (syscalls.bpf.c)."""
        o = obj or self.obj
        assert o is not None
        o.maps["pids"].update(pid, 1)
        self._pids_epoch += 1
        o.maps["pids_epoch"].update(0, self._pids_epoch)

    def poll_raw(self, timeout: float) -> tuple[bytes, int]:
        """Wait up to `timeout` for the ring to fill past its mark, then every record
        committed so far, framed as in the ring, and how many."""
        assert self.ring is not None
        if timeout > 0:
            self.ring.wait(timeout)
        return self.ring.drain_bytes()

    def decode(self, chunk: bytes) -> list[Syscall]:
        return decode_frames(frames(chunk), self.dtype, self.offset_ns)

    def poll(self, timeout: float) -> list[Syscall]:
        return self.decode(self.poll_raw(timeout)[0])

    def recorder(self, path: str, tool_args: list[str], raw: bool) -> Recorder:
        """Raw records either way: kept as they are, or spooled and written as JSON
        lines at the end, so a recording keeps up with the kernel."""
        if raw:
            return Recorder(path, tool_args, raw_dtype=self.dtype, wall_offset_ns=self.offset_ns)
        return SpooledJsonRecorder(path, tool_args, self.dtype, self.offset_ns)
