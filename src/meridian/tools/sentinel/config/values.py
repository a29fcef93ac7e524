"""Reading one configuration value: YAML or command-line text to a key's type, with
a one-line `UsageError` naming the key, and the closest known key for a typo. Shared by
the file reader and the flag merger so both say the same thing.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from typing import Any

from ....durations import parse_duration
from ....errors import UsageError
from .schema import DURATION, SentinelConfig

__all__ = ["copy_value", "key_fields", "set_key", "show_value", "unknown_key"]


def copy_value(v: Any) -> Any:
    """A deep copy of a list value, so a merged config never shares lists."""
    return [copy_value(x) for x in v] if isinstance(v, list) else v


def show_value(v: Any) -> str:
    """A value as messages quote it: strings in quotes, None as null."""
    return repr(v) if isinstance(v, str) else json.dumps(v) if v is None else str(v)


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    plural = {int: "integers", float: "numbers", str: "strings"}
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args[0] in plural:
        return f"a list of {plural[args[0]]}"
    if origin is list:
        return "a list of lists, such as [[cycles, llc-misses]]"
    inner = _optional(tp)
    return f"{_type_name(inner)} or null" if inner is not None else str(tp)


def _optional(tp: Any) -> Any:
    """X for `X | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return None


def _coerce(value: Any, tp: Any, kind: str, text_ok: bool) -> Any:
    """`value` as type `tp`, or raise ValueError. `text_ok`: a command-line string is
    converted (YAML values must already have the right type)."""
    inner = _optional(tp)
    if inner is not None:
        try:
            return None if value is None else _coerce(value, inner, kind, text_ok)
        except ValueError as exc:
            raise ValueError(f"{exc} or null") from None
    if kind == DURATION:
        return parse_duration(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if text_ok and isinstance(value, int) and value in (0, 1):
            return bool(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text_ok and isinstance(value, str) and re.fullmatch(r"\s*[-+]?[0-9]+\s*", value):
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if text_ok and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, list):
            try:
                return [_coerce(v, item, "", text_ok) for v in value]
            except ValueError:
                pass  # named as a whole below
    raise ValueError(f"expected {_type_name(tp)}")


def key_fields(obj: Any) -> dict[str, tuple[dataclasses.Field[Any], Any]]:
    """name -> (field, resolved type) of a dataclass."""
    hints = typing.get_type_hints(type(obj))
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(obj)}


def set_key(section: Any, name: str, value: Any, label: str, text_ok: bool = False) -> None:
    """Coerce and store one value; a bad one is a UsageError naming `label`."""
    f, tp = key_fields(section)[name]
    try:
        setattr(section, name, _coerce(value, tp, f.metadata.get("kind", ""), text_ok))
    except ValueError as exc:
        raise UsageError(f"{label}: {exc}, got {show_value(value)}") from None


def _all_keys() -> list[str]:
    cfg = SentinelConfig()
    return [f"{s}.{k}" for s in key_fields(cfg) for k in key_fields(getattr(cfg, s))]


def unknown_key(key: str, known: list[str], where: str) -> UsageError:
    """An unknown key, with the closest known one (in its section, or elsewhere)."""
    full = f"{where}.{key}" if where else key
    everywhere = _all_keys()
    leaf = {k: k.rsplit(".", 1)[1] for k in everywhere}
    same = [k for k in everywhere if leaf[k] == key]  # a key put in the wrong section
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if same:
        hint = same[0]
    elif close:
        hint = f"{where}.{close[0]}" if where else close[0]
    else:
        near = difflib.get_close_matches(key, list(leaf.values()), n=1, cutoff=0.6)
        hint = next((k for k in everywhere if near and leaf[k] == near[0]), "")
    tail = f": did you mean {hint}?" if hint else f"; known: {', '.join(known)}"
    return UsageError(f"unknown key {full}{tail}")
