"""What this kernel accepts, found by trying it: each probe loads and attaches a tiny
program of the kind in question. Results are cached for the process, and a missing
feature is always the same `NotSupported(feature, reason, fix)`.

Tools list their strategies best first (fentry, kprobe, tp_btf, tracepoint, ...) and
`choose()` takes the first whose features this kernel has.
"""

from __future__ import annotations

import errno as _errno
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BpfError, MeridianError, NotSupported
from ..system import TRACEFS, kernel_btf_has
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
    """The cached answer for one feature of FEATURES."""
    try:
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
        return (TRACEFS / "events" / rest).is_dir()
    if kind in ("fentry", "fexit", "kprobe", "kretprobe"):
        return kernel_btf_has(rest.split("+")[0])
    return True


@dataclass(frozen=True)
class Strategy:
    """One way to hook a tool: its programs (by name) and the features they need."""

    name: str
    programs: tuple[str, ...]
    needs: tuple[str, ...]
    optional: tuple[str, ...] = field(default=())

    def missing(self) -> list[Probe]:
        return [p for p in (probe(f) for f in self.needs) if not p.ok]


def choose(strategies: Sequence[Strategy], forced: str | None = None) -> Strategy:
    """The first strategy whose features this kernel has (or the one asked for)."""
    if forced:
        by_name = {s.name: s for s in strategies}
        if forced not in by_name:
            raise NotSupported(f"strategy {forced!r}", f"choose one of {', '.join(by_name)}")
        chosen = by_name[forced]
        for p in chosen.missing():
            p.require()
        return chosen
    reasons = []
    for s in strategies:
        missing = s.missing()
        if not missing:
            return s
        reasons.append(f"{s.name}: {missing[0].detail}")
    raise NotSupported("every strategy", "; ".join(reasons))
