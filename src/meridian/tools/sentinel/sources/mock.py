"""A synthetic sample source (`--perf-mock`): the whole user-space pipeline without the
kernel, for demos, benchmarks and tests (part 2's too).

Two modes. Generated: a batch every `period_ms` at `rate` samples/s in total, from a
few fixed flows (5-tuples as strings: nothing is sent on any network), functions in
fake JIT regions (`symbols()`, so they symbolize) and their stacks; deterministic for
a seed and a clock. Scripted (`MockSource.from_samples`): known arrays, one per poll,
e.g. HITM samples on a shared cache line, or remote-DRAM samples on a NUMA node
(`make_samples` builds them). Both obey `set_budget` (a per-CPU token bucket with a
hard-drop window, drops counted by reason like the kernel's), `set_events` and
`set_targets`. With `lbr` (`--lbr`), every sample kept that lies in a mock function
comes with synthetic branch records (mock_branches.py), as the kernel's with an LBR.
`set_targets`. Its events run all the time they are enabled (`event_times`), unless
`multiplex` names some that the "kernel" multiplexes: running = enabled / factor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.flows import FlowKey
from ..model.records import (
    CONTEXT_DTYPE,
    RX,
    TX,
    Event,
    FlowSource,
    concat,
    copy_records,
    empty_lbr,
    empty_samples,
    event_key,
    take,
)
from .mock_branches import branch_stacks
from .mock_layout import FUNC_SIZE, FUNCTIONS, JIT_BASE, PIDS, func_start

if TYPE_CHECKING:
    from .pmu_events import EventSpec

__all__ = [
    "DEFAULT_FLOWS",
    "FUNCTIONS",
    "FUNC_SIZE",
    "JIT_BASE",
    "PIDS",
    "MockFlow",
    "MockSource",
    "make_samples",
]

Array = np.ndarray[Any, Any]
NO_STACK = -14  # -EFAULT: what bpf_get_stackid returns without a stack
SHARED_LINES = 0x7F10_0000_0000  # cache lines that HITM samples point at
HEAP = 0x7F20_0000_0000  # remote-DRAM samples' addresses
RING_SAMPLES = 1 << 18  # per poll; beyond this the "ring" is full
MAX_CONTEXTS = 1 << 16  # packet contexts kept for contexts()
BLOCK = 1 << 13  # samples drawn at once, handed out over the polls


@dataclass(frozen=True)
class MockFlow:
    key: FlowKey
    direction: int
    weight: float
    gso_max: int
    pid: int


DEFAULT_FLOWS = (
    MockFlow(FlowKey("10.0.0.2", "10.0.0.1", 43012, 5201, "tcp"), RX, 0.30, 44, PIDS[0]),
    MockFlow(FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012, "tcp"), TX, 0.15, 4, PIDS[0]),
    MockFlow(FlowKey("10.0.0.3", "10.0.0.1", 40000, 53, "udp"), RX, 0.10, 1, PIDS[1]),
    MockFlow(FlowKey("fd00::2", "fd00::1", 51000, 443, "tcp"), RX, 0.15, 16, PIDS[1]),
    MockFlow(FlowKey("fd00::1", "fd00::2", 443, 51000, "tcp"), TX, 0.20, 16, PIDS[1]),
)
NO_FLOW_WEIGHT = 0.10  # samples the kernel found no packet for (flow 0)
LATE_PACKETS = 0.5  # of those, the share whose packet comes just after (skew adjuster)


def make_samples(n: int, **fields: Any) -> Array:
    """`n` samples (sample_dtype), every field given set (scalars or arrays of n),
    the rest zero, gso_segs 1 and no stacks: known streams for tests."""
    out = empty_samples(n)
    out["user_stack_id"] = NO_STACK
    out["kernel_stack_id"] = NO_STACK
    for name, value in fields.items():
        out[name] = value
    return out


class MockSource:
    """SampleSource without a kernel. `clock` is CLOCK_MONOTONIC ns (the samples'
    time base, as bpf_ktime_get_ns), `sleep` waits in poll: both injectable."""

    name = "mock"

    def __init__(
        self,
        period_ms: float = 25.0,
        rng_seed: int = 0,
        clock: Callable[[], int] = time.monotonic_ns,
        *,
        rate: float = 1000.0,
        cpus: int = 4,
        flows: Sequence[MockFlow] = DEFAULT_FLOWS,
        sleep: Callable[[float], None] = time.sleep,
        ring_samples: int = RING_SAMPLES,
        lbr: bool = False,
        multiplex: Mapping[str, float] | None = None,
    ) -> None:
        if period_ms <= 0:
            raise ValueError("period_ms must be positive")
        self.period_ns = int(period_ms * 1e6)
        self.rate = float(rate)
        self.cpus = cpus
        self.clock = clock
        self.sleep = sleep
        self.ring_samples = ring_samples
        self.lbr = lbr
        self.flows = tuple(flows)
        self._rng = np.random.default_rng(rng_seed)
        self._events: list[tuple[int, int]] = [(Event.CYCLES, 0)]
        self.multiplex = dict(multiplex or {})  # event name -> enabled / running
        self._mux = {event_key(Event.CYCLES): self.multiplex.get("cycles", 1.0)}
        self._opened_ns = clock()
        self._targets = np.empty(0, dtype=np.uint32)
        self._budget = 0
        self._hard_drop_ns = 0
        self._tokens = np.zeros(cpus, dtype=np.float64)
        self._refilled = np.zeros(cpus, dtype=np.int64)
        self._hard_until = np.zeros(cpus, dtype=np.int64)
        self._dropped = {"token_bucket": 0, "hard_drop": 0, "ring_full": 0, "target_filtered": 0}
        self._names: dict[int, FlowKey] = {f.key.flow_id: f.key for f in self.flows}
        # per flow (and one last row for flow 0), made once: a flow id is an FNV hash
        self._flow_ids = np.array([f.key.flow_id for f in self.flows] + [0], dtype=np.uint64)
        self._flow_dirs = np.array([f.direction for f in self.flows] + [RX], dtype=np.uint8)
        self._flow_pids = np.array([f.pid for f in self.flows] + [PIDS[0]], dtype=np.uint32)
        self._flow_gso = np.array([f.gso_max for f in self.flows] + [1], dtype=np.int64)
        weights = np.array([f.weight for f in self.flows] + [NO_FLOW_WEIGHT])
        self._flow_cdf = np.cumsum(weights / weights.sum())[:-1]  # to draw a flow index
        fw = np.array([w for _, _, w in FUNCTIONS])
        self._func_cdf = np.cumsum(fw / fw.sum())[:-1]
        self._block: tuple[Array, Array, Array] | None = None  # drawn samples not yet due
        self._pos = 0
        self._announced: set[int] = set()
        self._new: dict[int, FlowKey] = {}
        self._stacks: dict[int, tuple[int, ...]] = {}
        self._build_stacks()
        self._script: deque[Array] | None = None
        self._contexts: list[Array] = []
        self._last = clock()  # the generated batches so far end here
        self._opened = False  # set_events has run: sampling began then, as a kernel's
        self._carry = 0.0
        self._closed = False

    # ---- scripted mode ---------------------------------------------------------------

    @classmethod
    def from_samples(
        cls,
        samples: Array | Iterable[Array],
        flows: Iterable[FlowKey] = (),
        stacks: Mapping[int, tuple[int, ...]] | None = None,
        contexts: Array | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        cpus: int = 256,
    ) -> MockSource:
        """A source that returns these samples: one array per poll (pass a list of
        arrays for several batches), then nothing. `flows` name their flow ids,
        `stacks` give the frames of their stack ids."""
        src = cls(sleep=sleep, cpus=cpus, flows=())
        src._script = deque([samples] if isinstance(samples, np.ndarray) else list(samples))
        src._names = {k.flow_id: k for k in flows}
        src._stacks = dict(stacks or {})
        if contexts is not None:
            src._contexts.append(contexts)
        return src

    def feed(self, samples: Array) -> None:
        """One more batch for a scripted source."""
        if self._script is None:
            self._script = deque()
        self._script.append(samples)

    # ---- SampleSource ------------------------------------------------------------------

    def poll(self, timeout_s: float) -> tuple[Array, Array]:
        if self._closed:
            return empty_samples(0), empty_lbr(0)
        if self._script is not None:
            if not self._script:
                self.sleep(max(timeout_s, 0.0))
                return empty_samples(0), empty_lbr(0)
            batch = self._script.popleft()
            out = self._obey(batch, int(batch["time_ns"].max()) if len(batch) else self.clock())
            return out, self._branches(out)
        now = self.clock()
        due = self._last + self.period_ns
        if now < due:
            self.sleep(min(max(timeout_s, 0.0), (due - now) / 1e9))
            now = self.clock()
            if now < due:
                return empty_samples(0), empty_lbr(0)
        batches = (now - self._last) // self.period_ns
        start, end = self._last, self._last + batches * self.period_ns
        self._last = end
        want = self.rate * (end - start) / 1e9 + self._carry
        n = int(want)
        self._carry = want - n
        if n > self.ring_samples:
            self._dropped["ring_full"] += n - self.ring_samples
            n = self.ring_samples
        out = self._obey(self._generate(n, start, end), end)
        return out, self._branches(out)

    def _branches(self, samples: Array) -> Array:
        """With `lbr`: the branch records of the samples kept (the kernel takes them
        after the token bucket), their count in each sample's lbr_nr."""
        if not self.lbr or not len(samples):
            return empty_lbr(0)
        lbr = branch_stacks(samples)
        samples["lbr_nr"] = lbr["nr"]
        return take(lbr, lbr["nr"] > 0)

    def new_flows(self) -> dict[int, FlowKey]:
        out, self._new = self._new, {}
        return out

    def contexts(self) -> Array:
        """Packet contexts (skew.CONTEXT_DTYPE) seen since the last call: for some
        flow-0 samples, their packet a little after them, as the kernel's per-CPU
        history would show it (not part of SampleSource yet)."""
        out = concat(self._contexts) if self._contexts else np.empty(0, dtype=CONTEXT_DTYPE)
        self._contexts = []
        return out

    def stack_ips(self, stack_id: int) -> tuple[int, ...]:
        return self._stacks.get(stack_id, ())

    def dropped(self) -> dict[str, int]:
        return dict(self._dropped)

    def set_budget(self, samples_per_sec: int, hard_drop_ns: int) -> None:
        """Per CPU, as the kernel's: 0 means no limit. The bucket starts full."""
        self._budget = max(int(samples_per_sec), 0)
        self._hard_drop_ns = max(int(hard_drop_ns), 0)
        self._tokens[:] = self._headroom()
        self._refilled[:] = self.clock()
        self._hard_until[:] = 0

    def set_events(self, events: Sequence[EventSpec]) -> float:
        """Samples carry these events from now on (every mock event "opens")."""
        if events:
            self._events = [(int(e.event), int(e.raw_code)) for e in events]
            self._mux = {
                event_key(e.event, e.raw_code): self.multiplex.get(str(e.name), 1.0) for e in events
            }
            self._opened_ns = self.clock()
            self._block = None  # drawn with the old events
            if not self._opened:  # nothing was sampled before the first events opened
                self._opened, self._last = True, self._opened_ns
        return float(max(len(events), 1))

    def event_times(self) -> dict[int, tuple[float, float]]:
        """(time_enabled, time_running) ns of each event since `set_events`, by
        records.event_key: running is enabled over its `multiplex` factor (1: all)."""
        enabled = float(max(1, self.clock() - self._opened_ns))
        return {k: (enabled, enabled / f) for k, f in self._mux.items()}

    def set_targets(self, pids: Sequence[int]) -> None:
        self._targets = np.unique(np.array(list(pids), dtype=np.uint32))

    def close(self) -> None:
        self._closed = True

    # ---- for the runtime -------------------------------------------------------------

    def symbols(self) -> list[tuple[int, int, int, str]]:
        """(pid, start, end, name) of each mock function: register them as JIT
        regions so mock samples symbolize."""
        return [
            (pid, func_start(p, f), func_start(p, f) + FUNC_SIZE, name)
            for p, pid in enumerate(PIDS)
            for f, (name, _caller, _w) in enumerate(FUNCTIONS)
        ]

    @property
    def events(self) -> list[int]:
        return [e for e, _ in self._events]

    # ---- generation ------------------------------------------------------------------

    def _build_stacks(self) -> None:
        """Stack id 1 + p * len(FUNCTIONS) + f: function f of process p and its callers."""
        for p in range(len(PIDS)):
            for f in range(len(FUNCTIONS)):
                ips: list[int] = []
                cur = f
                while cur >= 0:
                    ips.append(func_start(p, cur) + 0x10 + 8 * len(ips))
                    cur = FUNCTIONS[cur][1]
                self._stacks[1 + p * len(FUNCTIONS) + f] = tuple(ips)

    def _generate(self, n: int, start: int, end: int) -> Array:
        """n samples in [start, end): rows of the drawn block, then their times."""
        rows, late_ns, late_flow = self._rows(n)
        if n == 0:
            return rows
        t = np.sort(self._rng.integers(start, max(end, start + 1), n, np.int64))
        # no two samples share a nanosecond, as none of a CPU's do in the kernel: the
        # branch records join their sample by (cpu, time_ns)
        step = np.arange(n, dtype=np.int64)
        rows["time_ns"] = np.maximum.accumulate(t - step) + step
        self._late_packets(rows, late_ns, late_flow)
        return rows

    def _rows(self, n: int) -> tuple[Array, Array, Array]:
        """The next n rows of the block (a copy), and for each the delay of its late
        packet (0: none) and that packet's flow; a new block is drawn when it runs out.
        Drawing BLOCK samples at once costs what drawing a few does: numpy calls."""
        parts: list[tuple[Array, Array, Array]] = []
        need = n
        while need > 0:
            if self._block is None or self._pos >= len(self._block[0]):
                self._block = self._draw(max(BLOCK, need))
                self._pos = 0
            block, ns, flow = self._block
            i, k = self._pos, min(need, len(block) - self._pos)
            parts.append((block[i : i + k], ns[i : i + k], flow[i : i + k]))
            self._pos += k
            need -= k
        if not parts:
            return make_samples(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(parts) == 1:
            rows, late_ns, late_flow = parts[0]
            return copy_records(rows), late_ns, late_flow
        rows = concat([p[0] for p in parts])
        late_ns = np.concatenate([p[1] for p in parts])
        return rows, late_ns, np.concatenate([p[2] for p in parts])

    def _draw(self, n: int) -> tuple[Array, Array, Array]:
        """n samples of the flows, functions and events (their times come later)."""
        rng = self._rng
        out = make_samples(n)
        cpu = rng.integers(0, self.cpus, n)
        out["cpu"] = cpu
        out["numa_node"] = cpu * 2 // max(self.cpus, 2)  # two nodes, half the CPUs each
        nf = len(self.flows)
        fi = np.searchsorted(self._flow_cdf, rng.random(n), "right")
        has = fi < nf
        out["flow_id"] = self._flow_ids[fi]
        out["direction"] = self._flow_dirs[fi]
        pid = self._flow_pids[fi]
        out["pid"] = pid
        out["tid"] = pid + rng.integers(0, 4, n).astype(np.uint32)
        out["cgroup_id"] = 1000 + pid.astype(np.uint64)
        out["ifindex"] = np.where(has, 2, 0)
        out["flow_source"] = np.where(has, FlowSource.CURRENT, FlowSource.FALLBACK)
        gso_max = self._flow_gso[fi]
        out["gso_segs"] = 1 + (rng.random(n) * gso_max).astype(np.int64)
        func = np.searchsorted(self._func_cdf, rng.random(n), "right")
        p_index = np.searchsorted(np.array(PIDS), pid)
        base = JIT_BASE + (p_index.astype(np.uint64) << np.uint64(24))
        off = rng.integers(0, FUNC_SIZE // 4, n).astype(np.uint64) * np.uint64(4)
        out["ip"] = base + func.astype(np.uint64) * np.uint64(FUNC_SIZE) + off
        out["user_stack_id"] = 1 + p_index * len(FUNCTIONS) + func
        ev = rng.integers(0, len(self._events), n)
        events = np.array([e for e, _ in self._events], dtype=np.uint16)[ev]
        out["event"] = events
        out["raw_code"] = np.array([c for _, c in self._events], dtype=np.uint32)[ev]
        hitm = events == Event.XSNP_HITM
        line = rng.integers(0, 4, n).astype(np.uint64) * np.uint64(64)
        word = rng.integers(0, 8, n).astype(np.uint64) * np.uint64(8)
        out["data_addr"] = np.where(hitm, np.uint64(SHARED_LINES) + line + word, 0)
        remote = events == Event.REMOTE_DRAM
        heap = np.uint64(HEAP) + rng.integers(0, 1 << 20, n).astype(np.uint64) * np.uint64(8)
        out["data_addr"] = np.where(remote, heap, out["data_addr"])
        # some flow-0 samples have their packet 1-150 us later (for the skew adjuster)
        late = ~has & (rng.random(n) < LATE_PACKETS) if nf else np.zeros(n, dtype=bool)
        late_ns = np.where(late, rng.integers(1_000, 150_000, n), 0).astype(np.int64)
        late_flow = rng.integers(0, max(nf, 1), n)
        return out, late_ns, late_flow

    def _late_packets(self, samples: Array, late_ns: Array, late_flow: Array) -> None:
        """Contexts 1-150 us after some flow-0 samples, on their CPU."""
        idx = np.flatnonzero(late_ns)
        if not len(idx):
            return
        ctx = np.zeros(len(idx), dtype=CONTEXT_DTYPE)
        ctx["time_ns"] = samples["time_ns"][idx] + late_ns[idx].astype(np.uint64)
        ctx["cpu"] = samples["cpu"][idx]
        ctx["flow_id"] = self._flow_ids[late_flow[idx]]
        ctx["direction"] = self._flow_dirs[late_flow[idx]]
        ctx["ifindex"] = 2
        ctx["gso_segs"] = 1
        self._contexts.append(ctx)
        while sum(len(c) for c in self._contexts) > MAX_CONTEXTS:  # nobody reads them
            self._contexts.pop(0)

    # ---- what the kernel would drop --------------------------------------------------

    def _headroom(self) -> float:
        """Most tokens kept: two batches' worth (at least 100 ms), so an idle period
        cannot release a burst."""
        return max(1.0, self._budget * max(0.1, 2 * self.period_ns / 1e9))

    def _obey(self, samples: Array, now: int) -> Array:
        if len(samples) and len(self._targets):
            keep = np.isin(samples["pid"], self._targets)
            self._dropped["target_filtered"] += int((~keep).sum())
            samples = take(samples, keep)
        if len(samples) and self._budget:
            samples = self._bucket_in_periods(samples, now)
        self._announce(samples)
        return samples

    def _bucket_in_periods(self, samples: Array, now: int) -> Array:
        """The bucket one slice at a time, in time order, as the kernel meets samples:
        a poll that took a long span at once must not look like a burst. A slice is
        at most half the time the headroom lasts, so a steady rate within the budget
        never runs it dry."""
        t = samples["time_ns"].astype(np.int64)
        first = int(t.min())
        step = max(self.period_ns, int(self._headroom() / self._budget * 1e9) // 2)
        if now - first <= step:
            return self._token_bucket(samples, now)
        order = np.argsort(t, kind="stable")
        bounds = np.arange(first + step, now + step, step)
        cuts = np.searchsorted(t[order], bounds)
        parts, lo = [], 0
        for end_ns, hi in zip(bounds.tolist(), cuts.tolist(), strict=True):
            if hi > lo:
                parts.append(self._token_bucket(take(samples, order[lo:hi]), min(end_ns, now)))
            lo = hi
        return concat(parts) if parts else empty_samples(0)

    def _token_bucket(self, samples: Array, now: int) -> Array:
        cpu = samples["cpu"].astype(np.int64)
        if int(cpu.max()) >= len(self._tokens):
            grow = int(cpu.max()) + 1 - len(self._tokens)
            self._tokens = np.concatenate([self._tokens, np.full(grow, self._headroom())])
            self._refilled = np.concatenate([self._refilled, np.full(grow, now, np.int64)])
            self._hard_until = np.concatenate([self._hard_until, np.zeros(grow, np.int64)])
        t = samples["time_ns"].astype(np.int64)
        hard = t < self._hard_until[cpu]
        self._dropped["hard_drop"] += int(hard.sum())
        elapsed = np.maximum(now - self._refilled, 0)
        self._tokens = np.minimum(self._tokens + elapsed * (self._budget / 1e9), self._headroom())
        self._refilled[:] = now
        # rank of each sample among the samples of its CPU still in play
        live = np.flatnonzero(~hard)
        lc = cpu[live]
        order = np.argsort(lc, kind="stable")
        sc = lc[order]
        rank = np.empty(len(live), dtype=np.int64)
        rank[order] = np.arange(len(live)) - np.searchsorted(sc, sc, "left")
        allowed = np.floor(self._tokens).astype(np.int64)
        ok = rank < allowed[lc]
        counts = np.bincount(lc[ok], minlength=len(self._tokens))
        self._tokens -= counts
        over = np.bincount(lc[~ok], minlength=len(self._tokens))
        self._dropped["token_bucket"] += int(over.sum())
        if self._hard_drop_ns:
            empty = over > 0
            self._hard_until[empty] = now + self._hard_drop_ns
        return take(samples, live[ok])

    def _announce(self, samples: Array) -> None:
        if not len(samples):
            return
        for fid in np.unique(samples["flow_id"]).tolist():
            if fid and fid not in self._announced and fid in self._names:
                self._announced.add(fid)
                self._new[fid] = self._names[fid]
