"""The container and pod a cgroup names (containers.py), for each runtime's layout under
the systemd and cgroupfs drivers, and cgroup ids resolved to paths by walking a
cgroup2 tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meridian.containers import CgroupPaths, ContainerRef, container_of, pid_cgroup

ID = "83c7cca40840566c12bd41412d2e48efd6ca27d14cd1d3a148bb453c11e5d33a"
UID = "0f4d4a2c-6a5b-4b8e-9c1d-2e3f4a5b6c7d"


@pytest.mark.parametrize(
    ("path", "want"),
    [
        (f"/system.slice/docker-{ID}.scope", ContainerRef(ID, "docker")),
        (f"/docker/{ID}", ContainerRef(ID, "docker")),
        (f"/machine.slice/libpod-{ID}.scope", ContainerRef(ID, "podman")),
        (f"/machine.slice/libpod-{ID}.scope/container", ContainerRef(ID, "podman")),
        (f"/libpod_parent/libpod-{ID}", ContainerRef(ID, "podman")),  # podman, cgroupfs
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{UID.replace('-', '_')}.slice/cri-containerd-{ID}.scope",
            ContainerRef(ID, "containerd", UID),
        ),
        (
            f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{ID}.scope",
            ContainerRef(ID, "cri-o", UID),
        ),
        (f"/kubepods/besteffort/pod{UID}/{ID}", ContainerRef(ID, "", UID)),  # cgroupfs kubelet
    ],
)
def test_each_runtimes_layout_names_the_container_and_pod(path: str, want: ContainerRef) -> None:
    assert container_of(path) == want


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/user.slice/user-0.slice/session-3.scope",
        "/system.slice/sshd.service",
        f"/machine.slice/libpod-conmon-{ID}.scope",  # podman's monitor, not the container
        f"/system.slice/crio-conmon-{ID}.scope",
        f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice",  # the pod, no container
        f"/docker-{ID[:12]}.scope",  # a short id is not one
    ],
)
def test_host_processes_and_runtime_monitors_are_in_no_container(path: str) -> None:
    assert container_of(path) is None


def test_this_process_is_named_by_its_cgroup() -> None:
    path = pid_cgroup(os.getpid())
    assert path is not None and path.startswith("/")
    assert pid_cgroup(2**22 + 1) is None  # above any pid_max: no such process


def test_cgroup_ids_are_the_directories_inodes_walked_once_per_unknown_id(tmp_path: Path) -> None:
    """A cgroup id is its directory's inode number; an id that appears after the first
    walk costs one more walk, and an id that is gone costs one walk, not one a lookup."""
    (tmp_path / "system.slice").mkdir()
    paths = CgroupPaths(str(tmp_path))
    root, system = tmp_path.stat().st_ino, (tmp_path / "system.slice").stat().st_ino
    assert paths.path(system) == "/system.slice" and paths.path(root) == "/"
    assert paths.walks == 1
    scope = tmp_path / "machine.slice" / f"libpod-{ID}.scope"
    scope.mkdir(parents=True)
    assert paths.path(scope.stat().st_ino) == f"/machine.slice/libpod-{ID}.scope"
    assert paths.walks == 2
    gone = scope.stat().st_ino + 10**9
    assert paths.path(gone) is None and paths.path(gone) is None
    assert paths.walks == 3
    assert paths.path(system) == "/system.slice" and paths.walks == 3
