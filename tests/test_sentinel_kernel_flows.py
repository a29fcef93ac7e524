"""The sentinel kernel program on the real kernel, on packets: flows attributed over a
veth pair, XDP on a veth inside a namespace, the XDP packet parser on crafted frames,
and each packet's context returned once."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
from children import patience
from netns import IFINDEX_A, IFINDEX_B, NetnsPair, netns_pair
from sentinel_source import CLOCK, drain
from strategies import every, run_or_skip

from meridian.tools.sentinel.model.records import FLOW_HISTORY_NS, Event
from meridian.tools.sentinel.sources.kernel import STRATEGIES, KernelSource

pytestmark = pytest.mark.kernel


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64, written again here so the test does not trust the code it checks."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def flow_id(src: str, dst: str, sport: int, dport: int, proto: int = 6) -> int:
    """struct ms_flow_key of an IPv4 5-tuple: 40 bytes, ports in network order."""
    s = bytes(int(x) for x in src.split(".")).ljust(16, b"\0")
    d = bytes(int(x) for x in dst.split(".")).ljust(16, b"\0")
    return fnv1a64(s + d + struct.pack("!HHBB2x", sport, dport, proto, 2))


# The packet's receive (a softirq, on the sending CPU) may run late: in ksoftirqd, after
# the busy loop's time slice (seen in a TCG guest, 5 ms after the send). The ICMP port
# unreachable it answers (ECONNREFUSED on the connected socket) says it has run.
MARK = (
    "import os, socket, sys, time\n"
    "cpu, dst, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])\n"
    "os.sched_setaffinity(0, {cpu})\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.bind(('', 41000 + cpu))\n"
    "s.connect((dst, 9))\n"
    "s.settimeout(seconds * 10)\n"
    "s.send(b'x')\n"
    "try:\n"
    "    s.recv(1)\n"
    "except ConnectionRefusedError:\n"
    "    pass\n"
    "quiet = time.clock_gettime_ns(time.CLOCK_MONOTONIC)\n"
    "end = time.monotonic() + seconds\n"
    "while time.monotonic() < end: pass\n"
    "print(quiet)\n"
)


def last_packet_then_busy(pair: NetnsPair, seconds: float) -> dict[int, tuple[int, int]]:
    """On each CPU in turn, one UDP packet from a to b and its ICMP answer, then
    `seconds` of a busy loop on that CPU, sampled with no packet: cpu -> (the packet's
    flow id, when its answer had come)."""
    marks = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        out = pair.run(pair.a, sys.executable, "-c", MARK, str(cpu), pair.addr_b, f"{seconds}")
        flow = flow_id(pair.addr_a, pair.addr_b, 41000 + cpu, 9, proto=17)
        marks[cpu] = (flow, int(out.stdout))
    return marks


@pytest.mark.parametrize("strategy", every(STRATEGIES))
def test_flow_attribution_over_veth(strategy: str) -> None:
    run_or_skip(STRATEGIES, strategy)
    cport = 40000 + os.getpid() % 20000
    with (
        netns_pair("f") as pair,
        KernelSource(CLOCK, frequency=999, strategy=strategy) as src,
    ):
        assert src.strategy.name == strategy
        batches: list[np.ndarray[Any, Any]] = []
        stop = threading.Event()
        reader = threading.Thread(target=drain, args=(src, stop, batches))
        reader.start()
        try:
            result = pair.iperf3(round(patience(3)), cport=cport)  # longer in a guest
            pair.servers[5201].wait(patience(10))  # the server's close: the stream's end
            time.sleep(patience(0.05))  # its last ACK (a guest is several times slower)
            ended_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # the samples' clock
            marks = last_packet_then_busy(pair, patience(0.3))
        finally:
            stop.set()
            reader.join()
        flows = src.new_flows()
        samples = np.concatenate(batches)
        assert src.dropped()["ring_full"] == 0
    conn = result["start"]["connected"][0]
    client, server = (conn["local_host"], conn["local_port"]), (conn["remote_host"], 5201)
    assert client == (pair.addr_a, cport)
    data = flow_id(client[0], server[0], client[1], server[1])  # client -> server
    acks = flow_id(server[0], client[0], server[1], client[1])  # server -> client

    # The kernel's ids are the Python FNV-1a of the 5-tuple, and named by new_flows().
    assert data in flows and acks in flows
    k = flows[data]
    assert (k.src, k.dst, k.sport, k.dport, k.proto) == (
        pair.addr_a,
        pair.addr_b,
        cport,
        5201,
        "tcp",
    )
    assert flows[data].flow_id == data
    k = flows[acks]
    assert (k.src, k.dst, k.sport, k.dport) == (pair.addr_b, pair.addr_a, 5201, cport)

    during = samples[samples["time_ns"] <= ended_ns]
    with_flow = during[during["flow_id"] != 0]
    on_stream = with_flow[np.isin(with_flow["flow_id"], [data, acks])]
    share = len(on_stream) / max(len(with_flow), 1)
    print(
        f"samples {len(during)}, with a flow {len(with_flow)}, on the stream {len(on_stream)} "
        f"({100 * share:.1f}%), data {np.sum(on_stream['flow_id'] == data)}, "
        f"acks {np.sum(on_stream['flow_id'] == acks)}"
    )
    # Hundreds here; tens in the kernel matrix's guests, where QEMU emulates every
    # instruction and the stream is slow (tests/kernel_matrix.py).
    assert len(with_flow) >= 20
    assert share > 0.5  # most of the attributed samples land on the stream
    # A packet's context lasts MS_FLOW_SKID_NS (200 us), and MS_HISTORY_LEN times that
    # in the CPU's history (3.2 ms): a CPU busy after its last packet (and that packet's
    # answer) is sampled, and no sample past that, and a margin for a sample's own time,
    # is charged to the packet or the stream.
    margin = FLOW_HISTORY_NS + round(patience(0.001) * 1e9)
    for cpu, (mark, quiet) in marks.items():
        later = samples[(samples["cpu"] == cpu) & (samples["time_ns"] > quiet + margin)]
        later = later[later["time_ns"] < quiet + round(patience(0.3) * 1e9)]
        assert len(later) >= 20, f"cpu {cpu}: {len(later)} samples after its last packet"
        charged = later[np.isin(later["flow_id"], [mark, data, acks])]
        names = {mark: "mark", data: "data", acks: "acks"}
        why = [
            f"{names[int(c['flow_id'])]} at +{(int(c['time_ns']) - quiet) / 1e3:.0f}us "
            f"source {int(c['flow_source'])} dir {int(c['direction'])}"
            for c in charged
        ]
        assert len(charged) == 0, f"cpu {cpu}: {len(charged)} of {len(later)} stale: {why}"
    # each sample of the stream names its direction's interface: data leaves a's veth
    # (TX) and arrives on b's (RX), the ACKs the other way round
    a, b = IFINDEX_A, IFINDEX_B
    expected = {(data, 1): a, (data, 0): b, (acks, 1): b, (acks, 0): a}
    seen = {
        (int(f), int(d)) for f, d in zip(on_stream["flow_id"], on_stream["direction"], strict=True)
    }
    assert (data, 1) in seen and (data, 0) in seen  # both ends of the packet path
    for (flow, direction), want in expected.items():
        mine = on_stream[(on_stream["flow_id"] == flow) & (on_stream["direction"] == direction)]
        assert np.all(mine["ifindex"] == want), ((flow, direction), set(mine["ifindex"]))
    # TSO on veth: the sender's stack hands the device 64 KiB segments of many MSS each
    sent = on_stream[(on_stream["flow_id"] == data) & (on_stream["direction"] == 1)]
    assert np.max(sent["gso_segs"]) > 1 and np.all(on_stream["gso_segs"] >= 1)
    assert set(np.unique(samples["event"]).tolist()) == {int(Event.CPU_CLOCK)}
    assert np.any(samples["kernel_stack_id"] >= 0)


def test_xdp_on_a_veth_inside_a_namespace() -> None:
    # XDP is attached by interface name in the agent's namespace: run a KernelSource in
    # namespace a (a child process) with --xdp on its veth, traffic from b. The skb
    # hooks are detached once it runs: XDP is then the only packet hook, and every
    # flow named was seen by it.
    script = (
        "import json, sys, time\n"
        "from meridian.tools.sentinel.sources.kernel import NET_PROGRAMS, KernelSource\n"
        "from meridian.tools.sentinel.sources.pmu_events import LOGICAL\n"
        "with KernelSource([LOGICAL['cpu-clock']], frequency=99, xdp=[sys.argv[1]]) as src:\n"
        "    assert src.obj is not None\n"
        "    skb = [lk for lk in src.obj.links if lk.program in NET_PROGRAMS]\n"
        "    assert len(skb) == 2, [lk.program for lk in src.obj.links]\n"
        "    src.obj.drop(skb)\n"
        "    print(json.dumps(src.hooks), flush=True)\n"
        "    sys.stdin.readline()\n"
        "    time.sleep(0.2)\n"
        "    flows = src.new_flows()\n"
        "    print(json.dumps([str(k) for k in flows.values()]), flush=True)\n"
    )
    with netns_pair("x") as pair:
        child = pair.popen(
            pair.a,
            sys.executable,
            "-c",
            script,
            pair.veth_a,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert child.stdin is not None and child.stdout is not None
        hooks = json.loads(child.stdout.readline())
        assert f"xdp/{pair.veth_a}" in hooks
        xdp = subprocess.run(
            ["ip", "-n", pair.a, "-j", "link", "show", pair.veth_a], capture_output=True, text=True
        )
        assert "xdp" in xdp.stdout
        # UDP from b to a, IPv4 and IPv6: the XDP program sees it first on a's veth
        for family, src, dst, sport in (
            ("AF_INET", pair.addr_b, pair.addr_a, 40999),
            ("AF_INET6", pair.addr6_b, pair.addr6_a, 40998),
        ):
            pair.run(
                pair.b, sys.executable, "-c",
                f"import socket; s = socket.socket(socket.{family}, socket.SOCK_DGRAM); "
                f"s.bind(('{src}', {sport})); s.sendto(b'x', ('{dst}', 9))",
            )  # fmt: skip
        child.stdin.write("\n")
        child.stdin.flush()
        names = json.loads(child.stdout.readline())
        child.wait(10)
        assert sorted(names) == sorted(
            [
                f"{pair.addr_b}:40999 -> {pair.addr_a}:9 udp",
                f"[{pair.addr6_b}]:40998 -> [{pair.addr6_a}]:9 udp",
            ]
        )
        after = subprocess.run(
            ["ip", "-n", pair.a, "-j", "link", "show", pair.veth_a], capture_output=True, text=True
        )
        assert "xdp" not in after.stdout


def _frame(*vlans: tuple[int, int], ethertype: int, payload: bytes) -> bytes:
    """An Ethernet frame with VLAN tags (TPID, VID) in front of `payload`."""
    out = bytes(6) + bytes([2, 0, 0, 0, 0, 1])
    for tpid, vid in vlans:
        out += struct.pack("!HH", tpid, vid)
    return out + struct.pack("!H", ethertype) + payload


def _ipv4(src: str, dst: str, proto: int, l4: bytes, frag: int = 0, options: bytes = b"") -> bytes:
    ihl = 5 + len(options) // 4
    hdr = struct.pack(
        "!BBHHHBBH4s4s",
        0x40 | ihl,
        0,
        ihl * 4 + len(l4),
        1,
        frag,
        64,
        proto,
        0,
        bytes(int(x) for x in src.split(".")),
        bytes(int(x) for x in dst.split(".")),
    )
    return hdr + options + l4


def _ipv6(src: str, dst: str, proto: int, l4: bytes) -> bytes:
    import ipaddress

    hdr = struct.pack("!IHBB", 6 << 28, len(l4), proto, 64)
    return hdr + ipaddress.ip_address(src).packed + ipaddress.ip_address(dst).packed + l4


def test_xdp_parser_on_crafted_frames() -> None:
    """The packet parser through BPF_PROG_TEST_RUN: VLAN and QinQ tags, IPv4 options,
    IPv6, fragments and non-IP frames, and what one packet costs."""
    from meridian.bpf import BpfObject, object_path
    from meridian.tools.sentinel.model.flows import FlowKey

    ports = struct.pack("!HH", 40001, 80) + bytes(16)
    cases = [
        (_frame(ethertype=0x0800, payload=_ipv4("10.9.0.1", "10.9.0.2", 6, ports)),
         FlowKey("10.9.0.1", "10.9.0.2", 40001, 80, "tcp")),
        (_frame((0x8100, 7), ethertype=0x0800, payload=_ipv4("10.9.0.3", "10.9.0.4", 17, ports)),
         FlowKey("10.9.0.3", "10.9.0.4", 40001, 80, "udp")),
        (_frame((0x88A8, 7), (0x8100, 8), ethertype=0x86DD,
                payload=_ipv6("fd00::1", "fd00::2", 6, ports)),
         FlowKey("fd00::1", "fd00::2", 40001, 80, "tcp")),
        (_frame(ethertype=0x0800,
                payload=_ipv4("10.9.0.5", "10.9.0.6", 6, ports, options=bytes(4))),
         FlowKey("10.9.0.5", "10.9.0.6", 40001, 80, "tcp")),
        (_frame(ethertype=0x0800, payload=_ipv4("10.9.0.7", "10.9.0.8", 17, ports, frag=185)),
         None),  # a later fragment: no ports, no flow
        (_frame(ethertype=0x0800, payload=_ipv4("10.9.0.7", "10.9.0.8", 1, bytes(8))), None),
        (_frame(ethertype=0x0806, payload=bytes(28)), None),  # ARP
    ]  # fmt: skip
    with BpfObject(object_path("sentinel")) as obj:
        obj.select(["ms_xdp_rx"])
        obj.load()
        prog = obj.programs["ms_xdp_rx"]
        for frame, _ in cases:
            assert prog.test_run(frame)[0] == 2  # XDP_PASS
        keys, vals = obj.maps["ms_flows"].items()
        got = {int(k): FlowKey.from_bytes(v.tobytes()) for k, v in zip(keys, vals, strict=True)}
        counters = obj.maps["ms_counters"].summed()
        _, per_packet_ns = prog.test_run(cases[0][0], repeat=200_000)
    want = [k for _, k in cases if k is not None]
    assert got == {k.flow_id: k for k in want}
    assert {flow_id(k.src, k.dst, k.sport, k.dport, 6) for k in want[:1]} <= got.keys()
    assert counters["flows_seen"] == len(want)
    assert counters["flows_unparsed"] == len(cases) - len(want)
    print(f"ms_xdp_rx: {per_packet_ns} ns per packet (BPF_PROG_TEST_RUN, one flow)")


def test_contexts_return_each_packet_of_the_history_once() -> None:
    """Three UDP datagrams a -> b, 0.1 s apart: each is one TX context (in a) and one
    RX context (in b) of the same flow, in the skew adjuster's rows, and only once."""
    sport, dport = 41000 + os.getpid() % 1000, 9999
    send = (
        "import socket, time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.bind(('{{a}}', {sport}))\n"
        "for _ in range(3):\n"
        f"    s.sendto(b'x' * 100, ('{{b}}', {dport})); time.sleep(0.1)\n"
    )
    with netns_pair("c") as pair, KernelSource(CLOCK, frequency=49) as src:
        src.contexts()  # what came before
        pair.run(pair.a, sys.executable, "-c", send.format(a=pair.addr_a, b=pair.addr_b))
        got = src.contexts()
        again = src.contexts()
    fid = flow_id(pair.addr_a, pair.addr_b, sport, dport, proto=17)
    ours = got[got["flow_id"] == fid]
    assert sorted(ours["direction"].tolist()) == [0, 0, 0, 1, 1, 1]  # 3 RX, 3 TX
    assert set(ours["gso_segs"].tolist()) == {1}
    assert np.all(np.diff(got["time_ns"][got["cpu"] == got["cpu"][0]].astype(np.int64)) > 0)
    assert fid not in again["flow_id"]
