"""pipeline/listening.py at its edges: /proc/net lines it must skip without losing the
ones after them, the ephemeral range's bounds, the tables read, and ServiceMap's
bound and range (the common cases: test_sentinel_services.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.tools.sentinel.model.flows import FlowKey
from meridian.tools.sentinel.model.services import EPHEMERAL, ServiceKey
from meridian.tools.sentinel.pipeline.listening import (
    ServiceMap,
    ephemeral_range,
    listening_sockets,
    parse_proc_net,
)

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
REST = " 00000000:00000000 00:00000000 00000000 0 0 1\n"


def line(local: str, remote: str = "00000000:0000", st: str = "0A") -> str:
    return f"   0: {local} {remote} {st}{REST}"


def test_lines_skipped_do_not_stop_the_table() -> None:
    """Each line that is not a listening socket is skipped and the next one read: an
    established one, one whose mark is in another column, a short one, one with a bad
    address; a line of exactly four columns is read."""
    text = HEAD + "".join(
        [
            line("0100007F:0001", "0100007F:9C40", "01"),  # established
            line("0100007F:0002"),
            "   0: 0100007F:0003 00000000:0000 01 0A 0\n",  # " 0A " past the st column
            line("0100007F:0004"),
            "   x 0A y\n",  # short
            line("0100007F:0005"),
            line("nothex:0006"),
            line("0100007F:0007"),
            "   0: 0100007F:0008 00000000:0000 0A \n",  # four columns
        ]
    )
    got = {port for _, _, port in parse_proc_net(text, "tcp")}
    assert got == {2, 4, 5, 7, 8}


def test_udp_in_the_ephemeral_range_or_connected_is_no_service() -> None:
    """UDP sockets on the range's own bounds are a client's; one below and one above
    are services; a connected one between them is skipped, not the rest."""
    ports = [999, 1000, 2000, 2001]
    text = HEAD + "".join(line(f"00000000:{p:04X}", st="07") for p in ports[:2])
    text += line("00000000:0BB8", "0200007F:0035", "07")  # 3000, connected
    text += "".join(line(f"00000000:{p:04X}", st="07") for p in ports[2:])
    got = {port for _, _, port in parse_proc_net(text, "udp", (1000, 2000))}
    assert got == {999, 2001}


def fake_proc(root: Path, tables: dict[str, str], port_range: str | None) -> str:
    (root / "net").mkdir(parents=True)
    for name, text in tables.items():
        (root / "net" / name).write_text(HEAD + text)
    if port_range is not None:
        (root / "sys/net/ipv4").mkdir(parents=True)
        (root / "sys/net/ipv4/ip_local_port_range").write_text(port_range)
    return str(root)


def test_every_table_read_and_one_missing_skipped(tmp_path: Path) -> None:
    """No tcp6 (a host without IPv6) does not stop udp and udp6; the range given is
    the one used."""
    root = fake_proc(
        tmp_path,
        {
            "tcp": line("0100007F:0016"),
            "udp": line("00000000:05DC", st="07") + line("00000000:9C40", st="07"),
            "udp6": line("00000000000000000000000000000000:0035", st="07"),
        },
        None,
    )
    assert listening_sockets(root, (1000, 2000)).sockets == {
        ("tcp", "127.0.0.1", 22),
        ("udp", "0.0.0.0", 40000),  # 1500 is in the range given
        ("udp", "::", 53),
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1 1\n", (1, 1)),
        ("1024 65535\n", (1024, 65535)),
        ("0 100\n", EPHEMERAL),
        ("100 99\n", EPHEMERAL),
        ("1024 65536\n", EPHEMERAL),
    ],
)
def test_the_ephemeral_range_s_bounds(tmp_path: Path, text: str, want: tuple[int, int]) -> None:
    assert ephemeral_range(fake_proc(tmp_path, {}, text)) == want


def test_service_map_uses_the_host_s_range_and_keeps_its_newest(tmp_path: Path) -> None:
    """With ip_local_port_range 1000-2000 a UDP socket on 1500 is a client's, and of a
    flow between 1500 and 40000 the service is 40000; past max_flows the oldest
    decision goes; the clock may start at 0."""
    root = fake_proc(
        tmp_path, {"udp": line("00000000:05DC", st="07")}, "1000 2000\n"
    )  # fmt: skip
    keys = {i: FlowKey("10.0.0.1", "10.0.0.2", 1500, 40000 + i, "udp") for i in (1, 2, 3)}
    m = ServiceMap(keys.get, root, max_flows=2, clock=lambda: 0.0)
    assert m.listening().sockets == frozenset()
    assert m(1) == ServiceKey("10.0.0.2", 40001, "udp")
    m(2)
    m(3)
    assert list(m._decided) == [2, 3]
