"""``tzrec-run data synth --like CONFIG OUT_DIR``: data shaped like a config's inputs, that the config
trains on once pointed there with the printed ``--set`` lines."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, cli
from tzrun.errors import EXIT_CONFIG, EXIT_USAGE


def _read(split_dir: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in sorted(split_dir.glob("part-*.parquet")))


def _synth(config: Path | str, out: Path, *extra: str) -> list[str]:
    """Run ``data synth --like`` and return the ``--set`` arguments it printed."""
    proc = cli(["data", "synth", "--like", str(config), str(out), "--rows", "600", "--eval-rows", "300", *extra])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1] == "train on it with:"
    return shlex.split(proc.stdout.splitlines()[2])


@pytest.fixture(scope="module")
def multi_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("like") / "mmoe"
    _synth(REPO / "examples" / "mmoe_taobao.toml", out)
    return out


def test_every_id_is_inside_its_table_and_sequences_stay_within_max_len(tmp_path):
    out = tmp_path / "din"
    _synth(REPO / "examples" / "din_taobao.toml", out)
    table = _read(out / "train")
    assert table.num_rows == 600 and _read(out / "eval").num_rows == 300
    config = __import__("tomllib").loads((REPO / "examples" / "din_taobao.toml").read_text())
    for f in config["features"]["sparse"]:
        ids = table.column(f.get("column", f["name"])).to_numpy()
        assert ids.min() >= 0 and ids.max() < (f.get("num_buckets") or f["hash_bucket_size"]), f["name"]
    group = config["features"]["sequence"][0]
    lengths = [pc.list_value_length(table.column(s["column"])).to_numpy() for s in group["features"]]
    assert all((length == lengths[0]).all() for length in lengths)  # aligned
    assert lengths[0].max() <= group["max_len"] and lengths[0].min() == 0
    assert set(np.unique(table.column("click").to_numpy())) == {0, 1}


def test_a_second_binary_task_is_a_conversion_and_labels_carry_signal(multi_task):
    table = _read(multi_task / "train")
    click, buy = (table.column(c).to_numpy() for c in ("click", "buy"))
    assert not (buy.astype(bool) & ~click.astype(bool)).any() and 0 < buy.sum() < click.sum()
    report = json.loads((multi_task / "synth.json").read_text())
    assert report["format"] == "tzrec-run synthetic like-config v1" and report["model"] == "mmoe"
    assert report["bayes_auc"]["click"] > 0.65 and report["bayes_auc"]["buy"] > 0.65
    assert report["set"] == [f'data.train_input="{multi_task}/train"', f'data.eval_input="{multi_task}/eval"']


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_rows(multi_task, tmp_path):
    _synth(REPO / "examples" / "mmoe_taobao.toml", tmp_path / "again")
    assert _read(tmp_path / "again" / "train").equals(_read(multi_task / "train"))
    _synth(REPO / "examples" / "mmoe_taobao.toml", tmp_path / "other", "--seed", "1")
    assert not _read(tmp_path / "other" / "train").equals(_read(multi_task / "train"))


def test_a_sampled_retrieval_config_trains_on_its_items_table(tmp_path):
    config = REPO / "examples" / "dssm_taobao_sampled.toml"
    sets = _synth(config, tmp_path / "data")
    items = pq.read_table(tmp_path / "data" / "items.parquet")
    assert sets[-1] == f'data.sampler.item_table="{tmp_path}/data/items.parquet"'
    for column in ("adgroup_id", "cate_id", "campaign_id", "customer", "brand", "price", "item_ctr_7d", "popularity"):
        assert column in items.column_names, column
    ids = items.column("adgroup_id").to_numpy()
    assert len(np.unique(ids)) == len(ids)
    rows = _read(tmp_path / "data" / "train")
    by_id = dict(zip(ids.tolist(), items.column("cate_id").to_pylist()))
    assert [by_id[i] for i in rows.column("adgroup_id").to_pylist()] == rows.column("cate_id").to_pylist()
    proc = cli(["train", str(config), *sets, "--set", f'model_dir="{tmp_path / "run"}"', "--set", "data.batch_size=128",
                "--set", "data.eval_batch_size=128", "--set", "data.sampler.num_negatives=16", "--set", "train.num_steps=2",
                "--set", "model.user_hidden_units=[8]", "--set", "model.item_hidden_units=[8]", "--set", "train.stages=[]"])
    assert proc.returncode == 0, proc.stderr
    assert "recall_at_5_sampled=" in proc.stdout


def test_a_column_two_features_read_in_ways_no_value_fits_is_one_line_naming_both(tmp_path):
    config = tmp_path / "clash.toml"
    text = (REPO / "examples" / "din_taobao.toml").read_text()
    config.write_text(text + '\n[[features.dense]]\nname = "cate_as_dense"\ncolumn = "click_50_seq"\n')
    proc = cli(["data", "synth", "--like", str(config), str(tmp_path / "out")])
    assert proc.returncode == EXIT_CONFIG
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "features.dense[" in proc.stderr and "click_50_seq" in proc.stderr
    assert "features.sequence[0].features[" in proc.stderr and not (tmp_path / "out").exists()


def test_a_config_that_does_not_check_writes_nothing(tmp_path):
    proc = cli(["data", "synth", "--like", str(REPO / "examples" / "mmoe_taobao.toml"), str(tmp_path / "out"),
                "--set", 'train.sparse_optimizer.type="adagard"'])
    assert proc.returncode == EXIT_CONFIG and "train.sparse_optimizer.type" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--like", "x.toml"], "--like CONFIG needs an output directory"),
    (["taobao", "--out", "x"], "--rows required for taobao"),
    (["imagenet", "--rows", "1", "--out", "x"], "DATASET must be criteo or taobao"),
])
def test_usage_errors_are_one_line(args, message):
    proc = cli(["data", "synth", *args])
    assert proc.returncode == EXIT_USAGE and message in proc.stderr


def test_a_feature_column_kept_among_the_labels_is_the_feature_as_drawn(tmp_path):
    """TorchEasyRec's pepnet_taobao keeps its domain column among the labels, read by no loss."""
    _synth(REPO / "examples" / "mmoe_taobao.toml", tmp_path / "out", "--set", 'data.labels=["click", "buy", "occupation"]')
    table = _read(tmp_path / "out" / "train")
    assert table.column_names.count("occupation") == 1 and table.column("occupation").type == pa.int64()
    assert "occupation" not in json.loads((tmp_path / "out" / "synth.json").read_text())["bayes_auc"]


def test_a_dense_sequence_is_drawn_aligned_with_its_group_and_din_trains_on_it(tmp_path):
    text = (REPO / "examples" / "din_taobao.toml").read_text()
    anchor = 'table = "adgroup_id_emb"   # adgroup_id\'s table: its size and width come from there\n'
    assert anchor in text
    config = tmp_path / "din_dense.toml"
    config.write_text(text.replace(anchor, anchor + '\n[[features.sequence.dense]]\nname = "click_seq__gap"\n'
                                   'column = "click_gap"\nlog1p = true\nmean = 1.0\nstd = 0.5\n'))
    sets = _synth(config, tmp_path / "data")
    table = _read(tmp_path / "data" / "train")
    assert pa.types.is_floating(table.schema.field("click_gap").type.value_type)
    gaps = pc.list_value_length(table.column("click_gap")).to_numpy()
    assert (gaps == pc.list_value_length(table.column("click_50_seq")).to_numpy()).all() and gaps.max() > 0
    values = pc.list_flatten(table.column("click_gap")).to_numpy()
    assert np.isfinite(values).all() and (values >= 0).all()  # log1p reads them: drawn as counts
    proc = cli(["train", str(config), *sets, "--set", f'model_dir="{tmp_path / "run"}"', "--set", "data.batch_size=128",
                "--set", "data.eval_batch_size=128", "--set", "train.num_steps=3", "--set", "train.stages=[]"])
    assert proc.returncode == 0, proc.stderr
    assert "auc=" in proc.stdout
