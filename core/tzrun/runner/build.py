"""Building a run: the sharding plan, DistributedModelParallel, the fused sparse optimizer, the
dense optimizers (and their parts), the schedules and the update path around them."""

from __future__ import annotations

import logging
from typing import Any, Mapping

import attrs
import torch
import torch.distributed as dist

from tzrun.config.schema import Component, RunConfig
from tzrun.errors import PlanError
from tzrun.kernel.registry import Registries
from tzrun.runner.compile import CompiledDense, compile_dense
from tzrun.runner.dense_parts import assign_parts
from tzrun.runner.distributed import DistInfo
from tzrun.runner.facts import RunFacts
from tzrun.runner.host_memory import host_memory
from tzrun.runner.model import dense_parameter_names
from tzrun.runner.sharding import ShardingSetup, prepare_sharding
from tzrun.runner.sparse_state import set_initial_accumulators
from tzrun.runner.update import UpdateOptimizer

__all__ = ["Built", "apply_tf32", "build_run"]

log = logging.getLogger(__name__)


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
        compiled: what ``[train.compile]`` compiled (None when it is off).
    """

    model: Any
    optimizer: Any
    update: Any
    optimizers: dict[str, Any]
    schedulers: dict[str, Any]
    plan: Any
    parts: dict[str, list[str]] = attrs.field(factory=dict)
    compiled: CompiledDense | None = None


def apply_tf32(cfg: RunConfig) -> None:
    """Set torch's TF32 switches the config names (CUDA only; harmless on CPU)."""
    if cfg.train.cudnn_allow_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = cfg.train.cudnn_allow_tf32
    if cfg.train.cuda_matmul_allow_tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.cuda_matmul_allow_tf32


def build_run(facts: RunFacts, info: DistInfo, source: str = "the config") -> Built:
    """Build the sharded model, optimizers, schedules and update path of a run, on every rank
    (collective).

    Raises:
        PlanError: when TorchRec's planner finds no plan for the job (one line naming the table
            that breaks it and what would help), or on CPU the tables need more memory than this
            host has available (:mod:`tzrun.runner.host_memory`).
        ConfigError: when a component rejects the config at build time (the model's own
            cross-checks, a sparse optimizer FBGEMM cannot run on this device, a part pattern
            that matches nothing, ...).
    """
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.optim.keyed import CombinedOptimizer

    cfg, registries = facts.cfg, facts.registries
    apply_tf32(cfg)
    loss_scale = UpdateOptimizer.make_loss_scale(cfg.train, info.device)
    try:
        setup = prepare_sharding(
            facts, world_size=info.world_size, local_world_size=info.local_world_size,
            device=info.device, loss_scale=loss_scale, host=host_memory() if info.device.type == "cpu" else None,
        )
    except PlanError as error:  # this host's memory cannot hold the tables
        raise PlanError(f"{source}: {error}") from None
    parts = assign_parts(dense_parameter_names(setup.model.model), cfg.train.dense_optimizer.fields.parts)
    fallback_tables = {name: u for name, u in setup.updates.items() if u.data_parallel}
    _warn_about_data_parallel_tables(fallback_tables, info.rank)
    compiled = compile_dense(setup.model, cfg.train.compile, info.rank)
    try:
        dmp, plan = _shard(setup, info)
    except PlannerError:
        from tzrun.runner.plan import PlanRequest, no_plan_error

        request = PlanRequest(info.world_size, info.local_world_size, info.device.type)
        raise no_plan_error(facts, request, source) from None
    optimizers, schedule_of = _optimizers(cfg, registries, dmp, parts, setup.updates, fallback_tables)
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
        ema=cfg.train.dense_optimizer.fields.ema,
        device=info.device,
    )
    combined = CombinedOptimizer(list(optimizers.items()))
    return Built(dmp, combined, update, optimizers, schedulers, plan, {k: v for k, v in parts.items() if v}, compiled)


def _warn_about_data_parallel_tables(fallback_tables: Mapping[str, Any], rank: int) -> None:
    if fallback_tables and rank == 0:
        log.warning(
            "tables %s train data-parallel with the torch equivalent of their sparse optimizer "
            "(cpu_policy = \"data_parallel\"): unlike FBGEMM's fused update, every row's optimizer state "
            "moves at every step, not only the rows a batch touched",
            ", ".join(sorted(fallback_tables)),
        )


def _shard(setup: ShardingSetup, info: DistInfo) -> tuple[Any, Any]:
    """The collective plan and the DistributedModelParallel model (with the initial
    accumulator values the sparse optimizers ask for)."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    pg = dist.GroupMember.WORLD
    plan = setup.planner.collective_plan(setup.model, setup.sharders, pg)
    dmp = DistributedModelParallel(
        setup.model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=setup.sharders, device=info.device
    )
    initial = {name: u.spec.initial_accumulator_value for name, u in setup.updates.items()
               if u.spec.initial_accumulator_value and not u.data_parallel}
    if initial:
        set_initial_accumulators(dmp, initial)
    return dmp, plan


def _optimizers(cfg: RunConfig, registries: Registries, dmp: Any, parts: Mapping[str, list[str]],
                updates: Mapping[str, Any], fallback_tables: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every schedulable optimizer by key (``sparse``, ``sparse_dp.<i>``, ``dense``,
    ``dense.parts[<i>]``) and, by the same key, where its schedule is configured."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    # Everything without an in-backward optimizer: dense layers and data-parallel fallback tables.
    unfused = dict(in_backward_optimizer_filter(dmp.named_parameters(), include=False))
    fallback_params: dict[str, dict[str, Any]] = {}
    for name in list(unfused):
        parts_of_name = name.split(".")
        if len(parts_of_name) >= 3 and parts_of_name[-1] == "weight" and parts_of_name[-2] in fallback_tables:
            fallback_params.setdefault(fallback_tables[parts_of_name[-2]].path, {})[name] = unfused.pop(name)
    by_user_name = {name.removeprefix("model."): (name, p) for name, p in unfused.items()}
    missing = [n for group in parts.values() for n in group if n not in by_user_name]
    if missing:
        raise RuntimeError(f"dense parameters not found after sharding: {missing[:5]}")
    sparse_schedule = ("train.sparse_optimizer", cfg.train.sparse_optimizer.fields.lr_schedule)
    optimizers: dict[str, Any] = {"sparse": dmp.fused_optimizer}
    schedule_of: dict[str, tuple[str, Component]] = {"sparse": sparse_schedule}
    for i, (path, params) in enumerate(sorted(fallback_params.items())):
        spec = updates[next(n for n, u in fallback_tables.items() if u.path == path)].spec
        optimizers[f"sparse_dp.{i}"] = KeyedOptimizerWrapper(params, spec.torch_fallback)
        schedule_of[f"sparse_dp.{i}"] = sparse_schedule
    dense_fields = cfg.train.dense_optimizer.fields
    for key, names in parts.items():
        if not names:
            continue
        if key == "dense":
            component, where, schedule = cfg.train.dense_optimizer, "train.dense_optimizer", dense_fields.lr_schedule
        else:
            index = int(key[len("dense.parts["):-1])
            component, where = dense_fields.parts[index], f"train.dense_optimizer.parts[{index}]"
            schedule = component.fields.lr_schedule or dense_fields.lr_schedule
        entry = registries["dense_optimizer"].get(component.type, f"{where}.type")
        params = {by_user_name[n][0]: by_user_name[n][1] for n in names}
        optimizers[key] = KeyedOptimizerWrapper(params, lambda ps, e=entry, c=component: e.build(c.config, ps))
        schedule_of[key] = (where, schedule)
    return optimizers, schedule_of
