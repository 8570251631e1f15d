"""The config loader follows its slot table (``tzrun.config.slots.COMPONENT_SLOTS``): where
components live, their kind, their core keys and the keys a place refuses are read from it."""

from __future__ import annotations

import typing
from types import MappingProxyType

import attrs
import pytest

from tzrun.config import load as load_module
from tzrun.config.load import load_config, parse_config
from tzrun.config.schema import Component, RunConfig
from tzrun.config.slots import COMPONENT_SLOTS, Slot
from tzrun.kernel.conformance import config_components
from tzrun.errors import ConfigError
from tzrun.kernel.registry import collect_registries

from tests.core.test_config import MINIMAL

#: Every slot filled once (arrays twice where the index matters).
EVERY_SLOT = [
    'data.reader={type = "parquet"}',
    'data.sampler={type = "negative", item_table = "data/items", num_negatives = 4, item_id = "c0"}',
    'train.sparse_optimizer={type = "rowwise_adagrad", lr = 0.05, lr_schedule = {type = "constant"}}',
    'train.dense_optimizer={type = "adam", lr = 0.001, lr_schedule = {type = "constant"}, '
    'parts = [{type = "sgd", lr = 0.1, pattern = "deep\\\\..*", lr_schedule = {type = "constant"}}]}',
    'features.sparse[0].sparse_optimizer={type = "rowwise_adagrad", lr = 0.1}',
    'features.sequence=[{name = "s", max_len = 2, features = [{name = "s0", column = "c0", num_buckets = 10, '
    'embedding_dim = 4, sparse_optimizer = {type = "sgd", lr = 0.1}}, {name = "s1", column = "c0", embedding_dim = 4, '
    'zch = {size = 8, eviction_policy = {type = "lru"}, admission = {type = "threshold"}}}]}]',
    'features.sparse+=[{name = "z0", column = "c0", zch = {size = 8, eviction_policy = {type = "lfu"}, '
    'admission = {type = "threshold"}}}]',
    'train.pipeline={type = "base"}',
    'train.stages=[{type = "progress"}, {type = "metrics_log"}]',
    'train.loss_weighting={type = "sum"}',
    'metrics=[{type = "auc"}, {type = "log_loss"}]',
    'train_metrics=[{type = "auc"}]',
]


def _schema_component_places(cls: type, prefix: str) -> set[str]:
    """Schema paths (array levels without brackets) of every component field reachable from
    ``cls``, into the core keys of the component tables that :data:`COMPONENT_SLOTS` gives."""
    places: set[str] = set()
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        path = f"{prefix}.{field.name}" if prefix else field.name
        hint = hints[field.name]
        if typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(hint) is tuple:
            hint = typing.get_args(hint)[0]
        if hint is Component:
            places.add(path)
            slot = COMPONENT_SLOTS.get(path)
            if slot is not None and slot.fields is not None:
                inner = _schema_component_places(slot.fields, path)
                places |= {p for p in inner if p.rpartition(".")[2] not in slot.omit or p.count(".") > path.count(".") + 1}
        elif isinstance(hint, type) and attrs.has(hint):
            places |= _schema_component_places(hint, path)
    return places


def test_every_schema_component_field_has_exactly_one_slot():
    assert _schema_component_places(RunConfig, "") == set(COMPONENT_SLOTS)


def _load(*overrides: str, pm) -> RunConfig:
    return load_config(parse_config(MINIMAL, "<string>", overrides), collect_registries(pm))


def _schema_path(toml_path: str) -> str:
    return ".".join(part.partition("[")[0] for part in toml_path.split("."))


def test_the_loader_resolves_the_places_of_the_table_and_no_other(tzrun_pm):
    cfg = _load(*EVERY_SLOT, pm=tzrun_pm)
    found = list(config_components(cfg))
    assert {_schema_path(path) for path, _, _ in found} == set(COMPONENT_SLOTS)
    for path, kind, component in found:
        assert component.config is not None, path
        assert kind == COMPONENT_SLOTS[_schema_path(path)].kind
    paths = [path for path, _, _ in found]
    assert "train.dense_optimizer.parts[0].lr_schedule" in paths and "metrics[1]" in paths


def _with_slot(monkeypatch, path: str, slot: Slot) -> None:
    monkeypatch.setattr(load_module, "COMPONENT_SLOTS", MappingProxyType({**COMPONENT_SLOTS, path: slot}))


def _problems(*overrides: str, pm) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(*overrides, pm=pm)
    return [str(p) for p in info.value.problems]


def test_an_omit_rule_of_the_table_is_enforced_with_its_reason(tzrun_pm, monkeypatch):
    ema = 'train.dense_optimizer={type = "adam", lr = 0.001, ema = {decay = 0.9}}'
    assert _load(ema, pm=tzrun_pm).train.dense_optimizer.fields.ema.decay == 0.9
    old = COMPONENT_SLOTS["train.dense_optimizer"]
    _with_slot(monkeypatch, "train.dense_optimizer", attrs.evolve(old, omit={"ema": "this place keeps no ``EMA``"}))
    assert _problems(ema, pm=tzrun_pm) == ["train.dense_optimizer.ema: this place keeps no EMA; remove it"]


def test_a_nested_slot_takes_its_kind_from_the_table(tzrun_pm, monkeypatch):
    _with_slot(monkeypatch, "train.dense_optimizer.lr_schedule", Slot("stage"))
    problems = _problems(pm=tzrun_pm)
    assert len(problems) == 1 and problems[0].startswith("train.dense_optimizer.lr_schedule.type: unknown stage 'constant'")


def test_core_keys_come_from_the_slots_fields_class(tzrun_pm, monkeypatch):
    _with_slot(monkeypatch, "metrics", Slot("metric"))  # no core keys: `name` goes to the metric
    problems = _problems('metrics=[{type = "auc", name = "x"}]', pm=tzrun_pm)
    assert len(problems) == 1 and problems[0].startswith("metrics[0].name: unknown key")
