"""`/query/...`: `meridian sentinel query` on this agent's store. An embedded store
opens in one process only: this is how it is queried while the agent runs; an agent
that stores nothing answers 409."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...query.services import top_services
from ...query.store import flow_detail, parse_flow, parse_since, top_flows
from ...storage.backend import Backend
from ..deps import Runtime
from ..models import ErrorOut, StoreQuery

__all__ = ["router"]

router = APIRouter(responses={409: {"model": ErrorOut, "description": "this agent stores nothing"}})


def _store(rt: Runtime) -> Backend:
    backend = rt.store_backend()
    if backend is None:
        raise StarletteHTTPException(409, "this agent stores nothing (see --data-dir)")
    return backend


@router.get("/query/top-flows")
def query_top_flows(rt: Runtime, q: Annotated[StoreQuery, Query()]) -> dict[str, Any]:
    """`meridian sentinel query top-flows` on this agent's store (an embedded store
    opens in one process only: this is how it is queried while the agent runs)."""
    rows = top_flows(_store(rt), parse_since(q.since), q.event, q.limit)
    return {"flows": [r.as_json() for r in rows]}


@router.get("/query/top-services")
def query_top_services(rt: Runtime, q: Annotated[StoreQuery, Query()]) -> dict[str, Any]:
    """`meridian sentinel query top-services` on this agent's store: the flows grouped
    by their listening side (address, port, protocol) and direction."""
    rows = top_services(_store(rt), parse_since(q.since), q.event, q.limit)
    return {"services": [r.as_json() for r in rows]}


@router.get("/query/flow/{flow}")
def query_flow(rt: Runtime, flow: str, q: Annotated[StoreQuery, Query()]) -> dict[str, Any]:
    """`meridian sentinel query flow FLOW` on this agent's store."""
    return asdict(flow_detail(_store(rt), parse_flow(flow), parse_since(q.since)))
