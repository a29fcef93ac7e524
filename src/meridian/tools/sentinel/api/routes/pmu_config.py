"""`/pmu-config`: the event groups of each mode, names as the config takes them or
raw codes as numbers."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import NO_QUERY, Runtime
from ..models import PmuConfigBody, PmuConfigOut

__all__ = ["router"]

router = APIRouter(dependencies=[NO_QUERY])


@router.get("/pmu-config")
def groups(rt: Runtime) -> PmuConfigOut:
    g = rt.status()["groups"]
    return PmuConfigOut(sentinel_groups=g["sentinel"], diagnostic_groups=g["diagnostic"])


def _names(gs: list[list[str | int]] | None) -> list[list[str]] | None:
    """A raw code given as a number is the event named raw:0xCODE."""
    if gs is None:
        return None
    return [[e if isinstance(e, str) else f"raw:{e:#x}" for e in g] for g in gs]


@router.post("/pmu-config")
def post_pmu_config(rt: Runtime, body: PmuConfigBody) -> PmuConfigOut:
    rt.set_groups(_names(body.sentinel_groups), _names(body.diagnostic_groups))
    return groups(rt)
