"""``--set KEY+=VALUE`` and ``--set KEY-=VALUE``: append items to an array of the config, and
remove the items that match a pattern (``docs/config.md``, "Overriding keys").

* ``train.stages+=[{type = "tensorboard"}]`` appends each item of the array; a value that is
  not an array is appended as one item (``data.train_input+="more/*.parquet"``).
* ``train.stages-=[{type = "progress"}]`` removes every item that matches an item of the array
  (or the value, when it is not an array). A table matches an item that is a table holding each
  of its keys with an equal value (``{type = "progress"}`` matches ``{type = "progress", mode =
  "bar"}``); any other value matches an equal item. A pattern that matches nothing is an error.
* When the config does not set the array, the schema's default is the starting point
  (``train.stages`` starts from ``progress`` and ``metrics_log``), so an append never drops
  what the run would otherwise have.
"""

from __future__ import annotations

import typing
from typing import Any

import attrs

__all__ = ["ARRAY_OPERATORS", "apply_array_override"]

#: The operators, by the character before ``=``.
ARRAY_OPERATORS = {"+": "append", "-": "remove"}


def apply_array_override(data: dict[str, Any], key: str, operator: str, value: Any) -> str | None:
    """Append ``value`` to, or remove what matches it from, the array at ``key`` of ``data``.

    Args:
        data: the parsed TOML, changed in place.
        key: the dotted TOML path of the array (``train.stages``).
        operator: ``"+"`` (append) or ``"-"`` (remove).
        value: the parsed TOML value after the operator.

    Returns:
        None, or the problem (one line naming ``key``).
    """
    from tzrun.config.load import walk_key

    container, selector, problem = walk_key(data, key)
    if problem:
        return problem
    if isinstance(container, dict) and selector not in container:
        default = schema_array_default(key)
        if default is None:
            return (f"{key}: the config does not set this array and it has no default to start from; "
                    f"set it whole with {key}=[...]")
        container[selector] = default
    items = container[selector]
    if not isinstance(items, list):
        return f"{key}: {_toml(items)} is not an array; {ARRAY_OPERATORS[operator]} works on arrays only"
    given = value if isinstance(value, list) else [value]
    if operator == "+":
        items.extend(given)
        return None
    for pattern in given:
        kept = [item for item in items if not _matches(pattern, item)]
        if len(kept) == len(items):
            shown = ", ".join(_toml(i) for i in items) or "none"
            return f"{key}: no item matches {_toml(pattern)} (the items: {shown})"
        items[:] = kept
    return None


def _matches(pattern: Any, item: Any) -> bool:
    """Whether ``item`` matches ``pattern`` (a table matches the tables holding its keys and values)."""
    if isinstance(pattern, dict):
        return isinstance(item, dict) and all(k in item and _matches(v, item[k]) for k, v in pattern.items())
    return type(pattern) is type(item) and pattern == item


def _toml(value: Any) -> str:
    """``value`` as a short TOML literal, for messages."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def schema_array_default(key: str) -> list[Any] | None:
    """The schema's default of the array at ``key`` as TOML would write it, or None when
    ``key`` is not an array field of the core schema (a component's option, an unknown key)."""
    from tzrun.config.load import schema_default
    from tzrun.config.schema import RunConfig

    cls: Any = RunConfig
    *parents, last = key.split(".")
    for segment in parents:
        field_type = _field_type(cls, segment)
        if field_type is None or not attrs.has(field_type):
            return None
        cls = field_type
    if last not in attrs.fields_dict(cls):
        return None
    default = schema_default(cls, last)
    return list(default) if isinstance(default, list) else None


def _field_type(cls: type, name: str) -> Any:
    """The resolved type of field ``name`` of attrs class ``cls``, or None."""
    if not attrs.has(cls) or name not in attrs.fields_dict(cls):
        return None
    return typing.get_type_hints(cls).get(name)
