"""Debian's Prometheus on the shipped deploy/prometheus/prometheus.yml, for the
rollout's tests: the same jobs, relabelling, intervals and rule files, with only the
service discovery replaced. Debian builds Prometheus without Kubernetes discovery, and
no API server runs here anyway: the Kubernetes job's discovery becomes static targets
carrying the meta labels Prometheus' discovery (role endpoints) would give each
endpoint of the rendered Services, so the shipped relabelling decides, as in a
cluster, which endpoints are kept and which job and instance they get. The systemd
jobs read a hosts file the caller writes (none: they find nothing)."""

from __future__ import annotations

import contextlib
import copy
import glob
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from children import wait_until
from test_deploy_dashboards_run import PROMETHEUS, Prometheus, started, unix
from test_export_kernel import free_ports

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "prometheus" / "prometheus.yml"
BASE = ROOT / "deploy" / "kubernetes"
OPERATOR = BASE / "operator"
JOB_LABEL = "meridian/job"  # the Services' label naming their scrape job
JOBS = tuple(f"meridian-{t}" for t in ("io", "biolat", "memlat", "runqlat", "sentinel"))


def shipped() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    return config


def rendered(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders from a kustomization directory."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def services(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Services that name a scrape job, by that job."""
    found: dict[str, dict[str, Any]] = {}
    for o in objects:
        job = o["metadata"].get("labels", {}).get(JOB_LABEL)
        if o["kind"] == "Service" and job:
            assert job not in found, f"two Services of job {job}"
            found[job] = o
    return found


def _meta(name: str) -> str:
    """A Kubernetes label or annotation name as Prometheus' discovery spells it in a
    meta label (strutil.SanitizeLabelName)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def endpoint_labels(service: dict[str, Any], node: str) -> dict[str, str]:
    """The meta labels Kubernetes discovery (role endpoints) gives the endpoint of this
    Service's first port on a pod of `node`."""
    meta = service["metadata"]
    port = service["spec"]["ports"][0]
    labels = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_service_name": meta["name"],
        "__meta_kubernetes_endpoints_name": meta["name"],
        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
        "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_node_name": node,
        "__meta_kubernetes_pod_node_name": node,
    }
    for kind, values in (
        ("label", meta.get("labels", {})),
        ("annotation", meta.get("annotations", {})),
    ):
        for k, v in values.items():
            labels[f"__meta_kubernetes_service_{kind}_{_meta(k)}"] = str(v)
            labels[f"__meta_kubernetes_service_{kind}present_{_meta(k)}"] = "true"
    return labels


def derived(
    kubernetes: dict[str, list[str]], node: str, by_job: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The shipped configuration, its Kubernetes discovery replaced by `kubernetes`
    (job -> ["host:port", ...], endpoints of that job's Service on `node`), its rule
    files absolute; to be written beside a meridian-hosts.yml (the systemd jobs')."""
    missing = set(kubernetes) - set(by_job)
    assert not missing, f"jobs with no Service labelled {JOB_LABEL} in deploy/kubernetes: {missing}"
    config = copy.deepcopy(shipped())
    config["rule_files"] = [str(SHIPPED.parent / f) for f in config["rule_files"]]
    swapped = 0
    for job in config["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs", None)
        if sd is None:
            continue
        [sd] = sd  # one discovery: the Services' endpoints in their namespace
        assert sd["role"] == "endpoints", sd
        job["static_configs"] = [
            {"targets": list(addresses), "labels": endpoint_labels(by_job[name], node)}
            for name, addresses in kubernetes.items()
        ]
        for group in job["static_configs"]:
            namespace = group["labels"]["__meta_kubernetes_namespace"]
            assert namespace in sd["namespaces"]["names"], (namespace, sd)
        swapped += 1
    assert swapped == 1, "one Kubernetes job in the shipped configuration"
    return config


def held_rules(directory: Path, config: dict[str, Any], hold: dict[str, str]) -> None:
    """Point `config` at copies of its rules files in `directory` where each alert named
    in `hold` waits that long (`for:`) instead of the shipped 10 minutes; expressions,
    thresholds and labels stay as shipped. An alert can then fire within a test."""
    directory.mkdir(parents=True, exist_ok=True)
    found, files = set(), []
    paths = [p for pattern in config["rule_files"] for p in sorted(glob.glob(pattern))]
    for name in paths:  # rule_files are globs, as Prometheus reads them
        rules = yaml.safe_load(Path(name).read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") in hold:
                    rule["for"] = hold[rule["alert"]]
                    found.add(rule["alert"])
        files.append(str(directory / Path(name).name))
        Path(files[-1]).write_text(yaml.safe_dump(rules, sort_keys=False))
    assert found == set(hold), f"alerts not in the rules files: {set(hold) - found}"
    config["rule_files"] = files


@contextlib.contextmanager
def running(root: Path, config: dict[str, Any], hosts: list[str]) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port with this configuration, the systemd jobs'
    hosts file listing `hosts`; ready to answer. Its log: root/prometheus.log."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "meridian-hosts.yml").write_text(yaml.safe_dump([{"targets": hosts}]))
    [port] = free_ports(1)
    prom = Prometheus(port, root, config)
    with open(root / "prometheus.log", "w") as log, started(prom.args, log):
        try:
            wait_until(prom.ready, 30, "Prometheus ready", step=0.1)
        except AssertionError:
            raise AssertionError((root / "prometheus.log").read_text()[-2000:]) from None
        yield prom


def have_prometheus() -> bool:
    return Path(PROMETHEUS).exists()


def targets(prom: Prometheus) -> list[dict[str, Any]]:
    active: list[dict[str, Any]] = prom.api("targets", state="active")["activeTargets"]
    return active


def alerts(prom: Prometheus) -> list[dict[str, Any]]:
    """The alerts pending or firing now."""
    found: list[dict[str, Any]] = prom.api("alerts")["alerts"]
    return found


def evaluated_since(prom: Prometheus, since: float, seconds: float) -> None:
    """Wait until every rule group has been evaluated after `since` (Unix time)."""

    def done() -> bool:
        groups = prom.api("rules")["groups"]
        return bool(groups) and all(unix(g["lastEvaluation"]) > since for g in groups)

    wait_until(done, seconds, "an evaluation of every rule group", step=0.5)
