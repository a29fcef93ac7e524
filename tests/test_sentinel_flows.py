"""Flow ids are FNV-1a 64 of the 40-byte struct ms_flow_key, to the bit: published
test vectors, the key bytes written out by hand, and a C program over the header."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from children import build_c

from meridian.tools.sentinel.model.flows import FlowKey, FlowNames, fnv1a64

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # the FNV authors' test vectors (isthe.com/chongo/tech/comp/fnv)
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"foobar", 0x85944171F73967E8),
    ],
)
def test_fnv1a64_vectors(data: bytes, expected: int) -> None:
    assert fnv1a64(data) == expected


V4 = FlowKey("10.0.0.1", "10.0.0.2", 5201, 43012, "tcp")
V6 = FlowKey("fd00::1", "fd00::2", 443, 51000, "udp")


def test_ipv4_key_bytes() -> None:
    raw = bytes.fromhex(
        "0a000001"
        + "00" * 12  # saddr: IPv4 in the first 4 bytes
        + "0a000002"
        + "00" * 12  # daddr
        + "1451"
        + "a804"  # ports 5201, 43012 in network byte order
        + "06"
        + "02"
        + "0000"  # tcp, AF_INET, pad
    )
    assert V4.to_bytes() == raw
    assert FlowKey.from_bytes(raw) == V4
    assert V4.flow_id == fnv1a64(raw)


def test_ipv6_round_trip() -> None:
    raw = V6.to_bytes()
    assert len(raw) == 40
    assert raw[:16] == bytes.fromhex("fd00" + "00" * 13 + "01")
    assert raw[36:38] == bytes([17, 10])
    assert FlowKey.from_bytes(raw) == V6


def test_str() -> None:
    assert str(V4) == "10.0.0.1:5201 -> 10.0.0.2:43012 tcp"
    assert str(V6) == "[fd00::1]:443 -> [fd00::2]:51000 udp"
    assert str(FlowKey("10.0.0.1", "10.0.0.2", 0, 0, 47)) == "10.0.0.1:0 -> 10.0.0.2:0 47"
    assert V4.reversed() == FlowKey("10.0.0.2", "10.0.0.1", 43012, 5201, 6)


def test_bad_keys() -> None:
    with pytest.raises(ValueError, match="mixes"):
        FlowKey("10.0.0.1", "fd00::1", 1, 2)
    with pytest.raises(ValueError, match="40 bytes"):
        FlowKey.from_bytes(b"\0" * 39)
    with pytest.raises(ValueError, match="family"):
        FlowKey.from_bytes(b"\0" * 40)


C_PROGRAM = """
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <linux/types.h>
#include "sentinel.h"
int main(void) {
    struct ms_flow_key k;
    memset(&k, 0, sizeof(k));
    inet_pton(AF_INET, "10.0.0.1", k.saddr);
    inet_pton(AF_INET, "10.0.0.2", k.daddr);
    k.sport = htons(5201); k.dport = htons(43012); k.proto = 6; k.family = AF_INET;
    unsigned long long h = 0xcbf29ce484222325ULL;
    const unsigned char *p = (const unsigned char *)&k;
    for (size_t i = 0; i < sizeof(k); i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
    printf("%zu %llu\\n", sizeof(k), h);
    return 0;
}
"""


def test_flow_id_matches_c_over_the_header(tmp_path: Path) -> None:
    """The struct as a C compiler lays it out, hashed as the kernel program does."""
    exe = build_c(tmp_path, "fnv", C_PROGRAM, f"-I{ROOT / 'bpf'}")
    size, value = subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True
    ).stdout.split()
    assert int(size) == 40
    assert int(value) == V4.flow_id


def test_flow_names_bounded_and_labelled() -> None:
    names = FlowNames(max_flows=2)
    names.add([V4])
    names.add({V6.flow_id: V6})
    assert names.label(V4.flow_id) == str(V4)
    assert names.get(V6.flow_id) == V6
    assert names.label(0x1234) == "0000000000001234"
    names.add([V4.reversed()])  # the oldest name goes
    assert len(names) == 2
    assert names.get(V4.flow_id) is None
    assert names.label(V4.flow_id) == f"{V4.flow_id:016x}"
