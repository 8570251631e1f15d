"""The ``zch`` block of an id feature: what ``check`` accepts and refuses, by name and path."""

from __future__ import annotations

import pytest

from tzrun.errors import ConfigError
from tzrun.testing import load_config_text

BASE = """
model_dir = "runs/x"

[data]
train_input = "data/train"

[[features.dense]]
name = "d0"

[[features.sparse]]
name = "user"
{zch}

[model]
type = "deepfm"

[[losses]]
type = "binary_cross_entropy"

[train]
num_steps = 10
sparse_optimizer = {{ type = "rowwise_adagrad", lr = 0.05 }}
dense_optimizer = {{ type = "adam", lr = 0.001 }}
"""


def config(zch: str, pm, *overrides: str):
    return load_config_text(BASE.format(zch=zch), pm, overrides)[0]


def problems(zch: str, pm, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config(zch, pm, *overrides)
    return [str(p) for p in info.value.problems]


def test_a_zch_block_is_an_id_source_with_lfu_by_default(tzrun_pm):
    cfg = config("zch = { size = 1000 }", tzrun_pm)
    zch = cfg.features.sparse[0].zch
    assert (zch.size, zch.eviction_interval, zch.eviction_policy.type, zch.admission) == (1000, 5, "lfu", None)
    assert zch.eviction_policy.config is not None  # resolved by the registered policy


def test_policy_and_admission_options_are_structured(tzrun_pm):
    cfg = config('zch = { size = 1000, eviction_interval = 3, eviction_policy = { type = "distance_lfu", decay_exponent = 0.5 }, '
                 'admission = { type = "threshold", min_count = 3 } }', tzrun_pm)
    zch = cfg.features.sparse[0].zch
    assert zch.eviction_policy.config.decay_exponent == 0.5
    assert zch.admission.config.min_count == 3


def test_an_unknown_policy_is_named_with_a_did_you_mean(tzrun_pm):
    found = problems('zch = { size = 1000, eviction_policy = { type = "lfru" } }', tzrun_pm)
    assert any(p.startswith("features.sparse[0].zch.eviction_policy.type:") and "did you mean" in p for p in found), found


def test_an_option_a_policy_does_not_take_is_named(tzrun_pm):
    found = problems('zch = { size = 1000, eviction_policy = { type = "lfu", decay_exponent = 2.0 } }', tzrun_pm)
    assert any(p.startswith("features.sparse[0].zch.eviction_policy.decay_exponent") for p in found), found


def test_an_unknown_admission_filter_is_named(tzrun_pm):
    found = problems('zch = { size = 1000, admission = { type = "treshold" } }', tzrun_pm)
    assert any(p.startswith("features.sparse[0].zch.admission.type:") and "'threshold'" in p for p in found), found


def test_zch_and_another_id_source_are_refused(tzrun_pm):
    found = problems("num_buckets = 10\nzch = { size = 1000 }", tzrun_pm)
    assert any("set exactly one of" in p and "zch" in p for p in found), found


def test_a_size_without_room_is_refused(tzrun_pm):
    found = problems("zch = { size = 1 }", tzrun_pm)
    assert any(p.startswith("features.sparse[0].zch.size") for p in found), found


def test_a_config_without_zch_names_no_policy(tzrun_pm):
    cfg = config("num_buckets = 10", tzrun_pm)
    assert cfg.features.sparse[0].zch is None
