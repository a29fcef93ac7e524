"""Which container, and which Kubernetes pod, a cgroup v2 directory belongs to: one
resolver for every tool.

The kernel gives a task's cgroup id (bpf_get_current_cgroup_id(): the inode number of
its cgroup v2 directory). `CgroupPaths` maps ids to directories by walking the cgroup2
mount, once and again only when an id it does not know appears. The container id and
the pod uid are in the directory names the runtimes and the kubelet choose, with the
systemd cgroup driver or cgroupfs:

    .../docker-<id>.scope              .../docker/<id>
    .../cri-containerd-<id>.scope      .../kubepods/burstable/pod<uid>/<id>
    .../crio-<id>.scope                .../kubepods-burstable-pod<uid_with_underscores>.slice/...
    .../libpod-<id>.scope              .../libpod_parent/libpod-<id>

(a runtime's monitor, `libpod-conmon-<id>.scope` or `crio-conmon-<id>.scope`, is not
the container). The id from the cgroup needs nothing.

Names, images and the pod come from the files the runtimes keep on the node
(`RuntimeFiles`), read once per container and never on an event's path: no API
socket, which can hang, nor its credentials, are needed. Each runtime's bundle
`config.json` carries the kubelet's annotations (CRI-O: `io.kubernetes.pod.name`, ...;
containerd: `io.kubernetes.cri.sandbox-name`, ...); containers/storage's list (podman,
CRI-O) has names and images; Docker's `config.v2.json` its name, image and labels.
Where none is readable (a container of a runtime not listed, a pod without the
mounts), the id alone shows, and nothing is said. Not read: podman's `--label`s (in
its database only).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from .cgroup import Cgroup, cgroup2_mounts
from .errors import UsageError

__all__ = [
    "CgroupPaths",
    "ContainerRef",
    "Containers",
    "RuntimeFiles",
    "container_of",
    "pid_cgroup",
]

_ID = r"([0-9a-f]{64})"
_SCOPE = re.compile(rf"^(docker|cri-containerd|crio|libpod)-{_ID}\.scope$")
_PLAIN = re.compile(rf"^(?:libpod-)?{_ID}$")  # cgroupfs: the id alone, or podman's libpod-<id>
_POD = re.compile(r"^(?:kubepods(?:-[a-z]+)*-)?pod([0-9a-f_-]{36})(?:\.slice)?$")
RUNTIME_OF_PREFIX = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o"}
RUNTIME_OF_PREFIX["libpod"] = "podman"


@dataclass(frozen=True)
class ContainerRef:
    """A container as its cgroup names it."""

    id: str  # 64 hex digits
    runtime: str  # docker, containerd, cri-o, podman; "" where the layout does not say
    pod_uid: str = ""  # the Kubernetes pod's uid, when the kubelet made the cgroup


def container_of(path: str) -> ContainerRef | None:
    """The container whose cgroup is `path` or above it (a process may sit in a
    sub-cgroup of its container), None for a host process."""
    parts = [p for p in path.split("/") if p]
    pod_uid = ""
    for part in parts:
        m = _POD.match(part)
        if m:
            pod_uid = m.group(1).replace("_", "-")
    for part in reversed(parts):
        m = _SCOPE.match(part)
        if m:
            return ContainerRef(m.group(2), RUNTIME_OF_PREFIX[m.group(1)], pod_uid)
        m = _PLAIN.match(part)
        if m:
            runtime = "podman" if part.startswith("libpod-") else ""
            runtime = runtime or ("docker" if "docker" in parts else "")
            return ContainerRef(m.group(1), runtime, pod_uid)
    return None


def pid_cgroup(pid: int, proc: str = "/proc") -> str | None:
    """A live process's cgroup v2 path (relative to the root, as /proc shows it)."""
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


class CgroupPaths:
    """cgroup ids to paths below the cgroup2 mount `root`, walked again only when an id
    it does not know is asked for (a walk is a few ms on a node with hundreds of
    containers). An id still unknown after a walk (its cgroup was removed) is
    remembered, so it costs one walk, not one per lookup."""

    def __init__(self, root: str = "/sys/fs/cgroup") -> None:
        self.root = root
        self.paths: dict[int, str] = {}
        self.gone: set[int] = set()
        self.walks = 0

    def _walk(self) -> None:
        self.walks += 1
        paths: dict[int, str] = {}
        for top, dirs, _ in os.walk(self.root):
            for d in dirs:
                full = os.path.join(top, d)
                try:
                    paths[os.stat(full).st_ino] = "/" + os.path.relpath(full, self.root)
                except OSError:
                    continue  # removed during the walk
        with contextlib.suppress(OSError):
            paths[os.stat(self.root).st_ino] = "/"
        self.paths = paths

    def path(self, cgroup_id: int) -> str | None:
        """The cgroup's path as /proc/PID/cgroup shows it, None once it is gone."""
        if cgroup_id not in self.paths and cgroup_id not in self.gone:
            self._walk()
            if cgroup_id not in self.paths:
                self.gone.add(cgroup_id)
        return self.paths.get(cgroup_id)


# Annotations (and Docker labels) the kubelet's runtimes set, as OpenTelemetry names
# them.
ANNOTATIONS = {
    "io.kubernetes.pod.name": "k8s.pod.name",  # CRI-O; Docker's labels (cri-dockerd)
    "io.kubernetes.pod.namespace": "k8s.namespace.name",
    "io.kubernetes.container.name": "k8s.container.name",
    "io.kubernetes.cri-o.ImageName": "container.image.name",
    "io.kubernetes.cri.sandbox-name": "k8s.pod.name",  # containerd's CRI plugin
    "io.kubernetes.cri.sandbox-namespace": "k8s.namespace.name",
    "io.kubernetes.cri.container-name": "k8s.container.name",
    "io.kubernetes.cri.image-name": "container.image.name",
}
MAX_FILE = 16 << 20  # a state file past this is not read (a list of every container)


def _json(path: str) -> Any:
    """A JSON file's value, None when it is missing, too big or not JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE + 1)
        return None if len(data) > MAX_FILE else json.loads(data)
    except (OSError, ValueError):
        return None


def _texts(d: Any) -> dict[str, str]:
    return {k: v for k, v in d.items() if isinstance(v, str) and v} if isinstance(d, dict) else {}


class RuntimeFiles:
    """A container's name, image and Kubernetes pod from its runtime's files below
    `root` (the node's /; in a pod, where its hostPath volumes put them: --host-root):

        /var/lib/containers/storage/<driver>-containers/containers.json  podman, CRI-O
        .../<driver>-containers/<id>/userdata/config.json (graph or run root)
        /run/containerd/io.containerd.runtime.v2.task/<namespace>/<id>/config.json
        /var/lib/docker/containers/<id>/config.v2.json

    containers/storage's list of every container is parsed again only when it changed."""

    STORAGE = ("var/lib/containers/storage", "run/containers/storage")
    CONTAINERD = "run/containerd/io.containerd.runtime.v2.task"
    DOCKER = "var/lib/docker/containers"

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self._lists: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def found(self) -> dict[str, list[str]]:
        """Each runtime's state directories that are here (where names can come from),
        for `meridian doctor`: none for a runtime means ids without names."""
        storage = [d for top in self.STORAGE for d in glob.glob(self._path(top, "*-containers"))]
        return {
            "podman, CRI-O": sorted(d for d in storage if os.path.isdir(d)),
            "containerd": [d for d in [self._path(self.CONTAINERD)] if os.path.isdir(d)],
            "docker": [d for d in [self._path(self.DOCKER)] if os.path.isdir(d)],
        }

    def attrs(self, container_id: str) -> dict[str, str]:
        """OpenTelemetry attributes of the container (name, image, pod, namespace,
        container in the pod) as far as its runtime's files tell; {} where none do."""
        out: dict[str, str] = {}
        entry = self._stored(container_id)
        names = entry.get("names")
        if isinstance(names, list) and names and isinstance(names[0], str):
            out["container.name"] = names[0]
        meta = _texts(_json_text(entry.get("metadata")))
        if meta.get("image-name"):
            out["container.image.name"] = meta["image-name"]
        for bundle in self._annotations(container_id):
            out.update({ANNOTATIONS[k]: v for k, v in bundle.items() if k in ANNOTATIONS})
        docker = _json(self._path(self.DOCKER, container_id, "config.v2.json"))
        if isinstance(docker, dict):
            name = docker.get("Name")
            if isinstance(name, str) and name.strip("/"):
                out["container.name"] = name.strip("/")
            config = docker.get("Config")
            config = config if isinstance(config, dict) else {}
            if isinstance(config.get("Image"), str) and config["Image"]:
                out["container.image.name"] = config["Image"]
            labels = _texts(config.get("Labels"))
            out.update({ANNOTATIONS[k]: v for k, v in labels.items() if k in ANNOTATIONS})
        return out

    def _annotations(self, container_id: str) -> list[dict[str, str]]:
        """The annotations of each OCI bundle config.json the container has."""
        paths = [
            path
            for top in self.STORAGE
            for path in glob.glob(
                self._path(top, "*-containers", container_id, "userdata", "config.json")
            )
        ]
        paths += glob.glob(self._path(self.CONTAINERD, "*", container_id, "config.json"))
        bundles = [_json(p) for p in paths]
        return [_texts(b.get("annotations")) for b in bundles if isinstance(b, dict)]

    def _stored(self, container_id: str) -> dict[str, Any]:
        """The container's entry in containers/storage's lists, {} if in none."""
        for top in self.STORAGE:
            for path in glob.glob(self._path(top, "*-containers", "*containers.json")):
                found = self._list(path).get(container_id)
                if found is not None:
                    return dict(found)
        return {}

    def _list(self, path: str) -> dict[str, Any]:
        try:
            st = os.stat(path)
        except OSError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._lists.get(path)
        if cached is None or cached[0] != stamp:
            entries = _json(path)
            by_id = {
                e["id"]: e
                for e in (entries if isinstance(entries, list) else [])
                if isinstance(e, dict) and isinstance(e.get("id"), str)
            }
            cached = self._lists[path] = (stamp, by_id)
        return cached[1]


def _json_text(text: Any) -> Any:
    """JSON inside a string (containers/storage's metadata), None when it is not."""
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


class Containers:
    """cgroup ids to the container attributes of the OpenTelemetry conventions, cached
    per id: what a tool's summaries and series add beside a process. From the cgroup,
    `container.id`, `container.runtime` and `k8s.pod.uid`; from the runtime's files
    (RuntimeFiles), `container.name`, `container.image.name`, `k8s.pod.name`,
    `k8s.namespace.name`, `k8s.container.name`. An id whose cgroup is already gone, or
    is no container's, has none."""

    CACHE_MAX = 65536

    def __init__(self, root: str | None = None, files: RuntimeFiles | None = None) -> None:
        self.paths = CgroupPaths(root or next(iter(cgroup2_mounts()), "/sys/fs/cgroup"))
        self.files = files or RuntimeFiles()
        self.cache: dict[int, dict[str, str]] = {}

    @classmethod
    def on_host(cls, host_root: str = "/", proc: str = "/proc") -> Containers:
        """The node's containers where its root file system is mounted at `host_root`
        (a pod's hostPath volumes; "/" on the node itself): its cgroup2 tree where the
        host's init mounts it (its mountinfo: the pod shares the host's PIDs), and the
        runtimes' files, below `host_root`."""
        if os.path.realpath(host_root) == "/":
            return cls()
        mount = next(iter(cgroup2_mounts(f"{proc}/1/mountinfo")), "/sys/fs/cgroup")
        return cls(os.path.join(host_root, mount.lstrip("/")), RuntimeFiles(host_root))

    def attrs(self, cgroup_id: int) -> dict[str, str]:
        if not cgroup_id:
            return {}
        got = self.cache.get(cgroup_id)
        if got is None:
            if len(self.cache) >= self.CACHE_MAX:
                self.cache.clear()
            path = self.paths.path(cgroup_id)
            ref = container_of(path) if path else None
            got = {} if ref is None else {"container.id": ref.id}
            if ref and ref.runtime:
                got["container.runtime"] = ref.runtime
            if ref and ref.pod_uid:
                got["k8s.pod.uid"] = ref.pod_uid
            if ref:
                got.update(self.files.attrs(ref.id))
            self.cache[cgroup_id] = got
        return got

    def cgroup_of(self, container: str | None = None, pod: str | None = None) -> Cgroup:
        """The cgroup that --container or --pod names, for a tool's kernel filter (that
        cgroup and those below it). A container by its name or a unique prefix of its id;
        a pod by its uid, its name or NAMESPACE/NAME. Only those running now: the filter
        is the cgroup's id, which a container started later does not have."""
        flag, wanted = ("--container", container) if container else ("--pod", pod or "")
        found, pods = _cgroup_dirs(self.paths.root)
        if container:
            dirs = {
                top
                for cid, (top, _) in found.items()
                if cid.startswith(container.lower())
                or self.files.attrs(cid).get("container.name") == container
            }
        else:
            uids = {wanted.lower().replace("_", "-")} & set(pods)
            uids |= {
                ref.pod_uid
                for cid, (_, ref) in found.items()
                if ref.pod_uid and _pod_named(self.files.attrs(cid), wanted)
            }
            dirs = {pods[u] for u in uids if u in pods}
        if len(dirs) != 1:
            what = "matches no running one" if not dirs else f"matches {len(dirs)}"
            more = "give more of its id" if container else "give NAMESPACE/NAME or its uid"
            fix = more if dirs else "see podman ps, crictl pods or docker ps"
            raise UsageError(
                f"{flag} {wanted!r} {what} under {self.paths.root} ({fix}; "
                "or name its cgroup with --cgroup)"
            )
        (top,) = dirs
        rel = os.path.relpath(top, self.paths.root)
        return Cgroup(os.stat(top).st_ino, len(rel.split("/")), top)


def _pod_named(attrs: dict[str, str], wanted: str) -> bool:
    """Whether a container's attributes name the pod `wanted` (NAME or NAMESPACE/NAME)."""
    namespace, _, name = wanted.rpartition("/")
    if attrs.get("k8s.pod.name") != name:
        return False
    return not namespace or attrs.get("k8s.namespace.name") == namespace


def _cgroup_dirs(root: str) -> tuple[dict[str, tuple[str, ContainerRef]], dict[str, str]]:
    """One walk below `root`: each container's cgroup directory (the highest that names
    it), by id, and each Kubernetes pod's, by uid."""
    containers: dict[str, tuple[str, ContainerRef]] = {}
    pods: dict[str, str] = {}
    for top, _, _ in os.walk(root):
        name = os.path.basename(top)
        ref = container_of("/" + os.path.relpath(top, root))
        if ref is not None and ref.id in name:
            containers.setdefault(ref.id, (top, ref))
        m = _POD.match(name)
        if m:
            pods.setdefault(m.group(1).replace("_", "-"), top)
    return containers, pods
