"""The sentinel kernel program's packet parser on crafted frames: through
BPF_PROG_TEST_RUN (XDP) and through the skb hooks on frames sent through a veth, it
keys VXLAN and Geneve packets by their inner 5-tuple and walks IPv6 extension headers
to TCP/UDP. test_sentinel_kernel_overlays.py runs real streams in such tunnels."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from frames import (
    DSTOPTS,
    FRAGMENT,
    GENEVE_PORT,
    HOPOPTS,
    ROUTING,
    TCP,
    UDP,
    VXLAN_PORT,
    eth,
    ext,
    flow_id,
    frag,
    ip,
    l4,
    tunnel,
)
from netns import netns_pair

from meridian.bpf import BpfObject, object_path

pytestmark = pytest.mark.kernel

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
