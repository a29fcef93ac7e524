"""The control plane's errors, every one the JSON `ErrorOut` body: a request the models
refuse is 400 naming the field, in the config's words (config/messages.py); FastAPI's
422 becomes 400; a wrong method is 405 with the Allow header, an unknown path 404;
anything else the app raises, 500 (the Guard logs it)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from ....errors import UsageError
from ..config.messages import describe, got
from .deps import PREFIX
from .guard import Scope
from .models import ErrorOut
from .routes import ROUTERS

__all__ = ["handle_errors"]


def _error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    body = ErrorOut(error=message, field=field).model_dump()
    return JSONResponse(body, status_code=status, headers=headers or None)


def _is_tag(part: object) -> bool:
    """A union member's tag in a pydantic error location (constrained-int, none, ...)."""
    return isinstance(part, str) and (part == "none" or "-" in part or "[" in part)


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (int, float, str, bool)) else ""
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(err: Any) -> tuple[str, str]:
    """(field, message) of one pydantic error."""
    loc = [p for p in err.get("loc", ()) if not _is_tag(p)]
    where, parts = (loc[0], loc[1:]) if loc else ("body", [])
    field = ".".join(str(p) for p in parts) or str(where)
    kind = err.get("type", "")
    if kind == "json_invalid":
        at = f" at position {parts[0]}" if parts else ""
        detail = (err.get("ctx") or {}).get("error", "")
        return "body", f"body: malformed JSON{at}: {detail}".rstrip(": ")
    if kind == "missing":
        return field, f"{field}: required"
    if kind == "extra_forbidden":
        return field, f"{field}: unknown {'query parameter' if where == 'query' else 'field'}"
    shown = _show(got(err))
    return field, f"{field}: {describe(err)}" + (f", got {shown}" if shown else "")


def _pick(errors: list[Any]) -> list[tuple[str, str]]:
    """(field, message) per field at fault, unknown fields first. A value that fits
    no member of a union has one error per member: the one about the kind of value
    it is (a pattern for a string, a range for a number) says the most."""
    by_field: dict[str, list[tuple[Any, str]]] = {}
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


def _allowed(app: FastAPI, scope: Scope) -> list[str]:
    """The methods of every route on this path (Starlette names only the first's): the
    app's own (the document) and the routers' below PREFIX, read from the routers, as
    the app holds an included router as one opaque route."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.matches({**scope, "method": "GET"})[0] != Match.NONE:
            methods |= route.methods or set()
    path = str(scope["path"])
    if path.startswith(PREFIX):
        for route in (r for router in ROUTERS for r in router.routes):
            if isinstance(route, APIRoute) and route.path_regex.match(path[len(PREFIX) :]):
                methods |= route.methods or set()
    return sorted(methods)


def handle_errors(app: FastAPI) -> None:
    """Install the handlers of every error on `app`."""

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
