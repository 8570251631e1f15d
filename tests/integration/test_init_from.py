"""Fine-tuning from another run's checkpoint: strict by default, renames through a map file,
a report of what was loaded, missing and unexpected."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.test_update_path import CONFIG, Recorder, _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.errors import TzrunError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.init_from import InitFrom
from tzrun.runner.trainer import train
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow


def _run(tmp_path, criteo_dir, name, *overrides, init=None):
    recorder = Recorder()
    pm = make_plugin_manager(plugins=[("recorder", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=tmp_path / name, train=criteo_dir / "train"), "<test>", list(overrides))
    result = train(Session(load_config(raw, registries), raw, pm, registries), init_from=init)
    return result, recorder


@pytest.fixture
def source(tmp_path, criteo_dir):
    result, _ = _run(tmp_path, criteo_dir, "source", "train.num_steps=3")
    from tests.integration.test_update_path import weights

    return result.checkpoint, weights(result.model)


def test_a_run_starts_from_the_weights_of_another(tmp_path, criteo_dir, source):
    checkpoint, trained = source
    _, rec = _run(tmp_path, criteo_dir, "tuned", "train.num_steps=1", init=InitFrom(str(checkpoint.parent.parent)))
    assert set(rec.before) == set(trained)
    for key in trained:
        assert torch.equal(rec.before[key], trained[key]), key
    report = json.loads((tmp_path / "tuned" / "init_report.json").read_text())
    assert report["checkpoint"] == str(checkpoint)
    assert len(report["loaded"]) == len(trained) and not report["missing"] and not report["unexpected"]
    assert report["optimizer"] is False


def test_missing_tensors_are_an_error_unless_allowed_by_name(tmp_path, criteo_dir, source):
    checkpoint, trained = source
    deeper = "model.final_hidden_units=[8, 8]"  # adds final.2.*, keeps every other shape
    with pytest.raises(TzrunError, match=r"'final\.2\.weight' is not in the checkpoint.*--init-allow-missing"):
        _run(tmp_path, criteo_dir, "a", deeper, "train.num_steps=1", init=InitFrom(str(checkpoint)))
    _, rec = _run(tmp_path, criteo_dir, "b", deeper, "train.num_steps=1",
                  init=InitFrom(str(checkpoint), allow_missing=("final.2.*",)))
    assert torch.equal(rec.before["deep.0.weight"], trained["deep.0.weight"])
    report = json.loads((tmp_path / "b" / "init_report.json").read_text())
    assert sorted(report["missing"]) == ["final.2.bias", "final.2.weight"]


def test_unexpected_tensors_and_shape_mismatches_are_errors(tmp_path, criteo_dir, source):
    checkpoint, _ = source
    with pytest.raises(TzrunError, match=r"the checkpoint's 'final\.0\.weight' is not used by the model"):
        _run(tmp_path, criteo_dir, "a", "model.final_hidden_units=[]", "train.num_steps=1",
             init=InitFrom(str(checkpoint), allow_missing=("*",)))
    with pytest.raises(TzrunError, match=r"'deep\.0\.weight' has shape \[32, 26\] here and \[16, 26\] in the checkpoint"):
        _run(tmp_path, criteo_dir, "b", "model.deep_hidden_units=[32, 8]", "train.num_steps=1", init=InitFrom(str(checkpoint)))


def test_a_name_map_loads_renamed_tables(tmp_path, criteo_dir, source):
    checkpoint, trained = source
    names = tmp_path / "names.txt"
    names.write_text(
        "# new name  old name\n"
        "deep_ebc.embedding_bags.c0_emb.weight deep_ebc.embedding_bags.cat_0_emb.weight\n"
        "wide_ebc.embedding_bags.c0_emb_wide.weight   wide_ebc.embedding_bags.cat_0_emb_wide.weight\n"
    )
    renamed = ('features.sparse[0]={name = "c0", column = "cat_0", num_buckets = 1000, embedding_dim = 8}',)
    _, rec = _run(tmp_path, criteo_dir, "tuned", *renamed, "train.num_steps=1",
                  init=InitFrom(str(checkpoint), name_map=str(names)))
    assert torch.equal(rec.before["table:c0_emb"], trained["table:cat_0_emb"])
    report = json.loads((tmp_path / "tuned" / "init_report.json").read_text())
    assert report["renamed"] == {
        "deep_ebc.embedding_bags.c0_emb.weight": "deep_ebc.embedding_bags.cat_0_emb.weight",
        "wide_ebc.embedding_bags.c0_emb_wide.weight": "wide_ebc.embedding_bags.cat_0_emb_wide.weight",
    }
    bad = tmp_path / "bad.txt"
    bad.write_text("only_one_name\n")
    with pytest.raises(TzrunError, match=r"bad\.txt:1: expected 'NEW_NAME OLD_NAME', got 'only_one_name'"):
        _run(tmp_path, criteo_dir, "x", "train.num_steps=1", init=InitFrom(str(checkpoint), name_map=str(bad)))
