"""meridian sentinel: what its BPF programs cost per run while iperf3 streams TCP and
64-byte UDP over veth (kernel.bpf_stats_enabled: run count and run time per program),
and what the two packet hooks cost a packet in all, dispatch included: a loop sending
64-byte UDP datagrams to itself over loopback (each one transmitted and received on
CPU 0) untraced, with two empty tp_btf programs on the same tracepoints, and with
sentinel's two packet programs.

The throughput ratio (sentinel_bench.py) is noisy on a 2-CPU VM; this says where the
agent's kernel time goes, packet hooks against the sample handler, and what of a
hook's cost is the tracepoint's and what is the program's.

Run as root from the repository (a quiet machine):
    .venv/bin/python benchmarks/sentinel_hook_cost.py [seconds] [rounds]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _rounds import compile_c

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from bpfbuild import compile_bpf  # noqa: E402
from netns import netns_pair  # noqa: E402

from meridian.bpf import BpfObject, object_path  # noqa: E402

PACKETS = 1_500_000
UDP_LOOP = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {  /* ns per 64-byte datagram sent to itself, CPU 0 */
    long n = atol(argv[1]);
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(0, &s); sched_setaffinity(0, sizeof s, &s);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t l = sizeof a;
    bind(fd, (void *)&a, sizeof a); getsockname(fd, (void *)&a, &l);
    connect(fd, (void *)&a, sizeof a); fcntl(fd, F_SETFL, O_NONBLOCK);
    char buf[64] = {0};
    double t0 = now();
    for (long i = 0; i < n; i++) {
        send(fd, buf, sizeof buf, 0);
        if ((i & 15) == 15) while (recv(fd, buf, sizeof buf, 0) > 0);
    }
    printf("%.1f\n", (now() - t0) * 1e9 / n);
    return 0;
}
"""
EMPTY_HOOKS = r"""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
SEC("tp_btf/netif_receive_skb") int BPF_PROG(empty_rx, struct sk_buff *skb) { return 0; }
SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(empty_tx, const struct sk_buff *skb, const struct net_device *dev) { return 0; }
char LICENSE[] SEC("license") = "GPL";
"""


def progs() -> dict[int, dict[str, Any]]:
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True)
    return {p["id"]: p for p in json.loads(out.stdout)}


def per_packet(rounds: int) -> None:
    """ns per datagram: untraced, empty hooks, sentinel's hooks; interleaved rounds,
    this process on CPU 1 and the loop on CPU 0."""
    os.sched_setaffinity(0, {1})
    with tempfile.TemporaryDirectory() as tmp:
        loop = compile_c(UDP_LOOP, Path(tmp), "udp_loop")
        (Path(tmp) / "empty.bpf.c").write_text(EMPTY_HOOKS)
        empty = compile_bpf(Path(tmp) / "empty.bpf.c", Path(tmp) / "empty.bpf.o")
        configs = {
            "untraced": None,
            "two empty tp_btf programs": (empty, ["empty_rx", "empty_tx"]),
            "sentinel's ms_btf_rx + ms_btf_tx": (
                object_path("sentinel"),
                ["ms_btf_rx", "ms_btf_tx"],
            ),
        }
        ns: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(rounds):
            for name, what in configs.items():
                obj = BpfObject(what[0]) if what is not None else None
                try:  # closed (every link detached) whatever fails
                    if obj is not None and what is not None:
                        obj.select(what[1])
                        obj.load()
                        obj.attach(what[1])
                    out = subprocess.run([str(loop), str(PACKETS)], capture_output=True, text=True)
                    ns[name].append(float(out.stdout))
                finally:
                    if obj is not None:
                        obj.close()
    base = statistics.median(ns["untraced"])
    print(f"\n64-byte UDP to itself over loopback, {PACKETS:,} datagrams, {rounds} rounds")
    print("| config | ns per datagram (median) | added | rounds |")
    print("| --- | ---: | ---: | --- |")
    for name, values in ns.items():
        med = statistics.median(values)
        print(
            f"| {name} | {med:.0f} | {med - base:+.0f} | {', '.join(f'{v:.0f}' for v in values)} |"
        )


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    # Started where SIGINT is ignored (a script's background job), the agent would
    # inherit that and outlive its SIGINT, still attached: restore it for the children.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        with netns_pair("hooks") as pair:
            agent = subprocess.Popen(
                [sys.executable, "-m", "meridian", "sentinel", "--prometheus", "127.0.0.1:0"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(4)  # loaded and attached
                for udp in (False, True):
                    before = progs()
                    pair.iperf3(seconds, udp=udp, length=64 if udp else None, cpus=(0, 1))
                    print(f"\n{'64-byte UDP' if udp else 'TCP'}, {seconds:g} s")
                    print("| program | runs | ns per run | share of one core |")
                    print("| --- | ---: | ---: | ---: |")
                    for pid, p in progs().items():
                        b = before.get(pid)
                        if b is None or "run_cnt" not in p:
                            continue
                        n = p["run_cnt"] - b.get("run_cnt", 0)
                        t = p["run_time_ns"] - b.get("run_time_ns", 0)
                        if n:
                            share = 100 * t / (seconds * 1e9)
                            print(f"| {p.get('name')} | {n:,} | {t / n:.1f} | {share:.2f} % |")
            finally:
                agent.send_signal(signal.SIGINT)
                agent.wait(30)
    finally:
        subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=0"], check=False)
    per_packet(rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
