"""The control plane (issue 14) on a running agent: each endpoint's POST changes the
runtime (the mock source obeys mode, budgets, groups and targets) and its GET reads
it back; bad input is 400 naming the field, 401 without the token, 405 for a wrong
method, 413 for a big body, never a 500; schemathesis against the OpenAPI document;
the flags' errors; a prompt stop. The kernel test reads the maps back after POSTs."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import positive_data_acceptance
from test_sentinel_e2e import free_port, mock_config, scrape, wait_for

from meridian.errors import UsageError
from meridian.tools.sentinel.agent.control import RuntimeControl
from meridian.tools.sentinel.agent.run import Runtime
from meridian.tools.sentinel.agent.services import Services
from meridian.tools.sentinel.config.load import parse_config
from meridian.tools.sentinel.model.records import Event
from meridian.tools.sentinel.sources.mock import PIDS, MockSource

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/api/v1"
Reply = tuple[int, dict[str, str], Any]


@dataclass
class Agent:
    rt: RuntimeControl
    src: MockSource
    port: int
    metrics_port: int
    logged: list[str]


def call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    auth: bool = True,
) -> Reply:
    """One request: (status, headers in lower case, JSON body or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent = dict(AUTH) if auth else {}
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    if data is not None:
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    try:
        conn.request(method, PREFIX + path, body=data, headers=sent)
        r = conn.getresponse()
        payload = r.read()
        got = {k.lower(): v for k, v in r.getheaders()}
        return r.status, got, json.loads(payload) if payload else None
    finally:
        conn.close()


def ok(port: int, method: str, path: str, body: Any = None) -> Any:
    status, _, out = call(port, method, path, body)
    assert status == 200, out
    return out


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """A mock agent with the control plane (token required) and /metrics."""
    token = tmp_path_factory.mktemp("api") / "token"
    token.write_text(TOKEN + "\n")
    cfg = mock_config()
    cfg.metrics.enabled = True
    cfg.metrics.listen_port = free_port()
    cp = cfg.control_plane
    cp.enabled, cp.listen_port, cp.token_file = True, free_port(), str(token)
    cfg.perf.sentinel_samples_per_sec = 20000  # far above the mock's rate
    src = MockSource(period_ms=10, rng_seed=3, rate=2000)
    logged: list[str] = []
    services = Services(cfg, Runtime(cfg, src, log=logged.append), logged.append)
    services.start()
    try:
        yield Agent(services.runtime.control, src, cp.listen_port, cfg.metrics.listen_port, logged)
    finally:
        services.stop()
    assert not [line for line in logged if "internal error" in line], logged


# ---- each endpoint: POST, then GET, then the runtime itself -----------------------------


def test_mode(agent: Agent) -> None:
    port, rt, src = agent.port, agent.rt, agent.src
    pinned = {"mode": "diagnostic", "pinned": True}
    assert ok(port, "POST", "/mode", {"mode": "diagnostic"}) == pinned
    assert ok(port, "GET", "/mode") == pinned
    assert rt.status()["mode"] == "diagnostic"
    wait_for(lambda: set(src.events) >= {Event.INSTRUCTIONS, Event.BRANCH_MISS})
    wait_for(lambda: "ms_agent_mode 1.0" in scrape(agent.metrics_port))
    assert ok(port, "POST", "/mode", {"mode": "auto"})["pinned"] is False
    assert ok(port, "POST", "/mode", {"mode": "sentinel"})["mode"] == "sentinel"
    wait_for(lambda: "ms_agent_mode 0.0" in scrape(agent.metrics_port))


def test_token_bucket(agent: Agent) -> None:
    port, rt, src = agent.port, agent.rt, agent.src
    ok(port, "POST", "/mode", {"mode": "sentinel"})
    want = {"sentinel_samples_per_sec": 777, "diagnostic_samples_per_sec": 8888, "hard_drop_ns": 5}
    out = ok(port, "POST", "/token-bucket", want)
    assert out == {**want, "samples_per_sec": 777, "mode": "sentinel"}
    assert ok(port, "GET", "/token-bucket") == out
    assert rt.cfg.perf.diagnostic_samples_per_sec == 8888
    wait_for(lambda: (src._budget, src._hard_drop_ns) == (777, 5))
    # the legacy name sets the sentinel budget; not both at once
    assert ok(port, "POST", "/token-bucket", {"samples_per_sec": 555})["samples_per_sec"] == 555
    wait_for(lambda: src._budget == 555)
    both = {"samples_per_sec": 1, "sentinel_samples_per_sec": 2}
    status, _, err = call(port, "POST", "/token-bucket", both)
    assert status == 400 and err["field"] == "samples_per_sec", err
    ok(port, "POST", "/token-bucket", {"sentinel_samples_per_sec": 20000, "hard_drop_ns": 0})


def test_pmu_config(agent: Agent) -> None:
    port, rt, src = agent.port, agent.rt, agent.src
    ok(port, "POST", "/mode", {"mode": "sentinel"})
    before = ok(port, "GET", "/pmu-config")
    out = ok(port, "POST", "/pmu-config", {"sentinel_groups": [["cpu-clock"], ["cycles", 0x1CD]]})
    assert out["sentinel_groups"] == [["cpu-clock"], ["cycles", "raw:0x1cd"]]
    assert out["diagnostic_groups"] == before["diagnostic_groups"]
    assert ok(port, "GET", "/pmu-config") == out
    # two groups take turns: each event is sampled half the time (once the consumer
    # has applied the groups)
    two = {"cpu-clock": 2.0, "cycles": 2.0, "raw:0x1cd": 2.0}
    wait_for(lambda: rt.status()["scales"] == two)
    wait_for(lambda: src.events == [Event.CPU_CLOCK])
    ok(port, "POST", "/pmu-config", {"sentinel_groups": before["sentinel_groups"]})
    wait_for(lambda: src.events == [Event.CYCLES, Event.LLC_MISS])


def test_symbols_jit(agent: Agent) -> None:
    port, rt = agent.port, agent.rt
    region = {"pid": 4242, "start": 0x5000_0000, "end": 0x5000_1000, "path": "jit_handler"}
    assert ok(port, "POST", "/symbols/jit", {**region, "build_id": "ab12"})["build_id"] == "ab12"
    listed = ok(port, "GET", "/symbols/jit?pid=4242")
    assert listed == {"regions": [{**region, "build_id": "ab12"}], "truncated": False}
    assert rt.symbolizer.frame(4242, 0x5000_0010).function == "jit_handler"
    every = ok(port, "GET", "/symbols/jit?limit=3")
    assert len(every["regions"]) == 3 and every["truncated"]  # the mock's own regions too


def test_symbols_data(agent: Agent) -> None:
    port, rt = agent.port, agent.rt
    obj = {"pid": 4243, "address": 0x7000_0000, "name": "conn_table", "size": 4096}
    out = ok(port, "POST", "/symbols/data", {**obj, "type": "struct conn[64]"})
    assert out["object_id"] > 0 and out["type"] == "struct conn[64]"
    assert ok(port, "POST", "/symbols/data", {**obj, "type": "struct conn[64]"}) == out  # same id
    assert ok(port, "GET", "/symbols/data?pid=4243")["objects"] == [out]
    assert rt.symbolizer.data_object_id(4243, 0x7000_0100) == out["object_id"]


def test_targets(agent: Agent) -> None:
    port, rt, src = agent.port, agent.rt, agent.src
    out = ok(port, "POST", "/targets", {"targets": [{"pid": PIDS[1]}]})
    assert out == {"targets": [{"pid": PIDS[1]}]} == ok(port, "GET", "/targets")
    wait_for(lambda: list(src._targets) == [PIDS[1]])  # the mock filters like the kernel
    flow = {"targets": [{"flow_id": "245eaf80ddcc96c7"}, {"pid": 1, "tid": 2}]}
    out = ok(port, "POST", "/targets", flow)
    assert out["targets"] == [{"flow_id": 0x245EAF80DDCC96C7}, {"pid": 1, "tid": 2}]
    assert rt.targets.targets == out["targets"]
    wait_for(lambda: len(src._targets) == 0)  # not every target names a pid: user space filters
    assert ok(port, "POST", "/targets", {"targets": []}) == {"targets": []}


def test_status(agent: Agent) -> None:
    st = ok(agent.port, "GET", "/status")
    assert st["running"] and st["source"] == "mock" and st["storage"] is None
    assert st["mode"] == agent.rt.status()["mode"]
    assert set(st["dropped"]) >= {"token_bucket", "hard_drop", "ring_full"}
    wait_for(lambda: ok(agent.port, "GET", "/status")["samples_delivered"] > 0)


def test_openapi_document(agent: Agent) -> None:
    doc = ok(agent.port, "GET", "/openapi.json")
    paths = doc["paths"]
    for name in ("mode", "token-bucket", "pmu-config", "symbols/jit", "symbols/data", "targets"):
        assert set(paths[f"{PREFIX}/{name}"]) == {"get", "post"}
        assert {"400", "401", "413"} <= set(paths[f"{PREFIX}/{name}"]["post"]["responses"])
    assert set(paths[f"{PREFIX}/status"]) == {"get"}
    assert "422" not in json.dumps(paths)
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


# ---- what is refused ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/mode", {"mode": "turbo"}, "mode"),
        ("/mode", {"mode": "sentinel", "extra": 1}, "extra"),
        ("/mode", {}, "mode"),
        ("/mode", ["sentinel"], "body"),
        ("/token-bucket", {"sentinel_samples_per_sec": "100"}, "sentinel_samples_per_sec"),
        ("/token-bucket", {"sentinel_samples_per_sec": 0}, "sentinel_samples_per_sec"),
        ("/token-bucket", {"diagnostic_samples_per_sec": 1.5}, "diagnostic_samples_per_sec"),
        ("/token-bucket", {"hard_drop_ns": -1}, "hard_drop_ns"),
        ("/token-bucket", {"hard_drop_ns": None}, "hard_drop_ns"),
        ("/token-bucket", {"hard_drop_ns": True}, "hard_drop_ns"),
        ("/pmu-config", {"sentinel_groups": [["bogus"]]}, "sentinel_groups.0.0"),
        ("/pmu-config", {"diagnostic_groups": [[]]}, "diagnostic_groups.0"),
        ("/pmu-config", {"sentinel_groups": [["cpu-clock:p"]]}, "sentinel_groups.0.0"),
        ("/symbols/jit", {"pid": 1, "start": 16, "end": 8, "path": "x"}, "end"),
        ("/symbols/jit", {"pid": 0, "start": 0, "end": 8, "path": "x"}, "pid"),
        ("/symbols/jit", {"pid": 1, "start": 0, "end": 2**64, "path": "x"}, "end"),
        ("/symbols/jit", {"pid": 1, "start": 0, "end": 8}, "path"),
        ("/symbols/data", {"pid": 1, "address": 0, "name": ""}, "name"),
        ("/symbols/data", {"pid": 1, "address": 0, "name": "a", "size": 0}, "size"),
        ("/targets", {"targets": [{}]}, "targets.0"),
        ("/targets", {"targets": [{"pid": -1}]}, "targets.0.pid"),
        ("/targets", {"targets": [{"pid": None}]}, "targets.0.pid"),
        ("/targets", {"targets": [{"port": 80}]}, "targets.0.port"),
        ("/targets", {"targets": [{"flow_id": "xyz"}]}, "targets.0.flow_id"),
        ("/targets", {"targets": [{"pid": 1}] * 1025}, "targets"),
    ],
)
def test_bad_values_are_400_naming_the_field(
    agent: Agent, path: str, body: Any, field: str
) -> None:
    before = agent.rt.status()
    status, headers, err = call(agent.port, "POST", path, body)
    assert status == 400, err
    assert headers["content-type"] == "application/json"
    assert err["field"] == field and err["error"].startswith(f"{field}: "), err
    after = agent.rt.status()
    for key in ("mode", "groups", "samples_per_sec_budget", "hard_drop_ns", "targets"):
        assert after[key] == before[key]  # nothing changed


@pytest.mark.parametrize(
    ("path", "key", "value", "field"),
    [
        ("/token-bucket", "sentinel_samples_per_sec", 50_000_000, "sentinel_samples_per_sec"),
        ("/token-bucket", "hard_drop_ns", 3600 * 10**9 + 1, "hard_drop_ns"),
        ("/pmu-config", "sentinel_groups", [["cycles"]] * 17, "sentinel_groups"),
        ("/pmu-config", "diagnostic_groups", [["cycles"] * 17], "diagnostic_groups.0"),
        ("/pmu-config", "sentinel_groups", [["CYCLES"]], "sentinel_groups.0.0"),
    ],
)
def test_a_limit_is_said_the_same_from_yaml_and_the_api(
    agent: Agent, path: str, key: str, value: Any, field: str
) -> None:
    """The YAML file and the API are one model: a value that had drifted (a budget of
    50,000,000 taken from a file, a hard drop or group count capped by the API only,
    event names checked two ways) is refused by both, in the same words."""
    with pytest.raises(UsageError) as exc:
        parse_config(f"perf:\n  {key}: {json.dumps(value)}\n", "config x.yaml")
    said = str(exc.value).removeprefix(f"config x.yaml: perf.{key}: ")
    before = [ok(agent.port, "GET", p) for p in ("/token-bucket", "/pmu-config")]
    status, _, err = call(agent.port, "POST", path, {key: value})
    assert status == 400 and err["field"] == field, err
    if isinstance(value, int):
        assert err["error"] == f"{field}: {said}"
    else:  # the API quotes a value as JSON, and shows no list
        assert err["error"].startswith(f"{field}: {said.rsplit(', got ', 1)[0]}"), err
    assert [ok(agent.port, "GET", p) for p in ("/token-bucket", "/pmu-config")] == before


@pytest.mark.parametrize(
    ("raw", "headers", "needle"),
    [
        (b'{"mode": "diag', None, "malformed JSON"),
        (b"", None, "body: required"),
        (b'{"mode": "sentinel"}', {"Content-Type": "text/plain"}, "Content-Type: application/json"),
        (b"\xff\xfe", None, "malformed JSON"),
    ],
)
def test_bad_bodies_are_400(
    agent: Agent, raw: bytes, headers: dict[str, str] | None, needle: str
) -> None:
    status, _, err = call(agent.port, "POST", "/mode", raw=raw, headers=headers)
    assert status == 400 and needle in err["error"], err
    assert status == 400 and err["field"] == "body", err


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}, AUTH | {"X": "y"}],
)
def test_token_required(agent: Agent, headers: dict[str, str]) -> None:
    for method, path, body in (("GET", "/status", None), ("POST", "/mode", {"mode": "auto"})):
        status, got, err = call(agent.port, method, path, body, headers=headers, auth=False)
        if headers.get("Authorization") == AUTH["Authorization"]:
            assert status == 200
            continue
        assert status == 401 and "bearer token" in err["error"], err
        assert got["www-authenticate"].startswith("Bearer")
    assert call(agent.port, "GET", "/openapi.json", auth=False)[0] == 401


@pytest.mark.parametrize(
    ("host", "status"),
    [("rebound.example.com", 403), ("10.0.0.1:80", 403), ("localhost:80", 200), ("[::1]", 200)],
)
def test_loopback_server_answers_loopback_names_only(agent: Agent, host: str, status: int) -> None:
    """A web page whose name was rebound to 127.0.0.1 sends its own name as Host."""
    got, _, out = call(agent.port, "GET", "/status", headers={"Host": host})
    assert got == status, out


def test_start_failure_frees_the_port() -> None:
    from meridian.errors import UsageError

    cfg = mock_config()
    cfg.control_plane.enabled, cfg.control_plane.listen_port = True, free_port()

    def no_source() -> Any:
        raise UsageError("no source here")

    services = Services(cfg, Runtime(cfg, no_source), print)
    with pytest.raises(UsageError, match="no source here"):
        services.start()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", cfg.control_plane.listen_port))
    services.stop()


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/mode", "GET, POST"),
        ("DELETE", "/targets", "GET, POST"),
        ("PATCH", "/symbols/jit", "GET, POST"),
        ("POST", "/status", "GET"),
        ("POST", "/openapi.json", "GET, HEAD"),
    ],
)
def test_wrong_method_is_405(agent: Agent, method: str, path: str, allow: str) -> None:
    status, headers, err = call(agent.port, method, path, {})
    assert status == 405, err
    assert headers["allow"] == allow and method in err["error"]


def test_big_body_is_413(agent: Agent) -> None:
    big = json.dumps({"targets": [{"pid": 1}] * 8000}).encode()  # ~96 KiB
    status, _, err = call(agent.port, "POST", "/targets", raw=big)
    assert status == 413 and "65536 bytes" in err["error"], err
    # without a length (chunked): the guard counts what it reads
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    try:
        conn.putrequest("POST", PREFIX + "/targets")
        for k, v in (AUTH | {"Content-Type": "application/json"}).items():
            conn.putheader(k, v)
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for i in range(0, len(big), 16384):
            piece = big[i : i + 16384]
            conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.send(b"0\r\n\r\n")
        assert conn.getresponse().status == 413
    finally:
        conn.close()
    assert agent.rt.targets.targets != [{"pid": 1}] * 8000


# ---- schemathesis against the OpenAPI document ---------------------------------------------

SAFE_INT = 1 << 53  # beyond it schemathesis compares bounds as floats (its limitation)


def _exempt(case: schemathesis.Case[Any]) -> bool:
    """A schema-valid request the API may still refuse: a bound the document cannot
    state (a JIT region's end above its start), a number near 2^64 that
    schemathesis takes for one inside the bound, or a query of the store, which this
    agent does not have (409; the query tests ask one that has)."""

    def big(v: Any) -> bool:
        if isinstance(v, dict):
            return any(big(x) for x in v.values())
        if isinstance(v, list):
            return any(big(x) for x in v)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > SAFE_INT

    body: Any = case.body
    if big(body) or "/query/" in case.path:
        return True
    if not (case.path.endswith("/symbols/jit") and isinstance(body, dict)):
        return False
    start, end = body.get("start"), body.get("end")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return end <= start
    return False


# headers the HTTP server reads before the app: uvicorn answers a malformed one itself
# (text/plain); hypothesis draws header names from the constants of the sources, so a
# change anywhere in src/ may bring one
FRAMING = {"content-length", "transfer-encoding"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis(agent: Agent, mode: GenerationMode) -> None:
    """Every operation of the document, valid and invalid requests: all of
    schemathesis' checks (no 5xx, responses and status codes as documented, the
    token enforced, wrong methods 405 with Allow, invalid data refused); valid data
    accepted but for the exemptions above."""
    url = f"http://127.0.0.1:{agent.port}{PREFIX}/openapi.json"
    refused = ["400", "401", "405", "413"]  # an invalid body may be too big as well
    config = SchemathesisConfig.from_dict(
        {
            "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},  # left out where it is tested
            "checks": {"negative_data_rejection": {"expected-statuses": refused}},
        }
    )
    schema = schemathesis.openapi.from_url(url, config=config, headers=AUTH)
    tested = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        op = result.ok()
        examples = 25
        if op.method == "get" and not op.query and not op.path_parameters:
            if mode is GenerationMode.NEGATIVE:
                continue  # nothing to get wrong
            # nothing to draw (the token is the one header, fixed by the auth above):
            # every example would be the same request
            examples = 1

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: schemathesis.Case[Any]) -> None:
            if FRAMING & {h.lower() for h in case.headers or {}}:
                return  # uvicorn's answer, not the API's
            r = case.call_and_validate(excluded_checks=[positive_data_acceptance])
            if mode is GenerationMode.POSITIVE and not _exempt(case):
                assert r.status_code == 200, (case.method, case.path, case.body, r.text)

        run()
        tested += 1
    assert tested >= 7


# ---- the command line ---------------------------------------------------------------------
