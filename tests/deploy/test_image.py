"""The OCI image (`make image`, deploy/image/build.sh) on this kernel: `meridian io`
and `meridian sentinel` run from it by podman as their DaemonSets run them (not
privileged: only the capabilities deploy/kubernetes gives each, the shipped seccomp
profile, a read-only root, no new privileges) in the host's PID and network
namespaces, trace workloads on the host, and their /metrics (and their output on
SIGTERM) carry the workloads' exact numbers.

podman runs them with runc and explicit ulimits (deploy/image/README.md): Debian 12's
crun 1.8 refuses a host with hybrid cgroups ("cgroups in hybrid mode not supported"),
and podman 4.3 gives a container RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 by default,
which a root without CAP_SYS_RESOURCE (this VM's) may not raise to; podman itself runs
with RLIMIT_NPROC at 32768."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from children import patience, reap, wait_until
from clickhouse_server import free_port
from netns import netns_pair

from meridian import __version__

pytestmark = [pytest.mark.kernel, pytest.mark.deploy]

IMAGE = os.environ.get("MERIDIAN_IMAGE", f"localhost/meridian:{__version__}")
K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
PROFILE = K8S / "seccomp" / "meridian.json"
DAEMONSETS = {"io": "io-exporter.yaml", "sentinel": "sentinel.yaml"}

# The workload: WRITES pwrites of WRITE_SIZE bytes, then READS preads of READ_SIZE
# bytes (1 MiB in all) on a regular file, once the test says go.
READS, READ_SIZE, WRITES, WRITE_SIZE = 64, 16_384, 3, 5_000
CHILD = f"""
import os, sys
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
f = os.open(sys.argv[1], os.O_RDWR)
for i in range({WRITES}):
    os.pwrite(f, b"w" * {WRITE_SIZE}, i * {WRITE_SIZE})
for i in range({READS}):
    assert len(os.pread(f, {READ_SIZE}, i * {READ_SIZE})) == {READ_SIZE}
os.close(f)
os.write(1, b"done\\n")
sys.stdin.readline()  # exits when the test closes stdin
"""


def capabilities(tool: str) -> list[str]:
    """The capabilities the tool's DaemonSet adds (it drops every other)."""
    for doc in yaml.safe_load_all((K8S / DAEMONSETS[tool]).read_text()):
        if doc and doc["kind"] == "DaemonSet":
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            return list(c["securityContext"]["capabilities"]["add"])
    raise AssertionError(f"no DaemonSet in {DAEMONSETS[tool]}")


def podman_run(name: str, tool: str) -> list[str]:
    """`podman run` as the tool's DaemonSet runs it: its capabilities only, the shipped
    seccomp profile, a read-only root, no new privileges; in the host's PID namespace
    (its PIDs and /proc) and network (/metrics on the host's loopback, its interfaces),
    with the kernel's BTF and tracefs mounted in read-only."""
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = min(nproc, 32768) if nproc != resource.RLIM_INFINITY else 32768
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    caps = [f"--cap-add={c}" for c in capabilities(tool)]
    return [
        "podman", *runtime, "run", "--rm", "--replace", "--name", name,
        "--cap-drop=ALL", *caps, f"--security-opt=seccomp={PROFILE}",
        "--security-opt=no-new-privileges", "--read-only", "--user=0",
        "--pid=host", "--network=host",
        "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}",
        "-v", "/sys/kernel/btf:/sys/kernel/btf:ro",
        "-v", "/sys/kernel/tracing:/sys/kernel/tracing:ro",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def image() -> str:
    """The image's tag; a skip (a failure with MERIDIAN_REQUIRE_BPF=1) when podman or
    the image is missing."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: make image")
    exists = subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True)
    if exists.returncode != 0:
        pytest.skip(f"{IMAGE} is not in podman's store: make image")
    return IMAGE


@dataclass
class Container:
    name: str
    proc: subprocess.Popen[str]
    out: Path
    err: Path

    def stop(self) -> str:
        """SIGTERM to meridian (podman stop); what it printed on stdout. It must exit 0."""
        subprocess.run(
            ["podman", "stop", "-t", str(round(patience(30))), self.name],
            check=True, capture_output=True, timeout=patience(60),
        )  # fmt: skip
        self.proc.wait(patience(30))
        assert self.proc.returncode == 0, self.err.read_text()[-2000:]
        return self.out.read_text()


@contextlib.contextmanager
def container(image: str, tmp: Path, *args: str) -> Iterator[Container]:
    """`meridian ARGS` (with -v) in a container of the image, once its programs are
    attached; the container is removed and podman reaped whatever happens."""
    name = f"meridian-test-{os.getpid()}-{args[0]}"
    out, err = tmp / f"{args[0]}.out", tmp / f"{args[0]}.err"
    with open(out, "w") as out_file, open(err, "w") as err_file:
        proc = subprocess.Popen(
            [*podman_run(name, args[0]), image, *args],
            stdout=out_file,
            stderr=err_file,
            text=True,
        )
    try:
        wait_until(
            lambda: "strategy:" in err.read_text() or proc.poll() is not None,
            60,
            f"meridian {args[0]} attached in the container",
        )
        assert proc.poll() is None, f"podman exited {proc.returncode}: {err.read_text()[-2000:]}"
        yield Container(name, proc, out, err)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)
        reap(proc)


def scrape(port: int, host: str = "127.0.0.1") -> list[Any]:
    """The samples of /metrics ([] while it does not answer), OpenMetrics (sentinel)
    or the Prometheus text format (io), as the server chose."""
    from prometheus_client import parser as text_parser
    from prometheus_client.openmetrics import parser as om_parser

    req = urllib.request.Request(f"http://{host}:{port}/metrics")
    req.add_header("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
            kind = r.headers.get("Content-Type", "")
    except OSError:
        return []
    module: Any = om_parser if kind.startswith("application/openmetrics") else text_parser
    parse: Any = module.text_string_to_metric_families  # untyped
    return [s for family in parse(text) for s in family.samples]


class Workload:
    """CHILD on the host, waiting for `go()`: its PID exists before the tracing starts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"\0" * (READS * READ_SIZE))
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert self.p.stdout is not None and self.p.stdout.readline() == "ready\n"
        except BaseException:
            reap(self.p)  # the test's finally does not run
            raise
        self.pid = self.p.pid

    def go(self) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline() == "done\n"


def test_io_in_the_image_counts_a_host_process_exactly(image: str, tmp_path: Path) -> None:
    port = free_port()
    child = Workload(tmp_path / "work.bin")
    try:
        with container(
            image, tmp_path, "io", "-v", "-p", str(child.pid),
            "--prometheus", f"127.0.0.1:{port}",
        ) as ctr:  # fmt: skip
            child.go()

            def io_bytes() -> dict[str, float]:
                """process_disk_io_bytes_total of the child by direction (writeback,
                which the flusher may add later, left out)."""
                got: dict[str, float] = {}
                for s in scrape(port):
                    if (
                        s.name == "process_disk_io_bytes_total"
                        and s.labels.get("process_pid") == str(child.pid)
                        and s.labels.get("meridian_io_writeback") != "true"
                    ):
                        direction = s.labels["disk_io_direction"]
                        got[direction] = got.get(direction, 0.0) + s.value
                return got

            want = {"read": READS * READ_SIZE, "write": WRITES * WRITE_SIZE}
            wait_until(lambda: io_bytes() == want, 30, "the workload's bytes in /metrics", 0.2)
            ops = {
                s.labels["disk_io_direction"]: s.value
                for s in scrape(port)
                if s.name == "process_disk_operations_total"
                and s.labels.get("process_pid") == str(child.pid)
                and s.labels.get("meridian_io_cached") == "true"
            }
            names = {
                s.labels.get("process_executable_name")
                for s in scrape(port)
                if s.labels.get("process_pid") == str(child.pid)
            }
            out = ctr.stop()
    finally:
        reap(child.p)
    # every operation of the workload was served by the page cache (it wrote the file)
    assert ops == {"read": READS, "write": WRITES}
    # named from the host's /proc and the kernel, seen through --pid=host
    assert len(names) == 1 and str(names.pop()).startswith("python"), names
    lines = [json.loads(line) for line in out.splitlines()]
    events = [x for x in lines if "type" not in x]
    (summary,) = [x for x in lines if x.get("type") == "summary" and x.get("pid") == child.pid]
    assert (summary["read"]["ops"], summary["read"]["bytes"]) == (READS, READS * READ_SIZE)
    assert summary["write"]["bytes"] == WRITES * WRITE_SIZE
    # the host path of the file, resolved in the kernel, though the container cannot see it
    assert {e["file"] for e in events} == {str(child.path)}
    assert [e["bytes"] for e in events if e["op"] == "read"] == [READ_SIZE] * READS


def test_sentinel_in_the_image_samples_a_host_stream(image: str, tmp_path: Path) -> None:
    port, cport = free_port(), 40000 + (os.getpid() + 1) % 20000
    with netns_pair("img") as pair, container(
        image, tmp_path, "sentinel", "--events", "cpu-clock", "-F", "199",
        "--samples-per-sec", "20000", "--json", "--prometheus", f"127.0.0.1:{port}", "-v",
    ) as ctr:  # fmt: skip
        client = pair.iperf3_start(round(patience(4)), cport=cport)
        stream = {"src": pair.addr_a, "dst": pair.addr_b, "sport": str(cport), "dport": "5201"}

        def stream_series() -> list[Any]:
            return [
                s
                for s in scrape(port)
                if s.name == "ms_flow_event_norm" and stream.items() <= s.labels.items()
            ]

        wait_until(lambda: len(stream_series()) >= 2, 20, "the stream's series in /metrics", 0.2)
        series = stream_series()
        rates = [s.value for s in scrape(port) if s.name == "ms_samples_per_sec"]
        pair.iperf3_result(client, patience(60))
        out = ctr.stop()
    # /metrics: the stream by its 5-tuple, leaving a (tx) and arriving at b (rx)
    assert {(s.labels["direction"], s.labels["event"]) for s in series} == {
        ("tx", "cpu-clock"),
        ("rx", "cpu-clock"),
    }
    assert all(s.value > 0 for s in series)
    assert len(rates) == 1 and rates[0] > 0
    objects = [json.loads(line) for line in out.splitlines()]
    (summary,) = [o for o in objects if o["type"] == "summary"]
    label = f"{pair.addr_a}:{cport} -> {pair.addr_b}:5201 tcp"
    rows = [row for row in summary["flows"] if row.get("label") == label]
    assert {row["direction"] for row in rows} == {"tx", "rx"}
    assert all(row["samples"] > 0 for row in rows)
    assert summary["samples"] >= sum(row["samples"] for row in rows) > 0
