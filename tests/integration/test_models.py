"""Every example of the model zoo trains through `tzrec-run train`, in one process and on 2 ranks.

Small data and small layers: these runs check that each model builds, shards, traces under
TorchRec's TrainPipelineSparseDist, trains and evaluates with its losses and metrics, not how
well it learns (see docs/models.md for the quality runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow

#: per example: its data set, small-layer overrides, and the metrics its final eval must report
EXAMPLES = {
    "dlrm_criteo": ("criteo", ["model.dense_hidden_units=[8, 16]", "model.top_hidden_units=[16]"], ["auc"]),
    "wide_and_deep_criteo": ("criteo", ["model.deep_hidden_units=[16]"], ["auc"]),
    "deepfm_criteo_text": ("criteo_text", ["model.deep_hidden_units=[16]", "model.final_hidden_units=[8]"], ["auc"]),
    "mmoe_taobao": (
        "taobao",
        ["model.expert_hidden_units=[16]", 'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[8]}]'],
        ["ctr_auc", "cvr_auc", "loss/ctr_bce", "loss/cvr_bce"],
    ),
    "multi_tower_taobao": ("taobao", ['model.towers=[{features=["user_id", "pid"], hidden_units=[16]}, '
                                      '{features=["adgroup_id", "price"], hidden_units=[16]}]',
                                      "model.final_hidden_units=[8]"], ["auc"]),
    "dssm_taobao": (
        "taobao",
        ["model.user_hidden_units=[16]", "model.item_hidden_units=[16]", "model.output_dim=8", "train.num_epochs=1"],
        ["recall_at_5", "recall_at_50", "loss/in_batch_softmax"],
    ),
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small criteo (Parquet and Criteo text) and taobao data sets for the whole module (read-only)."""
    from tzrun_tools.criteo_text import parquet_to_criteo_text
    from tzrun_tools.synth import synth_criteo
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("zoo")
    synth_criteo(root / "criteo", rows=2048, eval_rows=1024, seed=1, rows_per_file=1024, row_group_size=512)
    synth_taobao(root / "taobao", rows=2048, eval_rows=1024, seed=1, rows_per_file=1024, row_group_size=512)
    for split in ("train", "eval"):
        parquet_to_criteo_text(root / "criteo" / split, root / "criteo_text" / split)
    return {"criteo": root / "criteo", "taobao": root / "taobao", "criteo_text": root / "criteo_text"}


def _train(example: str, datasets: dict[str, Path], model_dir: Path, *extra: str) -> dict:
    data, overrides, _ = EXAMPLES[example]
    sets = [
        f'data.train_input="{datasets[data] / "train"}"',
        f'data.eval_input="{datasets[data] / "eval"}"',
        f'model_dir="{model_dir}"',
        "data.batch_size=256",
        "data.eval_batch_size=512",
        "data.num_workers=0",
        *overrides,
    ]
    proc = run_cli(["train", str(REPO / "examples" / f"{example}.toml"), *[a for s in sets for a in ("--set", s)], *extra])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_trains_in_one_process(example, datasets, tmp_path):
    result = _train(example, datasets, tmp_path / "run")
    assert result["step"] == 8 and result["rows"] == 1024  # 2,048 rows at 256 per step; every eval row once
    for name in EXAMPLES[example][2]:
        assert 0.0 <= result[name] < 100.0, (name, result)


@pytest.mark.multiproc
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_trains_on_two_ranks(example, datasets, tmp_path):
    model_dir = tmp_path / "run"
    result = _train(example, datasets, model_dir, "--nproc-per-node", "2")
    assert result["step"] == 4 and result["rows"] == 1024  # 1,024 rows per rank at 256 per step
    meta = json.loads((model_dir / "checkpoints" / "step-4" / "meta.json").read_text())
    assert meta["world_size"] == 2
    for name in EXAMPLES[example][2]:
        assert 0.0 <= result[name] < 100.0, (name, result)
