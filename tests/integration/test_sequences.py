"""Sequence tables in real runs: a test-only model plugin (``seq_model_plugin``, public API
only) reads ``[[features.sequence]]`` through a sharded ``EmbeddingCollection``; its tables take
their sparse optimizers (per-table overrides too), shard on 1 and 2 ranks, resume exactly, and
load bit-identically on another number of ranks (``--init-from``, ``--resume``)."""

from __future__ import annotations

import json
import os
import signal
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import tzrun
from tests.conftest import cli
from tests.warm_ranks import warm_cli
from tests.integration import seq_model_plugin
from tests.integration.test_train import _sets
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.distributed import shutdown_distributed
from tzrun.runner.session import Session
from tzrun.runner.trainer import train

pytestmark = pytest.mark.slow

CONFIG = """
model_dir = "{model_dir}"
[data]
train_input = "{train}"
eval_input = "{train}"
batch_size = 128
eval_batch_size = 700
labels = ["label"]
[model]
type = "seq_tower"
[[losses]]
type = "binary_cross_entropy"
[[metrics]]
type = "auc"
[train]
num_steps = 6
save_checkpoints_steps = 3
seed = 3
stages = []
sparse_optimizer = {{ type = "rowwise_adagrad", lr = 0.1 }}
dense_optimizer = {{ type = "adam", lr = 0.01 }}
[[features.dense]]
name = "price"
[[features.sparse]]
name = "adgroup_id"
num_buckets = 50
embedding_dim = 8
table = "adgroup"
[[features.sparse]]
name = "user"
num_buckets = 30
embedding_dim = 8
[[features.sequence]]
name = "click_seq"
max_len = 5
separator = ";"
query = ["adgroup_id"]
[[features.sequence.features]]
name = "click_seq__adgroup_id"
column = "seq_ad"
table = "adgroup"
[[features.sequence]]
name = "cate_seq"
max_len = 4
[[features.sequence.features]]
name = "cate_seq__cate_id"
column = "seq_cate"
num_buckets = 7
embedding_dim = 4
sparse_optimizer = {{ type = "sgd", lr = 0.5 }}
"""

SEQUENCE_TABLES = ("adgroup", "cate_seq__cate_id_emb")


@pytest.fixture(scope="module")
def seq_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 rows: sequences of 0..8 ids as lists and as ';'-joined strings."""
    rng = np.random.default_rng(0)
    rows = 2000
    lengths = rng.integers(0, 9, rows)
    ads = [rng.integers(0, 50, n).tolist() for n in lengths]
    out = tmp_path_factory.mktemp("seq") / "train"
    out.mkdir()
    table = pa.table({
        "label": rng.integers(0, 2, rows).astype(np.float32),
        "price": rng.random(rows).astype(np.float32),
        "adgroup_id": rng.integers(0, 50, rows),
        "user": rng.integers(0, 30, rows),
        "seq_ad": [";".join(map(str, a)) for a in ads],
        "seq_cate": pa.array([[x % 7 for x in a] for a in ads], pa.list_(pa.int64())),
    })
    pq.write_table(table, out / "part-0.parquet", row_group_size=500)
    return out


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    yield
    shutdown_distributed()


class StopAt:
    """Sends itself SIGUSR1 after a step (as test_resume's ``Losses`` does)."""

    def __init__(self, step: int) -> None:
        self.step = step

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        if step.step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


def _session(model_dir: Path, data: Path, *overrides: str, plugins=()) -> Session:
    pm = make_plugin_manager(plugins=[("seq", seq_model_plugin.PLUGIN), *plugins])
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=model_dir, train=data), "<test>", list(overrides))
    return Session(load_config(raw, registries), raw, pm, registries)


def saved(step_dir: Path) -> dict[str, torch.Tensor]:
    """The model tensors a checkpoint saved, whole (read in this process, any number of ranks)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = step_dir.parent.parent / f"{step_dir.name}.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(step_dir / "state"), str(target))
    state = torch.load(target, weights_only=False)
    model = state["model"] if "model" in state else state
    return {k: v for k, v in _flat(model).items() if isinstance(v, torch.Tensor)}


def _flat(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _tables(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if "embeddings." in k or "embedding_bags." in k}


def test_sequence_tables_take_their_sparse_optimizers_and_constraints(seq_data, tmp_path):
    from tzrun.runner.sharding import prepare_sharding

    session = _session(tmp_path / "md", seq_data)
    setup = prepare_sharding(session.facts, world_size=2, local_world_size=2, device=torch.device("cpu"))
    assert {t: setup.updates[t].path for t in SEQUENCE_TABLES} == {
        "adgroup": "train.sparse_optimizer",
        "cate_seq__cate_id_emb": "features.sequence[1].features[0].sparse_optimizer",
    }
    assert setup.updates["cate_seq__cate_id_emb"].spec.fbgemm_type == "EXACT_SGD"
    assert set(SEQUENCE_TABLES) <= set(setup.constraints)


def test_a_sequence_run_stopped_and_resumed_is_the_uninterrupted_run(seq_data, tmp_path):
    whole = train(_session(tmp_path / "whole", seq_data))
    assert whole.steps == 6
    stopped = train(_session(tmp_path / "split", seq_data, plugins=[("stop", StopAt(4))]))
    assert stopped.stopped_by == "SIGUSR1" and stopped.steps == 4
    resumed = train(_session(tmp_path / "split", seq_data), resume=True)
    assert resumed.steps == 6
    assert resumed.eval.metrics == whole.eval.metrics and 0.0 < whole.eval.metrics["auc"] < 1.0
    a, b = saved(tmp_path / "whole" / "checkpoints" / "step-6"), saved(tmp_path / "split" / "checkpoints" / "step-6")
    tables = _tables(a)
    assert {k.split("embeddings.")[1].removesuffix(".weight") for k in tables if "embeddings." in k} == set(SEQUENCE_TABLES)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []  # weights and optimizer state, to the bit
    first = saved(tmp_path / "whole" / "checkpoints" / "step-3")
    assert all(not torch.equal(first[k], a[k]) for k in tables)  # the sequence tables did train


@pytest.mark.multiproc
def test_sequence_tables_shard_on_two_ranks_and_load_bit_identically_on_one_and_back(seq_data, tmp_path):
    env = seq_model_plugin.install(tmp_path / "site")
    config = tmp_path / "seq.toml"
    config.write_text(CONFIG.format(model_dir=tmp_path / "two", train=seq_data))
    frozen = ['train.sparse_optimizer={type = "sgd", lr = 0.0}', 'train.dense_optimizer={type = "sgd", lr = 0.0}',
              'features.sequence[1].features[0].sparse_optimizer={type = "sgd", lr = 0.0}', "train.num_steps=1"]

    def run(model_dir: Path, *args: str, nproc: int = 1, sets=()) -> None:
        cmd = ["train", str(config), "--set", f'model_dir="{model_dir}"', *_sets(list(sets)), *args]
        proc = warm_cli(cmd + ["--nproc-per-node", str(nproc)], env=env) if nproc > 1 else cli(cmd, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]

    two = tmp_path / "two"
    # the sequence tables split over both ranks (TorchRec shards an EmbeddingCollection row-wise on CPU too)
    row_wise = ['features.sparse[0].embedding_constraints={sharding_types = ["row_wise"]}',
                'features.sequence[1].features[0].embedding_constraints={sharding_types = ["row_wise"]}']
    run(two, nproc=2, sets=["train.num_steps=3", *row_wise])
    plan = cli(["plan", str(config), "--world-size", "2", "--json"], env=env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = {t["table"]: t for t in json.loads(plan.stdout)["tables"]}
    assert planned["adgroup"]["features"] == ["click_seq__adgroup_id", "adgroup_id"]
    assert planned["cate_seq__cate_id_emb"]["features"] == ["cate_seq__cate_id"]
    # 2 -> 1: the sharded sequence tables load whole (lr 0: a step changes nothing)
    one = tmp_path / "one"
    run(one, "--init-from", str(two / "checkpoints" / "step-3"), sets=frozen)
    source, loaded = _tables(saved(two / "checkpoints" / "step-3")), _tables(saved(one / "checkpoints" / "step-1"))
    weights = [k for k in source if k.endswith(".weight")]
    assert any("seq.collections" in k for k in weights)
    assert [k for k in weights if not torch.equal(source[k], loaded[k])] == []
    # 1 -> 2, and a resume on another number of ranks continues the run
    back = tmp_path / "back"
    run(back, "--init-from", str(one / "checkpoints" / "step-1"), nproc=2, sets=[*frozen, *row_wise])
    again = _tables(saved(back / "checkpoints" / "step-1"))
    assert [k for k in weights if not torch.equal(source[k], again[k])] == []
    run(two, "--resume", sets=["train.num_steps=4", *row_wise])
    assert [s for s, _ in list_checkpoints(two)][-1] == 4


def test_a_model_that_reads_no_sequences_is_refused_on_a_config_with_them(seq_data, tmp_path):
    from tzrun.errors import ConfigError
    from tzrun.runner.sharding import prepare_sharding

    session = _session(tmp_path / "md", seq_data, 'model={type = "deepfm", deep_hidden_units = [8], final_hidden_units = [4]}')
    with pytest.raises(ConfigError, match=r"model\.type: model 'deepfm' does not read \[\[features\.sequence\]\]"):
        prepare_sharding(session.facts, world_size=1, local_world_size=1, device=torch.device("cpu"))
