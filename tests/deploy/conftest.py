"""The rollout of deploy/kubernetes on this machine (make deploy-test): each DaemonSet's
pod template, as `kubectl kustomize` renders it, run as a pod by `podman kube play`,
with the image `make image` built, and sentinel storing to Debian's clickhouse-server
as the user deploy/clickhouse/ makes.

Only what a real cluster has differently is changed, in a test overlay: the ClickHouse
URL of the sentinel ConfigMap points at this test's server (as an operator's with an
external server does), and the component of this node's runtime (podman's
containers/storage) is added, as the README tells an operator to. The pod templates
are taken as written: capabilities, host namespaces, mounts, probes, resources and
the seccomp profile, which is installed where a kubelet looks for it (a seccomp root
holding meridian/meridian.json). What podman 4.3 (Debian 12) does not read from a pod
spec is given to it the way it reads it, and `podman inspect` checks the outcome
(test_deploy_pods.py):

- the pod's seccompProfile: podman reads only the annotation
  seccomp.security.alpha.kubernetes.io/pod, and only a profile directly in its
  --seccomp-profile-root, so the root is the kubelet root's profile directory;
- hostPID: kube play ignores it, so the pod gets `pidns = "host"` in its
  containers.conf (CONTAINERS_CONF);
- ConfigMap and Secret volumes: kube play panics on a secret volume (a nil secrets
  manager) and mounts a ConfigMap as a directory even with subPath, so both are
  projected as the kubelet projects them, one file per key (the Secret's with its
  defaultMode) in a directory of this test, and mounted from there (a subPath mount
  as that one file);
- container ports: podman publishes each on the host's same port (a kubelet publishes
  only a hostPort, which no manifest has) and refuses them on the host's network, so
  they are left out: a pod answers on its own address, as in a cluster;
- probes: kube play makes a healthcheck of the liveness probe (a named port becomes
  port 0, and with no systemd nothing runs it) and ignores the readiness probe: the
  fixture waits for each pod's readiness probe port itself.

podman runs with runc and explicit ulimits from a containers.conf of the test's own
(deploy/image/README.md says why), on a podman network of the test's own, whose
subnet stays on this machine. The Secret is made from a password file by the command
deploy/clickhouse/README.md gives (kubectl create secret ... --from-file), rendered
client-side."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from clickhouse_server import ClickHouseServer, running_server

from meridian import __version__

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
CLICKHOUSE = ROOT / "deploy" / "clickhouse"
IMAGE = f"localhost/meridian:{__version__}"
NAMESPACE = "meridian"
JOB_LABEL = "meridian/job"
SUBNET = "10.236.0.0/24"  # the pods' network: a bridge on this machine only
SECCOMP_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
READY_WITHIN = 60.0  # seconds from `podman kube play` to every readiness port answering


def run(*argv: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """A command's stdout; its stderr in the error when it fails."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-3000:]}")
    return p.stdout


def rendered(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders from a kustomization directory."""
    return [d for d in yaml.safe_load_all(run("kubectl", "kustomize", str(directory))) if d]


def containers_conf(path: Path, host_pid: bool) -> Path:
    """podman's configuration for one pod: runc (crun refuses this VM's hybrid cgroups),
    ulimits a root without CAP_SYS_RESOURCE may set, and the host's PID namespace for
    a hostPID pod (kube play ignores hostPID)."""
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    lines = [
        "[containers]",
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]',
    ]
    if host_pid:
        lines.append('pidns = "host"')
    lines += ["[engine]", 'runtime = "runc"']
    path.write_text("\n".join(lines) + "\n")
    return path


def project(directory: Path, files: dict[str, bytes], mode: int) -> Path:
    """A ConfigMap's or Secret's keys as the kubelet projects them: one file each."""
    directory.mkdir(parents=True)
    for key, data in files.items():
        (directory / key).write_bytes(data)
        (directory / key).chmod(mode)
    return directory


@dataclass
class PodRun:
    """One DaemonSet's pod, as podman runs it."""

    daemonset: str
    template: dict[str, Any]  # the rendered pod template, as written
    spec: dict[str, Any]  # the Pod given to podman kube play
    file: Path
    conf: Path
    profile_root: Path
    network: str | None  # None: the host's (hostNetwork)
    address: str = ""  # where its ports answer from the host
    ready_after: float = 0.0  # seconds from kube play to its readiness port answering

    @property
    def name(self) -> str:
        return str(self.spec["metadata"]["name"])

    def container(self, index: int = 0) -> str:
        """podman's name of a container of the pod: POD-CONTAINER."""
        return f"{self.name}-{self.spec['spec']['containers'][index]['name']}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def play(self) -> None:
        argv = ["podman", "kube", "play", "--seccomp-profile-root", str(self.profile_root)]
        # hostNetwork as well: without --network, kube play makes and leaves behind its
        # default network even for a pod on the host's
        argv += ["--network", self.network or "host"]
        run(*argv, str(self.file), env=self.env, timeout=180)

    def down(self) -> None:
        subprocess.run(["podman", "pod", "rm", "-f", "-t", "5", self.name],
                       capture_output=True, timeout=120)  # fmt: skip

    def logs(self) -> str:
        p = subprocess.run(["podman", "logs", self.container()], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
        return p.stdout + p.stderr

    def inspect(self) -> dict[str, Any]:
        (got,) = json.loads(run("podman", "inspect", self.container()))
        return dict(got)

    def readiness_port(self) -> int:
        """The port of the container's readiness probe (tcpSocket), a name resolved
        against the container's ports as the kubelet does."""
        c = self.template["spec"]["containers"][0]
        port = c["readinessProbe"]["tcpSocket"]["port"]
        if isinstance(port, int):
            return port
        (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
        return int(number)


def pod_of(
    ds: dict[str, Any], work: Path, objects: list[dict[str, Any]], secrets: dict[str, Any]
) -> PodRun:
    """The DaemonSet's pod template as a Pod podman kube play runs (the module's
    docstring lists what is given to podman another way, and why)."""
    template = ds["spec"]["template"]
    name = ds["metadata"]["name"]
    spec = copy.deepcopy(template["spec"])
    spec["restartPolicy"] = "Always"  # a DaemonSet's pods always restart
    annotations = dict(template["metadata"].get("annotations", {}))
    profile = spec.get("securityContext", {}).get("seccompProfile", {"type": "RuntimeDefault"})
    seccomp_root = work / "kubelet-seccomp"  # the kubelet's /var/lib/kubelet/seccomp
    profile_root = seccomp_root
    if profile["type"] == "Localhost":
        local = Path(profile["localhostProfile"])
        profile_root = seccomp_root / local.parent
        annotations[SECCOMP_ANNOTATION] = f"localhost/{local.name}"
    elif profile["type"] == "RuntimeDefault":
        annotations[SECCOMP_ANNOTATION] = "runtime/default"
    else:
        raise AssertionError(f"{name}: seccomp profile {profile}")
    pod_dir = work / name
    pod_dir.mkdir()
    config_maps = {
        o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"
    }  # fmt: skip
    projected: dict[str, Path] = {}
    for v in spec.get("volumes", []):
        if "configMap" in v:
            cm = config_maps[v["configMap"]["name"]]
            files = {k: str(d).encode() for k, d in cm["data"].items()}
            mode = v["configMap"].get("defaultMode", 0o644)
            source = v.pop("configMap")
        elif "secret" in v:
            secret = secrets[v["secret"]["secretName"]]
            files = {k: base64.b64decode(d) for k, d in secret["data"].items()}
            mode = v["secret"].get("defaultMode", 0o644)
            source = v.pop("secret")
        else:
            continue
        assert "items" not in source, f"{name}: volume {v['name']}: items are not projected here"
        projected[v["name"]] = project(pod_dir / v["name"], files, mode)
        v["hostPath"] = {"path": str(projected[v["name"]]), "type": "Directory"}
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            sub = m.pop("subPath", None)
            if sub is not None:
                assert m["name"] in projected, f"{name}: subPath of a volume not projected"
                own = f"{m['name']}-{sub}".replace(".", "-").replace("_", "-").lower()
                spec["volumes"].append(
                    {
                        "name": own,
                        "hostPath": {"path": str(projected[m["name"]] / sub), "type": "File"},
                    }
                )
                m["name"] = own
        c.pop("ports", None)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": template["metadata"]["labels"],
            "annotations": annotations,
        },
        "spec": spec,
    }
    file = pod_dir / "pod.yaml"
    file.write_text(yaml.safe_dump(pod, sort_keys=False))
    conf = containers_conf(pod_dir / "containers.conf", bool(spec.get("hostPID")))
    return PodRun(name, template, pod, file, conf, profile_root,
                  None if spec.get("hostNetwork") else "")  # fmt: skip


@dataclass
class ClickHouse:
    """The test's ClickHouse server and meridian's two users on it (deploy/clickhouse/)."""

    url: str
    user: str
    password: str
    reader: str
    reader_password: str
    database: str
    server: ClickHouseServer


@dataclass
class Rollout:
    targets: dict[str, list[str]]  # scrape job -> ["host:port", ...] reachable from here
    clickhouse: ClickHouse
    pods: dict[str, PodRun]  # by scrape job
    objects: list[dict[str, Any]]  # what kustomize rendered, test overlay included
    work: Path
    network: str
    started: float = field(default=0.0)  # time.monotonic() of the first kube play


def have(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (make deps; make image for podman)")


def image_present() -> None:
    have("podman")
    if subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True).returncode:
        pytest.skip(f"{IMAGE} is not in podman's store: make image")


def secret_from_file(name: str, password_file: Path) -> dict[str, Any]:
    """The Secret deploy/clickhouse/README.md's command makes, rendered client-side."""
    out = run(
        "kubectl", "-n", NAMESPACE, "create", "secret", "generic", name,
        f"--from-file=password={password_file}", "--dry-run=client", "-o", "yaml",
    )  # fmt: skip
    secret: dict[str, Any] = yaml.safe_load(out)
    return secret


def overlay(work: Path, url: str) -> Path:
    """The test overlay: the base with the sentinel ConfigMap's clickhouse.url set to
    this test's server, and the containers-storage component (podman's files)."""
    base = [o for o in rendered(K8S) if o["kind"] == "ConfigMap"]
    (cm,) = [o for o in base if "sentinel.yaml" in o.get("data", {})]
    config = yaml.safe_load(cm["data"]["sentinel.yaml"])
    config["clickhouse"]["url"] = url
    directory = work / "overlay"
    directory.mkdir()
    patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm["metadata"]["name"], "namespace": NAMESPACE},
        "data": {"sentinel.yaml": yaml.safe_dump(config, sort_keys=False)},
    }
    (directory / "clickhouse-url.yaml").write_text(yaml.safe_dump(patch))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, directory)],
        "components": [os.path.relpath(K8S / "components" / "containers-storage", directory)],
        "patches": [{"path": "clickhouse-url.yaml"}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def answers(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return True
    return False


def pod_address(pod: PodRun) -> str:
    """The pod's address on the test's network (its infra container's), or the host's
    loopback for a pod on the host's network."""
    if pod.network is None:
        return "127.0.0.1"
    infra = run("podman", "pod", "inspect", "--format", "{{.InfraContainerID}}", pod.name).strip()
    nets = json.loads(
        run("podman", "inspect", "--format", "{{json .NetworkSettings.Networks}}", infra)
    )
    return str(nets[pod.network]["IPAddress"])


def wait_ready(pods: list[PodRun], started: float, limit: float) -> None:
    """Until each pod's readiness port answers; a pod whose container stopped, or not
    ready within `limit` seconds, fails with its log."""
    waiting = list(pods)
    while waiting:
        for pod in list(waiting):
            state = pod.inspect()
            if state["RestartCount"] > 1:  # crash-looping: say why at once
                raise AssertionError(f"{pod.daemonset} restarts:\n{pod.logs()[-3000:]}")
            if not pod.address:
                with contextlib.suppress(RuntimeError, KeyError):
                    pod.address = pod_address(pod)
            if pod.address and answers(pod.address, pod.readiness_port()):
                pod.ready_after = time.monotonic() - started
                waiting.remove(pod)
        if waiting and time.monotonic() - started > limit:
            logs = "\n".join(f"--- {p.daemonset}\n{p.logs()[-2000:]}" for p in waiting)
            raise AssertionError(
                f"not ready in {limit:.0f} s: {[p.daemonset for p in waiting]}\n{logs}"
            )
        time.sleep(0.2)


def password(path: Path) -> str:
    text = base64.b32encode(os.urandom(15)).decode().lower()
    path.write_text(text + "\n")  # a final newline, as an editor leaves it
    path.chmod(0o600)
    return text


@pytest.fixture(scope="session")
def rollout() -> Iterator[Rollout]:
    """deploy/kubernetes running here: every DaemonSet's pod, ready; ClickHouse with
    meridian's users. Everything is removed afterwards, whatever happened."""
    for tool in ("kubectl", "podman", "runc"):
        have(tool)
    image_present()
    work = Path(tempfile.mkdtemp(prefix="meridian-rollout-"))
    network = f"meridian-test-{os.getpid()}"
    pods: list[PodRun] = []
    servers = running_server(work / "clickhouse")
    try:
        server = next(servers)
        agent_file, reader_file = work / "clickhouse-password", work / "clickhouse-reader-password"
        agent_pw, reader_pw = password(agent_file), password(reader_file)
        users = CLICKHOUSE / "users.d" / "meridian.xml"
        rendered_users = run(
            str(CLICKHOUSE / "render.sh"), str(users), str(agent_file), str(reader_file)
        )
        (server.root / "users.d" / "meridian.xml").write_text(rendered_users)
        server.stop()  # users.d is read again at start: no wait for its reload
        server.start()
        objects = rendered(overlay(work, server.url))
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
        ch = yaml.safe_load(cm["data"]["sentinel.yaml"])["clickhouse"]
        clickhouse = ClickHouse(
            server.url, ch["user"], agent_pw, "meridian_reader", reader_pw, ch["database"], server
        )
        secrets = {"meridian-clickhouse": secret_from_file("meridian-clickhouse", agent_file)}
        profile = work / "kubelet-seccomp" / "meridian" / "meridian.json"
        profile.parent.mkdir(parents=True)
        shutil.copy(K8S / "seccomp" / "meridian.json", profile)  # the node's install step
        run("podman", "network", "create", "--subnet", SUBNET, network)
        by_labels = {}
        for ds in (o for o in objects if o["kind"] == "DaemonSet"):
            pod = pod_of(ds, work, objects, secrets)
            if pod.network == "":
                pod.network = network
            pods.append(pod)
            by_labels[ds["metadata"]["name"]] = (pod, ds["spec"]["template"]["metadata"]["labels"])
        jobs: dict[str, PodRun] = {}
        targets: dict[str, list[str]] = {}
        started = time.monotonic()
        for pod in pods:
            pod.play()
        wait_ready(pods, started, READY_WITHIN * 2)  # the test asserts READY_WITHIN
        for svc in (o for o in objects if o["kind"] == "Service"):
            job = svc["metadata"].get("labels", {}).get(JOB_LABEL)
            if not job:
                continue
            (pod,) = [p for p, labels in by_labels.values()
                      if svc["spec"]["selector"].items() <= labels.items()]  # fmt: skip
            (port,) = svc["spec"]["ports"]
            c = pod.template["spec"]["containers"][0]
            (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port["targetPort"]]
            jobs[job] = pod
            targets[job] = [f"{pod.address}:{number}"]
        yield Rollout(targets, clickhouse, jobs, objects, work, network, started)
    finally:
        for pod in pods:
            pod.down()
        subprocess.run(["podman", "network", "rm", "-f", network], capture_output=True, timeout=60)
        servers.close()  # stops the server
        shutil.rmtree(work, ignore_errors=True)
