"""``data synth criteo --drift``: the columns of an open id space keep getting new ids and lose old
ones over the rows, each id with an effect of its own on the label, reproducibly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun_tools import synth, synth_common
from tzrun_tools.synth import CRITEO_CARDINALITIES, SPARSE_COLUMNS, read_report, synth_criteo
from tzrun_tools.synth_drift import DRIFT_COLUMNS, DRIFT_SLOTS, Drift, drift_effect

DRIFTING = [SPARSE_COLUMNS[c] for c in DRIFT_COLUMNS]


def _read(out: Path, split: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in sorted((out / split).glob("part-*.parquet")))


@pytest.fixture(scope="module")
def drifting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drift") / "criteo"
    synth_criteo(out, rows=80_000, eval_rows=5_000, seed=0, rows_per_file=30_000, drift=True)
    return out


def test_same_seed_same_bytes_and_only_the_drifting_columns_and_labels_change(tmp_path, drifting):
    synth_criteo(tmp_path / "a", rows=3_000, eval_rows=1_000, seed=4, drift=True)
    synth_criteo(tmp_path / "b", rows=3_000, eval_rows=1_000, seed=4, drift=True)
    synth_criteo(tmp_path / "fixed", rows=3_000, eval_rows=1_000, seed=4)
    for split in ("train", "eval"):
        for f in (tmp_path / "a" / split).iterdir():
            assert f.read_bytes() == (tmp_path / "b" / split / f.name).read_bytes()
        moving, fixed = _read(tmp_path / "a", split), _read(tmp_path / "fixed", split)
        assert moving.column_names == fixed.column_names
        changed = {n for n in moving.column_names if not moving[n].equals(fixed[n])}
        assert changed == {*DRIFTING, "label"}, split


def test_the_id_space_drifts_new_ids_keep_arriving_over_the_second_half(drifting):
    table = _read(drifting, "train")
    half = table.num_rows // 2
    for name in DRIFTING:
        ids = table[name].to_numpy()
        seen = np.unique(ids[:half])
        quarters = np.array_split(ids[half:], 4)
        unseen = [float(np.mean(~np.isin(q, seen))) for q in quarters]
        assert all(b > a for a, b in zip(unseen, unseen[1:])), (name, unseen)
        assert unseen[-1] > unseen[0] + 0.1, (name, unseen)
        assert ids.max() >= 2**40 and len(np.unique(ids)) > 2 * DRIFT_SLOTS  # open, unbounded ids
    fixed = table["cat_0"].to_numpy()
    assert fixed.max() < CRITEO_CARDINALITIES[0]
    assert np.mean(~np.isin(fixed[-half // 4:], np.unique(fixed[:half]))) < 0.01  # a fixed column does not drift


def test_the_eval_split_follows_the_train_split_in_time(drifting):
    train, eval_ = _read(drifting, "train"), _read(drifting, "eval")
    for name in DRIFTING:
        early = np.unique(train[name].to_numpy()[:10_000])
        late = np.unique(train[name].to_numpy()[-10_000:])
        ids = eval_[name].to_numpy()
        assert np.mean(np.isin(ids, late)) > np.mean(np.isin(ids, early)) + 0.2, name


def test_the_train_prefix_does_not_depend_on_rows(tmp_path):
    synth_criteo(tmp_path / "a", rows=1_000, eval_rows=300, seed=3, drift=True)
    synth_criteo(tmp_path / "b", rows=20_000, eval_rows=300, seed=3, rows_per_file=333, drift=True)
    assert _read(tmp_path / "a", "train").equals(_read(tmp_path / "b", "train").slice(0, 1_000))


def test_the_drifting_ids_carry_learnable_signal_of_their_own():
    model = synth._build_model(0, drift=True)
    raw = synth._draw_raw(model, synth_common.block_rng(0, synth._SPLIT_EVAL, 0), 16_384, start=100_000)
    first, pairs, dense, drifting = synth._logit_parts(model, raw)
    assert drifting.var() == pytest.approx(1.0, rel=0.15)
    logit = model.bias + first + pairs + dense + drifting
    labels = np.random.default_rng(1).random(len(logit)) < synth_common.sigmoid(logit)
    assert synth_common.auc(logit, labels) > synth_common.auc(logit - drifting, labels) + 0.04
    # An id's effect is its own: every row of the same id gets the same one.
    one = Drift(columns=model.drift.columns[:1], specs=model.drift.specs[:1])
    effect = drift_effect(one, raw.drift_slots[:1], raw.drift_ids[:1])
    ids = raw.drift_ids[0]
    _, first_row, inverse = np.unique(ids, return_index=True, return_inverse=True)
    assert np.array_equal(effect, effect[first_row][inverse])
    assert len(np.unique(effect[first_row])) > 0.9 * len(first_row)


def test_the_report_names_the_drifting_columns(drifting, tmp_path):
    report = read_report(drifting)
    assert report.drift_columns == tuple(DRIFTING)
    document = json.loads((drifting / "synth.json").read_text())
    assert document["drift_columns"] == DRIFTING and "new one" in document["drift"]
    assert 0.8 <= report.bayes_auc <= 0.9 and 0.2 <= report.positive_rate <= 0.3
    assert synth_criteo(tmp_path, rows=100, eval_rows=10).drift_columns == ()


def test_the_cli_writes_drifting_data_and_refuses_drift_elsewhere(tmp_path):
    from tests.conftest import cli

    done = cli(["data", "synth", "criteo", "--drift", "--rows", "2000", "--out", str(tmp_path / "c"), "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["drift_columns"] == DRIFTING
    refused = cli(["data", "synth", "taobao", "--drift", "--rows", "2000", "--out", str(tmp_path / "t")])
    assert refused.returncode != 0 and "--drift is for criteo only" in refused.stderr
    assert not (tmp_path / "t").exists()
