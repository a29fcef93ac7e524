"""The kernel sample source of `meridian sentinel`: loads bpf/sentinel.bpf.c, hooks
the packet path (the first strategy this kernel accepts, plus XDP on named
interfaces), opens the sampled perf events on every online CPU with the
ms_pmu_handler program attached, and hands user space numpy batches of samples.

Budgets, targets and the event set change while it runs (maps, not reloads). Where
an event needs a PMU the host lacks (a VM), it samples `cpu-clock` instead, says so
once on stderr and labels those samples MS_EVT_CPU_CLOCK: the event actually used.
`resolve` says which event it would open for one and `event_times` how long each
held a counter of the time it was enabled (perf_open.py): the runtime scales each
event's samples by what was really sampled.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ....bpf import BpfObject, Link, RingBuffer, Strategy, choose, hook_exists
from ....errors import UsageError
from ....session import Session
from ..model.records import MAX_SLOTS
from .lbr import LBR_BRANCH_STACK, LBR_OFF, LBR_SNAPSHOT, MODES, require_lbr
from .perf_open import EventOpener
from .pmu_events import LOGICAL, EventSpec
from .stackmaps import STACK_ENTRIES, STACK_MAPS, StackSides

if TYPE_CHECKING:
    from ..model.flows import FlowKey

__all__ = [
    "DEFAULT_FREQUENCY",
    "DROP_REASONS",
    "LBR_BRANCH_STACK",
    "LBR_OFF",
    "LBR_SNAPSHOT",
    "NET_PROGRAMS",
    "PMU_PROGRAM",
    "STRATEGIES",
    "XDP_PROGRAM",
    "KernelSource",
]

DEFAULT_FREQUENCY = 99  # samples/s per event and CPU (perf's -F 99: off the 100 Hz tick)
PMU_PROGRAM = "ms_pmu_handler"
XDP_PROGRAM = "ms_xdp_rx"
# program -> its section: what hook_exists() checks before a strategy is chosen
NET_PROGRAMS = {
    "ms_fentry_tx": "fentry/__dev_queue_xmit",
    "ms_btf_rx": "tp_btf/netif_receive_skb",
    "ms_btf_tx": "tp_btf/net_dev_start_xmit",
}
STRATEGIES = (
    Strategy(
        "fentry",
        ("ms_btf_rx", "ms_fentry_tx", PMU_PROGRAM),  # RX: see bpf/sentinel.bpf.c
        ("fentry", "tp_btf", "perf_event", "ringbuf"),
    ),
    Strategy(
        "tp_btf",
        ("ms_btf_rx", "ms_btf_tx", PMU_PROGRAM),
        ("tp_btf", "perf_event", "ringbuf"),
    ),
)
# ms_counters fields that are samples lost in the kernel (dropped() reports these)
DROP_REASONS = ("token_bucket", "hard_drop", "ring_full")  # lbr_ring_full: the
# sample went out without its branches, so it is in counters(), not a lost sample
# Samples taken from the ring per poll: a consumer behind takes the backlog in batches
# of this many (5 MiB) back to back, rather than the whole ring at once (a 64 MiB ring
# then meant copies of 64 MiB at each step of the pipeline, and 300-400 MB RSS), until
# the ring is half full: then all of it (KernelSource.poll).
BATCH_LIMIT = 1 << 16
SLOT_DATA_ADDR = 1  # MS_SLOT_DATA_ADDR
# an ms_lbr record is ~4x a sample's: its ring holds as many seconds (a page when off)
LBR_RING_RATIO, LBR_RING_MAX = 4, 1 << 26


def _warn(msg: str) -> None:
    print(f"meridian sentinel: {msg}", file=sys.stderr)


def _max_sample_rate(path: str = "/proc/sys/kernel/perf_event_max_sample_rate") -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 100_000


def _ifindex(name: str) -> int:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise UsageError(f"--xdp {name}: no such network interface") from None


def _pick(forced: str | None) -> Strategy:
    """The first strategy whose features and hooks this kernel has."""
    usable = [
        s for s in STRATEGIES if all(hook_exists(NET_PROGRAMS.get(p, "")) for p in s.programs)
    ]
    if forced and forced not in {s.name for s in STRATEGIES}:
        raise UsageError(
            f"--strategy {forced}: choose one of {', '.join(s.name for s in STRATEGIES)}"
        )
    return choose(usable or STRATEGIES, forced)


def _slot_value(spec: EventSpec) -> int:
    """MS_COOKIE_VALUE(event, flags, raw_code) of sentinel.h."""
    flags = SLOT_DATA_ADDR if spec.data_address else 0
    return (spec.raw_code << 32) | (flags << 16) | int(spec.event)


class KernelSource(Session):
    """The SampleSource of the real kernel. Use as a context manager, or `open()` then
    `close()`; `close()` leaves no program, link or perf event behind."""

    OBJECT = "sentinel"

    def __init__(
        self,
        events: Sequence[EventSpec] = (),
        *,
        frequency: int = DEFAULT_FREQUENCY,
        samples_per_sec: int = 0,
        hard_drop_ns: int = 0,
        headroom_s: float = 0.05,
        xdp: Sequence[str] = (),
        pids: Sequence[int] = (),
        strategy: str | None = None,
        stacks: bool = True,
        lbr: int = LBR_OFF,
        ring_bytes: int = 1 << 22,
        stack_entries: int = STACK_ENTRIES,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        """`frequency` (-F) is per event and CPU; `samples_per_sec` (0: no limit) and
        `hard_drop_ns` are the per-CPU token bucket; `headroom_s` of budget is the most
        an idle CPU saves up; `xdp` names interfaces for the XDP RX hook; `lbr` is
        LBR_OFF, LBR_SNAPSHOT or LBR_BRANCH_STACK (lbr.py: refused, NoLBR, where the
        CPU records no branches); `stack_entries` sizes each of the two stack maps."""
        if frequency <= 0:
            raise UsageError(f"-F {frequency}: the sampling frequency must be positive")
        limit = _max_sample_rate()
        if frequency > limit:
            raise UsageError(f"-F {frequency}: above kernel.perf_event_max_sample_rate ({limit})")
        if (
            ring_bytes <= 0
            or ring_bytes & (ring_bytes - 1)
            or ring_bytes % os.sysconf("SC_PAGE_SIZE")
        ):
            raise ValueError(f"ring_bytes {ring_bytes} is not a power-of-two number of pages")
        self.frequency = frequency
        self.headroom_s = headroom_s
        self.xdp = {name: _ifindex(name) for name in xdp}
        self.stacks = stacks
        if lbr not in MODES.values():
            raise ValueError(f"lbr {lbr}: not one of {sorted(MODES.values())}")
        require_lbr(next(k for k, v in MODES.items() if v == lbr))
        self.lbr = lbr
        self.ring_bytes = ring_bytes
        self.batch_limit = BATCH_LIMIT  # samples per poll (the consumer drains by it)
        self.warn = warn
        self.strategy = _pick(strategy)
        self.name = "kernel"
        self._events = list(events) or [LOGICAL["cpu-clock"]]
        self._budget = (samples_per_sec, hard_drop_ns)
        self._pids = list(pids)
        self._perf_links: list[Link] = []
        self._opened: list[EventSpec] = []
        self._perf = EventOpener(frequency, lbr != LBR_OFF, warn)
        self._seq = 0
        self._known_flows = np.zeros(0, dtype=np.uint64)
        self._context_seen = np.zeros(0, dtype=np.uint64)  # per CPU: newest context returned
        self._lbr_ring: RingBuffer | None = None
        self.stack_entries = max(16, int(stack_entries))
        self._stacks = StackSides(self.stack_entries)
        self._sample_dtype: np.dtype[Any] | None = None
        self._lbr_dtype: np.dtype[Any] | None = None

    # ---- lifecycle -----------------------------------------------------------------

    @property
    def hooks(self) -> list[str]:
        """The attached hooks by section name (for -v and doctor)."""
        net = [NET_PROGRAMS[p] for p in self.strategy.programs if p in NET_PROGRAMS]
        return net + [f"xdp/{name}" for name in self.xdp] + ["perf_event"]

    def open(self) -> KernelSource:
        """Load and attach (the same as entering the context manager)."""
        return self.__enter__()

    def setup(self, obj: BpfObject) -> None:
        assert obj.btf is not None
        self._sample_dtype = obj.btf.struct_dtype("ms_sample")
        self._lbr_dtype = obj.btf.struct_dtype("ms_lbr")
        obj.resize("ms_events", self.ring_bytes)
        page = os.sysconf("SC_PAGE_SIZE")
        lbr_bytes = min(self.ring_bytes * LBR_RING_RATIO, LBR_RING_MAX) if self.lbr else page
        obj.resize("ms_lbr_events", lbr_bytes)
        for name in STACK_MAPS:
            obj.resize(name, self.stack_entries)
        obj.set_rodata(
            {
                # Wake the reader only once a quarter of the ring is full: it drains on
                # its own timer (a wake-up per record costs microseconds here).
                "wakeup_bytes": self.ring_bytes // 4,
                "collect_stacks": self.stacks,
                "self_tgid": os.getpid(),  # the agent: its samples carry no user stack
                "lbr_mode": self.lbr,
            }
        )
        programs = list(self.strategy.programs) + ([XDP_PROGRAM] if self.xdp else [])
        obj.select(programs)
        obj.load()
        self.obj = obj  # the setters below write its maps
        try:
            self._attach(obj, programs)
        except BaseException:
            if self._lbr_ring is not None:
                self._lbr_ring.close()
                self._lbr_ring = None
            self.obj = None  # Session closes the object and the ring
            raise

    def _attach(self, obj: BpfObject, programs: list[str]) -> None:
        assert self._sample_dtype is not None and self._lbr_dtype is not None
        self.set_budget(*self._budget)
        self.set_targets(self._pids)
        obj.attach([p for p in programs if p in NET_PROGRAMS])
        for ifindex in self.xdp.values():
            obj.programs[XDP_PROGRAM].attach_xdp(ifindex)
        self.ring = RingBuffer.of_map(obj.maps["ms_events"], self._sample_dtype)
        if self.lbr:
            self._lbr_ring = RingBuffer.of_map(obj.maps["ms_lbr_events"], self._lbr_dtype)
        self.set_events(self._events)

    def stop_sampling(self) -> None:
        """Detach and close the perf events (the packet hooks stay): on stop, the
        ring is then drained of every sample the kernel will ever emit, and the
        counters hold still."""
        self._perf.untrack()
        if self.obj is not None:
            self.obj.drop(self._perf_links)
        self._perf_links = []
        self._opened = []

    def close(self) -> None:
        """Detach everything: perf events, packet hooks, XDP; free the object."""
        self.stop_sampling()
        if self._lbr_ring is not None:
            self._lbr_ring.close()
            self._lbr_ring = None
        super().__exit__(None, None, None)
        self.ring = None
        self.obj = None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _obj(self) -> BpfObject:
        if self.obj is None:
            raise RuntimeError("KernelSource is not open")
        return self.obj

    # ---- samples ---------------------------------------------------------------------

    def poll(self, timeout_s: float) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Samples and LBR records since the last call (waits up to `timeout_s` for a
        wake-up, which comes only when the ring fills: call it on a timer)."""
        assert self._sample_dtype is not None and self._lbr_dtype is not None
        if self.ring is None:
            return np.empty(0, self._sample_dtype), np.empty(0, self._lbr_dtype)
        began = time.monotonic()
        self._stacks.before_poll(self._obj(), began)
        # Past half full the ring is emptied at once: a starved consumer then holds the
        # backlog in its own memory, not the kernel's ring that would drop what comes.
        limit = self.batch_limit if self.ring.fill() < 0.5 else None
        samples = self.ring.poll(timeout_s, limit)
        if self.stacks:
            self._stacks.after_poll(self._obj(), samples, began)
        lbr = (
            self._lbr_ring.drain()
            if self._lbr_ring is not None
            else np.empty(0, dtype=self._lbr_dtype)
        )
        return samples, lbr

    def contexts(self) -> np.ndarray[Any, Any]:
        """The packet contexts of every CPU's history ring (`ms_hist`) not returned
        before, as skew.CONTEXT_DTYPE rows: the skew adjuster gives their flow to the
        samples that came just before them. Each CPU keeps its last MS_HISTORY_LEN
        packets; when packets come faster than the polls, older ones are gone, but
        then a sample finds a recent packet in the kernel already."""
        from ..model.records import CONTEXT_DTYPE

        hist = self._obj().maps["ms_hist"].lookup(0)["ctx"]  # (cpus, MS_HISTORY_LEN)
        cpus = np.repeat(np.arange(hist.shape[0], dtype=np.uint32), hist.shape[1])
        flat = hist.reshape(-1)
        if len(self._context_seen) != hist.shape[0]:
            self._context_seen = np.zeros(hist.shape[0], dtype=np.uint64)
        fresh = (flat["time_ns"] > self._context_seen[cpus]) & (flat["time_ns"] > 0)
        out = np.empty(int(fresh.sum()), dtype=CONTEXT_DTYPE)
        for name in CONTEXT_DTYPE.names or ():
            out[name] = cpus[fresh] if name == "cpu" else flat[name][fresh]
        np.maximum.at(self._context_seen, out["cpu"], out["time_ns"])
        out.sort(order=["cpu", "time_ns"])
        return out

    def wake(self) -> None:
        """Wake a poll() blocked in another thread (stop)."""
        if self.ring is not None:
            self.ring.wake()

    def new_flows(self) -> dict[int, FlowKey]:
        """flow_id -> 5-tuple for the flows that entered the kernel's LRU map since the
        last call (a flow evicted and seen again is reported again)."""
        from ..model.flows import FlowKey

        keys, vals = self._obj().maps["ms_flows"].items()
        keys = keys.astype(np.uint64, copy=False)
        fresh = ~np.isin(keys, self._known_flows)
        self._known_flows = keys.copy()
        raw = vals.tobytes()
        size = vals.dtype.itemsize
        return {
            int(keys[i]): FlowKey.from_bytes(raw[i * size : (i + 1) * size])
            for i in np.flatnonzero(fresh)
        }

    def stack_ips(self, stack_id: int) -> tuple[int, ...]:
        """The frames of a stack id (of ms_stacks or ms_stacks_b), innermost first;
        () if gone (its side was emptied before it was asked: see stack_counts)."""
        if stack_id < 0 or self.obj is None:
            return ()
        return self._stacks.ips(self.obj, stack_id)

    def stack_counts(self) -> dict[str, int]:
        """How the stack maps are recycled: side switches, ids deleted, ids asked
        after their side was emptied (gone)."""
        return self._stacks.counts()

    def counters(self) -> dict[str, int]:
        """Every kernel counter (ms_counters) summed over the CPUs, plus the ring's
        records of an unexpected size (Session.BAD_RECORDS)."""
        out = self._obj().maps["ms_counters"].summed()
        if self.ring is not None:
            out[self.BAD_RECORDS] = self.ring.bad_records
        return out

    def dropped(self) -> dict[str, int]:
        """Cumulative samples lost in the kernel, by reason (target_filtered is a
        filter, not a loss: see counters())."""
        c = self.counters()
        return {reason: c[reason] for reason in DROP_REASONS}

    # ---- control -----------------------------------------------------------------------

    def set_budget(self, samples_per_sec: int, hard_drop_ns: int) -> None:
        """Per-CPU token bucket, in force at the next sample (0 samples/s: no limit)."""
        if samples_per_sec < 0 or hard_drop_ns < 0:
            raise UsageError(
                f"budget {samples_per_sec} samples/s, hard drop {hard_drop_ns} ns: "
                "must not be negative"
            )
        self._budget = (samples_per_sec, hard_drop_ns)
        if self.obj is None:
            return  # applied by open()
        self._seq += 1
        headroom = max(1, round(samples_per_sec * self.headroom_s))
        self._obj().maps["ms_tb_cfg"].update(
            0,
            {
                "samples_per_sec": samples_per_sec,
                "headroom": headroom,
                "hard_drop_ns": hard_drop_ns,
                "seq": self._seq,
            },
        )

    def set_targets(self, pids: Sequence[int]) -> None:
        """Kernel-side filter on thread group ids; [] samples everything."""
        wanted = {int(p) for p in pids}
        self._pids = sorted(wanted)
        if self.obj is None:
            return  # applied by open()
        m = self.obj.maps["ms_target_pids"]
        ctrl = self.obj.maps["ms_ctrl"]
        if not wanted:
            ctrl.update(0, {"pid_filter": 0})
        present = m.keys()
        for key in present:
            if int(key) not in wanted:
                m.delete(int(key))
        for pid in wanted:
            m.update(pid, 1)
        if wanted:
            ctrl.update(0, {"pid_filter": 1})

    def set_events(self, events: Sequence[EventSpec]) -> float:
        """Sample these events now, each on every online CPU, replacing the current
        set. An event the host cannot count (no PMU) becomes cpu-clock, said once.
        Returns the number of distinct events opened: the group's size."""
        if not events:
            raise UsageError("no event to sample: name at least one, e.g. cpu-clock")
        if len(events) > MAX_SLOTS:
            raise UsageError(f"{len(events)} events: at most {MAX_SLOTS} at once")
        if self.obj is None:
            self._events = list(events)  # opened by open()
            return float(len(set(events)))
        obj = self.obj
        opened: list[tuple[EventSpec, list[int]]] = []
        fallback = False
        try:
            # The new events are opened before the old ones go: one that cannot be
            # opened leaves the running set as it was.
            for spec in events:
                fds, used = self._perf.open(spec)
                if used is not spec:
                    fallback = True
                if any(o is used for o, _ in opened):  # cpu-clock twice (fallbacks)
                    for fd in fds:
                        os.close(fd)
                    continue
                opened.append((used, fds))
            self._perf.untrack()  # the events closed now: their last times
            obj.drop(self._perf_links)
            self._perf_links = []
            cookies = obj.maps["ms_event_cookie"]
            for slot, (spec, _) in enumerate(opened):
                cookies.update(slot, _slot_value(spec))
            prog = obj.programs[PMU_PROGRAM]
            attached = [(spec, list(fds)) for spec, fds in opened]
            for slot, (_, fds) in enumerate(opened):
                while fds:
                    self._perf_links.append(prog.attach_perf_event(fds[0], cookie=slot))
                    fds.pop(0)  # the link owns the fd now
            self._perf.track(attached)  # read while their links live
        finally:
            for _, fds in opened:
                for fd in fds:
                    os.close(fd)
        self._events = list(events)
        self._opened = [spec for spec, _ in opened]
        names = ",".join(s.name for s in self._opened)
        self.name = f"{names} (software fallback)" if fallback else names
        return float(len(self._opened))

    @property
    def opened(self) -> list[EventSpec]:
        """The events sampled now (after any fallback)."""
        return list(self._opened)

    def resolve(self, spec: EventSpec) -> EventSpec | None:
        """The event `set_events` opens for `spec`: itself, cpu-clock where the host
        cannot count it, None where it cannot be opened (EventOpener.resolve)."""
        return self._perf.resolve(spec)

    def event_times(self) -> dict[int, tuple[int, int]]:
        """(time_enabled, time_running) ns of each event sampled now, summed over the
        CPUs, and the last of each sampled before, by records.event_key: running is
        short of enabled when the kernel multiplexes more events than counters."""
        return self._perf.times()
