"""Flows as a person reads them: the 40-byte `struct ms_flow_key` the kernel hashes,
its FNV-1a 64 flow id, and `10.0.0.1:5201 -> 10.0.0.2:43012 tcp`.

The flow id must be the kernel's to the bit, so `fnv1a64` is the plain definition
(offset basis 0xcbf29ce484222325, prime 0x100000001b3) over the exact key bytes.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FNV_OFFSET", "FNV_PRIME", "KEY_SIZE", "FlowKey", "FlowNames", "fnv1a64"]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1
KEY_SIZE = 40  # sizeof(struct ms_flow_key)
AF_INET, AF_INET6 = socket.AF_INET.value, socket.AF_INET6.value  # 2, 10 on Linux
_PROTO_NAMES = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 132: "sctp"}
_PROTO_NUMBERS = {v: k for k, v in _PROTO_NAMES.items()}
# saddr[16] daddr[16] sport dport (network order) proto family pad[2]
_KEY = struct.Struct("!16s16sHHBB2x")


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 of `data` (what the kernel computes over the flow key)."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & _MASK
    return h


def _proto(value: str | int) -> str | int:
    """6 -> "tcp"; "UDP" -> "udp"; 47 -> 47 (no name we print)."""
    if isinstance(value, str):
        low = value.lower()
        if low in _PROTO_NUMBERS:
            return low
        return _proto(int(low))
    return _PROTO_NAMES.get(value, value)


@dataclass(frozen=True)
class FlowKey:
    """One direction of a connection, as the kernel keyed it (src -> dst)."""

    src: str
    dst: str
    sport: int
    dport: int
    proto: str | int = "tcp"
    family: int = 0  # AF_INET or AF_INET6; 0: from the addresses

    def __post_init__(self) -> None:
        src = ipaddress.ip_address(self.src)
        dst = ipaddress.ip_address(self.dst)
        if src.version != dst.version:
            raise ValueError(f"flow {self.src} -> {self.dst} mixes IPv4 and IPv6")
        object.__setattr__(self, "src", str(src))
        object.__setattr__(self, "dst", str(dst))
        object.__setattr__(self, "proto", _proto(self.proto))
        family = AF_INET if src.version == 4 else AF_INET6
        if self.family not in (0, family):
            raise ValueError(f"family {self.family} does not match address {self.src}")
        object.__setattr__(self, "family", family)

    @property
    def proto_number(self) -> int:
        return _PROTO_NUMBERS[self.proto] if isinstance(self.proto, str) else self.proto

    @classmethod
    def from_bytes(cls, raw: bytes) -> FlowKey:
        """Decode a `struct ms_flow_key` (IPv4 in the first 4 bytes of each address)."""
        if len(raw) != KEY_SIZE:
            raise ValueError(f"a flow key is {KEY_SIZE} bytes, got {len(raw)}")
        saddr, daddr, sport, dport, proto, family = _KEY.unpack(raw)
        if family == AF_INET:
            src, dst = socket.inet_ntop(AF_INET, saddr[:4]), socket.inet_ntop(AF_INET, daddr[:4])
        elif family == AF_INET6:
            src, dst = socket.inet_ntop(AF_INET6, saddr), socket.inet_ntop(AF_INET6, daddr)
        else:
            raise ValueError(f"flow key of unknown address family {family}")
        return cls(src, dst, sport, dport, proto, family)

    def to_bytes(self) -> bytes:
        """The 40 bytes the kernel hashes."""
        saddr = ipaddress.ip_address(self.src).packed.ljust(16, b"\0")
        daddr = ipaddress.ip_address(self.dst).packed.ljust(16, b"\0")
        return _KEY.pack(saddr, daddr, self.sport, self.dport, self.proto_number, self.family)

    @property
    def flow_id(self) -> int:
        return fnv1a64(self.to_bytes())

    def reversed(self) -> FlowKey:
        """The other direction of the same connection."""
        return FlowKey(self.dst, self.src, self.dport, self.sport, self.proto, self.family)

    def __str__(self) -> str:
        if self.family == AF_INET6:
            return f"[{self.src}]:{self.sport} -> [{self.dst}]:{self.dport} {self.proto}"
        return f"{self.src}:{self.sport} -> {self.dst}:{self.dport} {self.proto}"


class FlowNames:
    """flow_id -> FlowKey for display, bounded: the oldest names go first, so a host
    with a million short flows cannot grow it without limit."""

    def __init__(self, max_flows: int = 65536) -> None:
        self.max_flows = max_flows
        self._names: OrderedDict[int, FlowKey] = OrderedDict()

    def __len__(self) -> int:
        return len(self._names)

    def add(self, keys: Mapping[int, FlowKey] | Iterable[FlowKey]) -> None:
        items = keys.items() if isinstance(keys, Mapping) else ((k.flow_id, k) for k in keys)
        for flow_id, key in items:
            self._names[flow_id] = key
            self._names.move_to_end(flow_id)
        while len(self._names) > self.max_flows:
            self._names.popitem(last=False)

    def get(self, flow_id: int) -> FlowKey | None:
        return self._names.get(flow_id)

    def ids(self) -> list[int]:
        """The flow ids named now."""
        return list(self._names)

    def label(self, flow_id: int) -> str:
        """The 5-tuple when known, else the id as 16 hex digits."""
        key = self._names.get(flow_id)
        return str(key) if key is not None else f"{flow_id:016x}"
