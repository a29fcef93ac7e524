"""What the control plane's routes depend on: the prefix they share, the runtime they
control (a control.Control, in the app's state: build_app sets it, so the routers are
plain module objects), and the refusal of a query string where a route takes none."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError

from ..control import Control

__all__ = ["NO_QUERY", "PREFIX", "Runtime"]

PREFIX = "/api/v1"


async def _runtime(request: Request) -> Control:
    rt: Control = request.app.state.runtime
    return rt


async def _no_query(request: Request) -> None:
    """A query string where none is taken is refused, as an unknown body key is."""
    if request.query_params:
        name, value = next(iter(request.query_params.items()))
        msg = "Extra inputs are not permitted"
        err = {"type": "extra_forbidden", "loc": ("query", name), "msg": msg, "input": value}
        raise RequestValidationError([err])


Runtime = Annotated[Control, Depends(_runtime)]
NO_QUERY = Depends(_no_query)
