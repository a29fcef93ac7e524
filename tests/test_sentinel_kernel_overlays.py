"""The sentinel agent's kernel source on tunnels and its history: a TCP stream inside a
VXLAN or Geneve tunnel between two namespaces is attributed to its inner flows, with
the skb hooks and with XDP on the underlay; a sample past the skid window takes the
newest packet of its CPU's history within MS_HISTORY_LEN skid windows
(docs/requirements/sentinel.md §5.1)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bpfbuild import compile_bpf
from children import patience
from frames import GENEVE_PORT, TCP, UDP, VXLAN_PORT, flow_id
from netns import NetnsPair, netns_pair
from sentinel_source import CLOCK, drain

from meridian.tools.sentinel.model.records import FLOW_HISTORY_NS, FLOW_SKID_NS, FlowSource
from meridian.tools.sentinel.sources.kernel import KernelSource

pytestmark = pytest.mark.kernel


GENEVE_TC = r"""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct outer {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	__be32 word;
} __attribute__((packed));

SEC("tc")
int vxlan_geneve(struct __sk_buff *skb)
{
	struct outer h;

	if (bpf_skb_load_bytes(skb, 0, &h, sizeof(h)) || h.eth.h_proto != bpf_htons(0x0800) ||
		h.ip.ihl != 5 || h.ip.protocol != 17 || h.udp.dest != bpf_htons(6081))
		return 0;
	if (h.word == bpf_htonl(0x08000000))
		h.word = bpf_htonl(0x6558);
	else if (h.word == bpf_htonl(0x6558))
		h.word = bpf_htonl(0x08000000);
	else
		return 0;
	bpf_skb_store_bytes(skb, __builtin_offsetof(struct outer, word), &h.word, 4, 0);
	return 0; /* TC_ACT_OK */
}

char LICENSE[] SEC("license") = "GPL";
"""


def overlay(pair: NetnsPair, kind: str, tmp: Path) -> tuple[NetnsPair, int, str]:
    """A tunnel device `tun0` in each namespace over the veth pair, inner addresses on
    their own /24: the pair as seen inside the tunnel, the tunnel's UDP port and how it
    is made: "vxlan", "geneve" or, where the kernel has no geneve driver, "emulated"
    (VXLAN on Geneve's port, rewritten by GENEVE_TC)."""
    n = os.getpid() % 250
    inner = dataclasses.replace(pair, addr_a=f"10.232.{n}.1", addr_b=f"10.232.{n}.2")
    how, port = kind, VXLAN_PORT if kind == "vxlan" else GENEVE_PORT
    tc = None
    for ns, veth, peer, addr in ((pair.a, pair.veth_a, pair.addr_b, inner.addr_a),
                                 (pair.b, pair.veth_b, pair.addr_a, inner.addr_b)):  # fmt: skip
        dev = ["ip", "link", "add", "tun0", "type"]
        if how == "geneve":
            made = subprocess.run(
                ["ip", "netns", "exec", ns, *dev, "geneve", "id", "42", "remote", peer],
                capture_output=True, text=True, timeout=10,
            )  # fmt: skip
            if made.returncode:
                assert "Unknown device type" in made.stderr, made.stderr
                how = "emulated"
                (tmp / "geneve_tc.bpf.c").write_text(GENEVE_TC)
                tc = compile_bpf(tmp / "geneve_tc.bpf.c", tmp / "geneve_tc.bpf.o")
        if how != "geneve":  # VXLAN, on Geneve's port when emulating it
            pair.run(ns, *dev, "vxlan", "id", "42", "remote", peer, "dstport", str(port),
                     "dev", veth, *(["noudpcsum"] if tc else []))  # fmt: skip
        if tc:
            pair.run(ns, "tc", "qdisc", "add", "dev", veth, "clsact")
            for way in ("ingress", "egress"):
                pair.run(ns, "tc", "filter", "add", "dev", veth, way, "bpf", "direct-action",
                         "obj", str(tc), "sec", "tc")  # fmt: skip
        # no IPv6 (neighbour discovery, MLD) inside the tunnel: only the stream's packets
        pair.run(ns, "sysctl", "-q", "-w", "net.ipv6.conf.tun0.disable_ipv6=1")
        pair.run(ns, "ip", "addr", "add", f"{addr}/24", "dev", "tun0")
        pair.run(ns, "ip", "link", "set", "tun0", "up")
    return inner, port, how


XDP_CHILD = (
    "import json, sys, threading\n"
    "import numpy as np\n"
    "from meridian.tools.sentinel.sources.kernel import NET_PROGRAMS, KernelSource\n"
    "from meridian.tools.sentinel.sources.pmu_events import LOGICAL\n"
    "with KernelSource([LOGICAL['cpu-clock']], frequency=999, xdp=[sys.argv[1]]) as src:\n"
    "    assert src.obj is not None\n"
    "    src.obj.drop([lk for lk in src.obj.links if lk.program in NET_PROGRAMS])\n"
    "    batches, stop = [], threading.Event()\n"
    "    def drain():\n"
    "        while not stop.is_set():\n"
    "            batches.append(src.poll(0.05)[0])\n"
    "    reader = threading.Thread(target=drain)\n"
    "    reader.start()\n"
    "    print(json.dumps(src.hooks), flush=True)\n"
    "    sys.stdin.readline()\n"
    "    stop.set()\n"
    "    reader.join()\n"
    "    ids, counts = np.unique(np.concatenate(batches)['flow_id'], return_counts=True)\n"
    "    flows = {str(i): [k.src, k.dst, k.sport, k.dport, k.proto]\n"
    "             for i, k in src.new_flows().items()}\n"
    "    counts = {str(i): int(c) for i, c in zip(ids.tolist(), counts.tolist())}\n"
    "    print(json.dumps({'flows': flows, 'counts': counts}), flush=True)\n"
)


def stream_samples(
    pair: NetnsPair, inner: NetnsPair, xdp: bool, strategy: str | None, cport: int
) -> tuple[dict[int, tuple[str, str, int, int, str]], dict[int, int]]:
    """An iperf3 stream a -> b inside the tunnel, sampled (cpu-clock, every CPU) by a
    KernelSource here (the skb hooks) or in namespace b with XDP on b's veth as its
    only packet hook: the flows named (id -> 5-tuple) and the samples per flow id."""
    seconds = round(patience(2))
    if not xdp:
        with KernelSource(CLOCK, frequency=999, strategy=strategy) as src:
            batches: list[np.ndarray[Any, Any]] = []
            stop = threading.Event()
            reader = threading.Thread(target=drain, args=(src, stop, batches))
            reader.start()
            try:
                inner.iperf3(seconds, cport=cport)
            finally:
                stop.set()
                reader.join()
            keys = src.new_flows()
        ids, n = np.unique(np.concatenate(batches)["flow_id"], return_counts=True)
        flows = {i: (k.src, k.dst, k.sport, k.dport, str(k.proto)) for i, k in keys.items()}
        return flows, dict(zip(ids.tolist(), n.tolist(), strict=True))
    child = pair.popen(pair.b, sys.executable, "-c", XDP_CHILD, pair.veth_b,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    assert f"xdp/{pair.veth_b}" in json.loads(child.stdout.readline())
    inner.iperf3(seconds, cport=cport)
    child.stdin.write("\n")
    child.stdin.flush()
    out = json.loads(child.stdout.readline())
    child.wait(10)
    flows = {int(i): (s, d, sp, dp, p) for i, (s, d, sp, dp, p) in out["flows"].items()}
    return flows, {int(i): c for i, c in out["counts"].items()}


@pytest.mark.parametrize("hook", ["skb", "xdp"])
@pytest.mark.parametrize("kind", ["vxlan", "geneve"])
def test_tcp_stream_in_a_tunnel_is_its_inner_flows(kind: str, hook: str, tmp_path: Path) -> None:
    cport = 42000 + os.getpid() % 20000
    with netns_pair("t") as pair:
        inner, port, how = overlay(pair, kind, tmp_path)
        # tc rewrites after fentry's hook: that strategy would see VXLAN on port 6081
        strategy = "tp_btf" if how == "emulated" else None
        flows, counts = stream_samples(pair, inner, hook == "xdp", strategy, cport)
    data = flow_id(inner.addr_a, inner.addr_b, cport, 5201, TCP)
    acks = flow_id(inner.addr_b, inner.addr_a, 5201, cport, TCP)
    underlay = {pair.addr_a, pair.addr_b}
    outer = {
        i
        for i, (s, d, sp, dp, proto) in flows.items()
        if proto == "udp" and {s, d} == underlay and port in (sp, dp)
    }
    on_inner = counts.get(data, 0) + counts.get(acks, 0)
    on_outer = sum(counts.get(i, 0) for i in outer)
    print(
        f"{how}, {hook}: samples on the inner flows {on_inner} "
        f"(data {counts.get(data, 0)}, acks {counts.get(acks, 0)}), on the outer ones "
        f"{on_outer} ({len(outer)} flows), all {sum(counts.values())}"
    )
    assert data in flows or acks in flows  # named by their inner 5-tuple
    assert on_inner >= 20
    assert on_inner >= 0.95 * (on_inner + on_outer)


# ---- the history ---------------------------------------------------------------------------

MARKS = (
    "import os, socket, sys, time\n"
    "cpu, dst, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])\n"
    "os.sched_setaffinity(0, {cpu})\n"
    "socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]\n"
    "for s in socks:\n"
    "    s.bind(('', 0))\n"
    "    s.sendto(b'x', (dst, 9))\n"
    "end = time.monotonic() + seconds\n"
    "while time.monotonic() < end: pass\n"
    "print(*[s.getsockname()[1] for s in socks])\n"
)


def test_a_sample_past_the_skid_window_takes_the_newest_packet_of_the_history() -> None:
    """Three UDP datagrams of three flows from a process pinned to a CPU, then a busy
    loop there, sampled at 4 kHz: a sample within MS_FLOW_SKID_NS of the last packet
    has its flow; one later, within MS_HISTORY_LEN of those windows, takes it from the
    history (flow_source HISTORY), the newest packet's flow; one later still has none.
    Times are the kernel's own (the contexts' and the samples'): exact, no margin. A
    packet of another flow on that CPU (this host's traffic) shows in the CPU's
    history: only the samples before it (and before the history is read) count, and
    the run is made again (up to 10 times) until enough of them are left."""
    cpu = max(os.sched_getaffinity(0))
    limit = int(Path("/proc/sys/kernel/perf_event_max_sample_rate").read_text())
    with netns_pair("h") as pair, KernelSource(CLOCK, frequency=min(4000, limit)) as src:
        runs = 0
        for _ in range(10):
            runs += 1
            src.contexts()  # the contexts so far: not ours
            batches: list[np.ndarray[Any, Any]] = []
            stop = threading.Event()
            reader = threading.Thread(target=drain, args=(src, stop, batches))
            reader.start()
            try:
                out = pair.run(pair.a, sys.executable, "-c", MARKS, str(cpu), pair.addr_b,
                               f"{patience(0.02)}")  # fmt: skip
                # every packet before this is in the contexts read next; later ones
                # may not be: the samples after it are not looked at
                read_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                ctx = src.contexts()
            finally:
                stop.set()
                reader.join()
            ours = [flow_id(pair.addr_a, pair.addr_b, int(p), 9, UDP) for p in out.stdout.split()]
            ctx = ctx[ctx["cpu"] == cpu]
            mine = ctx[np.isin(ctx["flow_id"], ours)]
            if len(mine) < 6:  # other packets overran the ring: ours are gone
                continue
            t = int(mine["time_ns"].max())
            other = ctx[~np.isin(ctx["flow_id"], ours) & (ctx["time_ns"] > t)]
            until = min([*other["time_ns"].tolist(), read_ns])
            samples = np.concatenate(batches)
            samples = samples[
                (samples["cpu"] == cpu) & (samples["time_ns"] > t) & (samples["time_ns"] < until)
            ]
            dt = samples["time_ns"].astype(np.int64) - t
            skid = samples[dt <= FLOW_SKID_NS]
            history = samples[(dt > FLOW_SKID_NS) & (dt <= FLOW_HISTORY_NS)]
            later = samples[dt > FLOW_HISTORY_NS]
            if len(history) >= 3 and len(later) >= 5:
                break
        else:
            pytest.skip("other flows' packets on the CPU right after ours, in every run")
    print(f"run {runs}: samples after the last packet: {len(skid)} in the skid "
          f"window, {len(history)} within the history's, {len(later)} later")  # fmt: skip
    # each datagram leaves a's veth and arrives on b's, on this CPU, in order
    assert [int(f) for f in mine["flow_id"]] == [f for f in ours for _ in (0, 1)]
    assert np.all(skid["flow_id"] == ours[-1])
    assert np.all(history["flow_id"] == ours[-1]), history["flow_id"]
    assert np.all(history["flow_source"] == FlowSource.HISTORY)
    assert np.all(later["flow_id"] == 0) and np.all(later["flow_source"] == FlowSource.FALLBACK)
