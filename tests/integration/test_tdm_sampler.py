"""TDM trained on its tree (``[data.sampler] type = "tdm"``): each click expanded into its
ancestors and per-level negatives. It trains in one process and on two ranks, and a run stopped
by a signal and resumed draws the same rows (the same loss at every step) as an uninterrupted one."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.integration.test_resume import Losses
from tests.integration.test_update_path import weights
from tests.warm_ranks import warm_cli
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.session import Session
from tzrun.runner.trainer import train

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "tdm_taobao.toml"
#: 6,000 ads in a tree of 8 children per node: levels of 1, 8, 64, 512, 4,096 and 6,000 nodes
LAYERS = "[0, 1, 2, 2, 3, 4]"


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,024 train and 512 eval rows of synthetic Taobao data, and its tree (read-only)."""
    from tzrun_tools.synth_taobao import synth_taobao
    from tzrun_tools.tdm_tree import TDMTreeOptions, tdm_tree

    root = tmp_path_factory.mktemp("taobao")
    synth_taobao(root, rows=1024, eval_rows=512, seed=1, rows_per_file=512, row_group_size=256)
    tdm_tree(TDMTreeOptions(items=str(root / "items.parquet"), item_id="adgroup_id", cate_id="cate_id",
                            attr_fields=("cate_id", "campaign_id", "customer", "brand"),
                            raw_attr_fields=("price", "item_ctr_7d"), branching=8, out=str(root / "nodes.parquet")))
    return root


def _overrides(taobao: Path, model_dir: Path, *extra: str) -> list[str]:
    sparse = [f["name"] for f in tomllib.loads(EXAMPLE.read_text())["features"]["sparse"]]
    return [
        f'data.train_input="{taobao / "train"}"',
        f'data.eval_input="{taobao / "eval"}"',
        f'model_dir="{model_dir}"',
        f'data.sampler={{type = "tdm", tree = "{taobao / "nodes.parquet"}", item_id = "adgroup_id", '
        f'layer_num_sample = {LAYERS}}}',
        f"features.sparse[{sparse.index('adgroup_id')}].num_buckets=50000",  # the tree's node ids too
        "data.batch_size=64",  # 16 steps per epoch; 64 x (1 + 4 + 12) rows each
        "data.eval_batch_size=256",
        "model.attention_hidden_units=[8]",
        "model.final_hidden_units=[16, 8]",
        "model.windows_len=[1, 2, 4]",
        "train.log_every_n_steps=4",
        *extra,
    ]


def _train(taobao: Path, model_dir: Path, recorder: Losses, *extra: str, resume: bool = False):
    pm = make_plugin_manager(plugins=[("losses", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(EXAMPLE.read_text(), str(EXAMPLE), _overrides(taobao, model_dir, *extra))
    return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume)


def test_tdm_learns_its_tree_and_retrieves_by_beam_search_with_its_export(taobao, tmp_path):
    import pyarrow.parquet as pq

    from tests.conftest import cli

    losses = Losses()
    result = _train(taobao, tmp_path / "run", losses, "train.num_epochs=2")
    assert result.steps == 32
    evaluation = json.loads((tmp_path / "run" / "eval_results.jsonl").read_text().splitlines()[-1])
    # eval rows are expanded too: 512 clicks x 17 nodes, 5 of each 17 positive
    assert evaluation["rows"] == 512 * 17
    assert evaluation["auc"] > 0.7, evaluation
    sets = [a for s in _overrides(taobao, tmp_path / "run") for a in ("--set", s)]
    exported = cli(["export", str(EXAMPLE), *sets, "--out", str(tmp_path / "export")])
    assert exported.returncode == 0, exported.stderr[-4000:]
    users = pq.read_table(sorted((taobao / "eval").glob("*.parquet"))[0]).slice(0, 64)
    pq.write_table(users, tmp_path / "users.parquet")
    retrieved = cli(["tdm-retrieve", str(tmp_path / "export"), "--tree", str(taobao / "nodes.parquet"),
                     "--input", str(tmp_path / "users.parquet"), "--item-id", "adgroup_id", "--top-k", "20",
                     "--keep-column", "user_id", "--out", str(tmp_path / "recall.parquet")])
    assert retrieved.returncode == 0, retrieved.stderr[-4000:]
    assert "20 item ids for each of 64 rows (beam 40); recall@20 of the input's adgroup_id" in retrieved.stdout
    written = pq.read_table(tmp_path / "recall.parquet").to_pydict()
    items = set(pq.read_table(taobao / "items.parquet").column("adgroup_id").to_pylist())
    assert written["user_id"] == users.column("user_id").to_pylist()
    assert all(len(set(ids)) == 20 and set(ids) <= items for ids in written["recall_ids"])  # distinct leaves


def test_a_run_stopped_and_resumed_draws_the_same_rows(taobao, tmp_path):
    options = ("train.num_steps=10", "train.save_checkpoints_steps=4", "data.shuffle_buffer_rows=256")
    whole = Losses()
    uninterrupted = _train(taobao, tmp_path / "whole", whole, *options)
    first = Losses(signal_at=6)
    stopped = _train(taobao, tmp_path / "split", first, *options)
    assert stopped.stopped_by == "SIGUSR1"
    rest = Losses()
    resumed = _train(taobao, tmp_path / "split", rest, *options, resume=True)
    assert resumed.steps == 10
    assert {**first.steps, **rest.steps} == whole.steps  # the same loss at every step, exactly
    a, b = weights(uninterrupted.model), weights(resumed.model)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.multiproc
def test_tdm_trains_on_its_tree_on_two_ranks(taobao, tmp_path):
    model_dir = tmp_path / "run"
    sets = _overrides(taobao, model_dir, "train.num_epochs=1", "data.num_workers=0")
    proc = warm_cli(["train", str(EXAMPLE), *[a for s in sets for a in ("--set", s)], "--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])
    assert result["step"] == 8 and result["rows"] == 512 * 17
    assert 0.0 < result["auc"] <= 1.0


def test_a_tree_clustered_from_the_trained_embeddings_trains_on(taobao, tmp_path):
    """TorchEasyRec's retrain loop: train on the initial tree, cluster the items by the item id's
    learnt embeddings (tdm-tree --cluster-from the run), go on training on the new tree."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tzrun.errors import DataError
    from tzrun_tools.tdm_tree import TDMTreeOptions, tdm_tree

    first = _train(taobao, tmp_path / "first", Losses(), "train.num_steps=4")
    assert first.steps == 4
    learnt = tmp_path / "learnt.parquet"
    options = dict(items=str(taobao / "nodes.parquet"), item_id="adgroup_id", cluster_from=str(tmp_path / "first"),
                   attr_fields=("cate_id", "campaign_id", "customer", "brand"), raw_attr_fields=("price", "item_ctr_7d"),
                   branching=8)
    tdm_tree(TDMTreeOptions(**options, out=str(learnt)))
    old, new = pq.read_table(taobao / "nodes.parquet"), pq.read_table(learnt)
    leaves = [t.filter(t.column("is_leaf")) for t in (old, new)]
    assert sorted(leaves[0].column("adgroup_id").to_pylist()) == sorted(leaves[1].column("adgroup_id").to_pylist())
    assert not leaves[0].column("tree_code").equals(leaves[1].column("tree_code"))  # the items moved
    counts = np.bincount(new.column("tree_level").to_numpy()).tolist()
    layers = [0] + [min(2, c - 1) for c in counts[1:]]
    again = _train(taobao, tmp_path / "again", Losses(), "train.num_steps=4",
                   f'data.sampler.tree="{learnt}"', f"data.sampler.layer_num_sample={layers}")
    assert again.steps == 4
    pq.write_table(pa.table({"item": leaves[0].column("adgroup_id")}), tmp_path / "items.parquet")
    with pytest.raises(DataError, match="no \\[\\[features.sparse\\]\\] reads column 'item' \\(--item-id\\) in the "
                                        "checkpoint's config, so it has no item table"):
        tdm_tree(TDMTreeOptions(items=str(tmp_path / "items.parquet"), item_id="item",
                                cluster_from=str(tmp_path / "first"), out=str(tmp_path / "x.parquet")))
