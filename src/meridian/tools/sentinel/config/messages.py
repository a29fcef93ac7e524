"""Pydantic's errors as one line a person acts on: the key (or the flag that set it),
what is wrong, the value; for an unknown key, the closest known one (difflib), in its
section or in another. The control plane words its 400s with `describe` too, so a
value is refused in the same words from a file, a flag or a request.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from ....errors import UsageError

__all__ = ["describe", "got", "problem", "seed_keys", "show_value", "type_text"]

# pydantic's error type -> what was expected instead
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "a mapping of keys",
    "dict_type": "a mapping of keys",
}
_PLURAL = {int: "integers", float: "numbers", str: "strings"}
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def show_value(v: Any) -> str:
    """A value as messages quote it: strings in quotes, None as null."""
    return repr(v) if isinstance(v, str) else json.dumps(v) if v is None else str(v)


def got(err: ErrorDetails) -> Any:
    """The value at fault: as a rule saw it (converted), else as given."""
    return (err.get("ctx") or {}).get("got", err["input"])


def describe(err: ErrorDetails) -> str:
    """What is wrong, without the key or the value: a rule's sentence, or the type
    that was expected."""
    kind = err["type"]
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}"
    if kind == "literal_error":
        return "must be " + str((err.get("ctx") or {}).get("expected", "")).replace("'", "")
    return str(err["msg"]).removeprefix("Value error, ")


def _bare(tp: Any) -> Any:
    """`X` of `Annotated[X, ...]`."""
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def type_text(tp: Any) -> str:
    """A key's type as its messages name it: "a list of integers", "a string or null"."""
    tp = _bare(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _NAMES:
        return _NAMES[tp]
    if origin is list:
        item = _bare(args[0])
        if item in _PLURAL:
            return f"a list of {_PLURAL[item]}"
        return "a list of lists, such as [[cycles, llc-misses]]"
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return f"{type_text(rest[0])} or null"
    return str(tp)


def _section(root: type[BaseModel], name: str) -> type[BaseModel]:
    section = root.model_fields[name].annotation
    assert isinstance(section, type) and issubclass(section, BaseModel)
    return section


def seed_keys(root: type[BaseModel]) -> dict[str, dict[str, str]]:
    """section -> {the name docs/requirements/sentinel.md gives a key: our name}, for
    the keys it names otherwise (schema.py's `_key(..., seed=)`)."""
    out: dict[str, dict[str, str]] = {}
    for name in root.model_fields:
        for key, f in _section(root, name).model_fields.items():
            extra = f.json_schema_extra
            if isinstance(extra, dict) and isinstance(extra.get("seed"), str):
                out.setdefault(name, {})[str(extra["seed"])] = key
    return out


def _keys(root: type[BaseModel]) -> dict[str, list[str]]:
    """section -> its keys, their names in docs/requirements/sentinel.md too."""
    seed = seed_keys(root)
    return {
        name: [*_section(root, name).model_fields, *seed.get(name, {})]
        for name in root.model_fields
    }


def _unknown(loc: Sequence[str], root: type[BaseModel]) -> str:
    """An unknown section or key, with the closest known one: the same key in another
    section, a close key in its own section, or a close key in another."""
    keys = _keys(root)
    everywhere = [f"{s}.{k}" for s, ks in keys.items() for k in ks]
    key = loc[-1]
    known = keys[loc[0]] if len(loc) > 1 else list(keys)
    where = f"{loc[0]}." if len(loc) > 1 else ""
    same = [k for k in everywhere if k.rsplit(".", 1)[1] == key]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    leaves = [k.rsplit(".", 1)[1] for k in everywhere]
    near = difflib.get_close_matches(key, leaves, n=1, cutoff=0.6)
    if same:
        hint = same[0]
    elif close:
        hint = where + close[0]
    else:
        hint = everywhere[leaves.index(near[0])] if near else ""
    tail = f": did you mean {hint}?" if hint else f"; known: {', '.join(known)}"
    return f"unknown key {'.'.join(loc)}{tail}"


def problem(
    errors: Sequence[ErrorDetails],
    root: type[BaseModel],
    data: Mapping[str, Any],
    label: Callable[[str], str],
    prefix: Sequence[str] = (),
) -> UsageError:
    """The first of `errors` (of validating `data` as `root`, sections of keys; `prefix`
    before their locations) as one line: unknown keys first, as a typo explains the
    rest. `label(key)` names a key (the flag that set it, on the command line). A wrong
    type names the whole key and its value; a value out of its limits, the value at
    fault."""
    err = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = [*prefix, *(str(p) for p in err["loc"])]
    ctx = err.get("ctx") or {}
    if err["type"] == "extra_forbidden":
        return UsageError(_unknown(loc, root))
    if len(loc) == 1 and err["type"] == "model_type":
        return UsageError(f"{loc[0]}: expected a mapping of keys, got {show_value(err['input'])}")
    if "key" in ctx:  # a rule across keys, checked by the section: ctx names the key
        loc = [loc[0], ctx["key"]]
    value = got(err)
    key = ".".join(loc[:2])
    text = describe(err)
    if err["type"] in _EXPECTED and len(loc) >= 2:
        section = _section(root, loc[0])
        text = f"expected {type_text(section.model_fields[loc[1]].annotation)}"
        value = data.get(loc[0], {}).get(loc[1], value)
    return UsageError(f"{label(key)}: {text}, got {show_value(value)}")
