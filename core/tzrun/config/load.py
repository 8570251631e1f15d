"""Loading a run config: TOML, ``--set`` overrides, the two passes, one error with every problem.

Pass 1 structures the core schema (:mod:`tzrun.config.schema`). Pass 2 looks up every
``type = "..."`` component in the registries and structures its other keys into the config class
its plugin registered. Both passes run even when the other finds problems, so a user sees all of
them at once.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import attrs

from tzrun.config.converter import StructureFailed, ValueProblem, make_converter, show, structure
from tzrun.config.schema import (
    Component,
    DataConfig,
    DenseOptimizerFields,
    EMAConfig,
    PartFields,
    RunConfig,
    SparseOptimizerFields,
    TrainConfig,
)
from tzrun.config.slots import COMPONENT_SLOTS
from tzrun.errors import ComponentLookupError, ConfigError, ConfigProblem
from tzrun.registry import Registries

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
    return RawConfig(source, data, tuple(o.partition("=")[0].strip() for o in overrides))


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
    """Apply ``a.b.c=<TOML literal>`` overrides to ``data`` in place.

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
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        match = _SEGMENT.match(part)
        if not match:
            return f"'{part}' is not a key (use letters, digits, _ and -, and [N] for array items)"
        name, index = match.group(1), match.group(2)
        last = i == len(parts) - 1
        if not isinstance(node, dict):
            return f"'{'.'.join(parts[:i])}' is not a table"
        if index is None:
            if last:
                node[name] = value
            else:
                node = node.setdefault(name, {})
            continue
        items = node.get(name)
        if not isinstance(items, list) or int(index) >= len(items):
            size = len(items) if isinstance(items, list) else 0
            return f"'{name}' has {size} item(s); index {index} is out of range"
        if last:
            items[int(index)] = value
        else:
            node = items[int(index)]
    return None


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
    conv = _run_converter()
    problems: list[ConfigProblem] = []
    config: RunConfig | None = None
    try:
        config = structure(conv, dict(raw.data), RunConfig, "")
    except StructureFailed as failed:
        problems.extend(failed.problems)
        checkable = _without(raw.data, [p.path for p in failed.problems])
    else:
        checkable = config
    if checkable is not None:
        from tzrun.config.checks import check_run_config

        problems.extend(check_run_config(checkable))
    resolved = _Resolver(conv, registries, problems)
    resolved.run(raw.data)
    if problems:
        raise ConfigError(raw.source, _dedupe(problems))
    assert config is not None
    return resolved.apply(config)


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
    """Pass 2: every component location, looked up and structured, problems collected."""

    def __init__(self, conv: Any, registries: Registries, problems: list[ConfigProblem]) -> None:
        self.conv, self.registries, self.problems = conv, registries, problems
        self.found: dict[str, Component] = {}

    def run(self, data: Mapping[str, Any]) -> None:
        data_section = _table(data.get("data"))
        self.slot(data_section.get("reader", schema_default(DataConfig, "reader")), "data.reader", "data.reader")
        if "sampler" in data_section:
            self.slot(data_section["sampler"], "data.sampler", "data.sampler")
        if "model" in data:
            self.slot(data["model"], "model", "model")
        train = _table(data.get("train"))
        if "sparse_optimizer" in train:
            self.slot(train["sparse_optimizer"], "train.sparse_optimizer", "train.sparse_optimizer")
        if "dense_optimizer" in train:
            self.slot(train["dense_optimizer"], "train.dense_optimizer", "train.dense_optimizer")
        features = _table(data.get("features"))
        for i, feature in enumerate(_list(features.get("sparse"))):
            if isinstance(feature, dict) and "sparse_optimizer" in feature:
                path = f"features.sparse[{i}].sparse_optimizer"
                value = feature["sparse_optimizer"]
                if isinstance(value, dict) and "lr_schedule" in value:
                    self.problems.append(ConfigProblem(
                        f"{path}.lr_schedule",
                        "per-table sparse optimizers share train.sparse_optimizer.lr_schedule (applied to their own lr); remove it",
                    ))
                    value = {k: v for k, v in value.items() if k != "lr_schedule"}
                self.slot(value, path, "features.sparse.sparse_optimizer")
        self.slot(train.get("pipeline", schema_default(TrainConfig, "pipeline")), "train.pipeline", "train.pipeline")
        for i, stage in enumerate(_list(train.get("stages", schema_default(TrainConfig, "stages")))):
            self.slot(stage, f"train.stages[{i}]", "train.stages")
        self.slot(train.get("loss_weighting", schema_default(TrainConfig, "loss_weighting")), "train.loss_weighting",
                  "train.loss_weighting")
        for i, loss in enumerate(_list(data.get("losses"))):
            self.slot(loss, f"losses[{i}]", "losses")
        for i, metric in enumerate(_list(data.get("metrics"))):
            self.slot(metric, f"metrics[{i}]", "metrics")
        for i, metric in enumerate(_list(data.get("train_metrics"))):
            self.slot(metric, f"train_metrics[{i}]", "train_metrics")

    def slot(self, value: Any, path: str, slot: str) -> None:
        """Check the component table ``value`` at ``path``, a place of :data:`COMPONENT_SLOTS`."""
        where = COMPONENT_SLOTS[slot]
        self.component(value, path, where.kind, where.fields)

    def component(self, value: Any, path: str, kind: str, fields_cls: type | None = None) -> None:
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            return  # pass 1 reports the shape problem
        try:
            entry = self.registries[kind].get(value["type"], f"{path}.type")
        except ComponentLookupError as exc:
            self.problems.append(ConfigProblem(exc.path, str(exc).split(": ", 1)[1]))
            return
        options = {k: v for k, v in value.items() if k != "type"}
        core: dict[str, Any] = {}
        if fields_cls is not None:
            names = {f.name for f in attrs.fields(fields_cls)}
            core = {k: options.pop(k) for k in list(options) if k in names}
        fields = None
        if fields_cls in (SparseOptimizerFields, DenseOptimizerFields, PartFields):
            fields = self.optimizer_fields(core, path, fields_cls)
        elif fields_cls is not None:
            try:
                fields = structure(self.conv, core, fields_cls, path)
            except StructureFailed as failed:
                self.problems.extend(failed.problems)
            else:
                self.check_group(fields, entry, path)
        try:
            config = structure(self.conv, options, entry.config, path)
        except StructureFailed as failed:
            self.problems.extend(failed.problems)
            return
        self.found[path] = Component(value["type"], options, config, fields)

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

    def schedule(self, value: Any, path: str) -> Component | None:
        if not isinstance(value, dict):
            self.problems.append(ConfigProblem(path, f'expected a table like {{ type = "constant" }}, got {show(value)}'))
            return None
        self.component(value, path, "lr_scheduler")
        return self.found.get(path)

    def optimizer_fields(self, core: dict[str, Any], path: str, fields_cls: type) -> Any:
        """The core keys of an optimizer table (or a part): schedule, parts, EMA, CPU policy."""
        values: dict[str, Any] = {}
        if "lr_schedule" in core:
            values["lr_schedule"] = self.schedule(core["lr_schedule"], f"{path}.lr_schedule")
        elif fields_cls is not PartFields:
            values["lr_schedule"] = self.schedule(schema_default(fields_cls, "lr_schedule"), f"{path}.lr_schedule")
        if fields_cls is SparseOptimizerFields and "cpu_policy" in core:
            values["cpu_policy"] = core["cpu_policy"]
            if core["cpu_policy"] not in ("error", "data_parallel"):
                self.problems.append(ConfigProblem(
                    f"{path}.cpu_policy", f'expected "error" or "data_parallel", got {show(core["cpu_policy"])}'
                ))
                values.pop("cpu_policy")
        if fields_cls is DenseOptimizerFields:
            if "ema" in core:
                try:
                    values["ema"] = structure(self.conv, core["ema"], EMAConfig, f"{path}.ema")
                except StructureFailed as failed:
                    self.problems.extend(failed.problems)
            parts = core.get("parts", [])
            if not isinstance(parts, list):
                self.problems.append(ConfigProblem(f"{path}.parts", f"expected an array of tables ([[{path}.parts]]), got {show(parts)}"))
                parts = []
            found = []
            for i, part in enumerate(parts):
                part_path = f"{path}.parts[{i}]"
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    self.problems.append(ConfigProblem(part_path, f'expected a table with "type" and "pattern", got {show(part)}'))
                    continue
                self.slot(part, part_path, "train.dense_optimizer.parts")
                if part_path in self.found and self.found[part_path].fields is not None:
                    found.append(self.found[part_path])
            values["parts"] = tuple(found)
        if fields_cls is PartFields:
            pattern = core.get("pattern")
            if not isinstance(pattern, str):
                self.problems.append(ConfigProblem(
                    f"{path}.pattern", 'each part needs pattern = "<regex over parameter names>", e.g. "deep\\..*"'
                ))
                return None
            try:
                re.compile(pattern)
            except re.error as exc:
                self.problems.append(ConfigProblem(f"{path}.pattern", f"not a valid regular expression: {exc}"))
                return None
            values["pattern"] = pattern
        return fields_cls(**values)

    def apply(self, config: RunConfig) -> RunConfig:
        f = self.found
        train = config.train
        stages = tuple(f[f"train.stages[{i}]"] for i in range(len(train.stages)))
        return attrs.evolve(
            config,
            data=attrs.evolve(config.data, reader=f["data.reader"], sampler=f.get("data.sampler")),
            model=f["model"],
            train=attrs.evolve(
                train,
                sparse_optimizer=f["train.sparse_optimizer"],
                dense_optimizer=f["train.dense_optimizer"],
                pipeline=f["train.pipeline"],
                stages=stages,
                loss_weighting=f["train.loss_weighting"],
            ),
            features=attrs.evolve(
                config.features,
                sparse=tuple(
                    attrs.evolve(feature, sparse_optimizer=f[f"features.sparse[{i}].sparse_optimizer"])
                    if feature.sparse_optimizer is not None else feature
                    for i, feature in enumerate(config.features.sparse)
                ),
            ),
            losses=tuple(f[f"losses[{i}]"] for i in range(len(config.losses))),
            metrics=tuple(f[f"metrics[{i}]"] for i in range(len(config.metrics))),
            train_metrics=tuple(f[f"train_metrics[{i}]"] for i in range(len(config.train_metrics))),
        )


def _table(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

