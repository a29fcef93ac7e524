"""A container's name, image and Kubernetes pod from its runtime's files on the node
(containers.RuntimeFiles), as podman, CRI-O, containerd and Docker write them, and what
is left when they are missing or garbage. tests/deploy/test_containers.py reads a real
podman container's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from meridian import containers
from meridian.containers import Containers, RuntimeFiles

ID = "83c7cca40840566c12bd41412d2e48efd6ca27d14cd1d3a148bb453c11e5d33a"
OTHER = "1" * 64
UID = "0f4d4a2c-6a5b-4b8e-9c1d-2e3f4a5b6c7d"
POD = {
    "io.kubernetes.pod.name": "web-7d4b9",
    "io.kubernetes.pod.namespace": "shop",
    "io.kubernetes.container.name": "nginx",
}
IN_POD = {"k8s.pod.name": "web-7d4b9", "k8s.namespace.name": "shop", "k8s.container.name": "nginx"}


def write(root: Path, rel: str, value: Any) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def storage_entry(cid: str, name: str, image: str) -> dict[str, Any]:
    meta = {"image-name": image, "image-id": "ab" * 32, "name": name, "created-at": 1}
    return {"id": cid, "names": [name], "image": "ab" * 32, "metadata": json.dumps(meta)}


def test_podman_name_and_image_from_the_storage_list(tmp_path: Path) -> None:
    write(
        tmp_path,
        "var/lib/containers/storage/overlay-containers/containers.json",
        [storage_entry(OTHER, "other", "x"), storage_entry(ID, "reader", "localhost/app:1")],
    )
    write(
        tmp_path,
        f"var/lib/containers/storage/overlay-containers/{ID}/userdata/config.json",
        {"annotations": {"io.container.manager": "libpod", **POD}},
    )
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {
        "container.name": "reader",
        "container.image.name": "localhost/app:1",
        **IN_POD,
    }


def test_cri_o_pod_from_the_bundle_in_its_run_root(tmp_path: Path) -> None:
    write(
        tmp_path,
        f"run/containers/storage/overlay-containers/{ID}/userdata/config.json",
        {"annotations": {**POD, "io.kubernetes.cri-o.ImageName": "docker.io/nginx:1.27"}},
    )
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {
        "container.image.name": "docker.io/nginx:1.27",
        **IN_POD,
    }


def test_containerd_pod_from_its_task_bundle(tmp_path: Path) -> None:
    cri = {
        "io.kubernetes.cri.sandbox-name": "web-7d4b9",
        "io.kubernetes.cri.sandbox-namespace": "shop",
        "io.kubernetes.cri.container-name": "nginx",
        "io.kubernetes.cri.image-name": "docker.io/nginx:1.27",
        "io.kubernetes.cri.container-type": "container",
    }
    write(
        tmp_path,
        f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json",
        {"annotations": cri},
    )
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {
        "container.image.name": "docker.io/nginx:1.27",
        **IN_POD,
    }


def test_docker_name_image_and_labels(tmp_path: Path) -> None:
    config = {"Name": "/Xweb", "Config": {"Image": "nginx:1.27", "Labels": {**POD, "x": 1}}}
    write(tmp_path, f"var/lib/docker/containers/{ID}/config.v2.json", config)
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {
        "container.name": "Xweb",
        "container.image.name": "nginx:1.27",
        **IN_POD,
    }


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("var/lib/containers/storage/overlay-containers/containers.json", "not json"),
        ("var/lib/containers/storage/overlay-containers/containers.json", '{"id": "x"}'),
        (
            "var/lib/containers/storage/overlay-containers/containers.json",
            json.dumps([{"id": ID, "names": "reader", "metadata": "{not json"}, 7]),
        ),
        (f"var/lib/containers/storage/overlay-containers/{ID}/userdata/config.json", "[1, 2]"),
        (
            f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json",
            '{"annotations": {"io.kubernetes.cri.sandbox-name": 5}}',
        ),
        (f"var/lib/docker/containers/{ID}/config.v2.json", '{"Name": 1, "Config": []}'),
        (f"var/lib/docker/containers/{ID}/config.v2.json", '{"Name": "/", "Config": {}}'),
    ],
)
def test_garbage_leaves_no_name_and_no_error(tmp_path: Path, rel: str, text: str) -> None:
    write(tmp_path, rel, text)
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {}


def test_no_runtime_files_no_names(tmp_path: Path) -> None:
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {}


def test_a_file_past_the_size_bound_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"Name": "/web", "Config": {}}
    path = write(tmp_path, f"var/lib/docker/containers/{ID}/config.v2.json", config)
    monkeypatch.setattr(containers, "MAX_FILE", path.stat().st_size)
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {"container.name": "web"}
    monkeypatch.setattr(containers, "MAX_FILE", path.stat().st_size - 1)
    assert RuntimeFiles(str(tmp_path)).attrs(ID) == {}


def test_the_storage_list_is_parsed_again_only_when_it_changed(tmp_path: Path) -> None:
    rel = "var/lib/containers/storage/overlay-containers/containers.json"
    path = write(tmp_path, rel, [storage_entry(ID, "aaaa", "i")])
    files = RuntimeFiles(str(tmp_path))
    assert files.attrs(ID)["container.name"] == "aaaa"
    stamp = path.stat().st_mtime_ns
    write(tmp_path, rel, [storage_entry(ID, "bbbb", "i")])  # same size, same time: kept
    os.utime(path, ns=(stamp, stamp))
    assert files.attrs(ID)["container.name"] == "aaaa"
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert files.attrs(ID)["container.name"] == "bbbb"


def test_containers_adds_the_names_to_what_the_cgroup_says(tmp_path: Path) -> None:
    """Once per id: the names stay what they were when the id was first asked."""
    cgroups = tmp_path / "cgroup"
    scope = cgroups / f"machine.slice/libpod-{ID}.scope"
    pod = cgroups / f"kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{OTHER}.scope"
    for d in (scope, pod, cgroups / "system.slice"):
        d.mkdir(parents=True)
    node = tmp_path / "node"
    listed = write(
        node,
        "var/lib/containers/storage/overlay-containers/containers.json",
        [storage_entry(ID, "reader", "localhost/app:1")],
    )
    found = Containers(str(cgroups), RuntimeFiles(str(node)))
    want = {
        "container.id": ID,
        "container.runtime": "podman",
        "container.name": "reader",
        "container.image.name": "localhost/app:1",
    }
    assert found.attrs(scope.stat().st_ino) == want
    listed.unlink()
    assert found.attrs(scope.stat().st_ino) == want
    assert found.attrs(pod.stat().st_ino) == {
        "container.id": OTHER,
        "container.runtime": "cri-o",
        "k8s.pod.uid": UID,
    }
    assert found.attrs((cgroups / "system.slice").stat().st_ino) == {}
    assert found.attrs(scope.stat().st_ino + 10**9) == {}  # gone, or never was
    assert found.attrs(0) == {}


def test_on_a_host_root_the_hosts_cgroups_and_files(tmp_path: Path) -> None:
    """In a pod: the node's / at /host, its cgroup2 tree where the host's init mounts it
    (a hybrid host: /sys/fs/cgroup/unified), the runtimes' files below /host."""
    host = tmp_path / "host"
    scope = host / f"sys/fs/cgroup/unified/machine.slice/libpod-{ID}.scope"
    scope.mkdir(parents=True)
    write(
        host,
        "var/lib/containers/storage/overlay-containers/containers.json",
        [storage_entry(ID, "reader", "localhost/app:1")],
    )
    write(
        tmp_path,
        "proc/1/mountinfo",
        "25 1 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs ro\n"
        "26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    found = Containers.on_host(str(host), proc=str(tmp_path / "proc"))
    assert found.attrs(scope.stat().st_ino) == {
        "container.id": ID,
        "container.runtime": "podman",
        "container.name": "reader",
        "container.image.name": "localhost/app:1",
    }
    here = Containers.on_host("/")
    assert here.files.root == "/" and here.paths.root != found.paths.root


def test_doctor_says_which_runtimes_files_name_containers(tmp_path: Path) -> None:
    """RuntimeFiles.found(): each runtime's state directories that are here; doctor's
    line names them, or says ids only, or no ids without cgroup2."""
    from meridian.tools.doctor import _containers_line

    files = RuntimeFiles(str(tmp_path))
    assert files.found() == {"podman, CRI-O": [], "containerd": [], "docker": []}
    none = {"cgroup2": "/sys/fs/cgroup", "runtime_files": files.found()}
    assert _containers_line(none).endswith(
        "cgroup2 at /sys/fs/cgroup; no runtime's files: ids only"
    )
    (tmp_path / "var/lib/containers/storage/overlay-containers").mkdir(parents=True)
    (tmp_path / "var/lib/containers/storage/overlay-images").mkdir()
    (tmp_path / "var/lib/docker/containers").mkdir(parents=True)
    (tmp_path / "run/containerd").mkdir(parents=True)  # no task directory: no containers
    found = files.found()
    assert found == {
        "podman, CRI-O": [str(tmp_path / "var/lib/containers/storage/overlay-containers")],
        "containerd": [],
        "docker": [str(tmp_path / "var/lib/docker/containers")],
    }
    line = _containers_line({"cgroup2": "/sys/fs/cgroup", "runtime_files": found})
    assert line.startswith("containers  yes  ids from cgroup2 at /sys/fs/cgroup; names from ")
    assert "podman, CRI-O (" in line and "docker (" in line and "containerd" not in line
    assert "no cgroup2 mounted" in _containers_line({"cgroup2": None, "runtime_files": found})
