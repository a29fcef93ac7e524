"""deploy/kubernetes: a namespace, a DaemonSet and a headless Service per exporter (meridian
io, biolat, memlat, runqlat) and for the sentinel agent (with its ConfigMap), the
kustomization that lists them and names the image `make image` builds, the seccomp
profile they use, and the optional Service naming the ClickHouse server
(clickhouse/), with the grants of deploy/clickhouse/. The pods run as written in
tests/deploy (make deploy-test).

- Every manifest is valid for Kubernetes 1.37, the newest schemas kubernetes-validate
  ships (1.37.0 has 1.25 to 1.37), in strict mode: a field the API does not have fails.
- Least privilege: no privileged container, ALL capabilities dropped and only those
  the tools were found to need added (the same as the systemd units'), a read-only
  root file system, read-only host paths, host namespaces only where a tool needs them,
  the shipped seccomp profile (generated from containers-common's default).
- Each container's args are flags the real `meridian` parser accepts, serving on the
  port the Service and the annotations name; the sentinel's ConfigMap loads with the
  agent's own configuration loader.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from unit_sandbox import caps, parse_unit

from meridian.cli import build_parser
from meridian.export.prometheus import parse_listen
from meridian.tools.sentinel.storage.schema import seed_names, statements

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.37.0"  # the newest schemas of kubernetes-validate 1.37.0
IMAGE = "localhost/meridian:0.1.0"  # what `make image` builds, as the nodes import it
IO, BIOLAT, SENTINEL = "meridian-io-exporter", "meridian-biolat-exporter", "meridian-sentinel"
MEMLAT, RUNQLAT = "meridian-memlat-exporter", "meridian-runqlat-exporter"
# per DaemonSet: (tool, hostPID, hostNetwork, the systemd unit whose capabilities it
# has: memlat and runqlat have no unit, and need what biolat needs)
PODS = {
    IO: ("io", True, False, IO),
    BIOLAT: ("biolat", False, False, BIOLAT),
    MEMLAT: ("memlat", False, False, BIOLAT),
    RUNQLAT: ("runqlat", False, False, BIOLAT),
    SENTINEL: ("sentinel", True, True, SENTINEL),
}
HOST_PATHS = {"/sys/kernel/btf", "/sys/kernel/tracing"}  # mounted where the node has them
# io's too, below its --host-root (a pod's /sys/fs/cgroup is its cgroup namespace's)
HOST_ROOT_PATHS = {IO: {"/sys/fs/cgroup"}}
COMPONENTS = {  # the nodes' container runtime: what io reads to name its containers
    "containerd": {"/run/containerd/io.containerd.runtime.v2.task"},
    "containers-storage": {
        "/var/lib/containers/storage/overlay-containers",
        "/run/containers/storage/overlay-containers",
    },
    "docker": {"/var/lib/docker/containers"},
}
SECCOMP = {"type": "Localhost", "localhostProfile": "meridian/meridian.json"}
CONTAINERS_DEFAULT = Path("/usr/share/containers/seccomp.json")


def documents(directory: Path = K8S) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert "initContainers" not in ds["spec"]["template"]["spec"]
    return dict(c)


def parsed(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def metrics_port(c: dict[str, Any]) -> int:
    (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"]
    return int(port)


def test_every_manifest_is_valid_for_kubernetes_in_strict_mode() -> None:
    utils = pytest.importorskip("kubernetes_validate.utils")  # the deploy extra (make test)
    assert KUBERNETES in utils.all_versions()
    kinds = Counter(d["kind"] for d in documents())
    assert kinds == {"Namespace": 1, "ConfigMap": 1, "DaemonSet": 5, "Service": 5}
    for doc in [*documents(), *documents(K8S / "clickhouse")]:
        assert utils.validate(doc, KUBERNETES, strict=True) == "1.37"


def test_strict_validation_refuses_a_misspelt_field() -> None:
    utils = pytest.importorskip("kubernetes_validate.utils")
    ds = copy.deepcopy(of_kind("DaemonSet")[IO])
    container(ds)["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(utils.ValidationError):
        utils.validate(ds, KUBERNETES, strict=True)


def test_every_tool_with_alerts_is_deployed_under_the_job_they_select() -> None:
    """Each Service names its scrape job (meridian/job); the jobs are exactly those the
    rules' alerts select, so no Absent alert fires for a tool nothing deploys."""
    jobs = {svc["metadata"]["labels"]["meridian/job"] for svc in of_kind("Service").values()}
    rules = (ROOT / "deploy" / "prometheus").glob("*-rules.yml")
    wanted = {j for f in rules for j in re.findall(r'job="([^"]+)"', f.read_text())}
    assert jobs == wanted == {f"meridian-{tool}" for tool, *_ in PODS.values()}


@pytest.mark.parametrize("name", list(PODS))
def test_the_daemonset_has_least_privilege(name: str) -> None:
    ds = of_kind("DaemonSet")[name]
    pod = ds["spec"]["template"]["spec"]
    _, host_pid, host_network, unit_name = PODS[name]
    assert pod.get("hostPID", False) is host_pid
    assert pod.get("hostNetwork", False) is host_network
    assert not pod.get("hostIPC", False) and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == SECCOMP
    if host_network:
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # cluster names still resolve
    c = container(ds)
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)  # capabilities need uid 0
    assert sc["capabilities"]["drop"] == ["ALL"]
    unit = parse_unit((ROOT / "deploy" / "systemd" / f"{unit_name}.service").read_text())
    assert {a.lower() for a in sc["capabilities"]["add"]} == set(caps(unit))
    volumes = {v["name"]: v for v in pod["volumes"]}
    below_root = HOST_ROOT_PATHS.get(name, set())
    paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert paths == HOST_PATHS | below_root
    host_root = parsed(c["args"]).host_root if below_root else "/"
    for m in c["volumeMounts"]:
        if "emptyDir" in volumes[m["name"]]:
            continue  # the only writable paths
        assert m.get("readOnly") is True, m
        if "hostPath" in volumes[m["name"]]:
            path = volumes[m["name"]]["hostPath"]["path"]
            root = host_root if path in below_root else "/"
            assert m["mountPath"] == os.path.join(root, path.lstrip("/")), m
    for key in ("requests", "limits"):
        assert "memory" in c["resources"][key]


@pytest.mark.parametrize("name", list(PODS))
def test_the_container_runs_meridian_with_flags_it_accepts_on_the_services_port(
    name: str,
) -> None:
    c = container(of_kind("DaemonSet")[name])
    assert "command" not in c  # the image's entrypoint: meridian
    args = parsed(c["args"])
    tool, *_ = PODS[name]
    assert args.tool == tool and args.duration is None
    port = metrics_port(c)
    assert parse_listen(args.prometheus) == ("0.0.0.0", port)
    if tool == "sentinel":
        assert args.api_port is None and args.metrics_port is None  # not the old flag
    if tool == "io":
        assert args.no_events and not args.top
    if tool in ("biolat", "memlat", "runqlat"):
        assert args.interval is None and args.count is None
    if tool in ("memlat", "runqlat"):
        assert not args.pids  # -P fills the kernel's histogram map on a busy node
    svc = of_kind("Service")[name]
    assert svc["spec"]["clusterIP"] == "None"
    (sp,) = svc["spec"]["ports"]
    assert (sp["name"], sp["port"], sp["targetPort"]) == ("metrics", port, "metrics")
    notes = svc["metadata"]["annotations"]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                     "prometheus.io/path": "/metrics"}  # fmt: skip
    pod_labels = of_kind("DaemonSet")[name]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_the_sentinel_configmap_is_a_config_the_agent_loads_with_the_api_off(
    tmp_path: Path,
) -> None:
    from meridian.tools.sentinel.cli import config_from_args
    from meridian.tools.sentinel.storage.factory import spool_dir_for

    ds = of_kind("DaemonSet")[SENTINEL]
    c = container(ds)
    args = c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    # the file --config names is the ConfigMap's key, mounted there
    config_mount = mounts["config"]
    assert config_mount["mountPath"] == parsed(args).config
    cm = of_kind("ConfigMap")[volumes["config"]["configMap"]["name"]]
    text = cm["data"][config_mount["subPath"]]
    (tmp_path / "sentinel.yaml").write_text(text)
    i = args.index("--config")
    here = [*args[: i + 1], str(tmp_path / "sentinel.yaml"), *args[i + 2 :]]
    cfg = config_from_args(parsed(here))
    assert cfg.clickhouse.enabled and cfg.clickhouse.url == "http://clickhouse.meridian.svc:8123"
    assert (cfg.clickhouse.user, cfg.clickhouse.database) == ("meridian", "meridian")
    assert cfg.clickhouse.retention_days == 14
    assert not cfg.control_plane.enabled
    assert (cfg.metrics.listen_address, cfg.metrics.listen_port) == ("0.0.0.0", metrics_port(c))
    # the password: the Secret's key in its mount; the spool: in the emptyDir
    secret = mounts["clickhouse-password"]
    assert "secret" in volumes["clickhouse-password"]
    assert cfg.clickhouse.password_file == f"{secret['mountPath']}/password"
    spool = mounts["spool"]
    assert "emptyDir" in volumes["spool"]
    assert spool_dir_for(cfg.clickhouse).is_relative_to(spool["mountPath"])
    # room for the disk blocks the kubelet counts beyond the bytes the agent counts
    # (tests/deploy/test_deploy_pods.py fills a spool and measures)
    size_limit = volumes["spool"]["emptyDir"]["sizeLimit"]
    assert size_limit == "1280Mi" and cfg.clickhouse.spool_max_bytes == 1 << 30


def test_the_kustomization_lists_every_manifest_in_one_namespace() -> None:
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization" and k["namespace"] == "meridian"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(k["resources"]) == sorted(files)
    assert len(k["resources"]) == len(set(k["resources"]))
    for doc in documents():
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == "meridian"
        else:
            assert doc["metadata"]["namespace"] == "meridian"
    (image,) = k["images"]
    name, _, tag = IMAGE.partition(":")
    assert (image["newName"], image["newTag"]) == (name, tag)
    # the manifests name the image `meridian`, which the kustomization replaces
    for ds in of_kind("DaemonSet").values():
        assert container(ds)["image"] == f"{image['name']}:{tag}"
    assert "operator" not in str(k["resources"]) and "clickhouse" not in str(k["resources"])


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_a_runtimes_component_adds_its_files_to_io_read_only_below_its_host_root(
    component: str, tmp_path: Path
) -> None:
    """Each component, added to the base: io's pod gets the runtime's directories,
    read-only below its --host-root, with the node's unmounts reaching it; nothing else
    changes, and the DaemonSet is valid in strict mode."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (Debian's kubernetes-client)")
    assert sorted(COMPONENTS) == sorted(p.name for p in (K8S / "components").iterdir())
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, tmp_path)],
        "components": [os.path.relpath(K8S / "components" / component, tmp_path)],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    base, added = (
        {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(
            subprocess.run(["kubectl", "kustomize", str(directory)], check=True,
                           capture_output=True, text=True, timeout=60).stdout) if d}
        for directory in (K8S, tmp_path)
    )  # fmt: skip
    io = ("DaemonSet", IO)
    assert {k: v for k, v in added.items() if k != io} == {k: v for k, v in base.items() if k != io}
    pod, was = added[io]["spec"]["template"]["spec"], base[io]["spec"]["template"]["spec"]
    new = [v for v in pod["volumes"] if v not in was["volumes"]]
    assert {v["hostPath"]["path"] for v in new} == COMPONENTS[component]
    assert all(v["hostPath"]["type"] == "Directory" for v in new)
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    root = parsed(c["args"]).host_root
    for v in new:
        want = os.path.join(root, v["hostPath"]["path"].lstrip("/"))
        assert mounts[v["name"]] == {
            "name": v["name"], "mountPath": want, "readOnly": True,
            "mountPropagation": "HostToContainer",
        }  # fmt: skip
    utils = pytest.importorskip("kubernetes_validate.utils")
    assert utils.validate(added[io], KUBERNETES, strict=True) == "1.37"


def test_kustomize_renders_the_image_make_image_builds() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (Debian's kubernetes-client)")
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], check=True, capture_output=True,
                         text=True, timeout=60).stdout  # fmt: skip
    images = {
        c["image"]
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "DaemonSet"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {IMAGE}


def test_the_seccomp_profile_is_containers_commons_default_with_bpf_allowed() -> None:
    """The shipped profile is plain OCI (every runtime reads it alike), allows bpf() and
    perf_event_open() unconditionally, and is what generate.py makes of this host's
    containers-common default."""
    profile = json.loads((K8S / "seccomp" / SECCOMP["localhostProfile"].split("/")[1]).read_text())
    assert set(profile) == {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    allow = {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")
             for n in r["names"]}  # fmt: skip
    deny = {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ERRNO" for n in r["names"]}
    assert {"bpf", "perf_event_open", "read", "mmap"} <= allow
    assert {"kexec_load", "init_module", "delete_module", "acct"}.isdisjoint(allow)
    assert not {"bpf", "perf_event_open"} & deny
    assert all(set(r) <= {"names", "action", "errnoRet", "args"} for r in profile["syscalls"])
    if not CONTAINERS_DEFAULT.exists():
        pytest.skip("no containers-common default profile here (make test installs it)")
    generated = subprocess.run(
        [sys.executable, str(K8S / "seccomp" / "generate.py"), str(CONTAINERS_DEFAULT)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert json.loads(generated) == profile


def test_the_clickhouse_service_is_the_configmaps_host() -> None:
    (svc,) = documents(K8S / "clickhouse")
    k = yaml.safe_load((K8S / "clickhouse" / "kustomization.yaml").read_text())
    assert k["resources"] == ["service.yaml"] and k["namespace"] == "meridian"
    assert svc["kind"] == "Service" and svc["spec"]["type"] == "ExternalName"
    name = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    (cm,) = of_kind("ConfigMap").values()
    url = yaml.safe_load(cm["data"]["sentinel.yaml"])["clickhouse"]["url"]
    assert url == f"http://{name}:8123"


GRANTS = ROOT / "deploy" / "clickhouse" / "grants.sql"


def granted(user: str) -> set[str]:
    """The privileges grants.sql gives `user` on database meridian."""
    text = re.sub(r"--[^\n]*", "", GRANTS.read_text())
    got: set[str] = set()
    for m in re.finditer(r"GRANT (.+?) ON (\w+)\.\* TO (\w+);", text, re.DOTALL):
        if m.group(3) == user:
            assert m.group(2) == "meridian"
            got |= {" ".join(p.split()) for p in m.group(1).split(",")}
    return got


def test_the_grants_are_what_the_agent_runs_and_the_reader_only_reads() -> None:
    """Static (Debian's ClickHouse 18.16 has no GRANT; tests/deploy runs the agent
    against users.d/meridian.xml): every kind of statement the agent runs is granted,
    nothing more; the reader may only SELECT, with readonly = 1."""
    needed = {"CREATE DATABASE", "INSERT", "SELECT"}  # database at start; batches; lookups
    needed |= {"CREATE TABLE" for sql in statements() if sql.startswith("CREATE TABLE")}
    needed |= {"ALTER ADD COLUMN" for _, _, sql in seed_names() if " ADD COLUMN " in sql}
    needed |= {"ALTER MODIFY TTL", "ALTER MATERIALIZE TTL"}  # retention_days, applied
    assert granted("meridian") == needed
    assert granted("meridian_reader") == {"SELECT"}
    text = GRANTS.read_text()
    assert re.search(r"CREATE USER IF NOT EXISTS meridian_reader[^;]*SETTINGS readonly = 1;", text)
    xml = (ROOT / "deploy" / "clickhouse" / "users.d" / "meridian.xml").read_text()
    for placeholder in ("@MERIDIAN_PASSWORD_SHA256@", "@READER_PASSWORD_SHA256@"):
        assert placeholder in text and placeholder in xml
