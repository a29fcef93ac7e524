"""The sentinel kernel program on tunnels, IPv6 extension headers and its history: the
packet parser (XDP through BPF_PROG_TEST_RUN, the skb hooks on frames sent through a
veth) keys VXLAN and Geneve packets by their inner 5-tuple and walks IPv6 extension
headers to TCP/UDP; a TCP stream inside a VXLAN or Geneve tunnel between two
namespaces is attributed to its inner flows, with the skb hooks and with XDP on the
underlay; a sample past the skid window takes the newest packet of its CPU's history
within MS_HISTORY_LEN skid windows (docs/requirements/sentinel.md §5.1)."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bpfbuild import compile_bpf
from children import patience
from netns import NetnsPair, netns_pair
from sentinel_source import CLOCK, drain

from meridian.bpf import BpfObject, object_path
from meridian.tools.sentinel.model.records import FLOW_HISTORY_NS, FLOW_SKID_NS, FlowSource
from meridian.tools.sentinel.sources.kernel import KernelSource

pytestmark = pytest.mark.kernel

TCP, UDP = 6, 17
VXLAN_PORT, GENEVE_PORT = 4789, 6081
HOPOPTS, ROUTING, FRAGMENT, DSTOPTS = 0, 43, 44, 60


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64, written again here so the test does not trust the code it checks."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def flow_id(src: str, dst: str, sport: int, dport: int, proto: int) -> int:
    """The id of a 5-tuple: struct ms_flow_key (40 bytes, IPv4 addresses in the first 4
    bytes of 16, ports in network order, then proto and family) through FNV-1a 64."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    family = 2 if s.version == 4 else 10
    return fnv1a64(
        s.packed.ljust(16, b"\0")
        + d.packed.ljust(16, b"\0")
        + struct.pack("!HHBB2x", sport, dport, proto, family)
    )


# ---- frames ------------------------------------------------------------------------------


def eth(ethertype: int, payload: bytes, vlan: int | None = None) -> bytes:
    tag = struct.pack("!HH", 0x8100, vlan) if vlan is not None else b""
    macs = bytes([0xFF] * 6) + bytes([2, 0, 0, 0, 0, 1])  # broadcast, from a local address
    return macs + tag + struct.pack("!H", ethertype) + payload


def l4(proto: int, sport: int, dport: int, payload: bytes = b"") -> bytes:
    """A TCP (20 bytes) or UDP (8 bytes) header; checksums are not looked at."""
    if proto == TCP:
        return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x10, 512, 0, 0) + payload
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def ip(src: str, dst: str, proto: int, payload: bytes, frag: int = 0) -> bytes:
    """An IPv4 header (no options), or an IPv6 one with `proto` as its next header
    (`payload` then starts with any extension headers)."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if s.version == 4:
        return (
            struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(payload), 1, frag, 64, proto, 0)
            + s.packed
            + d.packed
            + payload
        )
    return struct.pack("!IHBB", 6 << 28, len(payload), proto, 64) + s.packed + d.packed + payload


def ext(nexthdr: int, units: int = 0) -> bytes:
    """A hop-by-hop, routing or destination options header, 8 x (1 + units) bytes
    (padding options only)."""
    return struct.pack("!BB", nexthdr, units) + bytes(6 + 8 * units)


def frag(nexthdr: int, offset: int, more: bool) -> bytes:
    """An IPv6 fragment header; `offset` in 8-byte units."""
    return struct.pack("!BBHI", nexthdr, 0, offset << 3 | more, 0x1234)


def vxlan(inner: bytes) -> bytes:
    return struct.pack("!II", 0x08 << 24, 42 << 8) + inner


def geneve(inner: bytes, options: bytes = b"", proto: int = 0x6558, version: int = 0) -> bytes:
    """The Geneve base header (opt_len in 4-byte words), options, the payload."""
    assert len(options) % 4 == 0
    return (
        struct.pack("!BBHI", version << 6 | len(options) // 4, 0, proto, 42 << 8) + options + inner
    )


def tunnel(kind: str, outer: tuple[str, str], sport: int, inner: bytes, **kw: Any) -> bytes:
    """`inner` (an Ethernet frame) in VXLAN or Geneve over UDP between `outer`."""
    if kind == "vxlan":
        return ip(*outer, UDP, l4(UDP, sport, VXLAN_PORT, vxlan(inner)))
    return ip(*outer, UDP, l4(UDP, sport, GENEVE_PORT, geneve(inner, **kw)))


Case = tuple[str, bytes, int | None]  # (what, Ethernet frame, expected flow id or None)


def tunnel_cases() -> list[Case]:
    """VXLAN and Geneve (with and without options), IPv4 and IPv6 underlay, inner IPv4
    and IPv6 TCP and UDP: each keyed by the inner 5-tuple; an inner frame with no
    5-tuple, or a Geneve header that is not one of an Ethernet frame: the outer one."""
    cases: list[Case] = []
    n = 0
    for kind, outer, options in (
        ("vxlan", ("192.0.2.1", "192.0.2.2"), b""),
        ("geneve", ("192.0.2.1", "192.0.2.2"), b""),
        ("geneve", ("192.0.2.1", "192.0.2.2"), bytes(range(12))),  # 3 words of options
        ("vxlan", ("2001:db8::1", "2001:db8::2"), b""),
        ("geneve", ("2001:db8::1", "2001:db8::2"), bytes(8)),
    ):
        for src, dst in (("10.77.0.1", "10.77.0.2"), ("fd77::1", "fd77::2")):
            for proto in (TCP, UDP):
                n += 1
                sport, dport = 40000 + n, 5201
                inner = eth(0x0800 if ":" not in src else 0x86DD,
                            ip(src, dst, proto, l4(proto, sport, dport)))  # fmt: skip
                opts: dict[str, Any] = {"options": options} if kind == "geneve" else {}
                frame = eth(0x0800 if ":" not in outer[0] else 0x86DD,
                            tunnel(kind, outer, 50000 + n, inner, **opts))  # fmt: skip
                what = f"{kind} over {outer[0]}, {len(options)} B options: {src} {proto}"
                cases.append((what, frame, flow_id(src, dst, sport, dport, proto)))
    inner_tcp = eth(0x0800, ip("10.77.1.1", "10.77.1.2", TCP, l4(TCP, 40100, 80)))
    arp = eth(0x0806, bytes(28))
    outer = ("192.0.2.5", "192.0.2.6")
    for what, kind, sport, inner, kw in (
        ("vxlan, inner ARP: the outer key", "vxlan", 50101, arp, {}),
        ("geneve, inner ARP: the outer key", "geneve", 50102, arp, {}),
        ("geneve of an IPv4 packet (not Ethernet)", "geneve", 50103, inner_tcp, {"proto": 0x0800}),
        ("geneve version 1", "geneve", 50104, inner_tcp, {"version": 1}),
        ("vxlan, inner frame cut short", "vxlan", 50105, inner_tcp[:30], {}),
    ):
        port = VXLAN_PORT if kind == "vxlan" else GENEVE_PORT
        frame = eth(0x0800, tunnel(kind, outer, sport, inner, **kw))
        cases.append((what, frame, flow_id(*outer, sport, port, UDP)))
    # an IPv6 extension header inside the inner frame; a VLAN tag on the outer one
    inner6 = eth(0x86DD, ip("fd77::5", "fd77::6", HOPOPTS, ext(TCP) + l4(TCP, 40200, 443)))
    cases.append((
        "geneve, inner IPv6 with hop-by-hop",
        eth(0x0800, tunnel("geneve", outer, 50106, inner6)),
        flow_id("fd77::5", "fd77::6", 40200, 443, TCP),
    ))  # fmt: skip
    cases.append((
        "vxlan in a VLAN",
        eth(0x0800, tunnel("vxlan", outer, 50107, inner_tcp), vlan=7),
        flow_id("10.77.1.1", "10.77.1.2", 40100, 80, TCP),
    ))  # fmt: skip
    return cases


def ext_header_cases() -> list[Case]:
    """IPv6 with each extension header, chains of them, fragments (the first has the
    ports; a later one has none: no flow, as for IPv4), more than the parser walks."""
    src, dst = "fd78::1", "fd78::2"
    cases: list[Case] = []
    for n, (what, first, chain, proto, expect) in enumerate(
        (
            ("hop-by-hop", HOPOPTS, ext(TCP), TCP, True),
            ("routing (24 bytes)", ROUTING, ext(UDP, 2), UDP, True),
            ("destination options", DSTOPTS, ext(TCP, 1), TCP, True),
            ("first fragment", FRAGMENT, frag(UDP, 0, True), UDP, True),
            ("last fragment of one", FRAGMENT, frag(TCP, 0, False), TCP, True),
            ("later fragment: no ports", FRAGMENT, frag(UDP, 185, True), UDP, False),
            ("hop-by-hop, dest options, routing, fragment", HOPOPTS,
             ext(DSTOPTS) + ext(ROUTING, 1) + ext(FRAGMENT) + frag(TCP, 0, True), TCP, True),
            ("5 extension headers: past the walk", HOPOPTS,
             ext(DSTOPTS) + ext(ROUTING) + ext(DSTOPTS) + ext(FRAGMENT) + frag(TCP, 0, True),
             TCP, False),
            ("hop-by-hop, then ICMPv6", HOPOPTS, ext(58), 58, False),
        )
    ):  # fmt: skip
        sport, dport = 41000 + n, 8000 + n
        frame = eth(0x86DD, ip(src, dst, first, chain + l4(proto, sport, dport)))
        cases.append((what, frame, flow_id(src, dst, sport, dport, proto) if expect else None))
    return cases


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """This thread on one CPU (BPF_PROG_TEST_RUN runs the program on the caller's)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize("kind", ["tunnels", "ipv6 extension headers"])
def test_xdp_parser_on_crafted_frames(kind: str) -> None:
    """Each frame through BPF_PROG_TEST_RUN: the CPU's current context then holds the
    expected flow id (0: no flow), computed here from the 5-tuple."""
    cases = tunnel_cases() if kind == "tunnels" else ext_header_cases()
    cpu = min(os.sched_getaffinity(0))
    with BpfObject(object_path("sentinel")) as obj, pinned(cpu):
        obj.select(["ms_xdp_rx"])
        obj.load()
        prog = obj.programs["ms_xdp_rx"]
        got = {}
        for what, frame, _ in cases:
            assert prog.test_run(frame)[0] == 2, what  # XDP_PASS
            got[what] = int(obj.maps["ms_curr_ctx"].lookup(0)["flow_id"][cpu])
        flows = obj.maps["ms_flows"].items()[0].astype(np.uint64).tolist()
        _, per_packet_ns = prog.test_run(cases[0][1], repeat=100_000)
    want = {what: fid or 0 for what, _, fid in cases}
    assert got == want
    assert set(flows) == {fid for _, _, fid in cases if fid}
    print(f"ms_xdp_rx: {per_packet_ns} ns per packet ({cases[0][0]}, BPF_PROG_TEST_RUN)")


SEND = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
    "s.bind((sys.argv[1], 0))\n"
    "for line in sys.stdin:\n"
    "    s.send(bytes.fromhex(line))\n"
)


@pytest.mark.parametrize("reads", ["direct", "probe_read"])
def test_skb_hooks_on_crafted_frames(reads: str) -> None:
    """The same frames through a veth (AF_PACKET from namespace b): the skb hooks see
    each one leave b's veth and arrive on a's. `probe_read` loads the object as on
    kernels without bpf_rdonly_cast (6.1): every header is then read by a helper."""
    cases = tunnel_cases() + ext_header_cases()
    with netns_pair("k") as pair, BpfObject(object_path("sentinel")) as obj:
        if reads == "probe_read":
            obj.kernel_facts = lambda: {"have_bpf_rdonly_cast": False}  # type: ignore[method-assign]
        obj.select(["ms_btf_rx", "ms_btf_tx"])
        obj.load()
        obj.attach()
        frames = "".join(frame.hex() + "\n" for _, frame, _ in cases)
        subprocess.run(
            ["ip", "netns", "exec", pair.b, sys.executable, "-c", SEND, pair.veth_b],
            input=frames, check=True, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        flows = set(obj.maps["ms_flows"].items()[0].astype(np.uint64).tolist())
        seen = obj.maps["ms_counters"].summed()["flows_seen"]
    want = {fid for _, _, fid in cases if fid}
    assert want <= flows, [what for what, _, fid in cases if fid and fid not in flows]
    # the outer 5-tuples of the tunnels whose inner frame has one were never keyed
    outer = set()
    for what, frame, _ in cases:
        if "over 192.0.2.1" in what:
            sport = struct.unpack_from("!H", frame, 14 + 20)[0]
            port = VXLAN_PORT if what.startswith("vxlan") else GENEVE_PORT
            outer.add(flow_id("192.0.2.1", "192.0.2.2", sport, port, UDP))
    assert len(outer) == 12 and not outer & flows
    assert seen >= 2 * len(want)  # each frame on TX and on RX


# ---- a TCP stream in a tunnel --------------------------------------------------------------

# Geneve on the wire where the kernel has no geneve driver: a VXLAN device on UDP port
# 6081 (no UDP checksum) and this tc program on both veths, which rewrites the first 32
# bits of the 8-byte header, VXLAN's (flag I) <-> Geneve's (version 0, no options,
# protocol type 0x6558: an Ethernet frame); the VNI and the last byte are at the same
# place in both. Egress (after __dev_queue_xmit's entry, before net_dev_start_xmit)
# makes Geneve, ingress (after XDP and netif_receive_skb) makes VXLAN again: every
# hook of the sentinel but fentry sees Geneve.
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
