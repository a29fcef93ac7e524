"""`meridian sentinel` on the real kernel, as a subprocess: a stop (a signal, during
the load or after) leaves no program or link of the run attached. The mock source's
runs end to end are in test_sentinel_e2e.py, whose helpers these tests share."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest
from children import wait_attached, wait_until
from test_sentinel_e2e import STOP_BOUND_S, free_port, scrape_until, start, stop

# ---- the real kernel ---------------------------------------------------------------
# Other tests may load programs at the same time, so the checks follow the programs
# of this run by id (from the fdinfo of the agent's descriptors) rather than counting.


def loaded_ids(kind: str = "prog") -> set[int]:
    """Ids of the BPF programs (or links: kind "link") loaded now."""
    items = json.loads(subprocess.check_output(["bpftool", "-j", kind, "list"]) or b"[]")
    return {int(p["id"]) for p in items}


@dataclass
class Held:
    """What a process holds, from its descriptors."""

    progs: set[int]  # ids of BPF programs (held directly or through a link)
    links: set[int]  # ids of BPF links
    perf: int  # perf event descriptors


def held_by(pid: int) -> Held:
    held = Held(set(), set(), 0)
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target == "anon_inode:[perf_event]":
                held.perf += 1
            if target.startswith("anon_inode:bpf"):
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    for line in f:
                        if line.startswith("prog_id:"):
                            held.progs.add(int(line.split()[1]))
                        if line.startswith("link_id:"):
                            held.links.add(int(line.split()[1]))
        except OSError:
            pass  # closed meanwhile
    return held


def still_loaded(held: Held, timeout: float = 10) -> tuple[set[int], set[int]]:
    """(programs, links) of `held` still in the kernel after patience(timeout): the
    kernel frees them after an RCU grace period once the last reference goes."""
    left: tuple[set[int], set[int]] = (set(), set())

    def freed() -> bool:
        nonlocal left
        left = (held.progs & loaded_ids(), held.links & loaded_ids("link"))
        return not any(left)

    with contextlib.suppress(AssertionError):
        wait_until(freed, timeout, "release", step=0.2)
    return left


def summary_samples(out: str) -> int:
    """The sample count of the exit summary's first line."""
    m = re.search(r"^meridian sentinel: (\d+) samples? in ", out, re.MULTILINE)
    assert m, f"no summary line in:\n{out}"
    return int(m[1])


def serving(port: int) -> bool:
    """The port accepts connections."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.05).close()
    except OSError:
        return False
    return True


def held_until_exit(p: subprocess.Popen[str]) -> Held:
    """Every program and link `p` holds from now until it exits, polled back to back."""
    seen = Held(set(), set(), 0)
    while p.poll() is None:
        try:
            now = held_by(p.pid)
        except FileNotFoundError:  # gone meanwhile
            break
        seen.progs |= now.progs
        seen.links |= now.links
        seen.perf = max(seen.perf, now.perf)
    return seen


@pytest.mark.kernel
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_kernel_stop_leaves_nothing_attached(procs: list[subprocess.Popen[str]], sig: int) -> None:
    """A real run, stopped once it has delivered samples: the summary counts them,
    the run exits 0, and every program and link it held is gone."""
    port = free_port()
    p = start("--events", "cpu-clock", f"--prometheus=127.0.0.1:{port}", "-F", "99", "-v")
    procs.append(p)
    wait_attached(p)  # -v names the strategy once the programs are attached
    held = held_by(p.pid)
    assert held.progs, "the agent holds no BPF program"
    assert held.links, "the agent holds no BPF link"
    assert held.progs <= loaded_ids() and held.links <= loaded_ids("link")
    assert held.perf > 0, "no perf event open"
    # a flush window with samples in it (cpu-clock samples idle CPUs too)
    scrape_until(p, port, "ms_samples_per_sec", timeout=60, value=lambda v: v > 0)
    out, err, took = stop(p, sig)
    assert p.returncode == 0, err
    assert took < STOP_BOUND_S + 5
    assert "Traceback" not in err
    assert summary_samples(out) > 0
    assert still_loaded(held) == (set(), set())


@pytest.mark.kernel
@pytest.mark.parametrize("stage", ["serving", "attached"])
def test_kernel_signal_while_loading(procs: list[subprocess.Popen[str]], stage: str) -> None:
    """SIGTERM as soon as /metrics answers (it is served before the kernel object is
    loaded: the signal is held through the load and the attach), or as soon as -v
    says the programs are attached: the run exits 0 within the bound with its
    summary, it did load programs and links, and none of them stays."""
    port = free_port()
    # -v only when its ready line is read: libbpf's detail would fill the stderr pipe
    verbose = ["-v"] if stage == "attached" else []
    p = start("--events", "cpu-clock", f"--prometheus=127.0.0.1:{port}", "-F", "99", *verbose)
    procs.append(p)
    if stage == "attached":
        wait_attached(p)
    else:
        wait_until(lambda: p.poll() is None and serving(port), 60, "/metrics", step=0.005)
    before = held_by(p.pid)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    held = held_until_exit(p)  # what it loads and attaches after the signal too
    out, err = p.communicate(timeout=STOP_BOUND_S + 10)
    took = time.monotonic() - t0
    if stage == "attached":
        assert before.progs and before.links, "attached, yet no program or link held"
    else:
        assert not before.progs, "loaded before /metrics answered: not a signal while loading"
    held.progs |= before.progs
    held.links |= before.links
    assert held.progs, "the agent loaded no BPF program"
    assert held.links, "the agent attached no BPF link"
    assert p.returncode == 0, err
    assert took < STOP_BOUND_S + 5, err
    assert "Traceback" not in err
    assert summary_samples(out) >= 0  # the summary was printed
    assert still_loaded(held) == (set(), set())
