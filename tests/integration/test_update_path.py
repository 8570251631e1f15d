"""The update path in real runs (one process, TorchRec DMP, FBGEMM CPU kernels): dense
optimizer parts, gradient accumulation, autocast, fp16 loss scaling, clipping, EMA, per-table
sparse optimizers, frozen tables, the CPU policy for GPU-only sparse optimizers, TF32 switches,
and schedules that continue after a checkpoint restore."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import tzrun
from tzrun.config.load import load_config, parse_config
from tzrun.errors import ConfigError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.dense_parts import assign_parts
from tests.checkpoint_entries import read_saved
from tzrun.runner.checkpoint import checkpoint_dir
from tzrun.runner.distributed import init_distributed, shutdown_distributed
from tzrun.runner.session import seed_everything as _seed_everything
from tzrun.runner.session import Session
from tzrun.runner.trainer import Trainer, train

pytestmark = pytest.mark.slow

CONFIG = """
model_dir = "{model_dir}"

[data]
train_input = "{train}"
batch_size = 256
labels = ["label"]

[model]
type = "deepfm"
deep_hidden_units = [16, 8]
final_hidden_units = [8]
wide_embedding_dim = 4

[[losses]]
type = "binary_cross_entropy"

[train]
num_steps = 4
seed = 3
pipeline = {{ type = "base" }}
stages = []
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}

[[features.dense]]
name = "int_0"
log1p = true

[[features.dense]]
name = "int_1"
log1p = true

[[features.sparse]]
name = "cat_0"
num_buckets = 1000
embedding_dim = 8

[[features.sparse]]
name = "cat_1"
num_buckets = 500
embedding_dim = 8

[[features.sparse]]
name = "cat_2"
num_buckets = 4000
embedding_dim = 8
"""


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    yield
    shutdown_distributed()


class Recorder:
    """A plugin that snapshots the model's weights before training and after every step."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.after_steps: list[dict[str, torch.Tensor]] = []
        self.lrs: list[dict[str, float]] = []
        self.metrics: list[dict[str, float]] = []
        self.run: Any = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run):
        self.run = run
        self.before = weights(run.model)

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        self.after_steps.append(weights(run.model, dense_only=True))
        self.lrs.append(dict(step.learning_rates))
        self.metrics.append(dict(step.metrics))


def _local(value: Any) -> torch.Tensor:
    return value.local_shards()[0].tensor if hasattr(value, "local_shards") else value


def weights(model: Any, dense_only: bool = False) -> dict[str, torch.Tensor]:
    """Every weight of the model by user name (``deep.0.weight``, ``table:cat_0_emb``)."""
    out = {}
    for key, value in model.state_dict().items():
        name = key.removeprefix("model.")
        if "embedding_bags." in name:
            if dense_only:
                continue
            name = "table:" + name.split("embedding_bags.")[1].removesuffix(".weight")
        out[name] = _local(value).detach().clone().float()
    return out


def run_small(tmp_path: Path, criteo_dir: Path, *overrides: str, name: str = "run") -> tuple[Any, Recorder]:
    model_dir = tmp_path / name
    text = CONFIG.format(model_dir=model_dir, train=criteo_dir / "train")
    recorder = Recorder()
    pm = make_plugin_manager(plugins=[("recorder", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(text, "<test>", overrides)
    cfg = load_config(raw, registries)
    result = train(Session(cfg, raw, pm, registries))
    return result, recorder


def dense_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("table:")}


def final_weights(result: Any) -> dict[str, torch.Tensor]:
    return weights(result.model)


# -- dense optimizer parts -------------------------------------------------------------------


def test_a_part_optimizer_owns_the_parameters_its_pattern_matches(tmp_path, criteo_dir):
    result, rec = run_small(
        tmp_path, criteo_dir,
        'train.dense_optimizer.parts=[{type = "sgd", lr = 0.0, pattern = "deep\\\\..*"}]',
    )
    after = final_weights(result)
    deep = [k for k in after if k.startswith("deep.")]
    others = [k for k in dense_of(after) if not k.startswith("deep.")]
    assert deep and others
    for k in deep:  # the part's lr is 0: its parameters never move
        assert torch.equal(after[k], rec.before[k]), k
    assert all(not torch.equal(after[k], rec.before[k]) for k in others)
    assert rec.lrs[0]["dense.parts[0]"] == 0.0 and rec.lrs[0]["dense"] == pytest.approx(0.1)


def test_a_parameter_in_two_parts_is_an_error_naming_both_patterns(tzrun_pm):
    from tzrun.testing import load_config_text

    text = CONFIG.format(model_dir="unused", train="unused")
    cfg, registries = load_config_text(text, tzrun_pm, [
        'train.dense_optimizer.parts=[{type = "sgd", lr = 0.1, pattern = "deep\\\\..*"}, {type = "adam", lr = 0.1, pattern = ".*\\\\.bias"}, {type = "sgd", lr = 0.1, pattern = "nothing"}]',
    ])
    names = ["deep.0.weight", "deep.0.bias", "final.0.bias", "output.weight"]
    with pytest.raises(ConfigError) as info:
        assign_parts(names, cfg.train.dense_optimizer.fields.parts)
    text = str(info.value)
    assert "train.dense_optimizer.parts[1].pattern: parameter 'deep.0.bias' is matched by parts[0] ('deep\\..*') and parts[1] ('.*\\.bias')" in text
    assert "train.dense_optimizer.parts[2].pattern: 'nothing' matches no dense parameter" in text


def test_part_config_errors_name_the_toml_path(tzrun_pm):
    from tzrun.testing import load_config_text

    text = CONFIG.format(model_dir="unused", train="unused")
    with pytest.raises(ConfigError) as info:
        load_config_text(text, tzrun_pm, [
            'train.dense_optimizer.parts=[{type = "sgd", lr = 0.1}, {type = "sgd", lr = 0.1, pattern = "("}, {type = "sgdd", lr = 1.0, pattern = "x"}]',
            "train.dense_optimizer.ema={decay = 1.5}",
        ])
    problems = [str(p) for p in info.value.problems]
    assert any(p.startswith("train.dense_optimizer.parts[0].pattern: each part needs pattern") for p in problems), problems
    assert any(p.startswith("train.dense_optimizer.parts[1].pattern: not a valid regular expression") for p in problems), problems
    assert any(p.startswith("train.dense_optimizer.parts[2].type: unknown dense optimizer 'sgdd'") for p in problems), problems
    assert any(p.startswith("train.dense_optimizer.ema.decay: must be between 0 and 1") for p in problems), problems


# -- gradient accumulation -------------------------------------------------------------------


def test_n_accumulated_micro_batches_equal_one_n_times_larger_batch_for_dense_sgd(tmp_path, criteo_dir):
    frozen = "train.sparse_optimizer.lr=0.0"
    big, _ = run_small(tmp_path, criteo_dir, frozen, "data.batch_size=512", "train.num_steps=2", name="big")
    accumulated, _ = run_small(
        tmp_path, criteo_dir, frozen, "data.batch_size=256", "train.num_steps=4",
        "train.gradient_accumulation_steps=2", name="acc",
    )
    plain, _ = run_small(tmp_path, criteo_dir, frozen, "data.batch_size=256", "train.num_steps=4", name="plain")
    a, b, c = (dense_of(final_weights(r)) for r in (big, accumulated, plain))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    assert any(not torch.allclose(c[k], a[k], rtol=1e-4, atol=1e-5) for k in a)  # the control differs


def test_under_accumulation_embeddings_still_get_each_batch_unscaled_gradient(tmp_path, criteo_dir):
    frozen_dense = "train.dense_optimizer.lr=0.0"
    accumulated, _ = run_small(tmp_path, criteo_dir, frozen_dense, "train.gradient_accumulation_steps=4", name="acc")
    plain, rec = run_small(tmp_path, criteo_dir, frozen_dense, name="plain")
    a, b = final_weights(accumulated), final_weights(plain)
    tables = [k for k in a if k.startswith("table:")]
    assert tables
    for k in tables:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7, msg=k)
    assert any(not torch.equal(b[k], rec.before[k]) for k in tables)


def test_a_partial_window_at_the_end_is_stepped_as_its_mean(tmp_path, criteo_dir):
    frozen = "train.sparse_optimizer.lr=0.0"
    # 3 batches with accumulation 4: one dense step on the mean of the 3 = one batch of 768 rows
    partial, _ = run_small(tmp_path, criteo_dir, frozen, "train.num_steps=3", "train.gradient_accumulation_steps=4", name="p")
    one, _ = run_small(tmp_path, criteo_dir, frozen, "train.num_steps=1", "data.batch_size=768", name="one")
    a, b = dense_of(final_weights(partial)), dense_of(final_weights(one))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


# -- precision, loss scaling, clipping --------------------------------------------------------


class DtypeProbe:
    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    @tzrun.hookimpl
    def tzrun_before_train(self, run):
        linear = next(m for m in run.model.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda m, i, o: self.dtypes.add(o.dtype))


def _run_with(tmp_path, criteo_dir, plugin, *overrides, name="run"):
    pm = make_plugin_manager(plugins=[("probe", plugin)])
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=tmp_path / name, train=criteo_dir / "train"), "<test>", overrides)
    return train(Session(load_config(raw, registries), raw, pm, registries))


def test_bf16_autocast_trains_on_cpu_under_the_default_pipeline(tmp_path, criteo_dir):
    probe = DtypeProbe()  # sparse_dist (the default) traces the forward: the autocast device is no batch field
    result = _run_with(tmp_path, criteo_dir, probe, 'train.mixed_precision="bf16"', 'train.pipeline={type="sparse_dist"}')
    assert probe.dtypes == {torch.bfloat16}
    assert result.steps == 4
    assert all(torch.isfinite(v).all() for v in final_weights(result).values())
    probe32 = DtypeProbe()
    _run_with(tmp_path, criteo_dir, probe32, name="fp32")
    assert probe32.dtypes == {torch.float32}


def test_fp16_with_the_scaler_leaves_embedding_updates_unscaled(tmp_path, criteo_dir):
    scaled, rec = run_small(
        tmp_path, criteo_dir, 'train.mixed_precision="fp16"', "train.grad_scaler={init_scale = 1024.0}",
        "train.num_steps=1", name="fp16",
    )
    plain, _ = run_small(tmp_path, criteo_dir, "train.num_steps=1", name="fp32")
    a, b = final_weights(scaled), final_weights(plain)
    for k in (k for k in a if k.startswith("table:")):
        moved_fp16 = (a[k] - rec.before[k]).norm()
        moved_fp32 = (b[k] - rec.before[k]).norm()
        assert moved_fp32 > 0
        assert moved_fp16 == pytest.approx(float(moved_fp32), rel=0.02), k  # not 1024x
    update = read_saved(checkpoint_dir(tmp_path / "fp16", 1), "update")
    assert update["scaler"]["scale"] == 1024.0


def test_fp16_gradients_are_unscaled_before_clipping(tmp_path, criteo_dir):
    result, rec = run_small(
        tmp_path, criteo_dir, 'train.mixed_precision="fp16"', "train.grad_scaler={init_scale = 4096.0}",
        "train.grad_clipping={by = \"norm\", max_gradient = 0.001}", "train.dense_optimizer.lr=1.0",
        "train.sparse_optimizer.lr=0.0", "train.num_steps=1",
    )
    after = dense_of(final_weights(result))
    moved = torch.cat([(after[k] - rec.before[k]).flatten() for k in after]).norm()
    # clipped after unscaling: the step is lr * 0.001; clipping the scaled gradient would give 0.001/4096
    assert float(moved) == pytest.approx(0.001, rel=1e-2)


def test_clipping_by_norm_bounds_the_global_dense_step(tmp_path, criteo_dir):
    result, rec = run_small(
        tmp_path, criteo_dir, "train.grad_clipping={max_gradient = 0.01}", "train.dense_optimizer.lr=1.0",
        "train.sparse_optimizer.lr=0.0", "train.num_steps=1",
    )
    after = dense_of(final_weights(result))
    moved = torch.cat([(after[k] - rec.before[k]).flatten() for k in after]).norm()
    assert float(moved) == pytest.approx(0.01, rel=1e-4)


def test_clipping_by_value_bounds_every_element(tmp_path, criteo_dir):
    result, rec = run_small(
        tmp_path, criteo_dir, 'train.grad_clipping={by = "value", max_gradient = 0.0001}', "train.dense_optimizer.lr=1.0",
        "train.sparse_optimizer.lr=0.0", "train.num_steps=1",
    )
    after = dense_of(final_weights(result))
    steps = torch.cat([(after[k] - rec.before[k]).flatten().abs() for k in after])
    assert float(steps.max()) == pytest.approx(0.0001, rel=1e-3)  # some gradients were larger and clamped


def test_grad_scaler_without_fp16_is_a_config_error(tzrun_pm):
    from tzrun.testing import load_config_text

    with pytest.raises(ConfigError, match=r"train.grad_scaler: loss scaling is for fp16 gradients"):
        load_config_text(CONFIG.format(model_dir="x", train="x"), tzrun_pm, ["train.grad_scaler={}"])


# -- EMA ---------------------------------------------------------------------------------------


def test_ema_averages_the_dense_weights_and_is_saved(tmp_path, criteo_dir):
    result, rec = run_small(tmp_path, criteo_dir, "train.dense_optimizer.ema={decay = 0.5}", name="ema")
    expected: dict[str, torch.Tensor] = {}
    for snapshot in rec.after_steps:
        for k, v in snapshot.items():
            expected[k] = v.clone() if k not in expected else 0.5 * expected[k] + 0.5 * v
    saved = read_saved(checkpoint_dir(tmp_path / "ema", 4), "update")["ema"]
    assert saved["updates"] == 4
    averages = {k.removeprefix("model."): v for k, v in saved["averages"].items()}
    assert set(averages) == set(expected)
    for k in expected:
        torch.testing.assert_close(averages[k], expected[k], rtol=1e-5, atol=1e-7, msg=k)
    # training goes on with the raw weights; evaluation swaps the averages in and back out
    final = dense_of(final_weights(result))
    for k in final:
        assert torch.equal(final[k], rec.after_steps[-1][k])


def test_evaluation_uses_the_ema_weights_when_asked(tmp_path, criteo_dir):
    with_eval = (f'data.eval_input="{criteo_dir / "eval"}"', 'metrics=[{type = "auc"}]', "eval.num_steps=2")
    on, _ = run_small(tmp_path, criteo_dir, *with_eval, "train.dense_optimizer.ema={decay = 0.9}", name="on")
    off, _ = run_small(tmp_path, criteo_dir, *with_eval, "train.dense_optimizer.ema={decay = 0.9, use_for_eval = false}", name="off")
    none, _ = run_small(tmp_path, criteo_dir, *with_eval, name="none")
    assert off.eval.metrics == none.eval.metrics  # same training, raw weights
    assert on.eval.metrics["loss/binary_cross_entropy"] != off.eval.metrics["loss/binary_cross_entropy"]


# -- sparse optimizers per table, frozen tables, the CPU policy --------------------------------


def test_frozen_tables_and_per_table_optimizers(tmp_path, criteo_dir):
    result, rec = run_small(
        tmp_path, criteo_dir,
        "features.sparse[0].trainable=false",
        'features.sparse[1].sparse_optimizer={type = "sgd", lr = 0.0}',
        'features.sparse[2].sparse_optimizer={type = "adagrad", lr = 0.05}',
    )
    after = final_weights(result)
    assert torch.equal(after["table:cat_0_emb"], rec.before["table:cat_0_emb"])  # trainable = false
    assert torch.equal(after["table:cat_1_emb"], rec.before["table:cat_1_emb"])  # its own lr 0
    assert not torch.equal(after["table:cat_2_emb"], rec.before["table:cat_2_emb"])
    optimizer_states = " ".join(str(k) for s in result.model.fused_optimizer.state.values() for k in s)
    assert "cat_2_emb.momentum1" in optimizer_states  # adagrad has state; the sgd tables do not


def test_features_sharing_a_table_must_agree_on_its_optimizer(tzrun_pm):
    from tzrun.testing import load_config_text

    with pytest.raises(ConfigError, match="must agree on trainable and sparse_optimizer"):
        load_config_text(CONFIG.format(model_dir="x", train="x"), tzrun_pm, [
            'features.sparse[0].table="shared"', 'features.sparse[1].table="shared"',
            "features.sparse[1].num_buckets=1000", "features.sparse[1].trainable=false",
        ])


def test_a_gpu_only_sparse_optimizer_on_cpu_is_an_error_that_says_what_to_do(tmp_path, criteo_dir):
    with pytest.raises(ConfigError) as info:
        run_small(tmp_path, criteo_dir, 'train.sparse_optimizer={type = "adam", lr = 0.01}')
    text = str(info.value)
    assert "train.sparse_optimizer.type: sparse optimizer 'adam' (FBGEMM ADAM) has no FBGEMM CPU kernel" in text
    assert 'cpu_policy = "data_parallel"' in text


def test_cpu_policy_data_parallel_trains_those_tables_with_the_torch_equivalent(tmp_path, criteo_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="tzrun"):
        result, rec = run_small(
            tmp_path, criteo_dir,
            'features.sparse[2].sparse_optimizer={type = "adam", lr = 0.01, cpu_policy = "data_parallel"}',
        )
    assert "train data-parallel with the torch equivalent" in caplog.text
    assert "every row's optimizer state moves at every step" in caplog.text
    after = final_weights(result)
    moved = (after["table:cat_2_emb"] - rec.before["table:cat_2_emb"]).abs().sum(dim=1) > 0
    assert moved.any()  # the table trained, through its own torch optimizer:
    assert "sparse_dp.0" in rec.lrs[0] and rec.lrs[0]["sparse_dp.0"] == pytest.approx(0.01)
    fallback = rec.run.model  # the fused optimizer no longer holds the table
    fused_tables = " ".join(str(k) for s in fallback.fused_optimizer.state.values() for k in s)
    assert "cat_2_emb" not in fused_tables
    assert not torch.equal(after["table:cat_0_emb"], rec.before["table:cat_0_emb"])  # fused sgd still


# -- TF32, schedules across a checkpoint restore ------------------------------------------------


def test_tf32_switches_are_applied(tmp_path, criteo_dir):
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:
        run_small(tmp_path, criteo_dir, "train.cudnn_allow_tf32=false", "train.cuda_matmul_allow_tf32=true", "train.num_steps=1")
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_schedules_continue_after_a_checkpoint_restore(tmp_path, criteo_dir):
    overrides = (
        "train.num_steps=6", "train.save_checkpoints_steps=3",
        'train.dense_optimizer.lr_schedule={type = "exponential_decay", decay_size = 1, decay_factor = 0.5}',
        'train.sparse_optimizer.lr_schedule={type = "cosine_annealing", T_max = 4}',
        "train.dense_optimizer.ema={decay = 0.5}",
    )
    result, rec = run_small(tmp_path, criteo_dir, *overrides, name="sched")
    assert [round(lr["dense"], 6) for lr in rec.lrs] == [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125]

    pm = make_plugin_manager()
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=tmp_path / "sched", train=criteo_dir / "train"), "<test>", overrides)
    cfg = load_config(raw, registries)
    _seed_everything(99)
    trainer = Trainer(Session(cfg, raw, pm, registries).start())
    trainer.set_up()
    start = trainer.load(checkpoint_dir(tmp_path / "sched", 3))
    fresh = trainer.built
    assert start.step == 3
    # the 4th step of the restored run uses the 4th lr of the uninterrupted one
    assert fresh.optimizers["dense"].param_groups[0]["lr"] == pytest.approx(rec.lrs[3]["dense"])
    assert fresh.optimizers["sparse"].param_groups[0]["lr"] == pytest.approx(rec.lrs[3]["sparse"])
    assert fresh.update.ema.updates == 3


def test_a_data_parallel_table_gets_the_gradient_nn_embedding_bag_computes():
    """The CPU fallback trains tables through FBGEMM's dense (data-parallel) kernel, which
    backpropagates through torch's autograd fallback: its gradient must be the real one."""
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv

    init_distributed()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            table = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])
            self.ebc = EmbeddingBagCollection(tables=[table], device=torch.device("meta"))

        def forward(self, kjt):
            return self.ebc(kjt).values()

    model = Model()
    constraints = {"t": ParameterConstraints(sharding_types=["data_parallel"], compute_kernels=["dense"])}
    pg = dist.GroupMember.WORLD
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints).collective_plan(
        model, get_default_sharders(), pg
    )
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=get_default_sharders(), device=torch.device("cpu"))
    weight = dict(dmp.named_parameters())["ebc.embedding_bags.t.weight"]
    torch.manual_seed(0)
    with torch.no_grad():
        weight.copy_(torch.randn(10, 4))
    ids, offsets = torch.tensor([1, 2, 2, 5, 7]), torch.tensor([0, 2, 3])
    out = dmp(KeyedJaggedTensor(keys=["f"], values=ids, lengths=torch.tensor([2, 1, 2])))
    coefficients = torch.randn_like(out)
    (out * coefficients).sum().backward()
    reference = torch.nn.EmbeddingBag(10, 4, mode="sum")
    with torch.no_grad():
        reference.weight.copy_(weight.detach())
    (reference(ids, offsets) * coefficients).sum().backward()
    torch.testing.assert_close(weight.grad, reference.weight.grad)
    assert weight.grad[[0, 3, 4, 6, 8, 9]].abs().sum() == 0 and weight.grad[2].abs().sum() > 0


def test_rowwise_adagrad_weight_decay_on_cpu_is_refused_not_ignored(tmp_path, criteo_dir):
    with pytest.raises(ConfigError, match=r"train.sparse_optimizer.weight_decay: FBGEMM's CPU kernel for rowwise_adagrad ignores weight_decay"):
        run_small(tmp_path, criteo_dir, 'train.sparse_optimizer={type = "rowwise_adagrad", lr = 0.1, weight_decay = 0.01}')


def test_by_epoch_schedules_step_at_epoch_ends(tmp_path, criteo_dir):
    text = CONFIG.replace("num_steps = 4", "num_epochs = 2")
    recorder = Recorder()
    pm = make_plugin_manager(plugins=[("recorder", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(text.format(model_dir=tmp_path / "epochs", train=criteo_dir / "train"), "<test>", [
        "data.batch_size=4096",  # 12000 rows: 3 steps per epoch, the last one short
        'train.dense_optimizer.lr_schedule={type = "exponential_decay", decay_size = 1, decay_factor = 0.5, by_epoch = true}',
        'train.sparse_optimizer.lr_schedule={type = "exponential_decay", decay_size = 2, decay_factor = 0.5}',
    ])
    result = train(Session(load_config(raw, registries), raw, pm, registries))
    assert result.steps == 6
    assert [round(lr["dense"], 6) for lr in recorder.lrs] == [0.1, 0.1, 0.1, 0.05, 0.05, 0.05]
    assert [round(lr["sparse"], 6) for lr in recorder.lrs] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]


def test_initial_accumulator_value_reaches_fbgemm_state(tmp_path, criteo_dir):
    result, _ = run_small(
        tmp_path, criteo_dir, 'train.sparse_optimizer={type = "adagrad", lr = 0.1, initial_accumulator_value = 0.25}',
        "train.num_steps=1",
    )
    states = {k: _local(v) for s in result.model.fused_optimizer.state.values() for k, v in s.items()}
    momentum = states["cat_2_emb.momentum1"]
    assert momentum.shape == (4000, 8)
    untouched = (momentum == 0.25).all(dim=1)
    assert untouched.sum() > 3000  # rows no batch touched keep the initial value
    assert (momentum[~untouched] >= 0.25).all()  # touched rows added their squared gradients


# -- non-finite gradients (train.on_nonfinite_loss) ---------------------------------------------


def _huge_dense_value_at_batch_3(tmp_path: Path, criteo_dir: Path) -> Path:
    """Six batches of 256 rows whose third holds int_0 = 3e38 in 16 rows: a finite value (it
    passes the input checks) that keeps the loss finite and makes the dense gradient overflow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(sorted((criteo_dir / "train").glob("*.parquet"))[0]).slice(0, 6 * 256)
    values = table.column("int_0").to_numpy().copy()
    values[2 * 256:2 * 256 + 16] = 3e38
    out = tmp_path / "huge"
    out.mkdir()
    pq.write_table(table.set_column(table.schema.get_field_index("int_0"), "int_0", pa.array(values, pa.float32())),
                   out / "part-00000.parquet")
    return out


class _Snapshots:
    """The weights, optimizer state and loss after every step."""

    def __init__(self) -> None:
        self.by_step: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]] = {}

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        from tests.integration.test_resume import _optimizer_state

        self.by_step[step.step] = (weights(run.model), _optimizer_state(run.optimizer), float(step.loss))


def _train_huge(tmp_path: Path, criteo_dir: Path, policy: str, *overrides: str) -> tuple[Any, _Snapshots]:
    snaps = _Snapshots()
    pm = make_plugin_manager(plugins=[("snaps", snaps)])
    registries = collect_registries(pm)
    text = CONFIG.format(model_dir=tmp_path / policy, train=_huge_dense_value_at_batch_3(tmp_path, criteo_dir))
    raw = parse_config(text, "<test>", [
        'features.dense=[{name = "int_0"}, {name = "int_1", log1p = true}]', "train.num_steps=5",
        'train.dense_optimizer={type = "adam", lr = 0.01}', 'train.sparse_optimizer={type = "adagrad", lr = 0.05}',
        f'train.on_nonfinite_loss="{policy}"', *overrides,
    ])
    return train(Session(load_config(raw, registries), raw, pm, registries)), snaps


def test_a_gradient_that_overflows_with_a_finite_loss_skips_its_step(tmp_path, criteo_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="tzrun"):
        result, snaps = _train_huge(tmp_path, criteo_dir, "skip", 'train.pipeline={type = "sparse_dist"}')
    assert result.steps == 5
    (w2, s2, _), (w3, s3, loss3), (w5, s5, _) = snaps.by_step[2], snaps.by_step[3], snaps.by_step[5]
    assert math.isfinite(loss3)  # the loss never told
    assert "step 3: the gradient of 'model.deep.0.weight' is not finite (or overflows when squared); its update " \
           "was skipped (1 such step(s) so far" in caplog.text
    assert any(k.startswith("state.dense") for k in s3) and any(k.startswith("state.sparse") for k in s3)
    for key in dense_of(w3):  # the dense weights and the dense optimizer's state did not move
        assert torch.equal(w3[key], w2[key]), key
    for key in (k for k in s3 if k.startswith("state.dense")):
        assert torch.equal(s3[key], s2[key]), key
    tables = [k for k in w3 if k not in dense_of(w3)]
    assert tables and any(k.startswith("state.sparse") for k in s3)
    for key in (*tables, *(k for k in s3 if k.startswith("state.sparse"))):  # nor the tables and their state:
        before, after = (w2, w3) if key in w3 else (s2, s3)  # FBGEMM's fused update never saw the batch
        assert torch.equal(after[key], before[key]), key
    bad = [k for k, v in (*w5.items(), *s5.items()) if not torch.isfinite(v.float()).all()]
    assert bad == []  # no weight, table, moment or accumulator holds inf or NaN
    assert any(not torch.equal(w5[k], w3[k]) for k in dense_of(w5))  # and training went on


def test_a_gradient_that_overflows_with_a_finite_loss_stops_the_run_naming_step_and_parameter(tmp_path, criteo_dir):
    from tzrun.errors import EXIT_DATA, NonFiniteLossError
    from tzrun.runner.checkpoint import list_checkpoints, verify_checkpoint

    with pytest.raises(NonFiniteLossError) as info:
        _train_huge(tmp_path, criteo_dir, "error", "train.save_checkpoints_steps=2")
    message = str(info.value)
    assert info.value.exit_code == EXIT_DATA == 65 and "\n" not in message
    assert message.startswith("step 3 (epoch 0, batch 3 of the epoch) on rank 0: the gradient of 'model.deep.0.weight' ")
    assert "the last one is intact" in message
    assert [s for s, _ in list_checkpoints(tmp_path / "error")] == [2]
    verify_checkpoint(checkpoint_dir(tmp_path / "error", 2))


def test_two_ranks_skip_a_step_with_an_overflowing_gradient_together(tmp_path, criteo_dir):
    from tests.warm_ranks import warm_cli

    config = tmp_path / "huge.toml"
    text = CONFIG.format(model_dir=tmp_path / "two", train=_huge_dense_value_at_batch_3(tmp_path, criteo_dir))
    config.write_text(text.replace('dense_optimizer = { type = "sgd", lr = 0.1 }', 'dense_optimizer = { type = "adam", lr = 0.01 }'))
    proc = warm_cli(["train", str(config), "--nproc-per-node", "2", "--set", 'features.dense=[{name = "int_0"}, {name = "int_1"}]',
                    "--set", 'train.on_nonfinite_loss="skip"', "--set", "train.num_steps=3"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = sorted(line.split("] tzrun: ") for line in proc.stderr.splitlines() if "its update was skipped" in line)
    ranks, messages = [r[-6:] for r, _ in skipped], [m.split(":")[0] for _, m in skipped]
    assert ranks == ["rank 0", "rank 1"] and messages[0] == messages[1], skipped  # both ranks, the same single step


def test_a_sequence_table_cannot_train_data_parallel_on_cpu_and_check_says_so_in_one_line():
    """FBGEMM's CPU dense kernel, which trains data-parallel tables, pools every lookup (it
    ignores PoolingMode.NONE): a sequence's table would fail on the first step inside
    TorchRec's lookup, so check and train refuse it up front, naming the table and its readers."""
    from tests.conftest import REPO, cli
    from tzrun.errors import EXIT_CONFIG

    proc = cli(["check", str(REPO / "examples" / "din_taobao.toml"), "--no-data", "--device", "cpu",
                "--set", 'train.sparse_optimizer={type = "adam", lr = 0.01, cpu_policy = "data_parallel"}'])
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert ("train.sparse_optimizer.cpu_policy: table 'adgroup_id_emb' (read by features.sequence[0].features[0], "
            "features.sparse[10]) is looked up unpooled, as a sequence, and FBGEMM's CPU kernel for data-parallel "
            "tables pools every lookup: it cannot train data-parallel on CPU. Give the features reading it a "
            "sparse_optimizer FBGEMM fuses on CPU (sgd, adagrad or rowwise_adagrad), or train on CUDA") in proc.stderr
    # the pooled tables of the same config train data-parallel as before: only the sequence's is refused
    assert proc.stderr.count("cpu_policy:") == 1, proc.stderr


def test_fbgemm_cpu_dense_kernel_still_pools_an_unpooled_lookup():
    """Why the refusal above exists. When this fails, FBGEMM's CPU kernel honours
    PoolingMode.NONE: lift the refusal (tzrun.runner.sharding._unpooled_data_parallel_problems)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

    kernel = DenseTableBatchedEmbeddingBagsCodegen([(10, 4), (10, 4)], pooling_mode=PoolingMode.NONE, use_cpu=True)
    out = kernel(torch.tensor([1, 2, 3, 4, 5, 6, 7]), torch.tensor([0, 3, 5, 6, 7]))
    assert tuple(out.shape) == (2, 8)  # pooled: [batch, tables * dim]; unpooled would be [7 ids, 4]
