"""Every shipped example trains through `tzrec-run train`, in one process and on 2 ranks, a run of
it stopped by a signal mid-epoch resumes to the uninterrupted result, and
under the default pipeline with the options users turn on together it trains and exports.

Small data and small layers: these runs check that each model builds, shards, traces under
TorchRec's TrainPipelineSparseDist, trains and evaluates with its losses and metrics, not how
well it learns (see docs/models.md for the quality runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import pyarrow.parquet as pq

from tests.conftest import REPO, cli
from tests.warm_ranks import warm_cli

pytestmark = pytest.mark.slow

#: per example: its data set, small-layer overrides, and the metrics its final eval must report
EXAMPLES = {
    "dlrm_criteo": ("criteo", ["model.dense_hidden_units=[8, 16]", "model.top_hidden_units=[16]"], ["auc"]),
    "wide_and_deep_criteo": ("criteo", ["model.deep_hidden_units=[16]"], ["auc"]),
    "dcn_v2_criteo": ("criteo", ["model.backbone_hidden_units=[16]", "model.low_rank=4", "model.deep_hidden_units=[8]",
                                 "model.final_hidden_units=[8]"], ["auc"]),
    "dcn_v1_criteo": ("criteo", ["model.cross_num=2", "model.deep_hidden_units=[8]", "model.final_hidden_units=[8]"],
                      ["auc"]),
    "mask_net_criteo": ("criteo", ["model.n_mask_blocks=2", "model.hidden_dim=8", "model.reduction_ratio=0.5",
                                   "model.top_hidden_units=[8]"], ["auc"]),
    "wukong_criteo": ("criteo", ["model.dense_hidden_units=[8, 16]", "model.final_hidden_units=[8]",
                                 ("model.wukong_layers=[{lcb_feature_num=4, fmb_feature_num=4, compressed_feature_num=4, "
                                  "feature_num_hidden_units=[16]}, {lcb_feature_num=4, fmb_feature_num=4, "
                                  "compressed_feature_num=2, feature_num_hidden_units=[8]}]")], ["auc"]),
    "rocket_launching_criteo": ("criteo", ["model.share_hidden_units=[16]", "model.booster_hidden_units=[16, 8]",
                                           "model.light_hidden_units=[8]"],
                                ["auc", "auc_booster", "loss/binary_cross_entropy", "loss/binary_cross_entropy_booster"]),
    "deepfm_criteo_text": ("criteo_text", ["model.deep_hidden_units=[16]", "model.final_hidden_units=[8]"], ["auc"]),
    "mmoe_taobao": (
        "taobao",
        ["model.expert_hidden_units=[16]", 'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[8]}]'],
        ["ctr_auc", "cvr_auc", "loss/ctr_bce", "loss/cvr_bce"],
    ),
    "ple_taobao": (
        "taobao",
        ["model.extraction_networks=[{num_task_experts=2, task_expert_hidden_units=[16], num_shared_experts=1}, "
         "{num_task_experts=1, task_expert_hidden_units=[8], num_shared_experts=2}]",
         'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[]}]'],
        ["ctr_auc", "cvr_auc", "loss/ctr_bce", "loss/cvr_bce"],
    ),
    "dbmtl_taobao": (
        "taobao",
        ["model.bottom_hidden_units=[16]", "model.expert_hidden_units=[8]", "model.num_experts=2",
         'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[8], relation_tasks=["ctr"], '
         "relation_hidden_units=[4]}]"],
        ["ctr_auc", "cvr_auc", "loss/ctr_bce", "loss/cvr_bce"],
    ),
    "pepnet_taobao": (
        "taobao",
        ["model.epnet_hidden_unit=8", "model.ppnet_hidden_units=[16, 8]",
         'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[]}]'],
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
    "dssm_v2_taobao": (
        "taobao",
        ["model.user_hidden_units=[16]", "model.item_hidden_units=[16]", "model.output_dim=8", "train.num_epochs=1"],
        ["recall_at_5", "recall_at_50", "loss/in_batch_softmax"],
    ),
    "tdm_taobao": ("taobao", ["model.attention_hidden_units=[8]", "model.final_hidden_units=[16, 8]",
                              "model.windows_len=[1, 2, 4]"], ["auc"]),
    "mind_taobao": (
        "taobao",
        ["model.user_hidden_units=[16]", "model.history_hidden_units=[16]", "model.max_k=3", "model.high_dim=8",
         "model.concat_hidden_units=[16]", "model.item_hidden_units=[16]", "model.output_dim=8", "train.num_epochs=1"],
        ["recall_at_5", "recall_at_50", "loss/in_batch_softmax"],
    ),
}
#: the other shipped examples (trained by the matrix below only; test_sequence_models.py,
#: test_sampled_negatives.py and test_real_formats.py train them on their own data as well)
MATRIX_ONLY = {
    "deepfm_criteo": ("criteo", ["model.deep_hidden_units=[16]", "model.final_hidden_units=[8]"], ["auc"]),
    # the real Criteo's table sizes (30 GiB with their optimizer state) cut to fit this host
    "deepfm_criteo_full": ("criteo", ["model.deep_hidden_units=[16]", "model.final_hidden_units=[8]", "train.num_steps=8",
                                      *(f"features.sparse[{i}].num_buckets=4000" for i in range(26))], ["auc"]),
    "din_taobao": ("taobao", ["model.towers=[{hidden_units=[16]}]", "model.final_hidden_units=[8]",
                              'model.din_towers=[{sequence="click_seq", attention_hidden_units=[8]}]'], ["auc"]),
    "dssm_taobao_sampled": ("taobao", ["model.user_hidden_units=[16]", "model.item_hidden_units=[16]",
                                       "model.output_dim=8", "train.num_epochs=1", "data.sampler.num_negatives=64",
                                       'data.sampler.item_table="{data}/items.parquet"'],
                            ["loss/sampled_softmax"]),
}
SHIPPED = sorted(p.stem for p in (REPO / "examples").glob("*.toml"))
#: what users turn on together, under the default pipeline (sparse_dist); fp16 on this host's
#: CPU autocast as well where it runs (it does on torch 2.13's CPU)
COMBINED = ("train.gradient_accumulation_steps=2", "data.eval_batch_size=256")


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


def _sets(example: str, datasets: dict[str, Path], model_dir: Path, *extra: str) -> list[str]:
    data, overrides, _ = {**EXAMPLES, **MATRIX_ONLY}[example]
    sets = [
        f'data.train_input="{datasets[data] / "train"}"',
        f'data.eval_input="{datasets[data] / "eval"}"',
        f'model_dir="{model_dir}"',
        "data.batch_size=256",
        "data.eval_batch_size=512",
        "data.num_workers=0",
        *(o.replace("{data}", str(datasets[data])) for o in overrides),
        *extra,
    ]
    return [a for s in sets for a in ("--set", s)]


def _train(example: str, datasets: dict[str, Path], model_dir: Path, *launch: str, extra: tuple[str, ...] = ()) -> dict:
    run = warm_cli if launch else cli  # torchrun's ranks are child processes; one process runs here
    proc = run(["train", str(REPO / "examples" / f"{example}.toml"), *_sets(example, datasets, model_dir, *extra), *launch])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])


def _train_here(example: str, datasets: dict[str, Path], model_dir: Path, recorder: object, resume: bool = False):
    """``train`` through the Session API in this process, with ``recorder`` as a plugin."""
    from tzrun.runner.session import Session
    from tzrun.runner.trainer import train

    sets = [s for s in _sets(example, datasets, model_dir, *EVERY_STEP) if s != "--set"]
    return train(Session.from_config(REPO / "examples" / f"{example}.toml", sets, [("losses", recorder)]), resume=resume)


def _train_losses(model_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (model_dir / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"}


#: a train record at every step (its loss is that step's)
EVERY_STEP = ("train.log_every_n_steps=1",)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_trains_in_one_process_and_a_stopped_run_resumes_to_the_same_result(example, datasets, tmp_path):
    from tests.checkpoint_entries import saved_tensors
    from tests.integration.test_resume import Losses

    result = _train(example, datasets, tmp_path / "run", extra=EVERY_STEP)
    assert result["step"] == 8 and result["rows"] == 1024  # 2,048 rows at 256 per step; every eval row once
    for name in EXAMPLES[example][2]:
        assert 0.0 <= result[name] < 100.0, (name, result)
    # stopped by a signal after step 4 (mid-epoch) and resumed: no model keeps state that its
    # checkpoint leaves out (a generator, a sampler's position, a buffer), so the two halves are
    # the uninterrupted run: the same loss at every step, evaluation, weights and optimizer state
    stopped = _train_here(example, datasets, tmp_path / "split", Losses(signal_at=4))
    assert stopped.stopped_by == "SIGUSR1" and stopped.steps == 4
    _train_here(example, datasets, tmp_path / "split", Losses(), resume=True)
    assert _train_losses(tmp_path / "split") == _train_losses(tmp_path / "run")
    resumed = json.loads((tmp_path / "split" / "eval_results.jsonl").read_text().splitlines()[-1])
    assert {k: v for k, v in resumed.items() if k != "time"} == {k: v for k, v in result.items() if k != "time"}
    whole, split = (saved_tensors(tmp_path / d / "checkpoints" / "step-8") for d in ("run", "split"))
    assert whole.keys() == split.keys()
    for key, value in whole.items():
        assert torch.equal(value, split[key]) if isinstance(value, torch.Tensor) else value == split[key], key


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


def test_the_matrix_covers_every_shipped_example():
    assert sorted({*EXAMPLES, *MATRIX_ONLY}) == SHIPPED  # a new example needs its small overrides here


@pytest.mark.parametrize(("example", "precision"), [*((e, "bf16") for e in SHIPPED),
                                                    ("deepfm_criteo", "fp16"), ("din_taobao", "fp16")])
def test_example_with_the_options_users_combine_trains_under_the_default_pipeline_and_exports(
        example, precision, datasets, tmp_path):
    """The defaults users get (``train.pipeline`` unset: sparse_dist) with mixed precision and
    gradient accumulation on, the sequence groups of the examples that have them (din_taobao,
    dssm_taobao, dssm_taobao_sampled, dssm_v2_taobao, mind_taobao), then an export that scores rows."""
    config = REPO / "examples" / f"{example}.toml"
    assert "pipeline" not in config.read_text()  # the default pipeline, as users get it
    model_dir = tmp_path / "run"
    sets = _sets(example, datasets, model_dir, f'train.mixed_precision="{precision}"', *COMBINED)
    trained = cli(["train", str(config), *sets])
    assert trained.returncode == 0, trained.stderr[-4000:]
    result = json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])
    for name in {**EXAMPLES, **MATRIX_ONLY}[example][2]:
        assert 0.0 <= result[name] < 100.0, (name, result)
    exported = cli(["export", str(config), *sets, "--out", str(tmp_path / "export")])
    assert exported.returncode == 0, exported.stderr[-4000:]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    if example.startswith(("dssm", "mind")):  # a retrieval model's two programs, each served on its own
        assert sorted(manifest["programs"]) == ["item_tower", "user_tower"]
        return
    data = {**EXAMPLES, **MATRIX_ONLY}[example][0]
    scored = cli(["predict", str(config), *sets, "--export", str(tmp_path / "export"),
                  "--input", str(datasets[data] / "eval"), "--output", str(tmp_path / "scores.parquet")])
    assert scored.returncode == 0, scored.stderr[-4000:]
    assert pq.read_metadata(tmp_path / "scores.parquet").num_rows == 1024
