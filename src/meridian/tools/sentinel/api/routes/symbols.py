"""`/symbols/jit` and `/symbols/data`: what the symbolizer cannot read from a binary,
JIT regions and named data objects, registered and listed (per process or all)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ...model.dataobjects import DataObject
from ..deps import NO_QUERY, Runtime
from ..models import (
    DataObjectBody,
    DataObjectsOut,
    JitBody,
    JitRegionOut,
    JitRegionsOut,
    ListQuery,
)

__all__ = ["router"]

router = APIRouter()


@router.get("/symbols/jit")
def get_jit(rt: Runtime, q: Annotated[ListQuery, Query()]) -> JitRegionsOut:
    limit = q.limit
    found = rt.symbolizer.jit_regions(q.pid, limit + 1)
    regions = [
        JitRegionOut(pid=p, start=g.start, end=g.end, path=g.name, build_id=g.build_id)
        for p, g in found[:limit]
    ]
    return JitRegionsOut(regions=regions, truncated=len(found) > limit)


@router.post("/symbols/jit", dependencies=[NO_QUERY])
def post_jit(rt: Runtime, body: JitBody) -> JitRegionOut:
    rt.register_jit(body.pid, body.start, body.end, body.path, body.build_id)
    return JitRegionOut(**body.model_dump())


@router.get("/symbols/data")
def get_data(rt: Runtime, q: Annotated[ListQuery, Query()]) -> DataObjectsOut:
    limit = q.limit
    found = rt.symbolizer.data_objects(q.pid, limit + 1)
    return DataObjectsOut(objects=found[:limit], truncated=len(found) > limit)


@router.post("/symbols/data", dependencies=[NO_QUERY])
def post_data(rt: Runtime, body: DataObjectBody) -> DataObject:
    b = body
    object_id = rt.register_data_object(b.pid, b.address, b.name, b.type, b.size)
    return DataObject(object_id=object_id, **b.model_dump())
