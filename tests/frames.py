"""Network frames built byte by byte for the sentinel kernel tests (Ethernet, VLAN,
IPv4/IPv6 with extension headers and fragments, TCP/UDP, VXLAN, Geneve), and the flow
id sentinel gives a 5-tuple, computed here without the code under test."""

from __future__ import annotations

import ipaddress
import struct
from typing import Any

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
