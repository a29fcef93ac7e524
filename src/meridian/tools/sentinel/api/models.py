"""The control plane's request and response bodies (pydantic v2), apart from the
server so that the contract reads in one place.

Requests are strict: an unknown field, a string where a number goes, a float for an
integer or a value out of range is refused (400) before anything changes, and the
ranges are the ones the kernel maps and the runtime accept, so a request the schema
allows never fails later on the consumer thread. The settings' values (budgets, hard
drop, event groups, targets) are the config's own types (config/fields.py): the same
limits and the same words as in the YAML file. A field left out or null keeps its
current value. Every limit is in the OpenAPI document, so that a client generated
from it sends only what is accepted.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue, SkipJsonSchema
from pydantic_core import CoreSchema

from ..config.fields import (
    GROUP_RULE,
    GROUP_SIZE,
    GROUPS_RULE,
    GROUPS_SIZE,
    MAX_TARGETS,
    U64,
    Budget,
    EventName,
    HardDropNs,
    ModeName,
    Pid,
    RawCode,
    U32Int,
    U64Int,
    Whole,
    rule,
)
from ..model.dataobjects import DataObject
from ..pipeline.targets import KEYS

__all__ = [
    "DataObjectBody",
    "DataObjectsOut",
    "ErrorOut",
    "JitBody",
    "JitRegionOut",
    "JitRegionsOut",
    "ListQuery",
    "ModeBody",
    "ModeOut",
    "PmuConfigBody",
    "PmuConfigOut",
    "StatusOut",
    "StoreQuery",
    "Target",
    "TargetsBody",
    "TargetsOut",
    "TokenBucketBody",
    "TokenBucketOut",
]

MAX_LIST = 10_000  # registrations a GET returns at most

Address = U64Int
NoNull = SkipJsonSchema[None]  # optional, but not nullable in the schema
# a mode's event groups as the config takes them, or raw codes as numbers
Group = Annotated[list[EventName | RawCode], GROUP_SIZE, GROUP_RULE]
Groups = Annotated[list[Group], GROUPS_SIZE, GROUPS_RULE]
# a flow id as a number, as /metrics' 16 hex digits, or 0x-hex
FlowId = U64Int | Annotated[str, Field(pattern=r"^(?:0x[0-9a-fA-F]{1,16}|[0-9a-fA-F]{16})$")]


class Body(BaseModel):
    """A request body: unknown fields, loose types and null refused (an optional key
    is left out instead, so the schema and the checks agree on every value)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("must not be null (leave the key out instead)")
        return value

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Without `"default": null`: a client (or schemathesis) would send it."""
        schema = handler(core_schema)
        for prop in handler.resolve_ref_schema(schema).get("properties", {}).values():
            if "default" in prop and prop["default"] is None:
                del prop["default"]
        return schema


class Out(BaseModel):
    """A response body."""

    model_config = ConfigDict(extra="forbid")


class StoreQuery(BaseModel):
    """The query of a GET of the agent's store (as `meridian sentinel query` takes it)."""

    model_config = ConfigDict(extra="forbid")

    since: str = Field("10m", min_length=1, max_length=32, description="such as 30s, 10m, 1h")
    event: str | NoNull = Field(default=None, min_length=1, max_length=64, description="one event")
    limit: int = Field(20, ge=1, le=MAX_LIST, description="flows (top-flows) at most")


class ListQuery(BaseModel):
    """The query of a GET of registrations (strings, converted; no other key)."""

    model_config = ConfigDict(extra="forbid")

    pid: Pid | NoNull = Field(default=None, description="one process only")
    limit: int = Field(1000, ge=1, le=MAX_LIST, description="entries at most")


class ErrorOut(Out):
    error: str = Field(description="what is wrong, naming the field")
    field: str | None = Field(
        default=None, description="the field at fault, dotted (targets.0.pid)"
    )


class ModeBody(Body):
    mode: Literal[ModeName, "auto"] = Field(
        description="pin a mode; auto: back to the mode controller's choice"
    )


class ModeOut(Out):
    mode: ModeName
    pinned: bool = Field(description="set by the control plane, not by the controller")


class TokenBucketBody(Body):
    model_config = ConfigDict(
        json_schema_extra={"not": {"required": ["samples_per_sec", "sentinel_samples_per_sec"]}}
    )

    sentinel_samples_per_sec: Budget | NoNull = None
    diagnostic_samples_per_sec: Budget | NoNull = None
    hard_drop_ns: HardDropNs | NoNull = Field(
        default=None, description="drop everything this long once empty"
    )
    samples_per_sec: Budget | NoNull = Field(
        default=None, description="legacy name of sentinel_samples_per_sec (not both)"
    )

    @field_validator("samples_per_sec")
    @classmethod
    def _one_sentinel_budget(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("sentinel_samples_per_sec") is not None:
            raise ValueError("the legacy name of sentinel_samples_per_sec: give one of them")
        return value

    @property
    def sentinel(self) -> int | None:
        return self.sentinel_samples_per_sec or self.samples_per_sec


class TokenBucketOut(Out):
    sentinel_samples_per_sec: int
    diagnostic_samples_per_sec: int
    hard_drop_ns: int
    samples_per_sec: int = Field(description="the budget in force: the current mode's")
    mode: ModeName


class PmuConfigBody(Body):
    sentinel_groups: Groups | NoNull = None
    diagnostic_groups: Groups | NoNull = None


class PmuConfigOut(Out):
    sentinel_groups: list[list[str]]
    diagnostic_groups: list[list[str]]


class JitBody(Body):
    pid: Pid
    start: Address
    end: Address = Field(description="above start: the region is [start, end)")
    path: str = Field(min_length=1, max_length=4096, description="an ELF image, or a name")
    build_id: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{2,128}$")] | NoNull = None

    @field_validator("end")
    @classmethod
    def _not_empty(cls, value: int, info: ValidationInfo) -> int:
        start = info.data.get("start")
        if start is not None and value <= start:
            raise ValueError(f"must be above start ({start})")
        return value


class JitRegionOut(Out):
    pid: int
    start: int
    end: int
    path: str
    build_id: str | None = None


class JitRegionsOut(Out):
    regions: list[JitRegionOut]
    truncated: bool = Field(description="more regions than the limit asked for")


class DataObjectBody(Body):
    pid: Pid
    address: Address
    name: str = Field(min_length=1, max_length=512)
    type: Annotated[str, Field(min_length=1, max_length=512)] | NoNull = None
    size: Annotated[int, Field(ge=1, le=U64), rule(f"must be from 1 to {U64}"), Whole] | NoNull = (
        None
    )


class DataObjectsOut(Out):
    objects: list[DataObject]  # the symbolizer's own record, as the response model
    truncated: bool


class Target(Body):
    """Samples matching every key given (at least one; null is no value here)."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    flow_id: FlowId | NoNull = None
    pid: U32Int | NoNull = None
    tid: U32Int | NoNull = None
    cgroup: U64Int | NoNull = None
    ifindex: U32Int | NoNull = None

    @model_validator(mode="after")
    def _names_one(self) -> Target:
        if not self.model_fields_set:
            raise ValueError(f"a target names at least one of {', '.join(KEYS)}")
        return self

    def given(self) -> dict[str, Any]:
        """The keys given a value (null ones are not a condition)."""
        return self.model_dump(exclude_none=True)


class TargetsBody(Body):
    targets: list[Target] = Field(max_length=MAX_TARGETS, description="[]: everything")


class TargetOut(Out):
    flow_id: int | None = None
    pid: int | None = None
    tid: int | None = None
    cgroup: int | None = None
    ifindex: int | None = None


class TargetsOut(Out):
    targets: list[TargetOut]


class StorageOut(Out):
    backend: str
    connected: bool
    stored_rows: int = Field(description="rows the store acknowledged since start")
    backlog_rows: int = Field(description="rows not stored yet (memory and spool)")
    spooled_rows: int = Field(description="rows on disk in the spool, not stored yet")
    spool_bytes: int
    dropped_rows: int
    flush_errors: int


class StatusOut(Out):
    mode: ModeName
    pinned: bool
    source: str
    events: list[str]
    groups: dict[str, list[list[str]]]
    samples_per_sec_budget: int
    hard_drop_ns: int
    samples_per_sec: float = Field(description="delivered in the last window, all CPUs")
    scales: dict[str, float] = Field(
        description="each event's sample scale: the inverse of the share of the time "
        "it was really sampled (PMU rotation, kernel multiplexing)"
    )
    safety_level: str
    throttled: bool
    dropped: dict[str, int]
    samples_delivered: int
    samples_kept: int
    labelled: dict[str, int]
    targets: list[TargetOut]
    running: bool
    storage: StorageOut | None = Field(description="null: nothing is stored")
