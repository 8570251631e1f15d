"""One strict cattrs converter, and structuring that reports every problem with its TOML path.

Strict means: unknown keys are errors, no silent ``int(3.7)`` or ``str(3)``, a bool is not an
int, an int is accepted where a float is expected (TOML writes ``1`` for ``1.0``).
"""

from __future__ import annotations

import re

import json
import typing
from typing import Any, Iterator, Literal, TypeVar

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError

from tzrun.errors import ConfigProblem, did_you_mean

__all__ = ["make_converter", "structure", "StructureFailed", "ValueProblem", "join_path", "show"]

T = TypeVar("T")


class StructureFailed(Exception):
    """Raised by :func:`structure` with every problem found."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(map(str, problems)))


def show(value: Any) -> str:
    """A TOML-ish rendering of a value for error messages (``"fast"``, ``3.7``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "an array"
    return repr(value)


class ValueProblem(ValueError):
    """A value of the wrong type or out of its choices; its message is shown as it is."""


def _expect(kind: str, value: Any) -> ValueProblem:
    return ValueProblem(f"expected {kind}, got {show(value)}")


def _structure_int(value: Any, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expect("an integer", value)
    return value


def _structure_float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _expect("a float", value)
    return float(value)


def _structure_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise _expect("a string", value)
    return value


def _structure_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise _expect("true or false", value)
    return value


def _is_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is Literal


def _structure_literal(value: Any, tp: Any) -> Any:
    allowed = typing.get_args(tp)
    if value not in allowed or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed):
        listed = ", ".join(show(a) for a in allowed)
        raise ValueProblem(f"expected one of {listed}, got {show(value)}")
    return value


def make_converter() -> cattrs.Converter:
    """The strict converter used for the core schema and every component's options."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook_func(_is_literal, _structure_literal)

    # arrays must be arrays: cattrs would happily iterate a string into characters
    conv.register_structure_hook_factory(
        lambda tp: typing.get_origin(tp) in (tuple, list), lambda tp: _sequence_hook(conv, tp)
    )
    return conv


def _sequence_hook(conv: cattrs.Converter, tp: Any) -> Any:
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        raise TypeError(f"fixed-length tuples are not supported in configs: {tp}")
    item_type = args[0] if args else Any

    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise _expect("an array", value)
        items, errors = [], []
        for i, item in enumerate(value):
            try:
                items.append(conv.structure(item, item_type) if item_type is not Any else item)
            except Exception as exc:
                exc.__notes__ = [*getattr(exc, "__notes__", []), _IndexNote(i)]
                errors.append(exc)
        if errors:
            raise cattrs.IterableValidationError("invalid items", errors, tp)
        return origin(items)

    return hook


def _IndexNote(index: int) -> str:
    """A note cattrs' error transformer reads as a list index."""
    from cattrs.errors import IterableValidationNote

    return IterableValidationNote(f"Structuring {index}", index, Any)


def join_path(prefix: str, suffix: str) -> str:
    """Join TOML path parts: ``join_path("train", ".lr")`` is ``train.lr``."""
    suffix = suffix.lstrip(".")
    if not prefix:
        return suffix
    if not suffix:
        return prefix
    return f"{prefix}{suffix}" if suffix.startswith("[") else f"{prefix}.{suffix}"


def _problems(exc: BaseException, where: str, tp: Any = None) -> Iterator[ConfigProblem]:
    """Every problem in ``exc`` at TOML path ``where``: cattrs' structured errors carry each
    inner error with the field name or list index it belongs to (their notes); ``tp`` is the
    type a leaf error's value was structured into."""
    if isinstance(exc, (cattrs.ClassValidationError, cattrs.IterableValidationError)):
        with_notes, without = exc.group_exceptions()
        for inner, note in with_notes:
            step = f"[{note.index!r}]" if isinstance(exc, cattrs.IterableValidationError) else note.name
            yield from _problems(inner, join_path(where, step), note.type)
        for inner in without:
            yield from _problems(inner, where)
    elif isinstance(exc, ForbiddenExtraKeysError):
        known = [f.name for f in attrs.fields(exc.cl)] if attrs.has(exc.cl) else []
        for key in sorted(exc.extra_fields):
            guess = did_you_mean(key, known)
            hint = f"; did you mean '{guess}'?" if guess else ""
            yield ConfigProblem(join_path(where, key), f"unknown key (known keys: {', '.join(known) or 'none'}{hint})")
    else:
        keyed = _validator_key(exc) if isinstance(exc, ValueError) and not isinstance(exc, ValueProblem) else None
        if keyed is not None:
            yield ConfigProblem(join_path(where, keyed[0]), keyed[1])
        else:
            yield ConfigProblem(where, _message(exc, tp))


def _message(exc: BaseException, tp: Any) -> str:
    """The text of an error that names no key of its own."""
    if isinstance(exc, ValueProblem):
        return str(exc)
    if isinstance(exc, KeyError):
        return f"required key {exc.args[0]!r} is missing"
    if isinstance(exc, (ValueError, TypeError)) and tp is not None:
        return f"expected {getattr(tp, '__name__', tp)}: {exc}"
    if isinstance(exc, ValueError):  # an attrs validator's own message
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _validator_key(exc: ValueError) -> tuple[str, str] | None:
    """``(key, message)`` when a validator's error names the field it rejected: ours pass the
    ``attrs.Attribute`` as the second argument, attrs' built-in ones word it
    ``'lr' must be >= 0.0: -1.0``."""
    if len(exc.args) > 1 and isinstance(exc.args[1], attrs.Attribute):
        return exc.args[1].name, str(exc.args[0])
    named = _ATTRS_MESSAGE.match(str(exc))
    if named:
        key, condition, value = named.groups()
        return key, f"must be {condition}, got {value}"
    return None


#: How attrs' built-in validators word a failure: ``'lr' must be >= 0.0: -1.0``.
_ATTRS_MESSAGE = re.compile(r"^'([A-Za-z_][A-Za-z0-9_]*)' must be (.+): (.+)$", re.S)


def structure(conv: cattrs.Converter, data: Any, cls: type[T], path: str) -> T:
    """Structure ``data`` into ``cls``, collecting every problem with its TOML path.

    Args:
        conv: the strict converter.
        data: what ``tomllib`` produced for this section.
        cls: the attrs class to build.
        path: the TOML path of ``data`` (``""`` for the whole file).

    Raises:
        StructureFailed: with every problem, one per bad key.
    """
    if attrs.has(cls) and not isinstance(data, dict):
        raise StructureFailed([ConfigProblem(path, f"expected a table, got {show(data)}")])
    try:
        return conv.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        if not isinstance(exc, cattrs.BaseValidationError):
            # an attrs validator (or __attrs_post_init__) rejected the values; attrs' own
            # validators (and ours) pass the field as the second argument: name its key
            keyed = _validator_key(exc) if isinstance(exc, ValueError) else None
            if keyed is not None and attrs.has(cls) and keyed[0] in attrs.fields_dict(cls):
                raise StructureFailed([ConfigProblem(join_path(path, keyed[0]), keyed[1])]) from exc
            raise StructureFailed([ConfigProblem(path, str(exc))]) from exc
        problems = list(_problems(exc, path))
        raise StructureFailed(problems) from exc
