"""Branch records (LBR) of `meridian sentinel --lbr`: the modes the kernel program
has, and the probe that refuses them where the CPU records no branches.

The program (bpf/sentinel.bpf.c, `lbr_mode`) reads a sample's last taken branches
in one of two ways, chosen at load time:

- `branch-stack` (`--lbr`, `perf.lbr: on`): bpf_read_branch_records, the branch stack
  the PMU recorded for this very sample; its hardware events are opened with
  `branch_sample_type` (any branch, user and kernel). The helper made for perf_event
  programs: the default.
- `snapshot`: bpf_get_branch_snapshot, the helper of docs/requirements/sentinel.md
  §2.3: the LBR as the program finds it, kept recording by the same events (the kernel
  implements it for Intel's LBR and AMD's LbrExtV2 only).

Either needs a PMU that records branches (Intel LBR, AMD BRS/LbrExtV2, Arm BRBE); a
VM has one only with a virtual PMU that passes LBR through. One perf_event_open of
`cycles` with a branch stack, on one CPU, at start says whether this host has it;
where it fails, the run is refused in one line rather than storing empty branch
arrays. The records go through the ring `ms_lbr_events`, are joined to their sample
by (cpu, time_ns) and stored in ms_raw_samples.lbr_from / lbr_to (`--raw-samples`).
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable

from ....bpf import _libbpf as L
from ....bpf.perf import PERF_FLAG_FD_CLOEXEC, online_cpus
from ....errors import NoLBR, PermissionProblem
from .pmu_events import LOGICAL

__all__ = [
    "LBR_BRANCH_STACK",
    "LBR_OFF",
    "LBR_SNAPSHOT",
    "MODES",
    "lbr_problem",
    "probe_lbr",
    "require_lbr",
]

LBR_OFF, LBR_SNAPSHOT, LBR_BRANCH_STACK = 0, 1, 2  # the program's lbr_mode
# perf.lbr's names -> lbr_mode (config/fields.py's LbrMode has the same names)
MODES = {"off": LBR_OFF, "branch-stack": LBR_BRANCH_STACK, "snapshot": LBR_SNAPSHOT}
PROBE_EVENT = "cycles"
FIX = (
    "run on bare metal, or in a VM with a virtual PMU that passes LBR through, "
    "or drop --lbr (perf.lbr: off)"
)


def _in_vm(path: str = "/proc/cpuinfo") -> bool:
    """The CPU says it runs under a hypervisor (x86's `hypervisor` flag)."""
    try:
        with open(path) as f:
            return any(
                line.startswith("flags") and "hypervisor" in line.split(":", 1)[1].split()
                for line in f
            )
    except OSError:
        return False


def _meaning(err: int) -> str:
    """What a refusal of a branch stack says about the host."""
    if err in (errno.ENOENT, errno.ENODEV):
        return "no hardware PMU here" + (" (a VM without a virtual PMU)" if _in_vm() else "")
    if err == errno.EOPNOTSUPP:
        return "the PMU records no branches (no LBR)"
    if err == errno.EINVAL:
        return "the PMU takes no branch stack on this event (no usable LBR)"
    return os.strerror(err)


def probe_lbr(
    open_event: Callable[[bytes, int, int, int, int], int] = L.perf_event_open,
    cpu: int | None = None,
) -> str | None:
    """Why this host cannot record branches, or None where it can: `cycles` with a
    branch stack opened (and closed) on one CPU, as the sampled events will be.
    Without the right to sample kernel branches, PermissionProblem."""
    attr = LOGICAL[PROBE_EVENT].attr(freq=1, lbr=True)
    where = online_cpus()[0] if cpu is None else cpu
    fd = open_event(attr, -1, where, -1, PERF_FLAG_FD_CLOEXEC)
    if fd >= 0:
        os.close(fd)
        return None
    err = -fd
    if err in (errno.EACCES, errno.EPERM):
        raise PermissionProblem("sampling branch records (--lbr)")
    # (Linux's ENOTSUP is EOPNOTSUPP: the name the kernel returns)
    name = "EOPNOTSUPP" if err == errno.EOPNOTSUPP else errno.errorcode.get(err, str(err))
    return (
        f"perf_event_open of {PROBE_EVENT} with branch_sample_type failed with {name}: "
        f"{_meaning(err)}"
    )


@functools.cache
def lbr_problem() -> str | None:
    """probe_lbr() once per process."""
    return probe_lbr()


def require_lbr(mode: str) -> None:
    """Refuse branch records (`mode`, a perf.lbr name) where the host has none: NoLBR,
    one line with why and what to do."""
    if MODES.get(mode, LBR_OFF) == LBR_OFF:
        return
    problem = lbr_problem()
    if problem is not None:
        raise NoLBR(f"--lbr {mode}: this host records no branches ({problem}); {FIX}")
