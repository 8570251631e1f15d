"""Building a run: the model on the meta device, its losses, the fused sparse optimizer, the
sharding plan, DistributedModelParallel, the dense optimizer and the schedules."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import attrs
import torch
import torch.distributed as dist
from torch import nn

from tzrun.config.schema import Component, RunConfig
from tzrun.data.features import FeatureSpecs
from tzrun.errors import ConfigError, ConfigProblem
from tzrun.interfaces import ModelContext
from tzrun.registry import Registries
from tzrun.runner.distributed import DistInfo

__all__ = ["LossSlot", "TrainModel", "Built", "build_run", "loss_slots", "metric_slots", "MetricSlot"]

log = logging.getLogger(__name__)


@attrs.frozen
class LossSlot:
    """A configured loss: its name, the output and label it reads, its weight."""

    name: str
    prediction: str
    label: str
    weight: float


@attrs.frozen
class MetricSlot:
    """A configured metric: its name, the output and label it reads, and its component."""

    name: str
    prediction: str
    label: str
    component: Component


def _slot_names(components: Sequence[Component], what: str) -> list[str]:
    names = [c.fields.name or c.type for c in components]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(
                what,
                [ConfigProblem(f"{what}[{i}].name", f"'{name}' is also the name of {what}[{seen[name]}]; give one a name = \"...\"")],
            )
        seen[name] = i
    return names


def _resolve_slots(cfg: RunConfig, registries: Registries, kind: str, what: str) -> list[tuple[str, str, str, Component]]:
    """``(name, prediction, label, component)`` of each ``[[losses]]`` or ``[[metrics]]`` entry."""
    components = getattr(cfg, what)
    return [
        (
            name,
            c.fields.prediction or registries[kind].get(c.type, what).extras["prediction"],
            c.fields.label or cfg.data.labels[0],
            c,
        )
        for name, c in zip(_slot_names(components, what), components)
    ]


def loss_slots(cfg: RunConfig, registries: Registries) -> list[LossSlot]:
    """Each ``[[losses]]`` entry resolved to what it reads."""
    return [LossSlot(n, p, lbl, c.fields.weight) for n, p, lbl, c in _resolve_slots(cfg, registries, "loss", "losses")]


def metric_slots(cfg: RunConfig, registries: Registries) -> list[MetricSlot]:
    """Each ``[[metrics]]`` entry resolved to what it reads."""
    return [MetricSlot(n, p, lbl, c) for n, p, lbl, c in _resolve_slots(cfg, registries, "metric", "metrics")]


class TrainModel(nn.Module):
    """The module DMP wraps: the user's model plus its losses.

    ``forward(batch)`` returns ``(total_loss, (total_loss, losses, outputs, labels, weights,
    num_rows))``, the ``(loss, output)`` pair TorchRec's train pipelines expect; everything in
    the second element is detached.
    """

    def __init__(self, model: nn.Module, losses: Mapping[str, nn.Module], slots: Sequence[LossSlot]) -> None:
        super().__init__()
        self.model = model
        self.losses = nn.ModuleDict(dict(losses))
        self.slots = list(slots)

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[Any, ...]]:
        outputs = self.model(batch)
        total = None
        values = {}
        for slot in self.slots:
            value = self.losses[slot.name](outputs[slot.prediction], batch.labels[slot.label], batch.weights)
            values[slot.name] = value.detach()
            weighted = value * slot.weight
            total = weighted if total is None else total + weighted
        detached = {k: v.detach() for k, v in outputs.items()}
        return total, (total.detach(), values, detached, batch.labels, batch.weights, batch.num_rows)


@attrs.define
class Built:
    """Everything :func:`build_run` makes.

    Attributes:
        model: the DistributedModelParallel-wrapped :class:`TrainModel`.
        optimizer: sparse (fused) and dense optimizers combined; what the pipeline steps.
        optimizers: ``{"sparse": ..., "dense": ...}``, each schedulable.
        schedulers: ``{"sparse": ..., "dense": ...}``.
        plan: the sharding plan.
    """

    model: Any
    optimizer: Any
    optimizers: dict[str, Any]
    schedulers: dict[str, Any]
    plan: Any


def _embedding_modules(model: nn.Module) -> list[nn.Module]:
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    return [m for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]


#: Sharding types the planner may choose by default. ``data_parallel`` is left out on purpose:
#: TorchRec runs data-parallel tables on a dense (unfused) kernel whose whole-table gradients go
#: to the dense optimizer, which would silently replace the configured sparse optimizer.
#: Column-wise types are left out too: with small widths they only multiply kernel launches
#: (measured: all 52 DeepFM tables column-wise on one CPU rank made a step 4x slower).
MODEL_PARALLEL_SHARDING_TYPES = ("table_wise", "row_wise", "table_row_wise")


def fused_constraints(embedding_modules: Sequence[nn.Module]) -> dict[str, Any]:
    """Planner constraints that put every table on a fused kernel with model-parallel sharding."""
    from torchrec.distributed.planner.types import ParameterConstraints

    constraints = {}
    for module in embedding_modules:
        configs = module.embedding_bag_configs() if hasattr(module, "embedding_bag_configs") else module.embedding_configs()
        for table in configs:
            constraints[table.name] = ParameterConstraints(
                sharding_types=list(MODEL_PARALLEL_SHARDING_TYPES), compute_kernels=["fused"]
            )
    return constraints


def build_run(cfg: RunConfig, registries: Registries, specs: FeatureSpecs, info: DistInfo) -> Built:
    """Build the sharded model, optimizers and schedules of a run, on every rank.

    Raises:
        ConfigError: when a component rejects the config at build time (the model's own
            cross-checks, a sparse optimizer FBGEMM cannot run on this device, ...).
    """
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("meta"), tuple(cfg.data.labels))
    model_entry = registries["model"].get(cfg.model.type, "model.type")
    model = model_entry.build(cfg.model.config, ctx)
    slots = loss_slots(cfg, registries)
    losses = {
        slot.name: registries["loss"].get(c.type, f"losses[{i}].type").build(c.config)
        for i, (slot, c) in enumerate(zip(slots, cfg.losses))
    }
    train_model = TrainModel(model, losses, slots)

    sparse = cfg.train.sparse_optimizer
    spec = registries["sparse_optimizer"].get(sparse.type, "train.sparse_optimizer.type").build(sparse.config)
    if info.device.type == "cpu" and not spec.cpu_supported:
        raise ConfigError(
            "train.sparse_optimizer",
            [ConfigProblem("train.sparse_optimizer.type", f"'{sparse.type}' ({spec.fbgemm_type}) has no FBGEMM CPU kernel; on CPU use sgd, adagrad or rowwise_adagrad")],
        )
    embedding_modules = _embedding_modules(train_model)
    if not embedding_modules:
        raise ConfigError("model", [ConfigProblem("model.type", f"model '{cfg.model.type}' built no EmbeddingBagCollection; tzrec-run shards embeddings with TorchRec")])
    for module in embedding_modules:
        apply_optimizer_in_backward(spec.optimizer_class, module.parameters(), dict(spec.kwargs))

    sharders = get_default_sharders()
    topology = Topology(
        world_size=info.world_size,
        local_world_size=info.local_world_size,
        compute_device=info.device.type,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=cfg.data.batch_size, constraints=fused_constraints(embedding_modules)
    )
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(train_model, sharders, pg)
    dmp = DistributedModelParallel(
        train_model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=info.device
    )

    dense = cfg.train.dense_optimizer
    dense_entry = registries["dense_optimizer"].get(dense.type, "train.dense_optimizer.type")
    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters(), include=False))
    dense_optimizer = KeyedOptimizerWrapper(dense_params, lambda params: dense_entry.build(dense.config, params))
    optimizers = {"sparse": dmp.fused_optimizer, "dense": dense_optimizer}
    combined = CombinedOptimizer([("sparse", dmp.fused_optimizer), ("dense", dense_optimizer)])

    schedulers = {}
    for key, component in (("sparse", sparse), ("dense", dense)):
        schedule = component.fields.lr_schedule
        entry = registries["lr_scheduler"].get(schedule.type, f"train.{key}_optimizer.lr_schedule.type")
        schedulers[key] = entry.build(schedule.config, optimizers[key])
    return Built(dmp, combined, optimizers, schedulers, plan)
