"""Prometheus with and without the operator, on this host alone (the rollout's live
half is tests/deploy/test_deploy_prometheus.py): deploy/prometheus/prometheus.yml passes
promtool and, run by Debian's Prometheus, gives every Service of deploy/kubernetes and
every systemd unit's port the job and instance the dashboards and rules select;
deploy/kubernetes/operator renders, its ServiceMonitor selects those Services with the
labels kube-prometheus-stack selects, and its PrometheusRules are what
deploy/prometheus/make_prometheusrules.py makes of the rules files; every Absent alert
names a job that the deployment runs and the configuration scrapes."""

from __future__ import annotations

import re
import runpy
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from children import wait_until
from deploy.promstack import (
    BASE,
    JOB_LABEL,
    JOBS,
    OPERATOR,
    SHIPPED,
    derived,
    have_prometheus,
    rendered,
    running,
    services,
    targets,
)
from test_prometheus_rules_tools import RULES_DIR

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = RULES_DIR / "make_prometheusrules.py"
SYSTEMD = ROOT / "deploy" / "systemd"
NODE = "node-a"
HOSTS = ["host-a", "host-b"]  # the systemd jobs' hosts file
# the Absent alerts' selector
ABSENT = re.compile(r'absent\(up\{job="([^"]+)"\}\)')

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (Debian's kubernetes-client)"
)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (Debian's kubernetes-client)")
    return rendered(BASE)


def absent_jobs() -> dict[str, str]:
    """alert name -> the job its absent(up{job=...}) names."""
    found = {}
    for path in sorted(RULES_DIR.glob("*-rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                m = ABSENT.search(rule.get("expr", ""))
                if "alert" in rule and m:
                    found[rule["alert"]] = m[1]
    return found


def unit_ports() -> dict[str, int]:
    """job -> the port its systemd unit serves /metrics on."""
    ports = {}
    for unit in SYSTEMD.glob("meridian-*.service"):
        exec_start = re.search(
            r"^ExecStart=\S+ (\w+) .*?--prometheus \S*:(\d+)", unit.read_text(), re.M
        )
        assert exec_start, unit
        ports[f"meridian-{exec_start[1]}"] = int(exec_start[2])
    return ports


# ---- the operator's objects --------------------------------------------------------------


def test_prometheusrules_are_generated_from_the_rules_files() -> None:
    """The committed output is what the script makes now: rerun it after editing a
    rules file (python3 deploy/prometheus/make_prometheusrules.py)."""
    script = runpy.run_path(str(GENERATOR))
    out: Path = script["OUT"]
    assert out == OPERATOR / "prometheusrules.yaml"
    assert out.read_text() == script["render"](), (
        f"stale: run python3 {GENERATOR.relative_to(ROOT)}"
    )
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    by_name = {d["metadata"]["name"]: d["spec"]["groups"] for d in docs}
    files = {
        f"meridian-{p.name.removesuffix('-rules.yml')}": yaml.safe_load(p.read_text())["groups"]
        for p in RULES_DIR.glob("*-rules.yml")
    }
    assert by_name == files


@needs_kubectl
def test_operator_overlay_renders_with_the_labels_kube_prometheus_stack_selects(
    base: list[dict[str, Any]],
) -> None:
    objects = rendered(OPERATOR)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["PrometheusRule"] * len(list(RULES_DIR.glob("*-rules.yml"))) + [
        "ServiceMonitor"
    ]
    for o in objects:
        assert o["metadata"]["namespace"] == "meridian", o["metadata"]
        assert o["metadata"]["labels"]["release"] == "kube-prometheus-stack", o["metadata"]
    [monitor] = [o for o in objects if o["kind"] == "ServiceMonitor"]
    spec = monitor["spec"]
    assert spec["jobLabel"] == JOB_LABEL
    assert "meridian" in spec["namespaceSelector"]["matchNames"]
    # it selects every Service that names a job, on the port its endpoints name
    [endpoint] = spec["endpoints"]
    selector = spec["selector"]
    for job, service in services(base).items():
        labels = service["metadata"]["labels"]
        assert selector["matchLabels"].items() <= labels.items(), job
        for expr in selector["matchExpressions"]:
            assert expr["operator"] == "Exists" and expr["key"] in labels, (job, expr)
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, job
    [instance] = endpoint["relabelings"]
    assert instance == {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "instance",
    }


@needs_kubectl
def test_the_base_applies_without_the_operators_crds(base: list[dict[str, Any]]) -> None:
    foreign = [o["kind"] for o in base if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert not foreign, f"{foreign} belong in deploy/kubernetes/operator"


# ---- prometheus.yml -----------------------------------------------------------------------


def test_kubernetes_discovery_is_the_meridian_namespaces_endpoints() -> None:
    """Debian's promtool and Prometheus have no Kubernetes discovery (left out of the
    package): this block is checked here by hand, the rest by promtool below."""
    [kubernetes] = [
        j
        for j in yaml.safe_load(SHIPPED.read_text())["scrape_configs"]
        if "kubernetes_sd_configs" in j
    ]
    assert kubernetes["kubernetes_sd_configs"] == [
        {"role": "endpoints", "namespaces": {"names": ["meridian"]}}
    ]


@needs_kubectl
def test_promtool_checks_the_config_and_its_rules(
    promtool: str, base: list[dict[str, Any]], tmp_path: Path
) -> None:
    by_job = services(base)
    config = derived({job: ["127.0.0.1:1"] for job in by_job}, NODE, by_job)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "meridian-hosts.yml").write_text(yaml.safe_dump([{"targets": HOSTS}]))
    got = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    for rules in RULES_DIR.glob("*-rules.yml"):
        assert f"Checking {rules}\n  SUCCESS" in got.stdout, rules
    scrape = config["global"]["scrape_interval"]
    assert scrape.endswith("s") and int(scrape[:-1]) >= 10  # the README's 10 s or more


@pytest.fixture(scope="module")
def scraped(base: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Debian's Prometheus on the shipped configuration, fed one endpoint per Service
    of deploy/kubernetes (meta labels as Kubernetes discovery gives them, addresses
    where nothing listens) and two systemd hosts: its targets after relabelling, by
    part ("kubernetes", "systemd": {(job, instance, port)}), and the endpoints it
    dropped."""
    if not have_prometheus():
        pytest.skip("prometheus is not installed (Debian's prometheus)")
    by_job = services(base)
    # a Service in the namespace, annotated for scraping, without the job label
    decoy = {
        "metadata": {
            "name": "other",
            "namespace": "meridian",
            "labels": {"app": "other"},
            "annotations": {"prometheus.io/scrape": "true"},
        },
        "spec": {"ports": [{"name": "metrics", "port": 9}]},
    }
    endpoints = {
        job: [f"127.0.0.{i + 2}:{s['spec']['ports'][0]['port']}"]
        for i, (job, s) in enumerate(by_job.items())
    }
    config = derived({**endpoints, "other": ["127.0.0.1:9"]}, NODE, {**by_job, "other": decoy})
    root = tmp_path_factory.mktemp("prometheus")
    with running(root, config, HOSTS) as prom:

        def listed() -> list[dict[str, Any]]:
            found = targets(prom)
            return found if len(found) >= len(by_job) + len(HOSTS) * len(JOBS) else []

        wait_until(listed, 20, "every target discovered", step=0.2)
        parts: dict[str, set[tuple[str, str, int]]] = {"kubernetes": set(), "systemd": set()}
        for t in targets(prom):
            url = urllib.parse.urlsplit(t["scrapeUrl"])
            part = "kubernetes" if t["scrapePool"] == "meridian-kubernetes" else "systemd"
            parts[part].add((t["labels"]["job"], t["labels"]["instance"], url.port or 0))
        dropped = prom.api("targets", state="dropped")["droppedTargets"]
        return {"parts": parts, "dropped": dropped}


def test_kubernetes_endpoints_get_their_services_job_and_the_node(
    base: list[dict[str, Any]], scraped: dict[str, Any]
) -> None:
    by_job = services(base)
    want = {(job, NODE, s["spec"]["ports"][0]["port"]) for job, s in by_job.items()}
    assert scraped["parts"]["kubernetes"] == want
    # a Service without the job label is not scraped
    assert any(
        d["discoveredLabels"].get("__meta_kubernetes_service_name") == "other"
        for d in scraped["dropped"]
    )


def test_systemd_hosts_get_each_units_port(
    base: list[dict[str, Any]], scraped: dict[str, Any]
) -> None:
    """Each job scrapes every listed host on its unit's port (a tool with no unit: its
    DaemonSet's), with the host as instance, as the Kubernetes part gives the node."""
    ports = {job: s["spec"]["ports"][0]["port"] for job, s in services(base).items()}
    ports |= unit_ports()
    want = {(job, host, ports[job]) for job in JOBS for host in HOSTS}
    assert scraped["parts"]["systemd"] == want


def test_absent_alerts_name_jobs_the_deployment_runs_and_prometheus_scrapes(
    base: list[dict[str, Any]], scraped: dict[str, Any]
) -> None:
    deployed = set(services(base))
    kubernetes = {job for job, _, _ in scraped["parts"]["kubernetes"]}
    systemd = {job for job, _, _ in scraped["parts"]["systemd"]}
    wrong = {
        alert: job
        for alert, job in absent_jobs().items()
        if not (job in deployed and job in kubernetes and job in systemd)
    }
    assert not wrong, (
        f"Absent alerts for jobs not deployed (Services {sorted(deployed)}) or not scraped: {wrong}"
    )
    assert set(absent_jobs().values()) == set(JOBS)
