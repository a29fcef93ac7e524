"""`/status`: the whole state of the agent in one read."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import NO_QUERY, Runtime
from ..models import StatusOut

__all__ = ["router"]

router = APIRouter(dependencies=[NO_QUERY])


@router.get("/status")
def get_status(rt: Runtime) -> StatusOut:
    st = rt.status()
    for key in ("dropped", "labelled"):
        st[key] = {k: int(v) for k, v in st[key].items()}
    for key in ("samples_per_sec_budget", "hard_drop_ns", "samples_delivered", "samples_kept"):
        st[key] = int(st[key])
    st["samples_per_sec"] = float(st["samples_per_sec"])
    return StatusOut.model_validate(st)
