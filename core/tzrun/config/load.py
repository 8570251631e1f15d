"""Loading a run config: TOML, ``--set`` overrides, the two passes, one error with every problem.

Pass 1 structures the core schema (:mod:`tzrun.config.schema`). Pass 2 looks up every
``type = "..."`` component, at the places :data:`tzrun.config.slots.COMPONENT_SLOTS` names, in the
registries, and structures its other keys: the slot's core keys into its ``fields`` class, the
rest into the config class its plugin registered. Both passes run even when the other finds problems, so a user sees all of
them at once.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import attrs

from tzrun.config.array_overrides import ARRAY_OPERATORS, apply_array_override
from tzrun.config.converter import StructureFailed, ValueProblem, join_path, make_converter, show, structure
from tzrun.config.schema import Component, RunConfig
from tzrun.config.slots import COMPONENT_SLOTS
from tzrun.errors import ComponentLookupError, ConfigError, ConfigProblem
from tzrun.kernel.registry import Registries

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "RawConfig",
    "read_config",
    "parse_config",
    "apply_overrides",
    "load_config",
    "disabled_plugins",
    "strict_plugins",
]

_SEGMENT = re.compile(r"^([A-Za-z0-9_\-]+)(?:\[(\d+)\])?$")


@attrs.frozen
class RawConfig:
    """A config file as TOML gave it, with ``--set`` overrides applied.

    Attributes:
        source: the file name (or ``"<string>"``), used in every error.
        data: the parsed TOML, overrides applied.
        overridden: the keys ``--set`` (or ``--model-dir``) gave, as written
            (``features.sparse[3].num_buckets``), in order.
    """

    source: str
    data: Mapping[str, Any]
    overridden: tuple[str, ...] = ()


def parse_config(text: str, source: str = "<string>", overrides: Iterable[str] = ()) -> RawConfig:
    """Parse TOML text and apply ``--set`` overrides.

    Raises:
        ConfigError: for invalid TOML or a malformed override.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [ConfigProblem("", f"not valid TOML: {exc}")]) from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(source, [ConfigProblem("", (
            "not valid TOML for tzrec-run: arrays or inline tables nested too deeply for the parser (Python's recursion limit); flatten them"))]) from None
    overrides = list(overrides)
    problems = apply_overrides(data, overrides)
    if problems:
        raise ConfigError(source, problems)
    return RawConfig(source, data, tuple(o.partition("=")[0].strip().rstrip("".join(ARRAY_OPERATORS)).strip()
                                         for o in overrides))


def read_config(path: str | Path, overrides: Iterable[str] = ()) -> RawConfig:
    """Read a TOML config file and apply ``--set`` overrides.

    Raises:
        ConfigError: when the file is missing, is not valid TOML, or an override is malformed.
    """
    path = Path(path)
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), [ConfigProblem("", f"cannot read the config: {exc.strerror}")]) from None
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [_not_utf8(content, exc)]) from None
    return parse_config(text, str(path), overrides)


def _not_utf8(content: bytes, error: UnicodeDecodeError) -> ConfigProblem:
    """The problem of a config that is not UTF-8 (TOML is), naming the line, column and byte."""
    before = content[:error.start]
    line = before.count(b"\n") + 1
    column = error.start - (before.rfind(b"\n") + 1) + 1
    return ConfigProblem("", (
        f"not valid TOML: line {line}, column {column} (byte {error.start}): 0x{content[error.start]:02x} is not "
        "UTF-8, and a TOML file must be; save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"))


# Keys of which a config sets exactly one: ``--set`` of one replaces the file's other.
EXCLUSIVE_KEYS: tuple[tuple[str, ...], ...] = (("train.num_steps", "train.num_epochs"),)


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> list[ConfigProblem]:
    """Apply ``a.b.c=<TOML literal>`` overrides to ``data`` in place; ``a.b+=<TOML literal>``
    appends to an array and ``a.b-=<TOML literal>`` removes the items matching it
    (:mod:`tzrun.config.array_overrides`).

    A path segment may index an array of tables: ``features.sparse[3].num_buckets=100``.
    Missing tables along the path are created. Of keys that exclude each other
    (:data:`EXCLUSIVE_KEYS`: ``train.num_steps`` and ``train.num_epochs``), setting one removes
    the other from the file's values, so ``--set train.num_steps=20`` works on a config that
    trains by epochs; setting both is left for the check to refuse.

    Returns:
        One problem per malformed override (the others are still applied).
    """
    problems, done = [], set()
    for override in overrides:
        where = f"--set {override}"
        key, sep, literal = override.partition("=")
        key = key.strip()
        operator = key[-1:] if key[-1:] in ARRAY_OPERATORS else ""
        key = key[: len(key) - len(operator)].rstrip()
        if not sep or not key:
            problems.append(ConfigProblem(where, "expected KEY=VALUE, e.g. train.num_steps=100"))
            continue
        try:
            value = tomllib.loads(f"v = {literal.strip()}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):
            problems.append(
                ConfigProblem(where, f"{literal.strip()} is not a TOML value; quote strings: {key}=\"text\"")
            )
            continue
        if operator:
            problem = apply_array_override(data, key, operator, value)
        else:
            problem = _set_path(data, key, value)
        if problem:
            problems.append(ConfigProblem(where, problem))
        else:
            done.add(key)
    drop_replaced_alternatives(data, done)
    return problems


def drop_replaced_alternatives(data: dict[str, Any], set_keys: Iterable[str]) -> None:
    """Of keys that exclude each other (:data:`EXCLUSIVE_KEYS`), remove from ``data`` the ones
    that a key of ``set_keys`` (dotted paths just set) replaces; both set is left for the check."""
    set_keys = set(set_keys)
    for group in EXCLUSIVE_KEYS:
        if any(k in set_keys for k in group):
            for other in group:
                table, _, name = other.rpartition(".")
                section = data.get(table)
                if other not in set_keys and isinstance(section, dict):
                    section.pop(name, None)


def _set_path(data: dict[str, Any], key: str, value: Any) -> str | None:
    container, selector, problem = walk_key(data, key)
    if problem is None:
        container[selector] = value
    return problem


def walk_key(data: dict[str, Any], key: str) -> tuple[Any, Any, str | None]:
    """Walk the dotted ``key`` down ``data``, creating missing tables along the way.

    Returns:
        ``(container, selector, None)``: ``container[selector]`` is the place ``key`` names (a
        table and a name, or an array and an index that exists); or ``(None, None, problem)``.
    """
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        match = _SEGMENT.match(part)
        if not match:
            return None, None, f"'{part}' is not a key (use letters, digits, _ and -, and [N] for array items)"
        name, index = match.group(1), match.group(2)
        last = i == len(parts) - 1
        if not isinstance(node, dict):
            return None, None, f"'{'.'.join(parts[:i])}' is not a table"
        if index is None:
            if last:
                return node, name, None
            node = node.setdefault(name, {})
            continue
        items = node.get(name)
        if not isinstance(items, list) or int(index) >= len(items):
            size = len(items) if isinstance(items, list) else 0
            return None, None, f"'{name}' has {size} item(s); index {index} is out of range"
        if last:
            return items, int(index), None
        node = items[int(index)]
    raise AssertionError("unreachable: a key has at least one segment")


def disabled_plugins(raw: RawConfig) -> tuple[str, ...]:
    """``[plugins] disable`` read before any plugin is loaded (checked fully in pass 1)."""
    section = raw.data.get("plugins", {})
    names = section.get("disable", ()) if isinstance(section, dict) else ()
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def strict_plugins(raw: RawConfig) -> bool:
    """``[plugins] strict`` read before any plugin is loaded (checked fully in pass 1)."""
    section = raw.data.get("plugins", {})
    return isinstance(section, dict) and section.get("strict") is True


def _structure_component(value: Any, _: type) -> Component:
    if not isinstance(value, dict) or "type" not in value:
        raise ValueProblem(f'expected a table with a "type" key, e.g. {{ type = "name" }}; got {show(value)}')
    if not isinstance(value["type"], str):
        raise ValueProblem(f'"type" must be a string, got {show(value["type"])}')
    return Component(value["type"], {k: v for k, v in value.items() if k != "type"})


def _run_converter() -> Any:
    """The strict converter with component tables kept raw for pass 2."""
    conv = make_converter()
    conv.register_structure_hook(Component, _structure_component)
    return conv


def load_config(raw: RawConfig, registries: Registries) -> RunConfig:
    """Check and structure a config: both passes, every problem reported together.

    Args:
        raw: the parsed file (see :func:`read_config`).
        registries: the components available to this run.

    Returns:
        The run config, every component's ``config`` and ``fields`` set.

    Raises:
        ConfigError: listing every problem, one line each, with its TOML path.
    """
    from tzrun.config.stage_sections import in_sections, listed_twice, stage_sections

    conv = _run_converter()
    config: RunConfig | None = None
    data, sections = stage_sections(raw.data, registries["stage"], RunConfig)
    problems: list[ConfigProblem] = listed_twice(raw.data, sections)
    try:
        config = structure(conv, data, RunConfig, "")
    except StructureFailed as failed:
        problems.extend(failed.problems)
        checkable = _without(data, [p.path for p in failed.problems])
    else:
        checkable = config
    if checkable is not None:
        from tzrun.config.checks import check_run_config

        problems.extend(check_run_config(checkable))
    resolved = _Resolver(conv, registries, problems)
    resolved.run(data)
    if problems:
        raise ConfigError(raw.source, _dedupe(in_sections(problems, sections, raw.data)))
    assert config is not None
    config = resolved.apply(config)
    if sections:
        stages = tuple(attrs.evolve(c, section=sections.get(f"train.stages[{i}]", "")) for i, c in enumerate(config.train.stages))
        config = attrs.evolve(config, train=attrs.evolve(config.train, stages=stages))
    return config


def _without(data: Mapping[str, Any], paths: list[str]) -> RunConfig | None:
    """The config structured again with the keys at ``paths`` removed, so that cross-key
    checks still run when some keys are bad; None when it still cannot be structured."""
    import copy

    pruned = copy.deepcopy(dict(data))
    for path in paths:
        parts = [p for p in re.split(r"\.|(?=\[)", path) if p]
        node: Any = pruned
        for part in parts[:-1]:
            node = node[int(part[1:-1])] if part.startswith("[") and isinstance(node, list) else (node.get(part) if isinstance(node, dict) else None)
            if node is None:
                break
        last = parts[-1] if parts else ""
        if isinstance(node, dict):
            node.pop(last, None)
    try:
        return structure(_run_converter(), pruned, RunConfig, "")
    except StructureFailed:
        return None


def _dedupe(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    seen, out = set(), []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def schema_default(cls: type, name: str) -> Any:
    """The default of field ``name`` of schema class ``cls``, as the TOML a user would write
    (a component as ``{ type = ... }``): the loader fills an absent component from the schema,
    so every default is written once, there."""
    default = attrs.fields_dict(cls)[name].default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    if isinstance(default, Component):
        return {"type": default.type}
    if isinstance(default, tuple):
        return [{"type": c.type} if isinstance(c, Component) else c for c in default]
    return default


class _Resolver:
    """Pass 2: every place of :data:`COMPONENT_SLOTS`, looked up and structured, problems collected."""

    def __init__(self, conv: Any, registries: Registries, problems: list[ConfigProblem]) -> None:
        self.conv, self.registries, self.problems = conv, registries, problems
        self.found: dict[str, Component] = {}

    def run(self, data: Mapping[str, Any]) -> None:
        for slot in COMPONENT_SLOTS:
            if _slot_parent(slot) is None:
                for path, value in _places(data, RunConfig, slot.split("."), ""):
                    self.component(value, path, slot)

    def component(self, value: Any, path: str, slot: str) -> None:
        """Check the component table ``value`` at ``path``, a place of slot ``slot``."""
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            return  # structuring the table that holds it reports the shape problem
        where = COMPONENT_SLOTS[slot]
        try:
            entry = self.registries[where.kind].get(value["type"], f"{path}.type")
        except ComponentLookupError as exc:
            self.problems.append(ConfigProblem(exc.path, str(exc).split(": ", 1)[1]))
            return
        options = {k: v for k, v in value.items() if k != "type"}
        for key, why in where.omit.items():
            if key in options:
                del options[key]
                self.problems.append(ConfigProblem(f"{path}.{key}", f"{why.replace('``', '')}; remove it"))
        fields = None
        if where.fields is not None:
            names = {f.name for f in attrs.fields(where.fields)}
            core = {k: options.pop(k) for k in list(options) if k in names}
            fields = self.fields(core, path, slot, entry)
        try:
            config = structure(self.conv, options, entry.config, path)
        except StructureFailed as failed:
            self.problems.extend(failed.problems)
            return
        self.found[path] = Component(value["type"], options, config, fields)

    def fields(self, core: dict[str, Any], path: str, slot: str, entry: Any) -> Any:
        """The core keys of the component table at ``path`` structured into its slot's fields
        class, the components they hold (the slot's child slots) resolved in place."""
        cls = COMPONENT_SLOTS[slot].fields
        assert cls is not None
        children = _child_slots(slot)
        for key, child in children.items():
            for child_path, value in _places(core, cls, [key], path):
                self.component(value, child_path, child)
        missing = [f for f in attrs.fields(cls) if f.default is attrs.NOTHING and f.name not in core]
        for field in missing:
            self.problems.append(ConfigProblem(
                f"{path}.{field.name}", field.metadata.get("missing", f"required key '{field.name}' is missing")))
        if missing:
            return None
        try:
            fields: Any = structure(self.conv, core, cls, path)
        except StructureFailed as failed:
            self.problems.extend(failed.problems)
            return None
        self.check_group(fields, entry, path)
        return attrs.evolve(fields, **{key: _put(getattr(fields, key), f"{path}.{key}", self.found)
                                       for key in children})

    def check_group(self, fields: Any, entry: Any, path: str) -> None:
        """``group_by`` is required by components registered with ``group="required"`` and
        refused by those registered with ``group="none"``."""
        group = entry.extras.get("group", "none") if hasattr(entry, "extras") else "none"
        given = getattr(fields, "group_by", None)
        if group == "required" and not given:
            self.problems.append(ConfigProblem(
                f"{path}.group_by", f"'{entry.name}' groups rows: name the column that holds the group key, e.g. group_by = \"user_id\""
            ))
        elif group == "none" and given:
            self.problems.append(ConfigProblem(f"{path}.group_by", f"'{entry.name}' does not use a group key; remove group_by"))

    def apply(self, config: RunConfig) -> RunConfig:
        """``config`` with every component the schema holds directly replaced by its resolved one."""
        for slot in COMPONENT_SLOTS:
            if _slot_parent(slot) is None:
                config = _evolve_at(config, slot.split("."), "", self.found)
        return config


def _put(current: Any, path: str, found: Mapping[str, Component]) -> Any:
    """The resolved component(s) of ``found`` for ``current``, the structured value at ``path``
    (a component, an array of them, or None); a place pass 2 did not resolve keeps its value
    (the config has problems then and is never used)."""
    if isinstance(current, tuple):
        return tuple(found.get(f"{path}[{i}]", c) for i, c in enumerate(current))
    return current if current is None else found.get(path, current)


def _evolve_at(value: Any, segments: list[str], path: str, found: Mapping[str, Component]) -> Any:
    """``value`` (a schema instance at ``path``) with the component(s) at schema path
    ``segments`` below it replaced by their resolved ones."""
    name, rest = segments[0], segments[1:]
    current, key = getattr(value, name), join_path(path, name)
    if not rest:
        new = _put(current, key, found)
    elif isinstance(current, tuple):
        new = tuple(_evolve_at(item, rest, f"{key}[{i}]", found) for i, item in enumerate(current))
    else:
        new = current if current is None else _evolve_at(current, rest, key, found)
    return attrs.evolve(value, **{name: new})


def _slot_parent(path: str) -> str | None:
    """The slot of :data:`COMPONENT_SLOTS` whose component table holds slot ``path`` (None: the
    schema holds it directly)."""
    parent = path.rpartition(".")[0]
    return parent if parent in COMPONENT_SLOTS else None


def _child_slots(path: str) -> dict[str, str]:
    """``{key: slot}`` of the slots held in the core keys of slot ``path``'s component table."""
    return {s.rpartition(".")[2]: s for s in COMPONENT_SLOTS if _slot_parent(s) == path}


def _field_type(cls: type, name: str) -> tuple[Any, bool]:
    """``(type, is_array)`` of field ``name`` of schema class ``cls`` (``Optional`` unwrapped)."""
    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


def _places(node: Any, cls: type, segments: list[str], path: str) -> Iterator[tuple[str, Any]]:
    """``(TOML path, value)`` of every place at schema path ``segments`` under the raw table
    ``node`` (of schema class ``cls``, at ``path``): an absent key gives the schema's default, a
    key absent without a default (or with None) gives nothing."""
    name, rest = segments[0], segments[1:]
    table = node if isinstance(node, dict) else {}
    target, is_array = _field_type(cls, name)
    key = join_path(path, name)
    if name in table:
        value = table[name]
    elif rest and schema_default(cls, name) is None:
        return  # an optional table left out (``zch``) holds no component
    elif rest:
        value = [] if is_array else {}
    else:
        value = schema_default(cls, name)
    if value is None or value is attrs.NOTHING:
        return
    items = [(f"{key}[{i}]", item) for i, item in enumerate(_list(value))] if is_array else [(key, value)]
    for item_path, item in items:
        if rest:
            yield from _places(item, target, rest, item_path)
        else:
            yield item_path, item


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

