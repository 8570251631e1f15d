"""Pareto loss weighting in real runs: MMoE trains with it and every train log record shows the
weights (one process and two ranks), and a Pareto step is the step of the weighted sum with the
weights it logged (the per-loss gradients it takes change nothing themselves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, cli
from tests.warm_ranks import warm_cli
from tzrun.testing import run_tiny_training

pytestmark = pytest.mark.slow

PARETO = 'train.loss_weighting={type="pareto", min_weights={cvr_bce=0.3}}'


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("taobao")
    synth_taobao(root, rows=2048, eval_rows=512, seed=1, rows_per_file=1024, row_group_size=512)
    return root


def _train_mmoe(taobao: Path, model_dir: Path, *extra: str) -> list[dict]:
    sets = [
        f'data.train_input="{taobao / "train"}"', f'data.eval_input="{taobao / "eval"}"', f'model_dir="{model_dir}"',
        "data.batch_size=256", "train.log_every_n_steps=2", "model.expert_hidden_units=[16]",
        'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[8]}]', PARETO,
    ]
    run = warm_cli if "--nproc-per-node" in extra else cli  # several ranks are child processes
    proc = run(["train", str(REPO / "examples" / "mmoe_taobao.toml"), *[a for s in sets for a in ("--set", s)], *extra])
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def _assert_weights_logged(records: list[dict], steps: list[int]) -> None:
    assert [r["step"] for r in records] == steps
    for record in records:
        weights = record["loss_weights"]
        assert set(weights) == {"ctr_bce", "cvr_bce"}, record
        assert sum(weights.values()) == pytest.approx(1.0, abs=1e-6)
        assert weights["cvr_bce"] >= 0.3 - 1e-6 and weights["ctr_bce"] >= 0.0


def test_mmoe_trains_with_pareto_weights_and_logs_them(taobao, tmp_path):
    records = _train_mmoe(taobao, tmp_path / "run")
    _assert_weights_logged(records, [2, 4, 6, 8])  # 2,048 rows at 256 per step


@pytest.mark.multiproc
def test_mmoe_trains_with_pareto_weights_on_two_ranks(taobao, tmp_path):
    records = _train_mmoe(taobao, tmp_path / "run", "--nproc-per-node", "2")
    _assert_weights_logged(records, [2, 4])  # 1,024 rows per rank


def _tables_and_weights(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in model.state_dict().items():
        if hasattr(value, "local_shards"):
            value = value.local_shards()[0].tensor
        out[name] = value.detach().clone().float()
    return out


def test_a_pareto_step_is_the_weighted_sum_step_with_its_logged_weights(tmp_path):
    """One step of ``pareto`` leaves the tables and dense layers as one step of ``sum`` with the
    logged weights as the losses' ``weight``: the per-loss gradients touch neither (the fused
    tables are updated once, by backward)."""
    from tzrun_tools.synth import synth_criteo

    data = tmp_path / "data"
    synth_criteo(data, rows=512, eval_rows=256, seed=0, rows_per_file=512, row_group_size=256)
    common = ["train.num_steps=1", "train.log_every_n_steps=1", 'train.stages=[{type="metrics_log"}]']
    two = 'losses=[{{type="binary_cross_entropy", weight={a!r}}}, {{type="binary_focal", weight={b!r}}}]'
    pareto = run_tiny_training(tmp_path / "pareto", data_dir=data, in_process=True,
                               overrides=[*common, two.format(a=1.0, b=1.0), 'train.loss_weighting={type="pareto", min_weights={binary_cross_entropy=0.25}}'])
    logged = json.loads((pareto.model_dir / "metrics.jsonl").read_text().splitlines()[0])["loss_weights"]
    a, b = logged["binary_cross_entropy"], logged["binary_focal"]
    assert 0.25 - 1e-7 <= a < 1.0 and 0.0 < b and a + b == pytest.approx(1.0, abs=1e-6)
    summed = run_tiny_training(tmp_path / "sum", data_dir=data, in_process=True,
                               overrides=[*common, two.format(a=a, b=b)])
    after_pareto, after_sum = _tables_and_weights(pareto.model), _tables_and_weights(summed.model)
    assert after_pareto.keys() == after_sum.keys()
    assert any("embedding" in name for name in after_pareto)
    for name in after_pareto:
        torch.testing.assert_close(after_pareto[name], after_sum[name], atol=1e-6, rtol=1e-5, msg=name)
