"""deploy/kubernetes: a namespace, a DaemonSet and a headless Service per exporter (meridian
io, meridian biolat) and for the sentinel agent (with its ConfigMap), a ServiceMonitor,
and the kustomization that lists them.

- Every manifest is valid for Kubernetes 1.37, the newest schemas kubernetes-validate
  ships (1.37.0 has 1.25 to 1.37), in strict mode: a field the API does not have fails.
  The ServiceMonitor is a custom resource kubernetes-validate has no schema for (and no
  way to be given one): it is checked here field by field against what
  monitoring.coreos.com/v1 declares for the fields it uses, and against the Services.
- Least privilege: no privileged container, ALL capabilities dropped and only those
  the tools were found to need added (the same as the systemd units'), a read-only
  root file system, read-only host paths, host namespaces only where a tool needs them.
- Each container's args are flags the real `meridian` parser accepts, serving on the
  port the Service and the annotations name; the sentinel's ConfigMap loads with the
  agent's own configuration loader.
"""

from __future__ import annotations

import argparse
import copy
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from unit_sandbox import caps, parse_unit

from meridian.cli import build_parser
from meridian.export.prometheus import parse_listen

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.37.0"  # the newest schemas of kubernetes-validate 1.37.0
IMAGE = "meridian:0.1.0"
IO, BIOLAT, SENTINEL = "meridian-io-exporter", "meridian-biolat-exporter", "meridian-sentinel"
# per DaemonSet: (tool, hostPID, hostNetwork); capabilities come from the systemd units
PODS = {
    IO: ("io", True, False),
    BIOLAT: ("biolat", False, False),
    SENTINEL: ("sentinel", True, True),
}
HOST_PATHS = {"/sys/kernel/btf", "/sys/kernel/tracing"}
# monitoring.coreos.com/v1 ServiceMonitor (prometheus-operator's CRD): the fields of
# spec and of an endpoint that this file may use, and the CRD's patterns for them
SPEC_FIELDS = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
               "podTargetLabels", "sampleLimit"}  # fmt: skip
ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
                   "relabelings", "metricRelabelings"}  # fmt: skip
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                      r"(([0-9]+)s)?(([0-9]+)ms)?)$")  # fmt: skip


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
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
    assert kinds == {"Namespace": 1, "ConfigMap": 1, "DaemonSet": 3, "Service": 3,
                     "ServiceMonitor": 1}  # fmt: skip
    for doc in documents():
        if doc["kind"] != "ServiceMonitor":  # a custom resource: the test below
            assert utils.validate(doc, KUBERNETES, strict=True) == "1.37"


def test_strict_validation_refuses_a_misspelt_field() -> None:
    utils = pytest.importorskip("kubernetes_validate.utils")
    ds = copy.deepcopy(of_kind("DaemonSet")[IO])
    container(ds)["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(utils.ValidationError):
        utils.validate(ds, KUBERNETES, strict=True)


def test_the_servicemonitor_scrapes_every_service_on_its_metrics_port() -> None:
    (sm,) = of_kind("ServiceMonitor").values()
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == "meridian"
    spec = sm["spec"]
    assert set(spec) <= SPEC_FIELDS
    assert spec["endpoints"] and all(set(e) <= ENDPOINT_FIELDS for e in spec["endpoints"])
    for e in spec["endpoints"]:
        assert e["scheme"] in ("http", "https") and e["path"] == "/metrics"
        assert DURATION.match(e["interval"]) and DURATION.match(e["scrapeTimeout"])
    selected = {
        name
        for name, svc in of_kind("Service").items()
        if spec["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        and svc["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
    }
    assert selected == set(of_kind("Service")) == {IO, BIOLAT, SENTINEL}
    for svc in of_kind("Service").values():
        names = {p["name"] for p in svc["spec"]["ports"]}
        assert {e["port"] for e in spec["endpoints"]} <= names
    # the job label: each Service's jobLabel label, the jobs the alerts select
    jobs = {svc["metadata"]["labels"][spec["jobLabel"]] for svc in of_kind("Service").values()}
    rules = (ROOT / "deploy" / "prometheus").glob("*-rules.yml")
    wanted = {j for f in rules for j in re.findall(r'job="([^"]+)"', f.read_text())}
    assert jobs == wanted - {"meridian-memlat", "meridian-runqlat"}  # no DaemonSets


@pytest.mark.parametrize("name", [IO, BIOLAT, SENTINEL])
def test_the_daemonset_has_least_privilege(name: str) -> None:
    ds = of_kind("DaemonSet")[name]
    pod = ds["spec"]["template"]["spec"]
    _, host_pid, host_network = PODS[name]
    assert pod.get("hostPID", False) is host_pid
    assert pod.get("hostNetwork", False) is host_network
    assert not pod.get("hostIPC", False) and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    if host_network:
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # cluster names still resolve
    c = container(ds)
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)  # capabilities need uid 0
    assert sc["capabilities"]["drop"] == ["ALL"]
    unit = parse_unit((ROOT / "deploy" / "systemd" / f"{name}.service").read_text())
    assert {a.lower() for a in sc["capabilities"]["add"]} == set(caps(unit))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v} == HOST_PATHS
    for m in c["volumeMounts"]:
        if "emptyDir" in volumes[m["name"]]:
            continue  # the only writable paths
        assert m.get("readOnly") is True, m
        if "hostPath" in volumes[m["name"]]:
            assert m["mountPath"] == volumes[m["name"]]["hostPath"]["path"]
    for key in ("requests", "limits"):
        assert "memory" in c["resources"][key]


@pytest.mark.parametrize("name", [IO, BIOLAT, SENTINEL])
def test_the_container_runs_meridian_with_flags_it_accepts_on_the_services_port(
    name: str,
) -> None:
    c = container(of_kind("DaemonSet")[name])
    assert c["image"] == IMAGE and "command" not in c  # the image's entrypoint: meridian
    args = parsed(c["args"])
    tool, _, _ = PODS[name]
    assert args.tool == tool and args.duration is None
    port = metrics_port(c)
    if tool == "sentinel":
        assert int(args.metrics_port) == port and args.api_port is None
    else:
        assert parse_listen(args.prometheus) == ("0.0.0.0", port)
    if tool == "io":
        assert args.no_events and not args.top
    if tool == "biolat":
        assert args.interval is None and args.count is None
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
    assert not cfg.control_plane.enabled
    assert (cfg.metrics.listen_address, cfg.metrics.listen_port) == ("0.0.0.0", metrics_port(c))
    # the password: the Secret's key in its mount; the spool: in the emptyDir
    secret = mounts["clickhouse-password"]
    assert "secret" in volumes["clickhouse-password"]
    assert cfg.clickhouse.password_file == f"{secret['mountPath']}/password"
    spool = mounts["spool"]
    assert "emptyDir" in volumes["spool"]
    assert spool_dir_for(cfg.clickhouse).is_relative_to(spool["mountPath"])


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
    assert (image["name"], image["newTag"]) == (name, tag)
