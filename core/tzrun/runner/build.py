"""Building a run: the model on the meta device, its losses, the fused sparse optimizer, the
sharding plan, DistributedModelParallel, the dense optimizer and the schedules."""

from __future__ import annotations

import logging
from typing import Any, Mapping, NamedTuple, Sequence

import attrs
import torch
import torch.fx
import torch.distributed as dist
from torch import nn

from tzrun.config.schema import Component, RunConfig
from tzrun.data.features import FeatureSpecs
from tzrun.errors import ConfigError, ConfigProblem
from tzrun.interfaces import ModelContext, SparseOptimizerSpec
from tzrun.registry import Registries
from tzrun.runner.distributed import DistInfo
from tzrun.runner.update import LossScale, UpdateOptimizer
from tzrun.runner.slots import LossSlot, MetricSlot, group_columns, loss_slots, metric_slots  # noqa: F401
from tzrun.runner.weighting import LossWeighting, build_loss_weighting, weigh_losses

torch.fx.wrap("weigh_losses")  # a leaf of TorchRec's tracing: a weighting may take gradients

__all__ = [
    "LossSlot",
    "MetricSlot",
    "StepOutput",
    "group_columns",
    "TrainModel",
    "Built",
    "TableUpdate",
    "build_run",
    "build_model",
    "loss_slots",
    "metric_slots",
    "plan_table_updates",
    "dense_parameter_names",
    "assign_parts",
    "fused_constraints",
    "table_constraints",
    "ShardingSetup",
    "prepare_sharding",
    "apply_tf32",
]

log = logging.getLogger(__name__)


class StepOutput(NamedTuple):
    """What :class:`TrainModel` returns next to the loss (all detached).

    Attributes:
        loss: the total loss.
        losses: each named loss.
        outputs: the model's outputs, float32.
        labels, weights, num_rows, groups: from the batch.
        loss_weights: the weight of each loss this step, when the loss weighting shows them.
    """

    loss: torch.Tensor
    losses: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    weights: torch.Tensor
    num_rows: int
    groups: dict[str, torch.Tensor]
    loss_weights: Mapping[str, torch.Tensor] = {}


@torch.fx.wrap
def call_loss(loss: nn.Module, prediction: torch.Tensor, label: torch.Tensor, weight: torch.Tensor,
              group: torch.Tensor | None) -> torch.Tensor:
    """One loss on one step, as a leaf of TorchRec's fx tracing.

    ``TrainPipelineSparseDist`` traces :class:`TrainModel` to find the sharded modules' inputs;
    a loss that checks shapes or loops over rows (most do) cannot be traced. Wrapped, every loss
    (first-party or a plugin's) is opaque to the tracer and runs as written at each step.
    """
    if group is None:
        return loss(prediction, label, weight)
    return loss(prediction, label, weight, group=group)


class TrainModel(nn.Module):
    """The module DMP wraps: the user's model plus its losses.

    ``forward(batch)`` returns ``(loss_for_backward, StepOutput)``, the ``(loss, output)`` pair
    TorchRec's train pipelines expect; everything in the :class:`StepOutput` is detached. In
    training, ``loss_for_backward`` is what the :class:`~tzrun.runner.update.LossScale` makes of
    the total loss (``1 / accumulation steps``, times the fp16 loss scale): the only place the
    loss is ever scaled.

    With ``mixed_precision``, the model and its losses run under ``torch.autocast``.
    """

    def __init__(
        self,
        model: nn.Module,
        losses: Mapping[str, nn.Module],
        slots: Sequence[LossSlot],
        mixed_precision: str | None = None,
        loss_scale: LossScale | None = None,
        loss_weighting: LossWeighting | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.losses = nn.ModuleDict(dict(losses))
        self.slots = list(slots)
        self.loss_weighting = loss_weighting if loss_weighting is not None else LossWeighting()
        self.autocast_dtype = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
        self.loss_scale = loss_scale if loss_scale is not None else LossScale()

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[Any, ...]]:
        if self.autocast_dtype is None:
            outputs, total, values, loss_weights = self._forward(batch)
        else:
            device_type = batch.labels[next(iter(batch.labels))].device.type
            with torch.autocast(device_type, dtype=self.autocast_dtype):
                outputs, total, values, loss_weights = self._forward(batch)
        detached = {k: v.detach().float() for k, v in outputs.items()}
        backward = self.loss_scale.for_backward(total) if self.training else total
        return backward, StepOutput(total.detach(), values, detached, batch.labels, batch.weights, batch.num_rows, batch.groups,
                                    loss_weights)

    def _forward(self, batch: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor], Any]:
        outputs = self.model(batch)
        weighted = {}
        values = {}
        for slot in self.slots:
            loss = self.losses[slot.name]
            prediction, label = outputs[slot.prediction].float(), batch.labels[slot.label]
            group = None if slot.group_by is None else batch.groups[slot.group_by]
            value = call_loss(loss, prediction, label, batch.weights, group).float()
            values[slot.name] = value.detach()
            weighted[slot.name] = value * slot.weight
        result = weigh_losses(self.loss_weighting, self.model, weighted, self.training)
        return outputs, result[0], values, result[1]


@attrs.define
class Built:
    """Everything :func:`build_run` makes.

    Attributes:
        model: the DistributedModelParallel-wrapped :class:`TrainModel`.
        optimizer: every optimizer combined (torchrec ``CombinedOptimizer``): what checkpoints save.
        update: the :class:`~tzrun.runner.update.UpdateOptimizer` the train pipeline steps:
            accumulation, loss scaling, clipping and EMA around ``optimizer``.
        optimizers: each schedulable optimizer by key: ``sparse`` (the fused one),
            ``sparse_dp.<i>`` (CPU data-parallel fallbacks), ``dense``, ``dense.parts[<i>]``.
        schedulers: the LR scheduler of each key of ``optimizers``.
        plan: the sharding plan.
        parts: the dense parameter names each dense optimizer key got.
    """

    model: Any
    optimizer: Any
    update: Any
    optimizers: dict[str, Any]
    schedulers: dict[str, Any]
    plan: Any
    parts: dict[str, list[str]] = attrs.field(factory=dict)


def _embedding_modules(model: nn.Module) -> list[nn.Module]:
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    return [m for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]


def _embedding_tables(module: nn.Module) -> list[tuple[Any, nn.Parameter]]:
    """``(table config, weight)`` of every table of an unsharded EBC or EC."""
    if hasattr(module, "embedding_bag_configs"):
        return [(t, module.embedding_bags[t.name].weight) for t in module.embedding_bag_configs()]
    return [(t, module.embeddings[t.name].weight) for t in module.embedding_configs()]


#: Sharding types the planner may choose by default. ``data_parallel`` is left out on purpose:
#: TorchRec runs data-parallel tables on a dense (unfused) kernel whose whole-table gradients go
#: to the dense optimizer, which would silently replace the configured sparse optimizer.
#: Column-wise types are left out too: with small widths they only multiply kernel launches
#: (measured: all 52 DeepFM tables column-wise on one CPU rank made a step 4x slower).
MODEL_PARALLEL_SHARDING_TYPES = ("table_wise", "row_wise", "table_row_wise")


def fused_constraints(embedding_modules: Sequence[nn.Module]) -> dict[str, Any]:
    """Planner constraints that put every table on a fused kernel with model-parallel sharding."""
    from torchrec.distributed.planner.types import ParameterConstraints

    return {
        table.name: ParameterConstraints(sharding_types=list(MODEL_PARALLEL_SHARDING_TYPES), compute_kernels=["fused"])
        for module in embedding_modules
        for table, _ in _embedding_tables(module)
    }


def table_constraints(
    cfg: RunConfig, embedding_modules: Sequence[nn.Module], updates: Mapping[str, "TableUpdate"], device: torch.device
) -> dict[str, Any]:
    """The planner constraints of every table, as training and ``tzrec-run plan`` both use them.

    Each table starts from :func:`fused_constraints`; ``train.global_embedding_constraints``
    replaces the keys it sets, then the ``embedding_constraints`` of the features reading the
    table replace the keys they set (features sharing a table agree: checked with the config).
    A table trained data-parallel on CPU (``cpu_policy = "data_parallel"``) gets
    ``data_parallel`` on the ``dense`` kernel.

    Raises:
        ConfigError: for a feature's ``embedding_constraints`` on a data-parallel table, or
            sharding types or compute kernels of which TorchRec offers none on ``device`` (on
            CPU it shards tables table-wise or column-wise only, on the ``fused`` kernel).
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints

    offered = EmbeddingBagCollectionSharder().sharding_types(device.type)
    constraints = fused_constraints(embedding_modules)
    features = {f.name: (i, f) for i, f in enumerate(cfg.features.sparse)}
    glob = cfg.train.global_embedding_constraints
    problems: list[ConfigProblem] = []
    for module in embedding_modules:
        for table, _ in _embedding_tables(module):
            layers = [("train.global_embedding_constraints", glob)] if glob is not None else []
            layers += [
                (f"features.sparse[{i}].embedding_constraints", f.embedding_constraints)
                for i, f in (features[n] for n in table.feature_names if n in features)
                if f.embedding_constraints is not None
            ][:1]
            if updates[table.name].data_parallel:
                constraints[table.name] = ParameterConstraints(sharding_types=["data_parallel"], compute_kernels=["dense"])
                problems += [ConfigProblem(path, f"table '{table.name}' trains data-parallel on CPU (cpu_policy = \"data_parallel\"); "
                                                 "its sharding cannot be constrained: remove embedding_constraints or run on CUDA")
                             for path, _ in layers if path.startswith("features.")]
                continue
            sharding_types = list(constraints[table.name].sharding_types)
            compute_kernels = list(constraints[table.name].compute_kernels)
            where = types_from = "default"
            for path, layer in layers:
                if layer.sharding_types is not None:
                    sharding_types, types_from = list(layer.sharding_types), f"{path}.sharding_types"
                if layer.compute_kernels is not None:
                    compute_kernels, where = list(layer.compute_kernels), f"{path}.compute_kernels"
            if not set(sharding_types) & set(offered):
                problems.append(ConfigProblem(types_from, f"table '{table.name}': TorchRec offers none of {', '.join(sharding_types)} "
                                                          f"on {device.type} (it offers {', '.join(t for t in offered if t != 'data_parallel')})"))
            if device.type != "cuda" and "fused" not in compute_kernels:
                problems.append(ConfigProblem(where, f"table '{table.name}': {', '.join(compute_kernels)} exist only on CUDA; "
                                                     f"on {device.type} add \"fused\""))
            constraints[table.name] = ParameterConstraints(sharding_types=sharding_types, compute_kernels=compute_kernels)
    if problems:
        raise ConfigError("embedding_constraints", list(dict.fromkeys(problems)))
    return constraints


@attrs.define
class ShardingSetup:
    """What TorchRec's sharding planner is given, built once for training and ``tzrec-run
    plan`` alike (:func:`prepare_sharding`).

    Attributes:
        model: the :class:`TrainModel`, embeddings on the meta device, each table's sparse
            optimizer applied in backward (the planner sizes optimizer state from it).
        embedding_modules: its embedding collections.
        updates: each table's :class:`TableUpdate`.
        constraints: each table's planner constraints (:func:`table_constraints`).
        sharders: TorchRec's default sharders.
        topology: the planner's ``Topology``.
        planner: the ``EmbeddingShardingPlanner``.
        batch_size: the planner's batch size (``data.batch_size``: rows per rank and step).
    """

    model: "TrainModel"
    embedding_modules: list[nn.Module]
    updates: dict[str, "TableUpdate"]
    constraints: dict[str, Any]
    sharders: list[Any]
    topology: Any
    planner: Any
    batch_size: int


def prepare_sharding(
    cfg: RunConfig,
    registries: Registries,
    specs: FeatureSpecs,
    *,
    world_size: int,
    local_world_size: int,
    device: torch.device,
    hbm_cap: int | None = None,
    ddr_cap: int | None = None,
    stats: Sequence[Any] | None = None,
    loss_scale: LossScale | None = None,
) -> ShardingSetup:
    """Build the model on the meta device and the planner that shards it.

    Args:
        cfg, registries, specs: the run.
        world_size, local_world_size: ranks in all and per host.
        device: the compute device (only its type matters: the planner needs no device).
        hbm_cap, ddr_cap: bytes of device and host memory per rank (default TorchRec's,
            32 GiB and 128 GiB).
        stats: TorchRec planner ``Stats`` to report to (default TorchRec's log table).
        loss_scale: how training scales the loss (none for planning).

    Raises:
        ConfigError: as :func:`plan_table_updates` and :func:`table_constraints`, or for a
            model without embedding collections.
    """
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    train_model = build_model(cfg, registries, specs, torch.device("meta"), loss_scale)
    embedding_modules = _embedding_modules(train_model)
    if not embedding_modules:
        raise ConfigError("model", [ConfigProblem("model.type", f"model '{cfg.model.type}' built no EmbeddingBagCollection; tzrec-run shards embeddings with TorchRec")])
    updates = plan_table_updates(cfg, registries, embedding_modules, device)
    constraints = table_constraints(cfg, embedding_modules, updates, device)
    for module in embedding_modules:
        for table, weight in _embedding_tables(module):
            update = updates[table.name]
            if not update.data_parallel:
                apply_optimizer_in_backward(update.spec.optimizer_class, [weight], dict(update.spec.kwargs))
    topology = Topology(
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=device.type,
        hbm_cap=hbm_cap,
        ddr_cap=ddr_cap,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=cfg.data.batch_size, constraints=constraints,
        stats=list(stats) if stats is not None else None,
    )
    return ShardingSetup(
        train_model, embedding_modules, updates, constraints, get_default_sharders(), topology, planner, cfg.data.batch_size
    )


@attrs.frozen
class TableUpdate:
    """How one embedding table is updated.

    Attributes:
        table: the table's name (its ``EmbeddingBagConfig`` name).
        path: the TOML path of its sparse optimizer (``train.sparse_optimizer`` or a feature's).
        spec: what the optimizer plugin returned (SGD with lr 0 for a frozen table).
        data_parallel: trained data-parallel with ``spec.torch_fallback`` (CPU policy).
        frozen: ``trainable = false``.
    """

    table: str
    path: str
    spec: Any
    data_parallel: bool = False
    frozen: bool = False


def plan_table_updates(
    cfg: RunConfig, registries: Registries, embedding_modules: Sequence[nn.Module], device: torch.device
) -> dict[str, TableUpdate]:
    """Decide each table's sparse optimizer: the feature's own, ``train.sparse_optimizer``, or
    frozen; and, on CPU, what happens to optimizers FBGEMM has no CPU kernel for.

    Raises:
        ConfigError: for an optimizer FBGEMM cannot run on ``device`` without ``cpu_policy =
            "data_parallel"``, or with that policy but no torch equivalent.
    """
    from torchrec.optim.optimizers import SGD

    features = {f.name: (i, f) for i, f in enumerate(cfg.features.sparse)}
    specs: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    updates: dict[str, TableUpdate] = {}
    for module in embedding_modules:
        for table, _ in _embedding_tables(module):
            users = [features[name] for name in table.feature_names if name in features]
            component, path, frozen = cfg.train.sparse_optimizer, "train.sparse_optimizer", False
            for i, feature in users:
                frozen = frozen or not feature.trainable
                if feature.sparse_optimizer is not None:
                    component, path = feature.sparse_optimizer, f"features.sparse[{i}].sparse_optimizer"
            if frozen:
                updates[table.name] = TableUpdate(table.name, path, SparseOptimizerSpec(SGD, {"lr": 0.0}, "EXACT_SGD"), frozen=True)
                continue
            if path not in specs:
                specs[path] = registries["sparse_optimizer"].get(component.type, f"{path}.type").build(component.config)
            spec = specs[path]
            data_parallel = False
            if device.type == "cpu" and spec.fbgemm_type == "EXACT_ROWWISE_ADAGRAD" and spec.kwargs.get("weight_decay"):
                # FBGEMM's vectorised CPU kernel (every float32 table read by one feature) is
                # called with weight decay 0: the option would be silently ignored
                problems.append(ConfigProblem(
                    f"{path}.weight_decay",
                    "FBGEMM's CPU kernel for rowwise_adagrad ignores weight_decay (it applies it only on CUDA); "
                    "remove weight_decay on CPU, or train on CUDA",
                ))
            if device.type == "cpu" and not spec.cpu_supported:
                policy = component.fields.cpu_policy
                if policy == "data_parallel" and spec.torch_fallback is not None:
                    data_parallel = True
                elif policy == "data_parallel":
                    problems.append(ConfigProblem(f"{path}.cpu_policy", f"sparse optimizer '{component.type}' has no torch equivalent to train data-parallel with; on CPU use sgd, adagrad or rowwise_adagrad"))
                else:
                    problems.append(ConfigProblem(
                        f"{path}.type",
                        f"sparse optimizer '{component.type}' (FBGEMM {spec.fbgemm_type}) has no FBGEMM CPU kernel "
                        "(FBGEMM fuses only sgd, adagrad and rowwise_adagrad on CPU). Use one of those, run on CUDA, "
                        f'or set {path}.cpu_policy = "data_parallel" to train these tables data-parallel with the '
                        "equivalent torch optimizer (its state then moves for every row at every step)",
                    ))
            updates[table.name] = TableUpdate(table.name, path, spec, data_parallel=data_parallel)
    if problems:
        unique = list(dict.fromkeys(problems))
        raise ConfigError("train.sparse_optimizer", unique)
    return updates


def dense_parameter_names(model: nn.Module) -> list[str]:
    """The names of a user model's dense parameters (everything outside its embedding
    collections), as part ``pattern``s see them."""
    embedding = {id(p) for m in _embedding_modules(model) for p in m.parameters()}
    return [name for name, p in model.named_parameters() if id(p) not in embedding]


def assign_parts(names: Sequence[str], parts: Sequence[Component], where: str = "train.dense_optimizer") -> dict[str, list[str]]:
    """Split dense parameter names between the part optimizers (whole-name regex match) and
    the main dense optimizer (key ``dense``; parts are ``dense.parts[<i>]``).

    Raises:
        ConfigError: when a name matches two parts (naming both patterns) or a part matches
            no parameter.
    """
    import re

    compiled = [(i, re.compile(part.fields.pattern)) for i, part in enumerate(parts)]
    groups: dict[str, list[str]] = {"dense": []}
    groups.update({f"dense.parts[{i}]": [] for i in range(len(parts))})
    problems = []
    for name in names:
        matched = [i for i, pattern in compiled if pattern.fullmatch(name)]
        if len(matched) > 1:
            a, b = matched[:2]
            problems.append(ConfigProblem(
                f"{where}.parts[{b}].pattern",
                f"parameter '{name}' is matched by parts[{a}] ('{parts[a].fields.pattern}') and parts[{b}] "
                f"('{parts[b].fields.pattern}'); a parameter belongs to one part",
            ))
        groups[f"dense.parts[{matched[0]}]" if matched else "dense"].append(name)
    for i, part in enumerate(parts):
        if not groups[f"dense.parts[{i}]"]:
            sample = ", ".join(list(names)[:6]) + (", ..." if len(names) > 6 else "")
            problems.append(ConfigProblem(
                f"{where}.parts[{i}].pattern",
                f"'{part.fields.pattern}' matches no dense parameter (the pattern must match the whole name; names: {sample}; "
                "see tzrec-run check --params)",
            ))
    if problems:
        raise ConfigError(where, problems)
    return groups


def build_model(cfg: RunConfig, registries: Registries, specs: FeatureSpecs, device: torch.device,
                loss_scale: LossScale | None = None) -> TrainModel:
    """The user's model and its losses, with embedding collections on ``device``."""
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, device, tuple(cfg.data.labels))
    model_entry = registries["model"].get(cfg.model.type, "model.type")
    model = model_entry.build(cfg.model.config, ctx)
    slots = loss_slots(cfg, registries)
    losses = {
        slot.name: registries["loss"].get(c.type, f"losses[{i}].type").build(c.config)
        for i, (slot, c) in enumerate(zip(slots, cfg.losses))
    }
    weighting = build_loss_weighting(cfg, registries, [slot.name for slot in slots])
    return TrainModel(model, losses, slots, cfg.train.mixed_precision, loss_scale, weighting)


def apply_tf32(cfg: RunConfig) -> None:
    """Set torch's TF32 switches the config names (CUDA only; harmless on CPU)."""
    if cfg.train.cudnn_allow_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = cfg.train.cudnn_allow_tf32
    if cfg.train.cuda_matmul_allow_tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.cuda_matmul_allow_tf32


def build_run(cfg: RunConfig, registries: Registries, specs: FeatureSpecs, info: DistInfo) -> Built:
    """Build the sharded model, optimizers, schedules and update path of a run, on every rank.

    Raises:
        ConfigError: when a component rejects the config at build time (the model's own
            cross-checks, a sparse optimizer FBGEMM cannot run on this device, a part pattern
            that matches nothing, ...).
    """
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    apply_tf32(cfg)
    loss_scale = UpdateOptimizer.make_loss_scale(cfg.train, info.device)
    setup = prepare_sharding(
        cfg, registries, specs, world_size=info.world_size, local_world_size=info.local_world_size, device=info.device,
        loss_scale=loss_scale,
    )
    train_model, updates, sharders = setup.model, setup.updates, setup.sharders
    dense_names = dense_parameter_names(train_model.model)
    dense_fields = cfg.train.dense_optimizer.fields
    parts = assign_parts(dense_names, dense_fields.parts)

    fallback_tables = {name: u for name, u in updates.items() if u.data_parallel}
    if fallback_tables and info.rank == 0:
        log.warning(
            "tables %s train data-parallel with the torch equivalent of their sparse optimizer "
            "(cpu_policy = \"data_parallel\"): unlike FBGEMM's fused update, every row's optimizer state "
            "moves at every step, not only the rows a batch touched",
            ", ".join(sorted(fallback_tables)),
        )

    pg = dist.GroupMember.WORLD
    plan = setup.planner.collective_plan(train_model, sharders, pg)
    dmp = DistributedModelParallel(
        train_model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=info.device
    )
    initial = {name: u.spec.initial_accumulator_value for name, u in updates.items()
               if u.spec.initial_accumulator_value and not u.data_parallel}
    if initial:
        from tzrun.runner.sparse_state import set_initial_accumulators

        set_initial_accumulators(dmp, initial)

    # Everything without an in-backward optimizer: dense layers and data-parallel fallback tables.
    unfused = dict(in_backward_optimizer_filter(dmp.named_parameters(), include=False))
    fallback_params: dict[str, dict[str, Any]] = {}
    for name, param in list(unfused.items()):
        parts_of_name = name.split(".")
        if len(parts_of_name) >= 3 and parts_of_name[-1] == "weight" and parts_of_name[-2] in fallback_tables:
            fallback_params.setdefault(fallback_tables[parts_of_name[-2]].path, {})[name] = unfused.pop(name)
    by_user_name = {name.removeprefix("model."): (name, p) for name, p in unfused.items()}
    missing = [n for group in parts.values() for n in group if n not in by_user_name]
    if missing:
        raise RuntimeError(f"dense parameters not found after sharding: {missing[:5]}")

    optimizers: dict[str, Any] = {"sparse": dmp.fused_optimizer}
    schedule_of: dict[str, tuple[str, Component]] = {"sparse": ("train.sparse_optimizer", cfg.train.sparse_optimizer.fields.lr_schedule)}
    for i, (path, params) in enumerate(sorted(fallback_params.items())):
        spec = updates[next(n for n, u in fallback_tables.items() if u.path == path)].spec
        key = f"sparse_dp.{i}"
        optimizers[key] = KeyedOptimizerWrapper(params, spec.torch_fallback)
        schedule_of[key] = ("train.sparse_optimizer", cfg.train.sparse_optimizer.fields.lr_schedule)
    dense = cfg.train.dense_optimizer
    for key, names in parts.items():
        if not names:
            continue
        if key == "dense":
            component, where, schedule = dense, "train.dense_optimizer", dense_fields.lr_schedule
        else:
            index = int(key[len("dense.parts["):-1])
            component, where = dense_fields.parts[index], f"train.dense_optimizer.parts[{index}]"
            schedule = component.fields.lr_schedule or dense_fields.lr_schedule
        entry = registries["dense_optimizer"].get(component.type, f"{where}.type")
        params = {by_user_name[n][0]: by_user_name[n][1] for n in names}
        optimizers[key] = KeyedOptimizerWrapper(params, lambda ps, e=entry, c=component: e.build(c.config, ps))
        schedule_of[key] = (where, schedule)
    combined = CombinedOptimizer(list(optimizers.items()))

    schedulers = {}
    for key, (where, schedule) in schedule_of.items():
        entry = registries["lr_scheduler"].get(schedule.type, f"{where}.lr_schedule.type")
        schedulers[key] = entry.build(schedule.config, optimizers[key])
    update = UpdateOptimizer(
        model=dmp,
        loss_scale=loss_scale,
        per_batch={k: v for k, v in optimizers.items() if k.startswith("sparse")},
        dense={k: v for k, v in optimizers.items() if k.startswith("dense")},
        train=cfg.train,
        ema=dense_fields.ema,
        device=info.device,
    )
    return Built(dmp, combined, update, optimizers, schedulers, plan, {k: v for k, v in parts.items() if v})
