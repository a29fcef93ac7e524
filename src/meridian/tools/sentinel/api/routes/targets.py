"""`/targets`: what the agent samples (every key of a target must match; [] is
everything)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import NO_QUERY, Runtime
from ..models import TargetOut, TargetsBody, TargetsOut

__all__ = ["router"]

router = APIRouter(dependencies=[NO_QUERY])


def _targets(rt: Runtime) -> TargetsOut:
    return TargetsOut(targets=[TargetOut(**t) for t in rt.targets.targets])


@router.get("/targets", response_model_exclude_none=True)
def get_targets(rt: Runtime) -> TargetsOut:
    return _targets(rt)


@router.post("/targets", response_model_exclude_none=True)
def post_targets(rt: Runtime, body: TargetsBody) -> TargetsOut:
    rt.set_targets([t.given() for t in body.targets])
    return _targets(rt)
