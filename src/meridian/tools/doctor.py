"""meridian doctor: what this kernel allows, which strategy each tool will use, and
what is missing with how to fix it; and where container ids and names come from."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from ..bpf import BpfObject, Strategy, features, object_path, refusals
from ..cgroup import cgroup2_mounts
from ..containers import RuntimeFiles
from ..errors import MeridianError
from ..flags import add_command
from ..output import JsonWriter
from ..system import KERNEL_BTF, has_bpf_privileges, raise_memlock, tracefs_mounted
from . import summary

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "doctor",
        help=summary("doctor"),
        description="Probe the kernel: each BPF feature is loaded and attached for real.",
        examples="examples:\n  meridian doctor\n  meridian doctor --json",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    return p


def _tool_strategies() -> dict[str, Sequence[Strategy]]:
    """Each tool's strategies, in the order it tries them."""
    from . import biolat, io, memlat, runqlat, sentinel, syscalls

    return {
        "biolat": biolat.STRATEGIES,
        "memlat": memlat.STRATEGIES,
        "runqlat": runqlat.STRATEGIES,
        "syscalls": syscalls.STRATEGIES,
        "io": io.STRATEGIES,
        "sentinel": sentinel.STRATEGIES,
    }


def _strategies() -> dict[str, str]:
    out = {}
    for tool, strategies in _tool_strategies().items():
        try:
            out[tool] = features.choose(strategies).name
        except MeridianError as exc:
            out[tool] = f"none ({exc})"
    return out


def _tracefs_needs() -> dict[str, list[dict[str, Any]]]:
    """Per tool, each strategy with its features and whether it needs tracefs: what a
    container without the host's tracefs can still run."""
    return {
        tool: [
            {"name": s.name, "needs": list(s.needs), "needs_tracefs": s.needs_tracefs}
            for s in strategies
        ]
        for tool, strategies in _tool_strategies().items()
    }


def _marked(strategies: list[dict[str, Any]]) -> str:
    """`fentry, tp_btf, tracepoint*`: the order tried, * on those that need tracefs."""
    return ", ".join(s["name"] + ("*" if s["needs_tracefs"] else "") for s in strategies)


# What a tool's object does where the kernel lacks a kfunc it uses when there
# (bpf/kread.bpf.h): the same results by another way.
KFUNC_FALLBACKS = {
    "bpf_rdonly_cast": "kernel memory read with bpf_probe_read_kernel, not direct loads "
    "(bpf_rdonly_cast is Linux 6.2+): the same results, a few helper calls more per event",
}


def _kfuncs(tools: list[str]) -> dict[str, dict[str, bool]]:
    """Per tool, each optional kfunc its object uses and whether this kernel has it."""
    out: dict[str, dict[str, bool]] = {}
    for tool in tools:
        try:
            with BpfObject(object_path(tool)) as obj:  # each tool's object has its name
                facts = obj.kernel_facts()
        except MeridianError:
            facts = {}
        out[tool] = {name.removeprefix("have_"): ok for name, ok in facts.items()}
    return out


def _not_counted() -> dict[str, dict[str, str]]:
    """Per tool, what it cannot count on this kernel for want of a hook, and the hook."""
    from .io.kernel import missing_hooks

    return {"io": missing_hooks()}


def _containers() -> dict[str, Any]:
    """Where io names containers from: the cgroup2 mount (their ids) and each runtime's
    files on this node (their names, images and pods)."""
    mounts = cgroup2_mounts()
    return {"cgroup2": mounts[0] if mounts else None, "runtime_files": RuntimeFiles().found()}


def _containers_line(found: dict[str, Any]) -> str:
    if found["cgroup2"] is None:
        return "containers  no   no cgroup2 mounted: no container ids (a cgroup v2 host has them)"
    runtimes = [
        f"{name} ({', '.join(dirs)})" for name, dirs in found["runtime_files"].items() if dirs
    ]
    names = "; names from " + "; ".join(runtimes) if runtimes else "; no runtime's files: ids only"
    return f"containers  yes  ids from cgroup2 at {found['cgroup2']}{names}"


def yes(ok: object) -> str:
    return "yes" if ok else "no "


def run(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "privileges": has_bpf_privileges(),
        "btf": KERNEL_BTF.exists(),
    }
    # Mounted as a tool whose strategy needs it mounts it; `tracefs_mounted`: it was
    # before doctor looked (a container may have none), None: unreadable without root.
    try:
        report["tracefs_mounted"] = tracefs_mounted() is not None
    except MeridianError:
        report["tracefs_mounted"] = None
    tracefs = features.probe("tracefs")
    report["tracefs"] = str(tracefs_mounted()) if tracefs.ok else None
    if not tracefs.ok:
        why, fix = f" ({tracefs.why})" if tracefs.why else "", tracefs.fix
        report["tracefs_error"] = f"{tracefs.detail}{why}" + (f": {fix}" if fix else "")
    report["strategy_needs"] = _tracefs_needs()
    refusals.ensure_securityfs()
    report["lockdown"] = refusals.lockdown()
    raise_memlock()
    probes = {}
    can_run = report["privileges"] and report["btf"]
    if can_run:
        probes = {name: features.probe(name) for name in features.FEATURES}
        report["features"] = {
            n: {"ok": p.ok, "detail": p.detail, "fix": p.fix, "why": p.why}
            for n, p in probes.items()
        }
        report["strategies"] = _strategies()
        report["kfuncs"] = _kfuncs(list(report["strategies"]))
        report["not_counted"] = _not_counted()
    report["containers"] = _containers()
    runnable = can_run and any(p.ok for n, p in probes.items() if n in ("tracepoint", "tp_btf"))
    report["can_run"] = bool(runnable)
    if args.json:
        JsonWriter(sys.stdout).write(report)
        return 0 if runnable else 1
    print(f"kernel      {report['kernel']} ({report['machine']})")
    print(
        f"privileges  {yes(report['privileges'])}  "
        + ("" if report["privileges"] else "needs root or CAP_BPF+CAP_PERFMON: run with sudo")
    )
    print(
        f"BTF         {yes(report['btf'])}  {KERNEL_BTF}"
        + ("" if report["btf"] else ": needs CONFIG_DEBUG_INFO_BTF=y")
    )
    mounted_now = "" if report["tracefs_mounted"] else " (mounted now: it was not)"
    print(
        f"tracefs     {yes(report['tracefs'] is not None)}  "
        + (report["tracefs"] + mounted_now if report["tracefs"] else report["tracefs_error"])
    )
    print(f"lockdown    {report['lockdown'] or 'unknown (no /sys/kernel/security/lockdown)'}")
    print(_containers_line(report["containers"]))
    if probes:
        print("\nfeatures")
        for name, p in probes.items():
            fix = f"  ({p.fix})" if (p.fix and not p.ok) else ""
            print(f"  {name:<11} {yes(p.ok)}  {features.FEATURES[name]}: {p.detail}{fix}")
            if p.why and not p.ok:
                print(f"  {'':<11}      why: {p.why}")
        print("\nstrategies (the first that loads, of those in brackets; * needs tracefs)")
        for tool, strategy in report["strategies"].items():
            print(f"  {tool:<11} {strategy:<15} [{_marked(report['strategy_needs'][tool])}]")
            for kfunc, ok in report["kfuncs"][tool].items():
                if not ok:
                    print(f"  {'':<11} without {kfunc}: {KFUNC_FALLBACKS.get(kfunc, '')}")
            for what, hooks in report["not_counted"].get(tool, {}).items():
                print(f"  {'':<11} not counted: {what} (this kernel has no {hooks})")
    verdict = "ready: the tools can run here"
    print("\n" + (verdict if runnable else "nothing can run here: fix the lines marked no"))
    if os.geteuid() != 0 and not report["privileges"]:
        return 1
    return 0 if runnable else 1
