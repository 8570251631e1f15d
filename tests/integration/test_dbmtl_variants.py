"""TorchEasyRec's dbmtl_taobao_seq.config and dbmtl_taobao_jrc.config, converted, train through
`tzrec-run train`, export, and score rows through the export: DBMTL with a sequence group read by
DIN attention, and DBMTL of two-class tasks trained with jrc on user_id sessions.

Small data (their own columns, ids below 50 with the tables cut to 50 rows) and TorchEasyRec's
layers: these runs check that the converted configs build, shard, train, evaluate and export.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import cli
from tests.core.torcheasyrec_examples import DBMTL_TAOBAO_JRC, DBMTL_TAOBAO_SEQ

pytestmark = pytest.mark.slow

ROWS, BUCKETS = 512, 50
IDS = ("user_id", "cms_segid", "cms_group_id", "final_gender_code", "age_level", "pvalue_level", "shopping_level",
       "occupation", "new_user_class_level", "adgroup_id", "cate_id", "campaign_id", "customer", "brand", "price",
       "pid")
SEQUENCE = ("click_50_seq__adgroup_id", "click_50_seq__cate_id", "click_50_seq__brand")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The columns both configs read: TorchEasyRec's label names, ids below 50, a click sequence."""
    rng = np.random.default_rng(3)
    clk = rng.integers(0, 2, ROWS)
    columns = {"clk": pa.array(clk, pa.int8()), "buy": pa.array(clk * rng.integers(0, 2, ROWS), pa.int8())}
    columns.update({name: pa.array(rng.integers(0, 2 if name == "pid" else BUCKETS, ROWS)) for name in IDS})
    lengths = rng.integers(0, 6, ROWS)
    for name in SEQUENCE:
        columns[name] = pa.array([rng.integers(0, BUCKETS, n).tolist() for n in lengths], pa.list_(pa.int64()))
    root = tmp_path_factory.mktemp("dbmtl_variants")
    pq.write_table(pa.table(columns), root / "part-0.parquet")
    return root


def _converted(text: str, name: str, tmp_path: Path) -> Path:
    (tmp_path / f"{name}.config").write_text(text)
    out = tmp_path / f"{name}.toml"
    proc = cli(["convert", str(tmp_path / f"{name}.config"), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    out.write_text(re.sub(r"num_buckets = \d+", f"num_buckets = {BUCKETS}", out.read_text()))
    return out


def _sets(data: Path, model_dir: Path) -> list[str]:
    sets = [f'data.train_input="{data}"', f'data.eval_input="{data}"', f'model_dir="{model_dir}"',
            "data.batch_size=128", "data.eval_batch_size=256", "data.num_workers=0", "train.save_checkpoints_steps=0"]
    return [a for s in sets for a in ("--set", s)]


@pytest.mark.parametrize("name, text, losses", [
    ("dbmtl_taobao_seq", DBMTL_TAOBAO_SEQ, ["loss/binary_cross_entropy_ctr", "loss/binary_cross_entropy_cvr"]),
    ("dbmtl_taobao_jrc", DBMTL_TAOBAO_JRC, ["loss/jrc_ctr", "loss/jrc_cvr"]),
])
def test_the_converted_dbmtl_variant_trains_exports_and_scores_rows(name, text, losses, data, tmp_path):
    config = _converted(text, name, tmp_path)
    sets = _sets(data, tmp_path / "run")
    trained = cli(["train", str(config), *sets])
    assert trained.returncode == 0, trained.stderr[-4000:]
    result = json.loads((tmp_path / "run" / "eval_results.jsonl").read_text().splitlines()[-1])
    assert result["step"] == 4 and result["rows"] == ROWS  # 512 rows at 128 per step
    for key in ["auc_ctr", "auc_cvr", *losses]:
        assert 0.0 < result[key] < 100.0, (key, result)
    exported = cli(["export", str(config), *sets, "--out", str(tmp_path / "export")])
    assert exported.returncode == 0, exported.stderr[-4000:]
    scored = cli(["predict", str(config), *sets, "--export", str(tmp_path / "export"), "--input", str(data),
                  "--output", str(tmp_path / "scores.parquet")])
    assert scored.returncode == 0, scored.stderr[-4000:]
    scores = pq.read_table(tmp_path / "scores.parquet")
    assert scores.num_rows == ROWS  # one score per row and task; the two logits are not written by default
    assert {"probs/ctr", "probs/cvr", "logits/ctr"} <= set(scores.column_names)
    assert not any(c.startswith("class_logits/") for c in scores.column_names)


def test_check_names_the_missing_session_column_of_jrc(data, tmp_path):
    config = _converted(DBMTL_TAOBAO_JRC.replace('session_name: "user_id"', 'session_name: "session_id"'),
                        "dbmtl_taobao_jrc", tmp_path)
    check = cli(["check", str(config), *_sets(data, tmp_path / "run")])
    assert check.returncode != 0
    assert "column 'session_id' missing" in check.stderr
