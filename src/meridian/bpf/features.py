"""What this kernel accepts, found by trying it: each probe loads and attaches a tiny
program of the kind in question. Results are cached for the process, and a missing
feature is always the same `NotSupported(feature, reason, fix)`.

Tools list their strategies best first (fentry, kprobe, tp_btf, tracepoint, ...) and
`choose()` takes the first whose features this kernel has. Only some features need
tracefs (`needs_tracefs`); it is mounted when a strategy that needs it is considered,
and where it cannot be, that strategy is refused and the next one tried.
"""

from __future__ import annotations

import errno as _errno
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import BpfError, MeridianError, NotSupported, TracefsMissing
from ..system import ensure_tracefs, kernel_btf_has, tracefs_mounted
from . import _libbpf as L
from . import refusals
from .object import BpfObject
from .perf import PerfEvent, open_per_cpu, perf_event_attr

__all__ = [
    "FEATURES",
    "Probe",
    "Strategy",
    "choose",
    "hook_exists",
    "needs_tracefs",
    "object_path",
    "probe",
    "require",
]

OBJ_DIR = Path(
    os.environ.get("MERIDIAN_BPF_DIR", Path(__file__).resolve().parent.parent / "bpfobj")
)


def object_path(name: str) -> Path:
    """The compiled object of a tool: `<name>.bpf.o` built by `make bpf`."""
    return OBJ_DIR / f"{name}.bpf.o"


@dataclass(frozen=True)
class Probe:
    feature: str
    ok: bool
    detail: str
    fix: str = ""
    why: str = ""  # the host's own reason for a refusal (lockdown, kernel config)
    tracefs_missing: bool = False  # refused only for want of tracefs (not mountable here)

    def require(self) -> None:
        if not self.ok:
            raise NotSupported(self.feature, self.detail, self.why or self.fix)


FEATURES = {
    "tracepoint": "tracepoint programs (tracepoint/...)",
    "tp_btf": "BTF raw tracepoints (tp_btf/...)",
    "fentry": "fentry/fexit programs",
    "kprobe": "kprobe/kretprobe programs",
    "perf_event": "perf_event programs on software events",
    "hw_perf": "hardware PMU perf events",
    "ringbuf": "ring buffer maps",
    "batch_ops": "batch map lookups",
}
_FIXES = {
    "tp_btf": "needs Linux >= 5.5 with BTF",
    "fentry": "needs Linux >= 5.5 with BTF and BPF trampolines (x86_64/arm64), no lockdown",
    "kprobe": "needs a kernel with CONFIG_KPROBES and CONFIG_KPROBE_EVENTS",
    "hw_perf": "use bare metal or a VM with a virtual PMU",
    "ringbuf": "needs Linux >= 5.8",
    "batch_ops": "needs Linux >= 5.6 (tools fall back to element-wise reads)",
}


# The kprobe PMU (Linux 4.17+): with it libbpf creates kprobes by perf_event_open,
# without it through tracefs's kprobe_events (libbpf's "legacy" kprobes).
KPROBE_PMU = Path("/sys/bus/event_source/devices/kprobe/type")


def needs_tracefs(feature: str) -> bool:
    """Does attaching programs of `feature` read tracefs? tracepoint/ programs do
    (libbpf reads the tracepoint's id in events/<category>/<name>/id), kprobes only
    where the kernel has no kprobe PMU; tp_btf, fentry/fexit and perf events never."""
    if feature == "tracepoint":
        return True
    if feature == "kprobe":
        return not KPROBE_PMU.exists()
    return False


NOT_MOUNTABLE = "needs tracefs at /sys/kernel/tracing, not mounted and not mountable here"


def _probe_tracefs() -> Probe:
    try:
        return Probe("tracefs", True, f"mounted at {ensure_tracefs()}")
    except TracefsMissing as exc:
        return Probe("tracefs", False, NOT_MOUNTABLE, TracefsMissing.FIX, exc.detail, True)


def _load_alone(program: str) -> BpfObject:
    obj = BpfObject(object_path("features"))
    try:
        obj.select([program])
        obj.load()
    except BaseException:
        obj.close()
        raise
    return obj


def _try_program(feature: str, program: str) -> Probe:
    if needs_tracefs(feature) and not (tracefs := probe("tracefs")).ok:
        return replace(tracefs, feature=feature)
    try:
        with _load_alone(program) as obj:
            obj.attach([program])
        return Probe(feature, True, "loads and attaches")
    except BpfError as exc:
        return Probe(feature, False, _short(exc), _FIXES.get(feature, ""), _why(feature))


def _why(feature: str) -> str:
    """The host's reason for refusing `feature`, where one is known."""
    if feature == "fentry":
        return refusals.fentry_reason()
    if feature == "kprobe":
        return refusals.kprobe_reason()
    return ""


def _short(exc: BpfError) -> str:
    name = _errno.errorcode.get(exc.errno, str(exc.errno))
    where = "load" if exc.call.startswith("loading") else "attach"
    return f"{where} refused with {name} ({os.strerror(exc.errno)})"


def _probe_perf_event() -> Probe:
    try:
        first, *others = open_per_cpu(PerfEvent.CPU_CLOCK, sample_period=1_000_000_000)
        for fd in others:  # one CPU is enough
            os.close(fd)
        attached = False
        try:
            with _load_alone("probe_perf_event") as obj:
                obj.programs["probe_perf_event"].attach_perf_event(first)
                attached = True  # the link owns the fd now, and closes it
        except BaseException:
            if not attached:
                os.close(first)
            raise
        return Probe("perf_event", True, "loads and attaches to cpu-clock")
    except BpfError as exc:
        return Probe("perf_event", False, _short(exc))


def _probe_hw_perf() -> Probe:
    attr = perf_event_attr(*PerfEvent.CPU_CYCLES, sample_period=1_000_000)
    fd = L.perf_event_open(attr, -1, 0, -1, 0)
    if fd >= 0:
        os.close(fd)
        return Probe("hw_perf", True, "cpu-cycles can be sampled")
    return Probe(
        "hw_perf", False, f"perf_event_open(cycles) refused: {os.strerror(-fd)}", _FIXES["hw_perf"]
    )


def _probe_ringbuf() -> Probe:
    ok = L.lib().libbpf_probe_bpf_map_type(27, None) == 1
    return Probe("ringbuf", ok, "available" if ok else "map type unknown", _FIXES["ringbuf"])


def _probe_batch() -> Probe:
    try:
        with _load_alone("probe_tracepoint") as obj:
            m = obj.maps["probe_hash"]
            m.update(1, 7)
            m._batch(delete=False)
        return Probe("batch_ops", True, "available")
    except BpfError as exc:
        return Probe("batch_ops", False, _short(exc), _FIXES["batch_ops"])
    except Exception as exc:  # _BatchUnsupported
        return Probe("batch_ops", False, f"refused ({exc})", _FIXES["batch_ops"])


@functools.cache
def probe(feature: str) -> Probe:
    """The cached answer for one feature of FEATURES, or for "tracefs": mounted, or
    mounted now (ensure_tracefs), or why it cannot be."""
    try:
        if feature == "tracefs":
            return _probe_tracefs()
        if feature == "tracepoint":
            return _try_program(feature, "probe_tracepoint")
        if feature == "tp_btf":
            return _try_program(feature, "probe_tp_btf")
        if feature == "fentry":
            return _try_program(feature, "probe_fentry")
        if feature == "kprobe":
            return _try_program(feature, "probe_kprobe")
        if feature == "perf_event":
            return _probe_perf_event()
        if feature == "hw_perf":
            return _probe_hw_perf()
        if feature == "ringbuf":
            return _probe_ringbuf()
        if feature == "batch_ops":
            return _probe_batch()
    except MeridianError as exc:
        return Probe(feature, False, str(exc))
    raise KeyError(f"unknown feature {feature!r}")


def require(feature: str) -> None:
    probe(feature).require()


def hook_exists(section: str) -> bool:
    """Does the kernel have the hook a program's section names?"""
    kind, _, rest = section.partition("/")
    if kind == "tp_btf":
        return kernel_btf_has("btf_trace_" + rest)
    if kind in ("tracepoint", "tp"):
        tracefs = tracefs_mounted()
        return tracefs is not None and (tracefs / "events" / rest).is_dir()
    if kind in ("fentry", "fexit", "kprobe", "kretprobe"):
        return kernel_btf_has(rest.split("+")[0])
    return True


@dataclass(frozen=True)
class Strategy:
    """One way to hook a tool: its programs (by name) and the features they need;
    whether it needs tracefs follows from those features (`needs_tracefs`)."""

    name: str
    programs: tuple[str, ...]
    needs: tuple[str, ...]
    optional: tuple[str, ...] = field(default=())

    @property
    def needs_tracefs(self) -> bool:
        return any(needs_tracefs(f) for f in self.needs)

    def missing(self) -> list[Probe]:
        """What this kernel refuses of the strategy's needs: the kernel's own refusals
        first, then those for want of tracefs (probing a feature that needs it mounts
        it where it can be)."""
        refused = [p for p in (probe(f) for f in self.needs) if not p.ok]
        return sorted(refused, key=lambda p: p.tracefs_missing)


def _refused(refusals: Sequence[tuple[Strategy, Probe]]) -> MeridianError:
    """One line for strategies that cannot run here, each by its first refusal: when
    some could run but for tracefs, TracefsMissing names them with the fix."""
    by_tracefs = [s.name for s, p in refusals if p.tracefs_missing]
    others = "; ".join(f"{s.name}: {p.detail}" for s, p in refusals if not p.tracefs_missing)
    if by_tracefs:
        mount_error = next(p.why for _, p in refusals if p.tracefs_missing)
        return TracefsMissing(mount_error, by_tracefs, others)
    if len(refusals) == 1:
        p = refusals[0][1]
        return NotSupported(p.feature, p.detail, p.why or p.fix)
    return NotSupported("every strategy", others)


def choose(strategies: Sequence[Strategy], forced: str | None = None) -> Strategy:
    """The first strategy whose features this kernel has (or the one asked for)."""
    if forced:
        by_name = {s.name: s for s in strategies}
        if forced not in by_name:
            raise NotSupported(f"strategy {forced!r}", f"choose one of {', '.join(by_name)}")
        chosen = by_name[forced]
        if missing := chosen.missing():
            raise _refused([(chosen, missing[0])])
        return chosen
    refusals = []
    for s in strategies:
        missing = s.missing()
        if not missing:
            return s
        refusals.append((s, missing[0]))
    raise _refused(refusals)
