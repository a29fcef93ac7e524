"""--container and --pod name the cgroup a tool's kernel filter keeps (that cgroup and
those below it): a container by its name or a unique prefix of its id, a pod by its
uid, its name or NAMESPACE/NAME, on a cgroup tree laid out as the runtimes and the
kubelet lay it out, with names from the runtimes' files. Anything else is one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from meridian.cgroup import cgroup2_mounts
from meridian.containers import Containers, RuntimeFiles
from meridian.errors import UsageError

WEB = "ab" + "1" * 62
WEB2 = "ab" + "2" * 62
DB = "cd" + "3" * 62
UID = "0f4d4a2c-6a5b-4b8e-9c1d-2e3f4a5b6c7d"
UID2 = "9e8d7c6b-5a49-4838-2716-051f2e3d4c5b"
POD_SLICE = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice"


def pod_dir(uid: str) -> str:
    return POD_SLICE.format(uid.replace("-", "_"))


def annotate(files: Path, cid: str, pod: str, namespace: str) -> None:
    bundle = files / "run/containers/storage/overlay-containers" / cid / "userdata"
    bundle.mkdir(parents=True)
    names = {"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": namespace}
    (bundle / "config.json").write_text(json.dumps({"annotations": names}))


@pytest.fixture
def node(tmp_path: Path) -> Containers:
    """A node's cgroups: a podman container named 'web' (with its monitor and a
    sub-cgroup), another whose id starts alike, and two pods of CRI-O, 'shop/web-0'
    and 'test/web-0', one container each."""
    # where the node's init mounts cgroup2, below a root as --host-root names it
    mount = next(iter(cgroup2_mounts("/proc/1/mountinfo")), "/sys/fs/cgroup")
    root, files = tmp_path / mount.lstrip("/"), tmp_path
    for rel in (
        f"machine.slice/libpod-{WEB}.scope/container",
        f"machine.slice/libpod-conmon-{WEB}.scope",
        f"machine.slice/libpod-{WEB2}.scope",
        f"{pod_dir(UID)}/crio-{DB}.scope",
        f"{pod_dir(UID2)}/crio-{'e' * 64}.scope",
        "system.slice/sshd.service",
    ):
        (root / rel).mkdir(parents=True)
    storage = files / "var/lib/containers/storage/overlay-containers"
    storage.mkdir(parents=True)
    entries = [{"id": WEB, "names": ["web"]}, {"id": WEB2, "names": ["cache"]}]
    (storage / "containers.json").write_text(json.dumps(entries))
    annotate(files, DB, "web-0", "shop")
    annotate(files, "e" * 64, "web-0", "test")
    return Containers(str(root), RuntimeFiles(str(files)))


def id_and_depth(node: Containers, rel: str) -> tuple[int, int]:
    """What the kernel filter compares: the directory's inode and its depth."""
    path = os.path.join(node.paths.root, rel)
    return os.stat(path).st_ino, len(rel.split("/"))


@pytest.mark.parametrize("name", ["web", WEB, WEB[:3], "AB1"])
def test_a_container_by_name_or_id_prefix_is_its_scope(node: Containers, name: str) -> None:
    found = node.cgroup_of(container=name)
    rel = f"machine.slice/libpod-{WEB}.scope"  # not its monitor's, not its sub-cgroup
    assert found.path == os.path.join(node.paths.root, rel)
    assert (found.id, found.depth) == id_and_depth(node, rel)


@pytest.mark.parametrize("name", [UID, UID.replace("-", "_"), "shop/web-0"])
def test_a_pod_by_uid_or_name_is_its_slice(node: Containers, name: str) -> None:
    found = node.cgroup_of(pod=name)
    assert (found.id, found.depth) == id_and_depth(node, pod_dir(UID))


def test_a_pod_name_in_two_namespaces_needs_its_namespace(node: Containers) -> None:
    with pytest.raises(UsageError, match=r"matches 2 .*give NAMESPACE/NAME or its uid"):
        node.cgroup_of(pod="web-0")
    assert node.cgroup_of(pod="test/web-0").path.endswith(pod_dir(UID2))


@pytest.mark.parametrize(
    ("kind", "name", "message"),
    [
        ("container", "ab", r"--container 'ab' matches 2 under .*give more of its id"),
        ("container", "nginx", r"--container 'nginx' matches no running one under .*crictl"),
        ("container", "sshd.service", "matches no running one"),
        ("pod", "shop/db-0", "--pod 'shop/db-0' matches no running one"),
        ("pod", "other/web-0", "matches no running one"),
    ],
)
def test_no_match_or_many_is_one_line(node: Containers, kind: str, name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as err:
        node.cgroup_of(**{kind: name})
    assert "\n" not in str(err.value) and "--cgroup" in str(err.value)


def test_io_filters_the_named_container_under_host_root(node: Containers) -> None:
    from meridian.cli import build_parser
    from meridian.tools.io.cli import options_from_args

    host_root = str(node.files.root)
    args = build_parser().parse_args(["io", "--pod", "shop/web-0", "--host-root", host_root])
    assert options_from_args(args).cgroup == id_and_depth(node, pod_dir(UID))
    args = build_parser().parse_args(["io", "--container", "web", "--host-root", host_root])
    rel = f"machine.slice/libpod-{WEB}.scope"
    assert options_from_args(args).cgroup == id_and_depth(node, rel)


@pytest.mark.parametrize("tool", ["io", "syscalls"])
def test_one_filter_of_the_three(tool: str) -> None:
    from meridian.cli import build_parser

    for two in (["--container", "web", "--pod", "web-0"], ["--cgroup", "/", "--pod", "x"]):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([tool, *two])
        assert exit_.value.code == 2


def test_syscalls_filters_a_container_of_this_host() -> None:
    """syscalls has no --host-root: the container is looked for in this host's cgroups,
    and an unknown one is the same line as io's."""
    from meridian.cli import build_parser
    from meridian.tools.syscalls.cli import options_from_args

    args = build_parser().parse_args(["syscalls", "--container", "no-such-container-here"])
    with pytest.raises(UsageError, match=r"--container 'no-such-container-here' matches no"):
        options_from_args(args)
