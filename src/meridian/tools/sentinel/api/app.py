"""The control plane's HTTP API (FastAPI): one router per resource of the runtime
(routes/), each setting with a POST that changes it and a GET that reads it, plus
`GET /api/v1/status` and the OpenAPI document at `GET /api/v1/openapi.json`.

Every answer is JSON. A request the models refuse is 400 naming the field (FastAPI's
422 is turned into 400, and left out of the document; errors.py), a wrong method 405
with the Allow header, an unknown path 404; the Guard (guard.py) in front of the app
answers 403, 401, 413 and, only for a true internal error, 500. The server that runs
this app is server.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from .... import __version__
from ..control import Control
from .deps import PREFIX
from .errors import handle_errors
from .guard import MAX_BODY, ASGIApp, Guard
from .models import ErrorOut
from .routes import ROUTERS

__all__ = ["build_app"]

Log = Callable[[str], None]


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
    """The refusals every route documents."""
    out: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorOut, "description": "a field is wrong (the message names it)"},
        413: {"model": ErrorOut, "description": f"the body is over {MAX_BODY} bytes"},
    }
    if secured:
        out[401] = {"model": ErrorOut, "description": "no bearer token, or a wrong one"}
    return out


def build_app(rt: Control, token: bytes | None, log: Log, loopback_only: bool = False) -> ASGIApp:
    """The API on `rt`, behind the Guard (Host, token, body size, internal errors)."""
    app = _App(
        title="meridian sentinel control plane",
        version=__version__,
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.secured = token is not None
    app.state.runtime = rt
    errors = _responses(app.secured)
    for router in ROUTERS:
        app.include_router(router, prefix=PREFIX, responses=errors)
    handle_errors(app)
    return Guard(app, token, log, loopback_only=loopback_only)
