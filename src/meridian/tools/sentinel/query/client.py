"""The queries through a running agent's control plane: chDB opens an embedded store in
one process only, so while an agent writes one, `meridian sentinel query` asks that
agent (GET /api/v1/query/...) instead. The agent names its API in a file beside the
store's lock (`storage.announce`), removed when it stops; the answers are the same rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode
from urllib.request import Request, urlopen

from ....errors import EnvironmentProblem, UsageError
from ..storage.announce import agent_url
from .services import ServiceRow
from .store import Bucket, FlowDetail, FlowRow, FunctionCost, StackCost

__all__ = ["agent_url", "fetch_flow", "fetch_top_flows", "fetch_top_services"]

TIMEOUT_S = 60.0


def _get(url: str, path: str, params: dict[str, Any], token_file: str | None) -> Any:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    headers = {}
    if token_file:
        try:
            headers["Authorization"] = "Bearer " + Path(token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--api-token-file {token_file}: {exc.strerror}") from None
    req = Request(f"{url}/api/v1/query/{path}?{query}", headers=headers)
    try:
        with urlopen(req, timeout=TIMEOUT_S) as resp:
            return json.load(resp)
    except HTTPError as exc:
        try:
            said = json.loads(exc.read() or b"{}").get("error") or exc.reason
        except ValueError:
            said = exc.reason
        if exc.code == 401:
            said = f"{said} (give the agent's token with --api-token-file)"
        raise UsageError(f"the agent's API at {url}: {said}") from None
    except (URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise EnvironmentProblem(f"the agent's API at {url} does not answer: {why}") from None


def fetch_top_flows(
    url: str, token_file: str | None, since: str, event: str | None, limit: int
) -> list[FlowRow]:
    got = _get(url, "top-flows", {"since": since, "event": event, "limit": limit}, token_file)
    return [FlowRow(**row) for row in got["flows"]]


def fetch_top_services(
    url: str, token_file: str | None, since: str, event: str | None, limit: int
) -> list[ServiceRow]:
    got = _get(url, "top-services", {"since": since, "event": event, "limit": limit}, token_file)
    return [ServiceRow(**row) for row in got["services"]]


def fetch_flow(url: str, token_file: str | None, flow: str, since: str) -> FlowDetail:
    d = _get(url, f"flow/{quote(flow)}", {"since": since}, token_file)
    return FlowDetail(
        flow=FlowRow(**d["flow"]),
        since_s=float(d["since_s"]),
        step_s=int(d["step_s"]),
        functions=[FunctionCost(**f) for f in d["functions"]],
        stacks=[
            StackCost(tuple(s["frames"]), tuple(s["functions"]), s["samples"], s["norm_cost"])
            for s in d["stacks"]
        ],
        timeline=[Bucket(**b) for b in d["timeline"]],
    )
