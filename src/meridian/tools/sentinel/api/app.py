"""The control plane's HTTP API (FastAPI): one route per control method of the
runtime, each setting with a POST that changes it and a GET that reads it, plus
`GET /api/v1/status` and the OpenAPI document at `GET /api/v1/openapi.json`.

Every answer is JSON. A request the models refuse is 400 naming the field (FastAPI's
422 is turned into 400, and left out of the document), a wrong method 405 with the
Allow header, an unknown path 404; the Guard (api_guard) in front of the app answers
403, 401, 413 and, only for a true internal error, 500. The server that runs this
app is api_server's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .... import __version__
from ....errors import UsageError
from ..agent.control import RuntimeControl
from ..model.dataobjects import DataObject
from ..query.store import flow_detail, parse_flow, parse_since, top_flows
from ..sources.pmu_events import LOGICAL
from ..storage.backend import Backend
from .guard import MAX_BODY, ASGIApp, Guard, Scope
from .models import (
    DataObjectBody,
    DataObjectsOut,
    ErrorOut,
    JitBody,
    JitRegionOut,
    JitRegionsOut,
    ListQuery,
    ModeBody,
    ModeOut,
    PmuConfigBody,
    PmuConfigOut,
    StatusOut,
    StoreQuery,
    TargetOut,
    TargetsBody,
    TargetsOut,
    TokenBucketBody,
    TokenBucketOut,
)

__all__ = ["PREFIX", "build_app"]

PREFIX = "/api/v1"
Log = Callable[[str], None]
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


class _App(FastAPI):
    """FastAPI whose OpenAPI document says 400 where FastAPI would say 422."""

    secured = False

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is not None:
            return self.openapi_schema
        doc = super().openapi()
        for item in doc.get("paths", {}).values():
            for op in item.values():
                op.get("responses", {}).pop("422", None)
        schemas = doc.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        if self.secured:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}]
        return doc


def _responses(secured: bool) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorOut, "description": "a field is wrong (the message names it)"},
        413: {"model": ErrorOut, "description": f"the body is over {MAX_BODY} bytes"},
    }
    if secured:
        out[401] = {"model": ErrorOut, "description": "no bearer token, or a wrong one"}
    return out


def build_app(
    rt: RuntimeControl, token: bytes | None, log: Log, loopback_only: bool = False
) -> ASGIApp:
    """The API on `rt`, behind the Guard (Host, token, body size, internal errors)."""
    app = _App(
        title="meridian sentinel control plane",
        version=__version__,
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.secured = token is not None
    errors = _responses(token is not None)

    def get(path: str, query: bool = False, **kw: Any) -> Callable[[Endpoint], Endpoint]:
        deps = [] if query else [Depends(_no_query)]
        responses = errors | kw.pop("responses", {})
        return app.get(PREFIX + path, responses=responses, dependencies=deps, **kw)

    def post(path: str, **kw: Any) -> Callable[[Endpoint], Endpoint]:
        deps = [Depends(_no_query)]
        return app.post(PREFIX + path, responses=errors, dependencies=deps, **kw)

    def mode() -> ModeOut:
        st = rt.status()
        return ModeOut(mode=st["mode"], pinned=st["pinned"])

    get("/mode")(mode)

    @post("/mode")
    def post_mode(body: ModeBody) -> ModeOut:
        rt.set_mode(None if body.mode == "auto" else body.mode)
        return mode()

    def budgets() -> TokenBucketOut:
        st = rt.status()
        p = rt.cfg.perf
        return TokenBucketOut(
            sentinel_samples_per_sec=p.sentinel_samples_per_sec,
            diagnostic_samples_per_sec=p.diagnostic_samples_per_sec,
            hard_drop_ns=st["hard_drop_ns"],
            samples_per_sec=st["samples_per_sec_budget"],
            mode=st["mode"],
        )

    get("/token-bucket")(budgets)

    @post("/token-bucket")
    def post_token_bucket(body: TokenBucketBody) -> TokenBucketOut:
        rt.set_budgets(body.sentinel, body.diagnostic_samples_per_sec, body.hard_drop_ns)
        return budgets()

    def groups() -> PmuConfigOut:
        g = rt.status()["groups"]
        return PmuConfigOut(sentinel_groups=g["sentinel"], diagnostic_groups=g["diagnostic"])

    get("/pmu-config")(groups)

    @post("/pmu-config")
    def post_pmu_config(body: PmuConfigBody) -> PmuConfigOut:
        def names(gs: list[list[str | int]] | None) -> list[list[str]] | None:
            if gs is None:
                return None
            return [[e if isinstance(e, str) else f"raw:{e:#x}" for e in g] for g in gs]

        rt.set_groups(names(body.sentinel_groups), names(body.diagnostic_groups))
        return groups()

    @get("/symbols/jit", query=True)
    def get_jit(q: Annotated[ListQuery, Query()]) -> JitRegionsOut:
        limit = q.limit
        found = rt.symbolizer.jit_regions(q.pid, limit + 1)
        regions = [
            JitRegionOut(pid=p, start=g.start, end=g.end, path=g.name, build_id=g.build_id)
            for p, g in found[:limit]
        ]
        return JitRegionsOut(regions=regions, truncated=len(found) > limit)

    @post("/symbols/jit")
    def post_jit(body: JitBody) -> JitRegionOut:
        rt.register_jit(body.pid, body.start, body.end, body.path, body.build_id)
        return JitRegionOut(**body.model_dump())

    @get("/symbols/data", query=True)
    def get_data(q: Annotated[ListQuery, Query()]) -> DataObjectsOut:
        limit = q.limit
        found = rt.symbolizer.data_objects(q.pid, limit + 1)
        return DataObjectsOut(objects=found[:limit], truncated=len(found) > limit)

    @post("/symbols/data")
    def post_data(body: DataObjectBody) -> DataObject:
        b = body
        object_id = rt.register_data_object(b.pid, b.address, b.name, b.type, b.size)
        return DataObject(object_id=object_id, **b.model_dump())

    def targets() -> TargetsOut:
        return TargetsOut(targets=[TargetOut(**t) for t in rt.targets.targets])

    @get("/targets", response_model_exclude_none=True)
    def get_targets() -> TargetsOut:
        return targets()

    @post("/targets", response_model_exclude_none=True)
    def post_targets(body: TargetsBody) -> TargetsOut:
        rt.set_targets([t.given() for t in body.targets])
        return targets()

    def store() -> Backend:
        backend: Backend | None = rt.store_backend()
        if backend is None:
            raise StarletteHTTPException(409, "this agent stores nothing (see --data-dir)")
        return backend

    stored = {409: {"model": ErrorOut, "description": "this agent stores nothing"}}

    @get("/query/top-flows", query=True, responses=stored)
    def query_top_flows(q: Annotated[StoreQuery, Query()]) -> dict[str, Any]:
        """`meridian sentinel query top-flows` on this agent's store (an embedded store
        opens in one process only: this is how it is queried while the agent runs)."""
        rows = top_flows(store(), parse_since(q.since), q.event, q.limit)
        return {"flows": [r.as_json() for r in rows]}

    @get("/query/flow/{flow}", query=True, responses=stored)
    def query_flow(flow: str, q: Annotated[StoreQuery, Query()]) -> dict[str, Any]:
        """`meridian sentinel query flow FLOW` on this agent's store."""
        return asdict(flow_detail(store(), parse_flow(flow), parse_since(q.since)))

    @get("/status")
    def get_status() -> StatusOut:
        st = rt.status()
        for key in ("dropped", "labelled"):
            st[key] = {k: int(v) for k, v in st[key].items()}
        for key in ("samples_per_sec_budget", "hard_drop_ns", "samples_delivered", "samples_kept"):
            st[key] = int(st[key])
        st["samples_per_sec"] = float(st["samples_per_sec"])
        return StatusOut.model_validate(st)

    _handle_errors(app)
    return Guard(app, token, log, loopback_only=loopback_only)


# ---- errors ----------------------------------------------------------------------------


def _error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    body = ErrorOut(error=message, field=field).model_dump()
    return JSONResponse(body, status_code=status, headers=headers or None)


def _no_query(request: Request) -> None:
    """A dependency: a query string where none is taken is refused, as a body key."""
    if request.query_params:
        name, value = next(iter(request.query_params.items()))
        msg = "Extra inputs are not permitted"
        err = {"type": "extra_forbidden", "loc": ("query", name), "msg": msg, "input": value}
        raise RequestValidationError([err])


def _is_tag(part: object) -> bool:
    """A union member's tag in a pydantic error location (constrained-int, none, ...)."""
    return isinstance(part, str) and (part == "none" or "-" in part or "[" in part)


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (int, float, str, bool)) else ""
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(err: dict[str, Any]) -> tuple[str, str]:
    """(field, message) of one pydantic error."""
    loc = [p for p in err.get("loc", ()) if not _is_tag(p)]
    where, parts = (loc[0], loc[1:]) if loc else ("body", [])
    field = ".".join(str(p) for p in parts) or str(where)
    kind, msg = err.get("type", ""), str(err.get("msg", "invalid"))
    if kind == "json_invalid":
        at = f" at position {parts[0]}" if parts else ""
        detail = (err.get("ctx") or {}).get("error", "")
        return "body", f"body: malformed JSON{at}: {detail}".rstrip(": ")
    if kind == "missing":
        return field, f"{field}: required"
    if kind == "extra_forbidden":
        return field, f"{field}: unknown {'query parameter' if where == 'query' else 'field'}"
    if kind == "string_pattern_mismatch" and field.split(".")[0].endswith("_groups"):
        msg = f"unknown event: use one of {', '.join(LOGICAL)} or raw:0xCODE[:0xCONFIG1]"
    msg = msg.removeprefix("Value error, ")
    shown = _show(err.get("input"))
    return field, f"{field}: {msg}" + (f", got {shown}" if shown else "")


def _pick(errors: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(field, message) per field at fault, unknown fields first. A value that fits
    no member of a union has one error per member: the one about the kind of value
    it is (a pattern for a string, a range for a number) says the most."""
    by_field: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for err in errors:
        field, message = _describe(err)
        by_field.setdefault(field, []).append((err, message))
    out = []
    for field, found in by_field.items():
        vague = ("_type", "_required")
        telling = [m for e, m in found if not str(e.get("type", "")).endswith(vague)]
        unknown = any(e.get("type") == "extra_forbidden" for e, _ in found)
        out.append((not unknown, field, (telling or [found[0][1]])[0]))
    out.sort(key=lambda x: x[0])  # stable: the models' order otherwise
    return [(field, message) for _, field, message in out]


def _handle_errors(app: FastAPI) -> None:
    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        found = _pick(list(exc.errors()))
        field, message = found[0]
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if field == "body" and kind != "application/json" and request.method == "POST":
            message = "body: send a JSON object with Content-Type: application/json"
        if len(found) > 1:
            message += f" (and {len(found) - 1} more: {', '.join(f for f, _ in found[1:4])})"
        return _error(400, message, field)

    async def usage(request: Request, exc: Exception) -> JSONResponse:
        return _error(400, str(exc))

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path
        if exc.status_code == 405:
            allow = _allowed(app, request.scope)
            text = f"{request.method} is not allowed on {path}: use {' or '.join(allow)}"
            return _error(405, text, Allow=", ".join(allow))
        if exc.status_code == 404:
            return _error(404, f"no such endpoint: {path} (see {PREFIX}/openapi.json)")
        return _error(exc.status_code, str(exc.detail), **(exc.headers or {}))

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, "internal error: the agent logged it")  # the Guard logs

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(UsageError, usage)
    app.add_exception_handler(StarletteHTTPException, http)
    app.add_exception_handler(Exception, internal)


def _allowed(app: FastAPI, scope: Scope) -> list[str]:
    """The methods of every route on this path (Starlette names only the first's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**scope, "method": "GET"})
        if match != Match.NONE:
            methods |= getattr(route, "methods", set())
    return sorted(methods)
