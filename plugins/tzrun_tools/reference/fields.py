"""The cells of a key's table row: its TOML type, bounds and default, from an attrs field."""

from __future__ import annotations

import json
import sys
import types
import typing
from typing import Any, Literal, Mapping, Union

import attrs

from tzrun.config.schema import Component
from tzrun.config.toml_text import default_value, toml_value
from tzrun_tools.reference.docstrings import code_span, table_cell

__all__ = [
    "TABLE_HEAD",
    "Written",
    "unwrap_optional",
    "item_type",
    "toml_value",
    "default_value",
    "field_default_cell",
    "field_type_cell",
    "table_row",
    "field_hints",
]


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``Optional[X]`` (and ``X | None``), else ``(hint, False)``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True
    return hint, False


_SCALARS = {bool: ("boolean", "booleans"), int: ("integer", "integers"), float: ("float", "floats"),
            str: ("string", "strings")}


def item_type(hint: Any) -> Any:
    """``X`` for ``tuple[X, ...]`` (and ``list[X]``), else None."""
    if typing.get_origin(hint) in (tuple, list):
        args = typing.get_args(hint)
        if args and (len(args) == 1 or args[1] is Ellipsis):
            return args[0]
    return None


def _toml_type(hint: Any, plural: bool = False) -> str:
    """The TOML name of a type hint, as Markdown (Literal choices in code spans)."""
    hint, _ = unwrap_optional(hint)
    if hint in _SCALARS:
        return _SCALARS[hint][plural]
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + " | ".join(code_span(json.dumps(a)) for a in typing.get_args(hint))
    item = item_type(hint)
    if item is not None:
        return "array of " + _toml_type(item, plural=True)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        args = typing.get_args(hint)
        return "table of " + _toml_type(args[1], plural=True) if len(args) == 2 else "table"
    if hint is Component or (isinstance(hint, type) and attrs.has(hint)):
        return "tables" if plural else "table"
    if origin in (Union, types.UnionType):
        return " or ".join(_toml_type(a, plural) for a in typing.get_args(hint))
    if hint is Any:
        return "any value"
    return code_span(getattr(hint, "__name__", str(hint)))


def field_default_cell(field: Any) -> str:
    """The Default cell of a field: ``required``, ``unset``, ``computed``, ``its defaults`` or the value."""
    value = default_value(field)
    if field.default is attrs.NOTHING:
        return "required"
    if value is attrs.NOTHING:
        return "computed"
    if value is None:
        return "unset"
    if attrs.has(type(value)) and not isinstance(value, Component) and toml_value(value) == "{}":
        return "its defaults"
    return code_span(toml_value(value))


_OPS = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


def _constraints(validator: Any) -> list[str]:
    """The bounds of attrs' ``ge``/``gt``/``le``/``lt`` validators, nested in ``and_``/``optional``."""
    if validator is None:
        return []
    if isinstance(validator, (list, tuple)):
        return [c for v in validator for c in _constraints(v)]
    name = type(validator).__name__
    if name == "_AndValidator":
        return _constraints(validator._validators)
    if name == "_OptionalValidator":
        return _constraints(validator.validator)
    if name == "_NumberValidator" and validator.compare_op in _OPS:
        return [f"{_OPS[validator.compare_op]} {validator.bound!r}"]
    return []


def field_type_cell(field: Any, hint: Any) -> str:
    """The Type cell of a field: its TOML type, and the bounds its validators set."""
    bounds = _constraints(field.validator)
    return table_cell(_toml_type(hint) + (f" ({', '.join(bounds)})" if bounds else ""))


def table_row(key: str, type_cell: str, default_cell: str, doc: str) -> str:
    """One row of a key table (see :data:`TABLE_HEAD`)."""
    return f"| {code_span(key)} | {type_cell} | {table_cell(default_cell)} | {doc} |"


TABLE_HEAD = "| Key | Type | Default | Description |\n| --- | --- | --- | --- |"


class Written(str):
    """An annotation as written (``from __future__ import annotations`` keeps them as text)."""

    def __repr__(self) -> str:
        return str(self)


def field_hints(cls: type) -> dict[str, Any]:
    """The resolved field types; the annotations as written when a name cannot be resolved (a
    plugin that imports a type only under ``TYPE_CHECKING``)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:
        namespace = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    hints = {}
    for field in attrs.fields(cls):
        try:
            hints[field.name] = eval(field.type, dict(namespace)) if isinstance(field.type, str) else field.type
        except Exception:
            hints[field.name] = Written(field.type)
    return hints
