"""`/mode`: the mode in force, and pinning one (auto: the controller's choice again)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import NO_QUERY, Runtime
from ..models import ModeBody, ModeOut

__all__ = ["router"]

router = APIRouter(dependencies=[NO_QUERY])


@router.get("/mode")
def mode(rt: Runtime) -> ModeOut:
    st = rt.status()
    return ModeOut(mode=st["mode"], pinned=st["pinned"])


@router.post("/mode")
def post_mode(rt: Runtime, body: ModeBody) -> ModeOut:
    rt.set_mode(None if body.mode == "auto" else body.mode)
    return mode(rt)
