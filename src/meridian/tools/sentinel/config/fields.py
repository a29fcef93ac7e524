"""The value types of sentinel's settings, shared by the YAML config and the control
plane's request bodies so that both accept exactly the same values. Each type holds
its limits (which the OpenAPI document shows too) and the one sentence that states
them, said the same from a file, a flag or a request.

Limits are what the kernel maps and the runtime accept: a budget above 10,000,000
samples/s per CPU, a hard drop above an hour, more than 16 event groups of 16 events
or more than 1,024 targets is refused wherever it comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from ....durations import parse_duration
from ....errors import UsageError
from ..model.records import MAX_SLOTS
from ..sources.pmu_events import LOGICAL, EventSpec, parse_event, parse_events
from .messages import describe, got, show_value

__all__ = [
    "DURATION",
    "GROUPS_RULE",
    "GROUPS_SIZE",
    "GROUP_RULE",
    "GROUP_SIZE",
    "MAX_TARGETS",
    "U64",
    "Budget",
    "EventGroups",
    "EventName",
    "HardDropNs",
    "IfName",
    "LbrMode",
    "ModeName",
    "Pid",
    "Port",
    "RawCode",
    "U32Int",
    "U64Int",
    "Whole",
    "parse_groups",
    "rule",
]

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
PID_MAX = 1 << 22  # PID_MAX_LIMIT: no process or thread id is above it
MAX_BUDGET = 10_000_000  # samples/s per CPU: far above any PMU's sampling rate
MAX_HARD_DROP_NS = 3600 * 10**9
MAX_GROUPS = 16
MAX_EVENTS = MAX_SLOTS  # events open at once: the kernel side has a slot each
MAX_TARGETS = 1024  # ms_target_pids' size: every pid target fits the kernel map

# the errors of a value's limits (Field's constraints), said by a rule's sentence
_BOUNDS = frozenset(
    {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}
)
_LIMITS = _BOUNDS | {
    "too_short",
    "too_long",
    "string_pattern_mismatch",
    "string_too_short",
    "string_too_long",
}


def _number(value: Any) -> Any:
    """A number given as text (a flag: lax validation converts it) as the number."""
    if not isinstance(value, str):
        return value
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def rule(sentence: str | Callable[[Any], str]) -> WrapValidator:
    """The limits before it in an Annotated type, stated by `sentence` (or by
    `sentence(value)`) instead of pydantic's words; a wrong type, and a bad item of a
    list (which has its own rule), pass through as they are. `got` is the value as
    converted (a flag's "-5" is -5)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            errors = exc.errors()
            if any(e["loc"] or e["type"] not in _LIMITS for e in errors):
                raise
            seen = errors[0]["input"]
            seen = _number(seen) if errors[0]["type"] in _BOUNDS else seen
            text = sentence(seen) if callable(sentence) else sentence
            raise PydanticCustomError("limit", "{rule}", {"rule": text, "got": seen}) from None

    return WrapValidator(check)


def _whole(value: object) -> object:
    """5.0 is an integer to JSON Schema (and so to the document): taken as 5; 5.5 and
    strings are still refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# after the bounds in an Annotated type, so that the document keeps them
Whole = BeforeValidator(_whole)
# seconds, or a string with a unit; last in an Annotated type, so that its bounds and
# its rule see the number of seconds
DURATION = BeforeValidator(parse_duration)

U32Int = Annotated[int, Field(ge=0, le=U32), rule(f"must be from 0 to {U32}"), Whole]
U64Int = Annotated[int, Field(ge=0, le=U64), rule(f"must be from 0 to {U64}"), Whole]
Pid = Annotated[int, Field(ge=1, le=PID_MAX), rule(f"a process id is from 1 to {PID_MAX}"), Whole]
Port = Annotated[int, Field(ge=0, le=65535), rule("must be from 0 to 65535"), Whole]
Budget = Annotated[
    int,
    Field(gt=0, le=MAX_BUDGET, description="samples per second per CPU"),
    rule(f"a budget is samples per second per CPU and must be positive and at most {MAX_BUDGET}"),
    Whole,
]
HardDropNs = Annotated[
    int,
    Field(ge=0, le=MAX_HARD_DROP_NS),
    rule(f"must be from 0 (off) to {MAX_HARD_DROP_NS} nanoseconds (an hour)"),
    Whole,
]
IfName = Annotated[
    str,
    Field(pattern=r"^[^\s/:]{1,15}$"),
    rule("an interface name has 1 to 15 characters, no '/', ':' or space"),
]
ModeName = Literal["sentinel", "diagnostic"]


def _lbr_mode(value: Any) -> Any:
    """YAML's on/off/true/false (booleans to PyYAML) and a bare `--lbr` ("on"): on is
    branch-stack, the sample's own branch records (sources/lbr.py)."""
    if value is True or value == "on":
        return "branch-stack"
    return "off" if value is False else value


# sources/lbr.py's MODES, by name
LbrMode = Annotated[Literal["off", "branch-stack", "snapshot"], BeforeValidator(_lbr_mode)]


def _event_pattern() -> str:
    """Logical names (hardware ones with perf's :p, :pp or :ppp) or raw codes that
    fit 64 bits, written the canonical way: what parse_event takes, minus aliases,
    upper case and spaces."""
    hw = "|".join(n for n, s in LOGICAL.items() if s.hardware)
    sw = "|".join(n for n, s in LOGICAL.items() if not s.hardware)
    hexa = "[0-9a-f]{1,16}"
    raw = f"(?:raw:(?:0x)?|r){hexa}(?::(?:0x)?{hexa})?"
    return f"^(?:(?:{hw}|{raw})(?::p{{1,3}})?|{sw})$"


def _spelling(spec: EventSpec) -> str:
    """The canonical name of a parsed event."""
    logical = LOGICAL.get(spec.name)
    if logical is None or spec.precise == logical.precise:
        return spec.name
    return f"{spec.name}:{'p' * spec.precise}"


def _event_problem(value: Any) -> str:
    """What is wrong with an event name: parse_event's own words, or the canonical
    spelling of a name it reads but the document does not allow."""
    try:
        spec = parse_event(str(value))
    except UsageError as exc:
        return str(exc)
    return f"event {value!r}: write it {_spelling(spec)!r}"


EventName = Annotated[
    str,
    Field(pattern=_event_pattern(), description="a logical event or raw:0xCODE[:0xCONFIG1]"),
    rule(_event_problem),
]
RawCode = Annotated[
    int,
    Field(ge=0, le=U64, description="a raw PMU event code"),
    rule(f"a raw PMU event code is from 0 to {U64}"),
    Whole,
]
# the limits of an event group and of a mode's groups, for any item type
GROUP_SIZE = Field(min_length=1, max_length=MAX_EVENTS)
GROUP_RULE = rule(f"an event group needs 1 to {MAX_EVENTS} events")
GROUPS_SIZE = Field(min_length=1, max_length=MAX_GROUPS)
GROUPS_RULE = rule(f"needs 1 to {MAX_GROUPS} event groups")
EventGroups = Annotated[
    list[Annotated[list[EventName], GROUP_SIZE, GROUP_RULE]], GROUPS_SIZE, GROUPS_RULE
]
_GROUPS: TypeAdapter[list[list[str]]] = TypeAdapter(
    EventGroups, config=ConfigDict(defer_build=True)
)


def parse_groups(groups: list[list[str]], label: str) -> list[list[EventSpec]]:
    """Event groups to `EventSpec` groups, checked as the settings check them; a
    mistake is a UsageError naming `label`."""
    try:
        _GROUPS.validate_python(groups, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UsageError(f"{label}: {describe(err)}, got {show_value(got(err))}") from None
    return [parse_events(",".join(g)) for g in groups]
