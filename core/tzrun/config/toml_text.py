"""TOML text of values: the one TOML literal writer of tzrec-run (``resolved_config.toml``,
``convert``, the reference pages, ``tzrec-run plugins``) and a config default as TOML. Part of the
config layer, so that the kernel and the tools read defaults the same way without importing each
other."""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

import attrs

from tzrun.config.base import Component

__all__ = ["toml_literal", "toml_key", "toml_value", "default_value"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(key: str) -> str:
    """``key`` as a TOML key: bare when it can be, else quoted."""
    return key if _BARE_KEY.match(key) else json.dumps(key)


def toml_literal(value: Any) -> str:
    """``value`` (TOML-shaped: dict, list, str, int, float, bool) as a TOML literal, tables inline;
    the one TOML writer of tzrec-run (``resolved_config.toml``, ``convert``, the reference pages).

    Raises:
        TypeError: a value that TOML cannot hold (None, say).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_literal(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")



def _toml_shaped(value: Any) -> Any:
    """``value`` as TOML-shaped data: a component as its table, an attrs instance as the keys it
    changes, tuples as lists."""
    if isinstance(value, Component):
        return {"type": value.type, **{k: _toml_shaped(v) for k, v in value.raw.items()}}
    if isinstance(value, (tuple, list)):
        return [_toml_shaped(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _toml_shaped(v) for k, v in value.items()}
    if attrs.has(type(value)):
        return {f.name: _toml_shaped(getattr(value, f.name)) for f in attrs.fields(type(value))
                if f.default is attrs.NOTHING or getattr(value, f.name) != default_value(f)}
    return value


def toml_value(value: Any) -> str:
    """A default value as TOML text (an attrs instance shows only the keys it changes), written by
    :func:`tzrun.runner.records.toml_literal`; a value TOML cannot hold shows as its ``repr``."""
    try:
        return toml_literal(_toml_shaped(value))
    except TypeError:
        return repr(value)


def default_value(field: Any) -> Any:
    """The default of an attrs field (a factory called; ``attrs.NOTHING`` when there is none)."""
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return attrs.NOTHING if default.takes_self else default.factory()
    return default
