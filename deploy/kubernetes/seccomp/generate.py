"""meridian.json, the seccomp profile of meridian's pods, from podman's default profile
(Debian 12's containers-common: /usr/share/containers/seccomp.json, which CRI-O uses
too). That profile lets bpf() and perf_event_open() through only with CAP_SYS_ADMIN, so
under it every tool fails with EPERM although its pod has CAP_BPF and CAP_PERFMON.
This one also allows bpf() with CAP_BPF and perf_event_open() with CAP_PERFMON, as
containerd's default profile does since 2022.

The output is resolved for the capabilities meridian's containers add (CAPS): the
default's rules that apply only with or without a capability ("includes"/"excludes"
caps, which podman and CRI-O evaluate but containerd does not: it reads a Localhost
profile as plain OCI LinuxSeccomp and would apply every rule) are kept or left out here,
once. So every runtime reads the same filter. A container granted fewer of CAPS (io,
biolat) is let through a few more calls than its runtime's own default would (kcmp,
open_by_handle_at): the kernel still refuses those without the capability.

    python3 deploy/kubernetes/seccomp/generate.py [/usr/share/containers/seccomp.json] \
        > deploy/kubernetes/seccomp/meridian.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

DEFAULT = "/usr/share/containers/seccomp.json"
# every capability a meridian DaemonSet adds (sentinel's are the most)
CAPS = frozenset(
    f"CAP_{c}"
    for c in ("BPF", "PERFMON", "SYSLOG", "SYS_PTRACE", "DAC_READ_SEARCH", "CHECKPOINT_RESTORE")
)
# the calls the tools need, and the capability the kernel checks for each
NEEDED = {"bpf": "CAP_BPF", "perf_event_open": "CAP_PERFMON"}
# the architectures of the nodes (amd64, arm64) with their 32-bit ones: a plain OCI
# profile lists them all for every node, and runc refuses one of the other byte order
# ("error adding architecture to seccomp filter")
ARCHES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64")
# rule fields of the OCI runtime spec (LinuxSyscall); the others are podman's
OCI_RULE = ("names", "action", "errnoRet", "args")


def applies(rule: dict[str, Any]) -> bool:
    """Whether a rule of the default applies to a container with CAPS (podman's
    semantics: every "includes" capability held, none of the "excludes")."""
    includes = set(rule.get("includes", {}).get("caps", []))
    excludes = set(rule.get("excludes", {}).get("caps", []))
    return includes <= CAPS and not excludes & CAPS


def resolved(default: dict[str, Any]) -> dict[str, Any]:
    syscalls = []
    for rule in default["syscalls"]:
        # a rule for some architectures only ("includes" arches) is kept for all: a
        # name the running architecture lacks is skipped by the runtime
        if not applies(rule):
            continue
        names = [n for n in rule["names"] if n not in NEEDED]
        if not names:
            continue
        out = {k: rule[k] for k in OCI_RULE if rule.get(k) not in (None, [], "")}
        out["names"] = names
        syscalls.append(out)
    syscalls.append({"names": sorted(NEEDED), "action": "SCMP_ACT_ALLOW"})
    architectures = []
    for arch in default["archMap"]:
        if arch["architecture"] in ARCHES:
            architectures += [arch["architecture"], *arch["subArchitectures"]]
    return {
        "defaultAction": default["defaultAction"],
        "defaultErrnoRet": default["defaultErrnoRet"],
        "architectures": list(dict.fromkeys(architectures)),
        "syscalls": syscalls,
    }


def main(argv: list[str]) -> None:
    with open(argv[1] if len(argv) > 1 else DEFAULT, encoding="utf-8") as f:
        default = json.load(f)
    assert set(NEEDED.values()) <= CAPS
    json.dump(resolved(default), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv)
