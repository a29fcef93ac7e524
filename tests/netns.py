"""Two network namespaces joined by a veth pair, for the kernel tests that need real
traffic: 10.x addresses exist only inside the namespaces made here, every process
started in them is killed, and both namespaces (with the veth) are deleted whatever
the test's outcome. iperf3 runs between them for a bounded time."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IFINDEX_A", "IFINDEX_B", "IPERF3", "NetnsPair", "netns_pair"]

IPERF3 = shutil.which("iperf3") or "/usr/bin/iperf3"
IFINDEX_A, IFINDEX_B = 10, 20


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@dataclass
class NetnsPair:
    """Namespace `a` (veth `veth_a`, address `addr_a`, IPv6 `addr6_a`) and `b`
    likewise: one IPv4 /24 and one IPv6 ULA /64."""

    a: str
    b: str
    veth_a: str
    veth_b: str
    addr_a: str
    addr_b: str
    addr6_a: str = ""
    addr6_b: str = ""
    children: list[subprocess.Popen[Any]] = field(default_factory=list)
    servers: dict[int, subprocess.Popen[Any]] = field(default_factory=dict)  # iperf3's, by port

    def run(self, ns: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", ns, *cmd],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, ns: str, *cmd: str, **kw: Any) -> subprocess.Popen[str]:
        """A process in namespace `ns`, killed at teardown if still running."""
        child: subprocess.Popen[str] = subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd], text=True, **kw
        )
        self.children.append(child)
        return child

    def iperf3(self, seconds: float, **options: Any) -> dict[str, Any]:
        """iperf3_start(seconds, **options), then its JSON result."""
        return self.iperf3_result(self.iperf3_start(seconds, **options), seconds + 30)

    def iperf3_start(
        self,
        seconds: float,
        port: int = 5201,
        cport: int | None = None,
        udp: bool = False,
        length: int | None = None,
        cpus: tuple[int, int] | None = None,
        interval: float | None = None,
        bitrate: str | None = None,
    ) -> subprocess.Popen[str]:
        """A TCP (or UDP) stream from a to b for `seconds`, `length` bytes a write,
        started and not waited for: the server, then the client once the server
        listens. `cpus` pins the client and the server to one CPU each; `interval` s
        between iperf3's reports; `bitrate` caps the stream (iperf3's -b: "50M")."""
        pin_server = ["-A", str(cpus[1])] if cpus else []
        last = self.servers.pop(port, None)
        if last is not None:  # the last run's server (-1) exits after its client's end
            with contextlib.suppress(subprocess.TimeoutExpired):
                last.wait(5)
        self.servers[port] = self.popen(
            self.b, IPERF3, "-s", "-1", "-B", self.addr_b, "-p", str(port), *pin_server,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while not self.run(self.b, "ss", "-Hltn", f"sport = :{port}").stdout.strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"iperf3: the server did not listen on port {port}")
            time.sleep(0.05)
        cmd = [IPERF3, "-c", self.addr_b, "-p", str(port), "-t", f"{seconds:g}", "-J"]
        if cport is not None:
            cmd += ["--cport", str(cport)]
        if cpus:
            cmd += ["-A", str(cpus[0])]
        if udp:
            cmd += ["-u", "-b", bitrate or "0"]  # 0: as fast as it goes
        elif bitrate is not None:
            cmd += ["-b", bitrate]
        if length is not None:
            cmd += ["-l", str(length)]
        if interval is not None:
            cmd += ["-i", f"{interval:g}"]
        return self.popen(self.a, *cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    @staticmethod
    def iperf3_result(client: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
        """The JSON result of a client from iperf3_start (RuntimeError on iperf3's error)."""
        out, _ = client.communicate(timeout=timeout)
        result: dict[str, Any] = json.loads(out or "{}")
        if "error" in result or not out:
            raise RuntimeError(f"iperf3: {result.get('error', 'no result')}")
        return result


@contextlib.contextmanager
def netns_pair(tag: str = "") -> Iterator[NetnsPair]:
    """Make the pair (names unique to this process), yield it, tear it all down."""
    n = os.getpid() % 250
    suffix = f"{tag}{os.getpid()}"[-8:]
    pair = NetnsPair(
        a=f"msa{suffix}",
        b=f"msb{suffix}",
        veth_a=f"mva{suffix}",
        veth_b=f"mvb{suffix}",
        addr_a=f"10.231.{n}.1",
        addr_b=f"10.231.{n}.2",
        # as the tools print them (canonical: fd00:231::1 where n is 0)
        addr6_a=str(ipaddress.IPv6Address(f"fd00:231:{n:x}::1")),
        addr6_b=str(ipaddress.IPv6Address(f"fd00:231:{n:x}::2")),
    )
    try:
        _ip("netns", "add", pair.a)
        _ip("netns", "add", pair.b)
        # indexes of their own (each namespace would give both 2): a packet's interface
        # tells which end it passed
        _ip(
            "link", "add", pair.veth_a, "netns", pair.a, "index", str(IFINDEX_A),
            "type", "veth", "peer", "name", pair.veth_b, "netns", pair.b, "index", str(IFINDEX_B),
        )  # fmt: skip
        for ns, dev, addr, addr6 in (
            (pair.a, pair.veth_a, pair.addr_a, pair.addr6_a),
            (pair.b, pair.veth_b, pair.addr_b, pair.addr6_b),
        ):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "-6", "addr", "add", f"{addr6}/64", "dev", dev, "nodad")
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for child in pair.children:
            if child.poll() is None:
                child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(5)
            for pipe in (child.stdin, child.stdout, child.stderr):
                if pipe is not None:
                    pipe.close()
        for ns in (pair.a, pair.b):  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
