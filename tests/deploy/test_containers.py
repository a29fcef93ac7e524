"""io names real podman containers: two containers of the image each read a 64 MiB
file of their own; io charges each container's id exactly 64 MiB, and names each
one's container, image and the pod the kubelet's runtimes annotate it with (as CRI-O
writes them into the bundle: podman's --annotation), from the runtime's files on the
node (containers.RuntimeFiles). --container keeps one of them by its name."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from children import build_c, patience, wait_until

from deploy.conftest import IMAGE, containers_conf, image_present
from meridian.containers import Containers
from meridian.tools.io.kernel import FileIO
from meridian.tools.io.metrics import snapshot_groups
from meridian.tools.io.options import Options

pytestmark = [pytest.mark.kernel, pytest.mark.deploy]

SIZE = 64 << 20
# Static: no loader reads a library's header. It reads once told to (SIGUSR1, with a
# handler: a PID namespace's init drops a signal it does not handle), so that the
# bytes between two snapshots of io's numbers are the file's alone, not also runc's
# own reads while it set the container up (about 20 KiB, charged to the container).
READER = r"""
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static char buf[1 << 20];
static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig; go = 1; }
int main(int argc, char **argv) {
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &old);
    signal(SIGUSR1, on_usr1);
    printf("ready\n");
    fflush(stdout);
    while (!go)
        sigsuspend(&old);
    int fd = open(argv[1], O_RDONLY);
    long total = 0;
    ssize_t n;
    while (fd >= 0 && (n = read(fd, buf, sizeof buf)) > 0)
        total += n;
    printf("read %ld\n", total);
    fflush(stdout);
    for (;;)
        pause(); /* its cgroup stays until the test has read io's numbers */
}
"""


@dataclass
class Reader:
    name: str
    id: str
    env: dict[str, str]

    def said(self) -> str:
        return subprocess.run(
            ["podman", "logs", self.name],
            capture_output=True, text=True, timeout=patience(30), env=self.env,
        ).stdout  # fmt: skip

    def read(self) -> None:
        """Tells it to read its file, and waits until it has."""
        subprocess.run(
            ["podman", "kill", "-s", "USR1", self.name],
            check=True, capture_output=True, timeout=patience(30), env=self.env,
        )  # fmt: skip
        wait_until(lambda: "read" in self.said(), patience(60), f"{self.name} read its file")
        assert self.said() == f"ready\nread {SIZE}\n"


@contextlib.contextmanager
def reader(tmp: Path, name: str, pod: str) -> Iterator[Reader]:
    """A container of the image that reads its own 64 MiB file when told to, annotated
    as the kubelet's runtimes annotate a pod's container. Removed whatever happens."""
    data = tmp / f"{name}.bin"
    with open(data, "wb") as f:
        f.write(os.urandom(1 << 20) * 64)
    env = {**os.environ, "CONTAINERS_CONF": str(containers_conf(tmp / f"{name}.conf", False))}
    annotations = {
        "io.kubernetes.pod.name": pod,
        "io.kubernetes.pod.namespace": "shop",
        "io.kubernetes.container.name": "reader",
    }
    try:
        cid = subprocess.run(
            [
                "podman", "run", "-d", "--name", name, "--network=none",
                *[f"--annotation={k}={v}" for k, v in annotations.items()],
                "-v", f"{tmp / 'reader'}:/reader:ro", "-v", f"{data}:/data:ro",
                "--entrypoint", "/reader", IMAGE, "/data",
            ],
            check=True, capture_output=True, text=True, timeout=patience(120), env=env,
        ).stdout.strip()  # fmt: skip
        started = Reader(name, cid, env)
        wait_until(lambda: "ready" in started.said(), patience(60), f"{name} started")
        yield started
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, env=env)
        data.unlink()  # 64 MiB: not left for pytest's kept temporary directories


def by_container(tool: FileIO) -> dict[str, tuple[int, dict[str, str | int | bool]]]:
    """Bytes read so far per container id, with the attributes of its series."""
    out: dict[str, tuple[int, dict[str, str | int | bool]]] = {}
    keys, vals = tool.stats()
    for attrs, summary in snapshot_groups(keys, vals, None, tool.containers.attrs):
        cid = str(attrs.get("container.id", ""))
        if cid:
            out[cid] = (out.get(cid, (0, {}))[0] + summary.total("read").bytes, attrs)
    return out


def test_two_containers_reads_are_charged_to_each_by_name(tmp_path: Path) -> None:
    image_present()
    build_c(tmp_path, "reader", READER, "-static", "-O2")
    prefix = f"meridian-test-{os.getpid()}"
    with (
        FileIO(Options()) as tool,
        reader(tmp_path, f"{prefix}-a", "web-a") as a,
        reader(tmp_path, f"{prefix}-b", "web-b") as b,
    ):
        before = by_container(tool)
        a.read()
        b.read()
        after = by_container(tool)
    read = {c.id: after[c.id][0] - before.get(c.id, (0, {}))[0] for c in (a, b)}
    assert read == {a.id: SIZE, b.id: SIZE}
    for c, pod in ((a, "web-a"), (b, "web-b")):
        want = {
            "container.id": c.id,
            "container.runtime": "podman",
            "container.name": c.name,
            "container.image.name": IMAGE,
            "k8s.pod.name": pod,
            "k8s.namespace.name": "shop",
            "k8s.container.name": "reader",
        }
        attrs = after[c.id][1]
        assert {k: attrs.get(k) for k in want} == want


def test_the_container_filter_keeps_one_container_by_its_name(tmp_path: Path) -> None:
    """--container NAME, resolved from podman's own files: io keeps that container's
    64 MiB and nothing of the other's."""
    image_present()
    build_c(tmp_path, "reader", READER, "-static", "-O2")
    prefix = f"meridian-test-{os.getpid()}"
    with (
        reader(tmp_path, f"{prefix}-a", "web-a") as a,
        reader(tmp_path, f"{prefix}-b", "web-b") as b,
    ):
        found = Containers().cgroup_of(container=a.name)
        with FileIO(Options(cgroup=(found.id, found.depth))) as tool:
            before = by_container(tool)
            a.read()
            b.read()
            after = by_container(tool)
    assert set(after) == {a.id}
    assert after[a.id][0] - before.get(a.id, (0, {}))[0] == SIZE
