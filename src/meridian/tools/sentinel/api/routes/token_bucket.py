"""`/token-bucket`: the per-CPU budgets of both modes and the hard drop, as the
config's `perf` keys take them."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import NO_QUERY, Runtime
from ..models import TokenBucketBody, TokenBucketOut

__all__ = ["router"]

router = APIRouter(dependencies=[NO_QUERY])


@router.get("/token-bucket")
def budgets(rt: Runtime) -> TokenBucketOut:
    st = rt.status()
    p = rt.cfg.perf
    return TokenBucketOut(
        sentinel_samples_per_sec=p.sentinel_samples_per_sec,
        diagnostic_samples_per_sec=p.diagnostic_samples_per_sec,
        hard_drop_ns=st["hard_drop_ns"],
        samples_per_sec=st["samples_per_sec_budget"],
        mode=st["mode"],
    )


@router.post("/token-bucket")
def post_token_bucket(rt: Runtime, body: TokenBucketBody) -> TokenBucketOut:
    rt.set_budgets(body.sentinel, body.diagnostic_samples_per_sec, body.hard_drop_ns)
    return budgets(rt)
