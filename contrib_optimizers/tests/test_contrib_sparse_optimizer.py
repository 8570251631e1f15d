"""``ema_rowwise_adagrad`` through TorchRec and FBGEMM's CPU kernel, against its rule in plain torch.

A small EmbeddingBagCollection is sharded with DistributedModelParallel on a one-process gloo
group with the spec's optimizer fused into it, as tzrec-run does, and trained for a few steps
whose loss is ``sum(pooled * COEF)``, so that each bag's output gradient is known. The
reference applies FBGEMM's rule: at forward call ``t`` (from 1), before the lookup, if
``t % ema_every == 0 and t >= ema_start`` every row's second half moves towards its first
half by ``ema_coef``; then row-wise Adagrad updates the touched rows.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tzrun.errors import ConfigError
from tzrun.testing import load_config_text, tiny_config_text
from tzrun_contrib_optimizers.options import EmaRowWiseAdagradConfig
from tzrun_contrib_optimizers.sparse import build_ema_rowwise_adagrad

ROWS, DIM, BATCH = 8, 4, 3
IDS = [  # per step, the ids of each bag of feature f0 (repeats and empty bags included)
    [[1, 1], [2], []],
    [[2, 6], [1], [6]],
    [[1], [5, 1], [2]],
    [[3], [], [2, 2]],
    [[6], [1], [0]],
]
W0 = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1)) * 0.5
COEF = [torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(10 + s)) for s in range(len(IDS))]


@pytest.fixture(scope="module", autouse=True)
def process_group():
    """A one-process gloo group (TorchRec's sharding needs one); left alone if one exists."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def _sharded(cfg: EmaRowWiseAdagradConfig):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    spec = build_ema_rowwise_adagrad(cfg)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t0", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["f0"])],
        device=torch.device("meta"),
    )
    apply_optimizer_in_backward(spec.optimizer_class, ebc.parameters(), dict(spec.kwargs))
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, local_world_size=1, compute_device="cpu"),
        batch_size=BATCH,
        constraints={"t0": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])},
    )
    pg = dist.GroupMember.WORLD
    sharders = get_default_sharders()
    plan = planner.collective_plan(ebc, sharders, pg)
    model = DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=torch.device("cpu"))
    weight = next(iter(model.state_dict().values())).local_shards()[0].tensor  # a view of FBGEMM's weights
    with torch.no_grad():
        weight.copy_(W0)
    return model, weight


def _kjt(bags: list[list[int]]):
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f0"], values=torch.tensor([i for bag in bags for i in bag]), lengths=torch.tensor([len(b) for b in bags])
    )


def _train(cfg: EmaRowWiseAdagradConfig, eval_after: tuple[int, ...] = ()) -> tuple[torch.Tensor, object]:
    model, weight = _sharded(cfg)
    for step, bags in enumerate(IDS):
        (model(_kjt(bags))["f0"] * COEF[step]).sum().backward()
        model.fused_optimizer.step()  # what the train loop does (the update itself ran in backward)
        if step + 1 in eval_after:
            model.eval()
            with torch.no_grad():
                model(_kjt(bags))
            model.train()
    return weight.detach().double().clone(), model


def _reference(cfg: EmaRowWiseAdagradConfig, eval_after: tuple[int, ...] = ()) -> torch.Tensor:
    w = W0.double().clone()
    h = torch.zeros(ROWS, dtype=torch.float64)
    half = DIM // 2
    # FBGEMM's counter t of each training step: every forward call counts, evaluation ones too
    calls = [step + 1 + sum(1 for e in eval_after if e <= step) for step in range(len(IDS))]
    for step, (t, bags) in enumerate(zip(calls, IDS)):
        if t % cfg.ema_every == 0 and t >= cfg.ema_start:  # every row, before the lookup
            w[:, half:] += cfg.ema_coef * (w[:, :half] - w[:, half:])
        grads: dict[int, torch.Tensor] = {}
        for bag, ids in enumerate(bags):
            for i in ids:
                grads[i] = grads.get(i, 0) + COEF[step][bag].double()
        for i, g in grads.items():
            h[i] += (g * g).mean()
            w[i] -= cfg.lr * g / (h[i].sqrt() + cfg.eps)
    return w


@pytest.mark.parametrize(
    "cfg",
    [
        EmaRowWiseAdagradConfig(lr=0.1, ema_every=2, ema_coef=0.25),
        EmaRowWiseAdagradConfig(lr=0.05, eps=1e-3, ema_every=1, ema_start=3, ema_coef=1.0),
        EmaRowWiseAdagradConfig(lr=0.1, ema_every=2, ema_coef=0.0),  # plain row-wise Adagrad
    ],
    ids=["every_2", "from_3_copy", "no_ema"],
)
def test_fbgemm_cpu_kernel_applies_the_rule(cfg):
    got, _ = _train(cfg)
    torch.testing.assert_close(got, _reference(cfg), rtol=1e-5, atol=1e-6)
    assert not torch.equal(got, W0.double())


def test_evaluation_forwards_advance_the_counter_and_only_the_accumulator_is_state():
    """What the options' docstring says: an eval forward counts (and never applies the EMA),
    and FBGEMM's counter is not in the model's or the optimizer's state."""
    cfg = EmaRowWiseAdagradConfig(lr=0.1, ema_every=2, ema_coef=0.5)
    got, model = _train(cfg, eval_after=(1, 3))
    torch.testing.assert_close(got, _reference(cfg, eval_after=(1, 3)), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, _reference(cfg), rtol=1e-5, atol=1e-6)
    assert [k for k in model.state_dict() if "iter" in k] == []
    optimizer_state = model.fused_optimizer.state_dict()["state"]
    assert {key.rpartition(".")[2] for per_param in optimizer_state.values() for key in per_param} == {"momentum1"}


def test_the_spec_names_the_fbgemm_type_and_runs_on_cpu():
    spec = build_ema_rowwise_adagrad(EmaRowWiseAdagradConfig(lr=0.1))
    assert spec.fbgemm_type == "EMAINPLACE_ROWWISE_ADAGRAD" and spec.cpu_supported
    assert spec.kwargs["emainplace_mode"].step_ema == 10 and spec.kwargs["emainplace_mode"].step_ema_coef == 0.6


def test_options_are_checked_with_their_toml_path(tzrun_pm, tmp_path):
    text = tiny_config_text(tmp_path / "data", tmp_path / "run")
    cfg, registries = load_config_text(text, tzrun_pm, ['train.sparse_optimizer={type="ema_rowwise_adagrad", lr=0.05, ema_every=4}'])
    assert cfg.train.sparse_optimizer.config == EmaRowWiseAdagradConfig(lr=0.05, ema_every=4)
    assert registries["sparse_optimizer"].get("ema_rowwise_adagrad", "x").distribution == "tzrun-contrib-optimizers"
    with pytest.raises(ConfigError, match=r"train\.sparse_optimizer\.ema_coef: .*1\.5"):
        load_config_text(text, tzrun_pm, ['train.sparse_optimizer={type="ema_rowwise_adagrad", lr=0.05, ema_coef=1.5}'])
