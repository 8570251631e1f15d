"""A small fused embedding table trained by FBGEMM, and the updates it must make in plain torch.

The harness shards one table (``ROWS x DIM``, float32, table-wise, the ``fused`` kernel) with
``DistributedModelParallel`` on a one-process group, fuses the sparse optimizer tzrec-run builds
from a ``train.sparse_optimizer`` TOML value into it (the registry's own build function, as a run
does), and trains ``STEPS`` steps. Each step looks every row up once, in its own bag, under the
loss ``sum(pooled * GRADS[step])``, so every row is touched at every step and its gradient is
exactly ``GRADS[step][row]``: FBGEMM's "touched rows only" and a torch optimizer's "every row"
then coincide, and a torch optimizer on a dense parameter is a valid reference.

The references (:data:`REFERENCES`) are either a torch optimizer (``torch.optim.SGD``,
``Adagrad``, ``AdamW``; tzrec-run's ``FbgemmLamb`` and ``FbgemmLarsSGD`` where torch has none)
or, for the row-wise forms, FBGEMM's rule written out by hand after
``fbgemm_gpu/codegen/genscript/optimizers.py`` in pytorch/FBGEMM (``rowwise_adagrad()``,
``partial_rowwise_adam()``, ``partial_rowwise_lamb()``; the same rules are quoted in
``tzrun_plugins.optim.sparse`` and docs/sparse_optimizers.md). They run in float64 on CPU.

The harness runs on CPU (gloo, FBGEMM's CPU kernels: ``sgd``, ``adagrad``, ``rowwise_adagrad``,
``ema_rowwise_adagrad``) and on CUDA (NCCL, every optimizer): tests/plugins checks it and the
references on CPU, tests/gpu runs it on the GPU.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

__all__ = [
    "ROWS", "DIM", "STEPS", "W0", "GRADS", "CASES", "REFERENCES",
    "spec_for", "fused_train", "reference", "torch_optimizer_reference",
    "rowwise_adagrad_reference", "partial_rowwise_reference", "ema_rowwise_adagrad_reference",
]

ROWS, DIM, STEPS = 8, 4, 3


def _seeded(seed: int, *shape: int, scale: float) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


W0 = _seeded(1, ROWS, DIM, scale=0.5)
GRADS = [_seeded(10 + step, ROWS, DIM, scale=2.0) for step in range(STEPS)]

Tensor = torch.Tensor
Grads = Sequence[torch.Tensor]

#: per tzrec-run sparse optimizer name: the TOML options of the case (non-default values where an
#: option changes the rule, so a dropped option fails the comparison)
CASES: dict[str, str] = {
    "sgd": "lr = 0.1",
    "adagrad": "lr = 0.1, eps = 0.1, initial_accumulator_value = 0.5",
    "rowwise_adagrad": "lr = 0.1, eps = 0.1, weight_decay = 0.05, weight_decay_mode = \"decoupled\"",
    "adam": "lr = 0.05, eps = 0.01, beta1 = 0.8, beta2 = 0.9, weight_decay = 0.1",
    "lamb": "lr = 0.05, eps = 0.01, beta1 = 0.8, beta2 = 0.9, weight_decay = 0.1",
    "lars_sgd": "lr = 0.5, eta = 0.1, momentum = 0.8, weight_decay = 0.1",
    "partial_rowwise_adam": "lr = 0.05, eps = 0.01, beta1 = 0.8, beta2 = 0.9, weight_decay = 0.1",
    "partial_rowwise_lamb": "lr = 0.05, eps = 0.01, beta1 = 0.8, beta2 = 0.9, weight_decay = 0.1",
    "ema_rowwise_adagrad": "lr = 0.1, eps = 0.1, ema_every = 2, ema_coef = 0.25",
}

_CONFIG = """
model_dir = "runs/x"
[data]
train_input = "data/train"
[[features.sparse]]
name = "c0"
num_buckets = 10
[model]
type = "deepfm"
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 1
dense_optimizer = { type = "sgd", lr = 0.1 }
"""


def spec_for(name: str, options: str) -> tuple[Any, Any]:
    """The config and ``SparseOptimizerSpec`` tzrec-run builds for
    ``train.sparse_optimizer = { type = NAME, OPTIONS }`` (both config passes, then the
    registered build function)."""
    from tzrun.testing import load_config_text

    cfg, registries = load_config_text(_CONFIG, overrides=[f'train.sparse_optimizer={{type = "{name}", {options}}}'])
    entry = registries["sparse_optimizer"].get(name, "train.sparse_optimizer.type")
    return cfg.train.sparse_optimizer.config, entry.build(cfg.train.sparse_optimizer.config)


def _sharded(spec: Any, device: torch.device) -> Any:
    """One table ``t0`` (feature ``f0``), table-wise on the fused kernel, ``spec`` fused in."""
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    table = EmbeddingBagConfig(name="t0", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["f0"])
    ebc = EmbeddingBagCollection(tables=[table], device=torch.device("meta"))
    apply_optimizer_in_backward(spec.optimizer_class, ebc.parameters(), dict(spec.kwargs))
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, local_world_size=1, compute_device=device.type),
        batch_size=ROWS,
        constraints={"t0": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])},
    )
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(ebc, sharders, pg)
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=device)


def _weight(model: torch.nn.Module) -> torch.Tensor:
    (value,) = model.state_dict().values()
    return value.local_shards()[0].tensor


def fused_train(spec: Any, device: torch.device) -> torch.Tensor:
    """Train the fused table from :data:`W0` for :data:`STEPS` steps on ``device`` (a process
    group must exist); return its weight after, on CPU."""
    from torchrec import KeyedJaggedTensor

    from tzrun.runner.sparse_state import set_initial_accumulators

    model = _sharded(spec, device)
    with torch.no_grad():
        _weight(model).copy_(W0.to(device))
    if spec.initial_accumulator_value:
        set_initial_accumulators(model, {"t0": spec.initial_accumulator_value})
    for step in range(STEPS):
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["f0"], values=torch.arange(ROWS, device=device), lengths=torch.ones(ROWS, dtype=torch.int64, device=device)
        )
        pooled = model(kjt)
        (pooled["f0"] * GRADS[step].to(device)).sum().backward()
        model.fused_optimizer.step()
    return _weight(model).detach().cpu().clone()


def torch_optimizer_reference(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], w0: Tensor = W0, grads: Grads = GRADS
) -> torch.Tensor:
    """``w0`` after one step of the torch optimizer ``make([param])`` per gradient of
    ``grads``, in float64."""
    param = torch.nn.Parameter(w0.double().clone())
    optimizer = make([param])
    for grad in grads:
        param.grad = grad.double().clone()
        optimizer.step()
    return param.detach()


def rowwise_adagrad_reference(cfg: Any, w0: Tensor = W0, grads: Grads = GRADS) -> torch.Tensor:
    """FBGEMM ``rowwise_adagrad()``: ``g' = g + wd * w`` (l2 only); ``h += sum(g'^2) / D``;
    ``m = lr / (sqrt(h) + eps)``; ``w = c * w - m * g`` with ``c = 1 - m * wd`` (l2),
    ``1 - lr * wd`` (decoupled) or 1."""
    w = w0.double().clone()
    h = torch.full((len(w), 1), cfg.initial_accumulator_value, dtype=torch.float64)
    l2 = cfg.weight_decay_mode == "l2"
    for grad in grads:
        g = grad.double()
        decayed = g + cfg.weight_decay * w if l2 else g
        h += decayed.square().mean(dim=1, keepdim=True)
        multiplier = cfg.lr / (h.sqrt() + cfg.eps)
        if l2:
            correction = 1 - multiplier * cfg.weight_decay
        elif cfg.weight_decay_mode == "decoupled":
            correction = torch.full_like(h, 1 - cfg.lr * cfg.weight_decay)
        else:
            correction = torch.ones_like(h)
        w = correction * w - multiplier * g
    return w


def partial_rowwise_reference(cfg: Any, lamb: bool, w0: Tensor = W0, grads: Grads = GRADS) -> torch.Tensor:
    """FBGEMM ``partial_rowwise_adam()`` / ``partial_rowwise_lamb()``: ``v = b2 * v + (1 - b2)
    * sum(g^2) / D`` (one per row), ``m = b1 * m + (1 - b1) * g``, ``r = m / (1 - b1^t) /
    (sqrt(v / (1 - b2^t)) + eps) + wd * w``; Adam: ``w -= lr * r``; LAMB: ``w -= lr *
    (|w| / |r|) * r`` with the row's L2 norms."""
    w = w0.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros(len(w), 1, dtype=torch.float64)
    for t, grad in enumerate(grads, start=1):
        g = grad.double()
        v = cfg.beta2 * v + (1 - cfg.beta2) * g.square().mean(dim=1, keepdim=True)
        m = cfg.beta1 * m + (1 - cfg.beta1) * g
        r = m / (1 - cfg.beta1**t) / ((v / (1 - cfg.beta2**t)).sqrt() + cfg.eps) + cfg.weight_decay * w
        if lamb:
            ratio = w.norm(dim=1, keepdim=True) / r.norm(dim=1, keepdim=True)
            w = w - cfg.lr * ratio * r
        else:
            w = w - cfg.lr * r
    return w


def ema_rowwise_adagrad_reference(cfg: Any, w0: Tensor = W0, grads: Grads = GRADS) -> torch.Tensor:
    """tzrun-contrib-optimizers' ``ema_rowwise_adagrad`` (FBGEMM EMAINPLACE_ROWWISE_ADAGRAD):
    before the lookup of forward call ``t`` with ``t % ema_every == 0 and t >= ema_start``,
    ``w[:, D/2:] += ema_coef * (w[:, :D/2] - w[:, D/2:])``; then row-wise Adagrad (no decay)."""
    w = w0.double().clone()
    h = torch.zeros(len(w), 1, dtype=torch.float64)
    half = w.shape[1] // 2
    for t, grad in enumerate(grads, start=1):
        if t % cfg.ema_every == 0 and t >= cfg.ema_start:
            w[:, half:] += cfg.ema_coef * (w[:, :half] - w[:, half:])
        g = grad.double()
        h += g.square().mean(dim=1, keepdim=True)
        w = w - cfg.lr / (h.sqrt() + cfg.eps) * g
    return w


def _torch(make: Callable[[Any, list[torch.nn.Parameter]], torch.optim.Optimizer]) -> Callable[[Any], torch.Tensor]:
    return lambda cfg: torch_optimizer_reference(lambda params: make(cfg, params))


def _lamb(cfg: Any, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    from tzrun_plugins.optim.torch_equivalents import FbgemmLamb

    return FbgemmLamb(params, lr=cfg.lr, eps=cfg.eps, beta1=cfg.beta1, beta2=cfg.beta2, weight_decay=cfg.weight_decay)


def _lars(cfg: Any, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    from tzrun_plugins.optim.torch_equivalents import FbgemmLarsSGD

    return FbgemmLarsSGD(params, lr=cfg.lr, eta=cfg.eta, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


#: per sparse optimizer name: ``reference(cfg) -> weights after STEPS steps`` (float64)
REFERENCES: dict[str, Callable[[Any], torch.Tensor]] = {
    "sgd": _torch(lambda cfg, p: torch.optim.SGD(p, lr=cfg.lr)),
    "adagrad": _torch(lambda cfg, p: torch.optim.Adagrad(
        p, lr=cfg.lr, eps=cfg.eps, initial_accumulator_value=cfg.initial_accumulator_value)),
    "adam": _torch(lambda cfg, p: torch.optim.AdamW(
        p, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)),
    "lamb": _torch(_lamb),
    "lars_sgd": _torch(_lars),
    "rowwise_adagrad": rowwise_adagrad_reference,
    "partial_rowwise_adam": lambda cfg: partial_rowwise_reference(cfg, lamb=False),
    "partial_rowwise_lamb": lambda cfg: partial_rowwise_reference(cfg, lamb=True),
    "ema_rowwise_adagrad": ema_rowwise_adagrad_reference,
}


def reference(name: str, cfg: Any) -> torch.Tensor:
    """The weights FBGEMM must reach for the sparse optimizer ``name`` with options ``cfg``."""
    return REFERENCES[name](cfg)
