"""The host's side of the service rule (model/services.py): the sockets it listens on,
from /proc/net/{tcp,tcp6,udp,udp6}, and its ephemeral port range, from
/proc/sys/net/ipv4/ip_local_port_range; and `ServiceMap`, flow id -> service, which
the runtime's names answer with.

/proc/net lists every socket of the agent's network namespace (established ones
too), so it is read at most every REFRESH_S, when a flow not seen before asks; a
flow's service is decided once (the first time it is asked) and kept, bounded, so a
row does not move from one service to another while the run goes on.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from ..model.flows import FlowKey
from ..model.services import EPHEMERAL, Listening, ServiceKey, server_side

__all__ = ["REFRESH_S", "ServiceMap", "ephemeral_range", "listening_sockets", "parse_proc_net"]

REFRESH_S = 5.0
TCP_LISTEN, UDP_UNCONNECTED = "0A", "07"  # the `st` column: TCP_LISTEN, TCP_CLOSE


def _address(hexaddr: str) -> str:
    """/proc/net's `0100007F` (IPv4: the address's 32-bit word printed in host byte
    order) or 32 hex digits (IPv6: four such words) as text; an IPv4-mapped IPv6
    address as the IPv4 one."""
    words = (int(hexaddr[i : i + 8], 16) for i in range(0, len(hexaddr), 8))
    packed = b"".join(struct.pack("=I", w) for w in words)
    if len(packed) == 4:
        return socket.inet_ntop(socket.AF_INET, packed)
    if packed[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, packed[12:])
    return socket.inet_ntop(socket.AF_INET6, packed)


def parse_proc_net(
    text: str, proto: str, ephemeral: tuple[int, int] = EPHEMERAL
) -> set[tuple[str, str, int]]:
    """The listening sockets of one /proc/net table (`proto` tcp or udp): TCP in
    LISTEN; UDP unconnected (TCP_CLOSE, no remote address) on a port outside the
    ephemeral range."""
    state = TCP_LISTEN if proto == "tcp" else UDP_UNCONNECTED
    lo, hi = ephemeral
    out = set()
    mark = f" {state} "  # only the `st` column is two hex digits between spaces
    for line in text.splitlines()[1:]:
        if mark not in line:  # most lines on a busy host: established connections
            continue
        parts = line.split(None, 4)
        if len(parts) < 4 or parts[3] != state:
            continue
        try:
            addr, port = parts[1].split(":")
            local = (proto, _address(addr), int(port, 16))
        except ValueError:
            continue
        if proto == "udp" and (lo <= local[2] <= hi or set(parts[2]) - {"0", ":"}):
            continue
        out.add(local)
    return out


def listening_sockets(
    proc_root: str = "/proc", ephemeral: tuple[int, int] = EPHEMERAL
) -> Listening:
    """The sockets the host (the agent's network namespace) listens on; a table that
    cannot be read (no IPv6) adds none."""
    found: set[tuple[str, str, int]] = set()
    for table, proto in (("tcp", "tcp"), ("tcp6", "tcp"), ("udp", "udp"), ("udp6", "udp")):
        try:
            text = Path(proc_root, "net", table).read_text()
        except OSError:
            continue
        found |= parse_proc_net(text, proto, ephemeral)
    return Listening(frozenset(found))


def ephemeral_range(proc_root: str = "/proc") -> tuple[int, int]:
    """The host's ip_local_port_range; Linux's default when it cannot be read."""
    try:
        text = Path(proc_root, "sys/net/ipv4/ip_local_port_range").read_text()
        lo, hi = (int(x) for x in text.split())
    except (OSError, ValueError):
        return EPHEMERAL
    return (lo, hi) if 0 < lo <= hi <= 65535 else EPHEMERAL


class ServiceMap:
    """flow id -> its service (None while the flow's 5-tuple is not known), by
    model/services.py's rules with this host's listening sockets and ephemeral range.
    Safe across threads (the flush thread and the API's)."""

    def __init__(
        self,
        flow: Callable[[int], FlowKey | None],
        proc_root: str = "/proc",
        max_flows: int = 65536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flow = flow
        self.proc_root = proc_root
        self.max_flows = max_flows
        self.clock = clock
        self.ephemeral = ephemeral_range(proc_root)
        self._listening: Listening | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()
        self._decided: OrderedDict[int, ServiceKey] = OrderedDict()

    def listening(self) -> Listening:
        """The listening sockets, read again when REFRESH_S old."""
        now = self.clock()
        if self._listening is None or now - self._read_at >= REFRESH_S:
            self._listening = listening_sockets(self.proc_root, self.ephemeral)
            self._read_at = now
        return self._listening

    def __call__(self, flow_id: int) -> ServiceKey | None:
        if not flow_id:
            return None
        with self._lock:
            found = self._decided.get(flow_id)
            if found is not None:
                return found
            key = self.flow(flow_id)
            if key is None:
                return None
            found = self._decided[flow_id] = server_side(key, self.listening(), self.ephemeral)
            while len(self._decided) > self.max_flows:
                self._decided.popitem(last=False)
            return found
