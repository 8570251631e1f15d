"""``--set KEY+=VALUE`` and ``--set KEY-=VALUE``: append to and remove from a config's arrays."""

from __future__ import annotations

import pytest

from tests.core.test_config import MINIMAL, problems_of
from tzrun.testing import load_config_text

WITH_STAGES = MINIMAL + """
[[train.stages]]
type = "progress"
mode = "lines"

[[train.stages]]
type = "metrics_log"
"""


def stage_types(cfg) -> list[str]:
    return [s.type for s in cfg.train.stages]


def test_append_starts_from_the_schema_default_when_the_config_sets_no_stages(tzrun_pm):
    cfg, _ = load_config_text(MINIMAL, tzrun_pm, ['train.stages+=[{type = "tensorboard"}]'])
    assert stage_types(cfg) == ["progress", "metrics_log", "tensorboard"]


def test_append_a_table_that_is_not_in_an_array_appends_one_item(tzrun_pm):
    cfg, _ = load_config_text(WITH_STAGES, tzrun_pm, ['train.stages+={type = "tensorboard"}'])
    assert stage_types(cfg) == ["progress", "metrics_log", "tensorboard"]


def test_remove_matches_tables_by_the_keys_the_pattern_names(tzrun_pm):
    cfg, _ = load_config_text(WITH_STAGES, tzrun_pm, ['train.stages-=[{type = "progress"}]'])
    assert stage_types(cfg) == ["metrics_log"]


def test_append_and_remove_apply_in_order(tzrun_pm):
    cfg, _ = load_config_text(WITH_STAGES, tzrun_pm, [
        'train.stages+=[{type = "tensorboard"}, {type = "early_stopping", metric = "auc"}]',
        'train.stages-=[{type = "metrics_log"}, {type = "progress"}]'])
    assert stage_types(cfg) == ["tensorboard", "early_stopping"]


def test_remove_from_an_indexed_table_and_append_scalars(tzrun_pm):
    text = MINIMAL.replace('type = "deepfm"', 'type = "deepfm"\ndeep_hidden_units = [64, 32, 16]')
    cfg, _ = load_config_text(text, tzrun_pm, ["model.deep_hidden_units-=32", "model.deep_hidden_units+=[8]"])
    assert cfg.model.config.deep_hidden_units == (64, 16, 8)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ('train.stages-=[{type = "tensorboard"}]',
         '--set train.stages-=[{type = "tensorboard"}]: train.stages: no item matches {type = "tensorboard"} '
         '(the items: {type = "progress", mode = "lines"}, {type = "metrics_log"})'),
        ('data.train_input+="more"',
         '--set data.train_input+="more": data.train_input: "data/train" is not an array; append works on arrays only'),
        ("model.deep_hidden_units+=[8]",
         "--set model.deep_hidden_units+=[8]: model.deep_hidden_units: the config does not set this array and it "
         "has no default to start from; set it whole with model.deep_hidden_units=[...]"),
        ("train.stages+=[", '--set train.stages+=[: [ is not a TOML value; quote strings: train.stages="text"'),
    ],
)
def test_array_override_problems_name_the_toml_path(tzrun_pm, override, expected):
    assert problems_of(WITH_STAGES, override, pm=tzrun_pm) == [expected]


def test_a_number_pattern_does_not_match_a_bool_item(tzrun_pm):
    text = MINIMAL.replace('type = "deepfm"', 'type = "deepfm"\ndeep_hidden_units = [1, 2]')
    assert "no item matches true" in problems_of(text, "model.deep_hidden_units-=true", pm=tzrun_pm)[0]
