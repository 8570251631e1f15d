"""Sparse optimizers through torchrec and FBGEMM's CPU kernels, against the update rules written
out in plain torch; their configs; the GPU-only specs' fallbacks.

Each case shards a small EmbeddingBagCollection with DistributedModelParallel on a one-process
gloo group, as a run does, trains three steps, and compares every row with a reference that
applies FBGEMM's rule (``fbgemm_gpu/codegen/genscript/optimizers.py``) to the touched rows.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist

from tzrun.errors import ConfigError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.sparse_state import set_initial_accumulators
from tzrun.testing import load_config_text
from tzrun_plugins.optim import sparse
from tests.core.test_config import MINIMAL

ROWS, DIM, BATCH = 10, 4, 3
# Per step, per feature, the ids of each bag: repeated ids in a bag and across bags, empty bags.
IDS = [
    {"f0": [[1, 1], [2], []], "f1": [[3], [5, 3], [7]], "f2": [[1], [], [4]]},
    {"f0": [[2, 6], [1], [6]], "f1": [[3], [], [9, 9]], "f2": [[2], [6], []]},
    {"f0": [[1], [8, 1], [2]], "f1": [[5], [3], [0]], "f2": [[], [1, 1], [4]]},
]


def _seeded(seed: int, *shape: int, scale: float) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


W0 = {"t0": _seeded(1, ROWS, DIM, scale=0.5), "t1": _seeded(2, ROWS, DIM, scale=0.5)}
# The loss is sum(pooled[f] * COEF[step][f]): COEF is each bag's pooled-output gradient.
COEF = [{f: _seeded(10 * step + i, BATCH, DIM, scale=2.0) for i, f in enumerate(("f0", "f1", "f2"))} for step in range(3)]


@pytest.fixture(scope="module", autouse=True)
def process_group():
    """A one-process gloo group (TorchRec's sharding needs one); left alone if one exists."""
    from tzrun.runner.distributed import init_distributed, shutdown_distributed

    created = not dist.is_initialized()
    init_distributed()
    yield
    if created:
        shutdown_distributed()


def features(shared: bool) -> dict[str, list[str]]:
    """Table -> features; ``shared`` lets a second feature read ``t0``."""
    return {"t0": ["f0", "f2"] if shared else ["f0"], "t1": ["f1"]}


def sharded(spec: Any, tables: dict[str, list[str]], world_size: int = 1, sharding_type: Optional[str] = None) -> Any:
    """A DMP-sharded EBC of ``tables`` (name -> features) with ``spec`` fused into it, planned
    as a run plans it (or with every table on ``sharding_type``)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from tzrun.runner.sharding import fused_constraints

    configs = [EmbeddingBagConfig(name=t, embedding_dim=DIM, num_embeddings=ROWS, feature_names=fs) for t, fs in tables.items()]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    apply_optimizer_in_backward(spec.optimizer_class, ebc.parameters(), dict(spec.kwargs))
    constraints = fused_constraints([ebc])
    if sharding_type is not None:
        constraints = {t: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=["fused"]) for t in tables}
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu"),
        batch_size=BATCH,
        constraints=constraints,
    )
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(ebc, sharders, pg)
    return DistributedModelParallel(
        ebc, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=torch.device("cpu")
    )


def fresh(spec: Any, shared: bool = False) -> Any:
    """``sharded`` on this process, holding ``W0``."""
    model = sharded(spec, features(shared))
    with torch.no_grad():
        for table, weight in weights(model).items():
            weight.copy_(W0[table])
    return model


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's (whole, on one process) weight of each table: views into FBGEMM's."""
    return {
        key.split(".")[-2]: value.local_shards()[0].tensor
        for key, value in model.state_dict().items()
    }


def train(model: Any, shared: bool = False, lr_after_first_step: Optional[float] = None) -> dict[str, torch.Tensor]:
    """Three forward/backward steps (the fused update runs in backward); the weights after."""
    from torchrec import KeyedJaggedTensor

    keys = [f for fs in features(shared).values() for f in fs]
    for step, ids in enumerate(IDS):
        bags = [ids[k] for k in keys]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.tensor([i for bag_list in bags for bag in bag_list for i in bag]),
            lengths=torch.tensor([len(bag) for bag_list in bags for bag in bag_list]),
        )
        pooled = model(kjt)
        sum((pooled[k] * COEF[step][k]).sum() for k in keys).backward()
        if step == 0 and lr_after_first_step is not None:
            for group in model.fused_optimizer.param_groups:
                group["lr"] = lr_after_first_step
        model.fused_optimizer.step()  # what the train loop does; applies param_groups' lr
    return {table: weight.clone() for table, weight in weights(model).items()}


def row_gradients(step: int, table: str, shared: bool, max_gradient: Optional[float]) -> dict[int, torch.Tensor]:
    """Each touched row's gradient: the bags' pooled-output gradients, each clamped (FBGEMM
    clips the output gradient before it reaches the rows), summed over every lookup."""
    grads: dict[int, torch.Tensor] = {}
    for feature in features(shared)[table]:
        for bag, ids in enumerate(IDS[step][feature]):
            g = COEF[step][feature][bag].double()
            if max_gradient is not None:
                g = g.clamp(-max_gradient, max_gradient)
            for i in ids:
                grads[i] = grads.get(i, 0) + g
    return grads


def reference(
    name: str,
    lr: float,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    mode: str = "none",
    max_gradient: Optional[float] = None,
    h0: float = 0.0,
    shared: bool = False,
    lrs: Optional[list[float]] = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """FBGEMM's rule on the touched rows: the weights and accumulators after three steps."""
    w = {t: W0[t].double().clone() for t in W0}
    h = {t: torch.full((ROWS, DIM) if name == "adagrad" else (ROWS,), h0, dtype=torch.float64) for t in W0}
    for step in range(len(IDS)):
        step_lr = lrs[step] if lrs else lr
        for table in w:
            for i, g in row_gradients(step, table, shared, max_gradient).items():
                row = w[table][i]
                if name == "sgd":
                    row -= step_lr * g
                elif name == "adagrad":
                    h[table][i] += g * g
                    row -= step_lr * g / (h[table][i].sqrt() + eps)
                else:  # rowwise_adagrad
                    g_decayed = g + weight_decay * row if mode == "l2" else g
                    h[table][i] += (g_decayed * g_decayed).mean()
                    multiplier = step_lr / (h[table][i].sqrt() + eps)
                    correction = {"l2": 1 - multiplier * weight_decay, "decoupled": 1 - step_lr * weight_decay}
                    row.copy_(correction.get(mode, 1.0) * row - multiplier * g)
    return w, h


def assert_rows_match(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], shared: bool = False) -> None:
    for table, weight in actual.items():
        touched = {i for step in range(len(IDS)) for f in features(shared)[table] for bag in IDS[step][f] for i in bag}
        for i in range(ROWS):
            if i in touched:
                torch.testing.assert_close(weight[i].double(), expected[table][i], rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(weight[i], W0[table][i]), f"{table} row {i} is untouched but changed"


def accumulators(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        key.rpartition(".")[0]: value.local_shards()[0].tensor
        for per_param in model.fused_optimizer.state.values()
        for key, value in per_param.items()
        if key.endswith(".momentum1")
    }


@pytest.mark.parametrize(
    ("name", "build", "cfg", "ref"),
    [
        ("sgd", sparse.build_sgd, sparse.SparseSGDConfig(lr=0.1), {}),
        # a large eps tells sqrt(h) + eps from sqrt(h + eps)
        ("adagrad", sparse.build_adagrad, sparse.SparseAdagradConfig(lr=0.1, eps=0.1), {"eps": 0.1}),
        ("rowwise_adagrad", sparse.build_rowwise_adagrad, sparse.SparseRowWiseAdagradConfig(lr=0.1, eps=0.1), {"eps": 0.1}),
    ],
)
def test_fused_update_matches_the_rule_on_touched_rows_only(name, build, cfg, ref):
    model = fresh(build(cfg))
    expected, h = reference(name, lr=0.1, **ref)
    assert_rows_match(train(model), expected)
    for table, state in accumulators(model).items():
        torch.testing.assert_close(state.double(), h[table], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["l2", "decoupled"])
def test_rowwise_adagrad_weight_decay_modes_and_fbgemms_cpu_gap(mode):
    """``t0`` (read by two features) decays by FBGEMM's rule. ``t1`` (one feature) does not:
    FBGEMM's CPU kernel hands a float32 table read by one feature to its vectorised row-wise
    Adagrad with weight decay 0 (docs/sparse_optimizers.md); this fails once FBGEMM applies it."""
    cfg = sparse.SparseRowWiseAdagradConfig(lr=0.1, eps=0.1, weight_decay=0.5, weight_decay_mode=mode)
    decayed, _ = reference("rowwise_adagrad", lr=0.1, eps=0.1, weight_decay=0.5, mode=mode, shared=True)
    without_decay, _ = reference("rowwise_adagrad", lr=0.1, eps=0.1, shared=True)
    assert not torch.allclose(decayed["t0"], without_decay["t0"], atol=1e-3)
    actual = train(fresh(sparse.build_rowwise_adagrad(cfg), shared=True), shared=True)
    assert_rows_match(actual, {"t0": decayed["t0"], "t1": without_decay["t1"]}, shared=True)


@pytest.mark.parametrize(
    ("name", "build", "cfg"),
    [
        ("sgd", sparse.build_sgd, sparse.SparseSGDConfig(lr=0.1, gradient_clipping=True, max_gradient=0.5)),
        ("rowwise_adagrad", sparse.build_rowwise_adagrad,
         sparse.SparseRowWiseAdagradConfig(lr=0.1, eps=0.1, gradient_clipping=True, max_gradient=0.5)),
    ],
)
def test_gradient_clipping_clamps_each_bags_output_gradient_before_the_sum(name, build, cfg):
    expected, _ = reference(name, lr=0.1, eps=0.1, max_gradient=0.5)
    unclipped, _ = reference(name, lr=0.1, eps=0.1)
    assert not torch.allclose(expected["t0"], unclipped["t0"], atol=1e-3)
    assert_rows_match(train(fresh(build(cfg))), expected)


@pytest.mark.parametrize(
    ("name", "build", "cfg"),
    [
        ("adagrad", sparse.build_adagrad, sparse.SparseAdagradConfig(lr=0.1, initial_accumulator_value=4.0)),
        ("rowwise_adagrad", sparse.build_rowwise_adagrad,
         sparse.SparseRowWiseAdagradConfig(lr=0.1, initial_accumulator_value=4.0)),
    ],
)
def test_initial_accumulator_is_written_into_fbgemms_state(name, build, cfg):
    spec = build(cfg)
    assert spec.initial_accumulator_value == 4.0 and "initial_accumulator_value" not in spec.kwargs
    model = fresh(spec)
    assert set_initial_accumulators(model, {"t0": spec.initial_accumulator_value}) == ["t0"]
    actual = train(model)
    expected_t0, h = reference(name, lr=0.1, h0=4.0)
    expected_t1, _ = reference(name, lr=0.1)
    assert_rows_match(actual, {"t0": expected_t0["t0"], "t1": expected_t1["t1"]})
    torch.testing.assert_close(accumulators(model)["t0"].double(), h["t0"], rtol=1e-5, atol=1e-6)


def test_set_initial_accumulators_names_what_it_cannot_set():
    model = fresh(sparse.build_adagrad(sparse.SparseAdagradConfig(lr=0.1)))
    with pytest.raises(ValueError, match=r"no embedding table named 'nope' \(tables: t0, t1\)"):
        set_initial_accumulators(model, {"t0": 1.0, "nope": 1.0})
    sgd = fresh(sparse.build_sgd(sparse.SparseSGDConfig(lr=0.1)))
    with pytest.raises(ValueError, match="no fused momentum1 state for 't1'"):
        set_initial_accumulators(sgd, {"t1": 1.0})


def _two_rank_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        spec = sparse.build_rowwise_adagrad(sparse.SparseRowWiseAdagradConfig(lr=0.1))
        model = sharded(spec, {"t0": ["f0"], "t1": ["f1"], "t2": ["f2"]}, world_size=2, sharding_type="table_wise")
        names = set_initial_accumulators(model, {"t0": 3.0, "t1": 5.0, "t2": 7.0})
        shards = {
            key.rpartition(".")[0]: [sorted(set(shard.tensor.flatten().tolist())) for shard in value.local_shards()]
            for per_param in model.fused_optimizer.state.values()
            for key, value in per_param.items()
        }
        ranks = {table: sharding.ranks for table, sharding in model.plan.plan[""].items()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"set": names, "shards": shards, "ranks": ranks}))
    finally:
        dist.destroy_process_group()


def test_initial_accumulators_fill_every_shard_on_each_rank(tmp_path):
    from tests.warm_ranks import warm_spawn

    warm_spawn(_two_rank_worker, (str(tmp_path / "store"), str(tmp_path)))
    values = {"t0": 3.0, "t1": 5.0, "t2": 7.0}
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        here = sorted(t for t, ranks in out["ranks"].items() if rank in ranks)
        assert out["set"] == here
        assert 0 < len(here) < len(values)  # the planner spread the tables: each rank skips one
        assert out["shards"] == {t: [[values[t]]] for t in here}


def test_learning_rate_set_through_the_fused_optimizer_takes_effect():
    model = fresh(sparse.build_rowwise_adagrad(sparse.SparseRowWiseAdagradConfig(lr=0.1)))
    expected, _ = reference("rowwise_adagrad", lr=0.1, lrs=[0.1, 0.02, 0.02])
    assert_rows_match(train(model, lr_after_first_step=0.02), expected)


@pytest.fixture(scope="module")
def registries():
    return collect_registries(make_plugin_manager())


def problems(override: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(MINIMAL, overrides=[f"train.sparse_optimizer={override}"])
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ('{type="sgd", lr=-0.1}', "lr", ">= 0"),
        ('{type="rowwise_adagrad", lr=0.1, weight_decay=0.01, weight_decay_mode="none"}', "weight_decay",
         'weight_decay = 0.01 with weight_decay_mode = "none": '
         'set weight_decay_mode = "l2" or "decoupled", or weight_decay = 0'),
        ('{type="adagrad", lr=0.1, gradient_clipping=true, max_gradient=0}', "max_gradient", "> 0"),
        ('{type="adagrad", lr=0.1, initial_accumulator_value=-1}', "initial_accumulator_value", ">= 0"),
        ('{type="adam", lr=0.1, beta2=1.0}', "beta2", "< 1"),
        ('{type="sgd", lr=0.1, eps=0.1}', "eps", "unknown key (known keys: lr, gradient_clipping, max_gradient)"),
    ],
)
def test_config_errors_name_the_key_and_the_fix(override, key, fragment):
    found = problems(override)
    assert any(p.startswith("train.sparse_optimizer") and key in p and fragment in p for p in found), found


def test_weight_decay_mode_is_one_of_three(registries):
    assert any("weight_decay_mode" in p for p in problems('{type="rowwise_adagrad", lr=0.1, weight_decay_mode="l1"}'))
    cfg, _ = load_config_text(MINIMAL, overrides=['train.sparse_optimizer={type="rowwise_adagrad", lr=0.1}'])
    assert cfg.train.sparse_optimizer.config.weight_decay_mode == "l2"
    spec = registries["sparse_optimizer"].get("rowwise_adagrad", "x").build(cfg.train.sparse_optimizer.config)
    assert "weight_decay_mode" not in spec.kwargs  # weight_decay = 0: FBGEMM's default, no decay


GPU_ONLY = {
    "adam": "ADAM",
    "lamb": "LAMB",
    "lars_sgd": "LARS_SGD",
    "partial_rowwise_adam": "PARTIAL_ROWWISE_ADAM",
    "partial_rowwise_lamb": "PARTIAL_ROWWISE_LAMB",
}


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad", *GPU_ONLY])
def test_every_spec_is_an_fbgemm_optimizer_with_fbgemm_options(registries, name):
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    entry = registries["sparse_optimizer"].get(name, "x")
    override = f'train.sparse_optimizer={{type="{name}", lr=0.5, gradient_clipping=true}}'
    cfg, _ = load_config_text(MINIMAL, overrides=[override])
    spec = entry.build(cfg.train.sparse_optimizer.config)
    assert optimizer_type_to_emb_opt_type(spec.optimizer_class).name == spec.fbgemm_type
    tbe_options = set(inspect.signature(SplitTableBatchedEmbeddingBagsCodegen.__init__).parameters) | {"lr"}
    assert set(spec.kwargs) <= tbe_options
    if name in GPU_ONLY:
        assert spec.fbgemm_type == GPU_ONLY[name] and not spec.cpu_supported and callable(spec.torch_fallback)
        assert entry.description.endswith('CUDA only (CPU: cpu_policy = "data_parallel")')
    else:
        assert spec.cpu_supported and spec.torch_fallback is None
        assert entry.description.endswith("CPU and CUDA")
