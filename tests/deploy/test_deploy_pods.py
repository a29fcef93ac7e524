"""The DaemonSets of deploy/kubernetes run here as pods (conftest.py's `rollout`): every
pod is ready within 60 s, runs unprivileged with exactly what its manifest declares
(capabilities, host namespaces, read-only mounts, the shipped seccomp profile), and
does its work: io's /metrics carries a host process's reads, sentinel's rows arrive
in ClickHouse as the user deploy/clickhouse/ makes, with the retention the ConfigMap
sets. The same io pod under the runtime's default seccomp profile (podman's, CRI-O's)
fails as the issue saw it fail, and the spool, filled to clickhouse.spool_max_bytes,
stays under its volume's sizeLimit as the kubelet counts it (disk blocks)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from children import build_c, reap, wait_until
from clickhouse_server import free_port
from sentinel_store import rollups

from deploy.conftest import (
    IMAGE,
    K8S,
    READY_WITHIN,
    SECCOMP_ANNOTATION,
    Rollout,
    pod_of,
    rendered,
)
from deploy.test_containers import READER, SIZE, reader
from deploy.test_image import READ_SIZE, READS, WRITE_SIZE, WRITES, Workload, scrape
from meridian.tools.sentinel.storage import BatchingSink, HttpBackend, StoreUnavailable
from meridian.tools.sentinel.storage.schema import (
    ROLLUP,
    TABLES,
    ttl_expression,
    ttl_missing,
    ttl_supported,
)

pytestmark = pytest.mark.deploy

JOBS = (
    "meridian-io",
    "meridian-biolat",
    "meridian-memlat",
    "meridian-runqlat",
    "meridian-sentinel",
)
# capability numbers (linux/capability.h) of the names the manifests add
CAP_NUMBERS = {"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "SYSLOG": 34, "PERFMON": 38,
               "BPF": 39, "CHECKPOINT_RESTORE": 40}  # fmt: skip
EPERM = "every strategy is not supported here"


def sentinel_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["sentinel.yaml"])
    return config


def metrics_answer(target: str) -> bool:
    host, _, port = target.rpartition(":")
    return bool(scrape(int(port), host))


def test_every_pod_is_ready_within_60_s(rollout: Rollout) -> None:
    assert set(rollout.targets) == set(JOBS)
    ready = {job: round(pod.ready_after, 1) for job, pod in rollout.pods.items()}
    assert all(0 < s <= READY_WITHIN for s in ready.values()), ready
    for job, (target,) in rollout.targets.items():
        wait_until(partial(metrics_answer, target), 30, f"{job}'s /metrics at {target}")


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def allowed(rules: list[dict[str, Any]]) -> set[str]:
    """The calls a seccomp filter lets through whatever their arguments."""
    return {
        n
        for r in rules
        if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")
        for n in r["names"]
    }


@pytest.mark.parametrize("job", JOBS)
def test_the_pod_runs_unprivileged_as_its_manifest_says(rollout: Rollout, job: str) -> None:
    pod = rollout.pods[job]
    spec = pod.template["spec"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    got = pod.inspect()
    host = got["HostConfig"]
    assert host["Privileged"] is False and sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    want = sorted(f"CAP_{name}" for name in sc["capabilities"]["add"])
    assert sorted(host["CapAdd"]) == want
    assert sorted(got["EffectiveCaps"]) == want  # and nothing else
    assert host["ReadonlyRootfs"] is sc["readOnlyRootFilesystem"] is True
    assert (host["PidMode"] == "host") is spec.get("hostPID", False)
    assert (host["NetworkMode"] == "host") is spec.get("hostNetwork", False)
    assert "no-new-privileges" in host["SecurityOpt"]  # allowPrivilegeEscalation: false
    # the process itself: root's uid, exactly these capabilities in every set that
    # counts, no new privileges, under a seccomp filter
    status = proc_status(int(got["State"]["Pid"]))
    mask = sum(1 << CAP_NUMBERS[name] for name in sc["capabilities"]["add"])
    assert status["Uid"].split()[0] == "0"
    assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == mask
    assert (status["NoNewPrivs"], status["Seccomp"]) == ("1", "2")
    # the filter the runtime was given is the shipped profile, found where the
    # manifest's localhostProfile says under the kubelet's seccomp root
    profile = spec["securityContext"]["seccompProfile"]
    assert profile == {"type": "Localhost", "localhostProfile": "meridian/meridian.json"}
    shipped = json.loads((K8S / "seccomp" / "meridian.json").read_text())
    oci = json.loads((Path(got["StaticDir"]) / "config.json").read_text())["linux"]["seccomp"]
    assert oci["defaultAction"] == shipped["defaultAction"]
    assert allowed(oci["syscalls"]) == allowed(shipped["syscalls"])
    assert {"bpf", "perf_event_open"} <= allowed(oci["syscalls"])
    # host paths read-only where the manifest says so, at the paths it names
    mounts = {m["Destination"]: m for m in got["Mounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in c["volumeMounts"]:
        if "hostPath" in volumes[m["name"]]:
            assert m.get("readOnly") is True
            assert mounts[m["mountPath"]]["RW"] is False, m


def test_under_the_runtimes_default_seccomp_profile_the_tools_fail(rollout: Rollout) -> None:
    """The io pod as written but for its seccomp profile (RuntimeDefault: podman's
    containers-common default, which CRI-O uses too): bpf() is refused without
    CAP_SYS_ADMIN, and the tool exits with the EPERM the issue saw. The rollout's io
    pod, the shipped profile its one difference, answers."""
    (ds,) = [
        o
        for o in rollout.objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "meridian-io-exporter"
    ]
    lesser = copy.deepcopy(ds)
    lesser["metadata"]["name"] = "meridian-io-default-seccomp"
    lesser["spec"]["template"]["spec"]["securityContext"]["seccompProfile"] = {
        "type": "RuntimeDefault"
    }
    pod = pod_of(lesser, rollout.work, rollout.objects, {})
    pod.network = rollout.network
    try:
        pod.play()
        wait_until(lambda: EPERM in pod.logs(), 60, "the tool's EPERM under the default profile")
        got = pod.inspect()
        assert got["Config"]["Annotations"][SECCOMP_ANNOTATION] == "runtime/default"
        assert sorted(got["HostConfig"]["CapAdd"]) == ["CAP_BPF", "CAP_PERFMON"]
    finally:
        log = pod.logs()
        pod.down()
    assert re.search(r"tp_btf: load refused with EPERM", log), log[-2000:]
    (target,) = rollout.targets["meridian-io"]
    assert metrics_answer(target)


def test_ios_metrics_carry_a_host_process_reads(rollout: Rollout, tmp_path: Path) -> None:
    """A small known workload on the host (preads and pwrites of a file it made), in
    the io pod's /metrics by the host's PID (hostPID): what it did after the count
    below was taken (its interpreter's start is counted too, before)."""
    (target,) = rollout.targets["meridian-io"]
    host, _, port = target.rpartition(":")
    child = Workload(tmp_path / "work.bin")

    def io_bytes() -> dict[str, float]:
        got = {"read": 0.0, "write": 0.0}
        for s in scrape(int(port), host):
            if (
                s.name == "process_disk_io_bytes_total"
                and s.labels.get("process_pid") == str(child.pid)
                and s.labels.get("meridian_io_writeback") != "true"
            ):
                got[s.labels["disk_io_direction"]] += s.value
        return got

    def settled() -> dict[str, float]:
        """The child's count once two scrapes a second apart agree (the exporter may
        take a moment to count its start; it waits, doing nothing)."""
        last: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while (now := io_bytes()) != last or not now["read"]:
            assert time.monotonic() < deadline, f"the child's count never settled: {now}"
            last = now
            time.sleep(1.0)
        return now

    try:
        before = settled()
        child.go()
        want = {"read": READS * READ_SIZE, "write": WRITES * WRITE_SIZE}
        wait_until(
            lambda: {d: v - before[d] for d, v in io_bytes().items()} == want,
            30,
            "the workload's bytes in the pod's /metrics",
            0.5,
        )
    finally:
        reap(child.p)


def test_ios_metrics_name_a_containers_reads_and_its_pod(rollout: Rollout, tmp_path: Path) -> None:
    """A podman container on the node (annotated as CRI-O annotates a pod's container)
    reads its 64 MiB file: the io pod's /metrics has the bytes under its id, with its
    name, image and pod, read through the component's mounts at --host-root."""
    build_c(tmp_path, "reader", READER, "-static", "-O2")
    (target,) = rollout.targets["meridian-io"]
    host, _, port = target.rpartition(":")

    def read_by(cid: str) -> tuple[float, dict[str, str]]:
        total, labels = 0.0, {}
        for s in scrape(int(port), host):
            if (
                s.name == "process_disk_io_bytes_total"
                and s.labels.get("container_id") == cid
                and s.labels.get("disk_io_direction") == "read"
                and s.labels.get("meridian_io_writeback") != "true"
            ):
                total, labels = total + s.value, s.labels
        return total, labels

    with reader(tmp_path, f"meridian-test-{os.getpid()}-pods-reader", "web-a") as r:
        before = read_by(r.id)[0]  # runc's own reads as it started the container
        r.read()
        wait_until(
            lambda: read_by(r.id)[0] - before == SIZE,
            30,
            "the container's 64 MiB in the io pod's /metrics",
            0.5,
        )
        labels = read_by(r.id)[1]
    want = {
        "container_runtime": "podman",
        "container_name": r.name,
        "container_image_name": IMAGE,
        "k8s_pod_name": "web-a",
        "k8s_namespace_name": "shop",
        "k8s_container_name": "reader",
    }
    assert {k: labels.get(k) for k in want} == want


def loopback_stream(seconds: float) -> None:
    """TCP traffic on the host's loopback for sentinel to attribute (hostNetwork)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 16):
                pass

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port)) as c:
        while time.monotonic() < deadline:
            c.sendall(b"x" * (1 << 16))
    t.join(10)
    server.close()


def test_sentinel_stores_rows_as_meridian_with_the_retention(
    rollout: Rollout, tmp_path: Path
) -> None:
    ch = rollout.clickhouse
    days = sentinel_config(rollout.objects)["clickhouse"]["retention_days"]
    (tmp_path / "reader").write_text(ch.reader_password)
    reader = HttpBackend(ch.url, ch.reader, str(tmp_path / "reader"), ch.database)

    def stored() -> int:
        try:
            return int(reader.query(f"SELECT count() AS n FROM {ROLLUP}")[0]["n"])
        except Exception:
            return 0  # no table yet

    deadline = time.monotonic() + 90
    while stored() == 0 and time.monotonic() < deadline:
        loopback_stream(3)
    assert stored() > 0, rollout.pods["meridian-sentinel"].logs()[-3000:]
    tables = reader.query(f"SELECT name FROM system.tables WHERE database = '{ch.database}'")
    assert {t["name"] for t in tables} == set(TABLES)
    assert reader.query("SELECT count() AS n FROM ms_flows")[0]["n"] > 0
    # the agent's user: in its database only
    (tmp_path / "agent").write_text(ch.password)
    agent = HttpBackend(ch.url, ch.user, str(tmp_path / "agent"), "default")
    with pytest.raises(StoreUnavailable, match=r"Access denied|ACCESS_DENIED"):
        agent.query("SELECT count() FROM system.one")
    # the reader's: no insert
    with pytest.raises(StoreUnavailable, match=r"readonly"):
        reader.query(f"INSERT INTO {ROLLUP} (time_bucket) VALUES (1)")
    version = reader.query("SELECT version() AS v")[0]["v"]
    if ttl_supported(version):
        for table in ("ms_flow_rollup", "ms_raw_samples"):
            (row,) = reader.query(f"SHOW CREATE TABLE {table}")
            assert f"TTL {ttl_expression(days)}" in str(next(iter(row.values())))
    else:
        # Debian's 18.16: no TTL; the agent says the retention is not applied
        assert ttl_missing(version, days) in rollout.pods["meridian-sentinel"].logs()


def spool_volume(objects: list[dict[str, Any]]) -> tuple[int, int, int]:
    """The spool's sizeLimit, the agent's spool_max_bytes and batch_rows, as the
    rendered manifests set them."""
    (ds,) = [
        o
        for o in objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "meridian-sentinel"
    ]
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    config = sentinel_config(objects)["clickhouse"]
    (mount,) = [m for m in c["volumeMounts"] if config["spool_dir"].startswith(m["mountPath"])]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    limit = quantity(volume["emptyDir"]["sizeLimit"])
    return limit, int(config["spool_max_bytes"]), int(config.get("batch_rows", 10000))


def quantity(text: str) -> int:
    """A Kubernetes quantity in bytes (binary suffixes, as sizeLimit uses them)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", text)
    assert m, text
    return int(m.group(1)) * units.get(m.group(2) or "", 1)


def test_a_full_spool_stays_under_its_size_limit(tmp_path: Path) -> None:
    """The agent's sink with its store down fills its spool (on this ext4 disk, as an
    emptyDir is on the node's) with batches of the ConfigMap's batch_rows rollup rows
    until it drops rows at spool_max_bytes; `du` (disk blocks, what the kubelet
    counts) stays under sizeLimit. The manifest's two values are scaled down together
    (their ratio kept) so that the test writes 64 MiB, not 1 GiB."""
    limit, max_bytes, batch_rows = spool_volume(rendered(K8S))
    scale = max_bytes // (64 << 20)
    limit, max_bytes = limit // scale, max_bytes // scale
    spool = tmp_path / "spool"
    down = HttpBackend(f"http://127.0.0.1:{free_port()}", "meridian", None, "meridian")
    sink = BatchingSink(down, spool_dir=str(spool), spool_max_bytes=max_bytes,
                        batch_rows=batch_rows, flush_interval=0.05, max_backoff=60.0)  # fmt: skip
    try:
        written = 0
        while sink.stats().dropped_rows == 0:
            sink.write_rollups(rollups(written, batch_rows))
            written += batch_rows
            sink.flush(timeout=5.0)
            assert written <= max_bytes, "the spool never filled"
        sizes = [p.stat().st_size for p in spool.glob("*.batch")]
        du = subprocess.run(["du", "-s", "--block-size=1", str(spool)], capture_output=True,
                            text=True, check=True).stdout.split()[0]  # fmt: skip
    finally:
        sink.close()
    # full: no room for one more batch
    assert max_bytes - 2 * max(sizes) < sum(sizes) <= max_bytes, (sizes, max_bytes)
    assert int(du) < limit, (int(du), limit, sum(sizes))
