"""What TorchRec's sharding planner is given: each table's sparse optimizer (and what happens on
CPU to those FBGEMM cannot fuse there), each table's constraints, and the model on the meta
device, for training and ``tzrec-run plan`` alike."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import attrs
import torch
from torch import nn

from tzrun.config.schema import RunConfig
from tzrun.config.sequences import id_features
from tzrun.errors import ConfigError, ConfigProblem, PlanError
from tzrun.interfaces import SparseOptimizerSpec
from tzrun.kernel.registry import Registries
from tzrun.runner.facts import RunFacts
from tzrun.runner.host_memory import HostMemory, host_memory_problem
from tzrun.runner.model import TrainModel, build_model, embedding_modules, embedding_tables
from tzrun.runner.update import LossScale
from tzrun.runner.zch import check_zch_world_size, swap_managed_collisions, zch_table_names
from tzrun.runner.zch_memory import ManagedState, managed_states
from tzrun.runner.zch_sharding import with_zch_sharder

__all__ = ["MODEL_PARALLEL_SHARDING_TYPES", "fused_constraints", "table_constraints", "ShardingSetup",
           "prepare_sharding", "TableUpdate", "plan_table_updates"]


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
        for table, _ in embedding_tables(module)
    }


def table_constraints(
    cfg: RunConfig, embedding_modules: Sequence[nn.Module], updates: Mapping[str, "TableUpdate"], device: torch.device,
    managed: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
    """The planner constraints of every table, as training and ``tzrec-run plan`` both use them.

    Each table starts from :func:`fused_constraints`; ``train.global_embedding_constraints``
    replaces the keys it sets, then the ``embedding_constraints`` of the features reading the
    table replace the keys they set (features sharing a table agree: checked with the config).
    A table trained data-parallel on CPU (``cpu_policy = "data_parallel"``) gets
    ``data_parallel`` on the ``dense`` kernel. A ``managed`` table (``zch``) is sharded
    row-wise: TorchRec's managed-collision sharder offers nothing else.

    Raises:
        ConfigError: for a feature's ``embedding_constraints`` on a data-parallel table, or
            sharding types or compute kernels of which TorchRec offers none on ``device`` (on
            CPU it shards tables table-wise or column-wise only, on the ``fused`` kernel).
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints

    from torchrec import EmbeddingCollection
    from torchrec.distributed.embedding import EmbeddingCollectionSharder

    bag_offered = EmbeddingBagCollectionSharder().sharding_types(device.type)
    unpooled_offered = EmbeddingCollectionSharder().sharding_types(device.type)
    constraints = fused_constraints(embedding_modules)

    features = id_features(cfg.features)
    glob = cfg.train.global_embedding_constraints
    problems: list[ConfigProblem] = []
    for module in embedding_modules:
        for table, _ in embedding_tables(module):
            offered = unpooled_offered if isinstance(module, EmbeddingCollection) else bag_offered
            if table.name in managed:
                offered = ["row_wise"]  # TorchRec's managed-collision sharder: row-wise only
                constraints[table.name] = dataclasses.replace(constraints[table.name], sharding_types=list(offered))
            layers = [("train.global_embedding_constraints", glob)] if glob is not None else []
            layers += [
                (f"{path}.embedding_constraints", f.embedding_constraints)
                for path, f in (features[n] for n in table.feature_names if n in features)
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
        managed: the managed state of each ``zch`` table, by table name
            (:mod:`tzrun.runner.zch_memory`).
    """

    model: "TrainModel"
    embedding_modules: list[nn.Module]
    updates: dict[str, "TableUpdate"]
    constraints: dict[str, Any]
    sharders: list[Any]
    topology: Any
    planner: Any
    batch_size: int
    managed: dict[str, ManagedState] = attrs.field(factory=dict)


def prepare_sharding(
    facts: RunFacts,
    *,
    world_size: int,
    local_world_size: int,
    device: torch.device,
    batch_size: int | None = None,
    hbm_cap: int | None = None,
    ddr_cap: int | None = None,
    stats: Sequence[Any] | None = None,
    loss_scale: LossScale | None = None,
    host: HostMemory | None = None,
) -> ShardingSetup:
    """Build the model on the meta device and the planner that shards it.

    Args:
        facts: the run's config, components and derived facts.
        world_size, local_world_size: ranks in all and per host.
        device: the compute device (only its type matters: the planner needs no device).
        batch_size: rows per step per rank (default ``data.batch_size``).
        hbm_cap, ddr_cap: bytes of device and host memory per rank (default TorchRec's,
            32 GiB and 128 GiB).
        stats: TorchRec planner ``Stats`` to report to (default TorchRec's log table).
        loss_scale: how training scales the loss (none for planning).
        host: this host's memory, to refuse tables it cannot hold (a run on CPU here:
            :mod:`tzrun.runner.host_memory`); None checks nothing.

    Raises:
        ConfigError: as :func:`plan_table_updates` and :func:`table_constraints`, or for a
            model without embedding collections.
        PlanError: when ``host`` is given and cannot hold this host's share of the tables.
    """
    from torchrec.distributed.model_parallel import get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    cfg = facts.cfg
    batch_size = cfg.data.batch_size if batch_size is None else batch_size
    train_model = build_model(facts, torch.device("meta"), loss_scale, compute_device=device.type)
    check_zch_world_size(cfg, world_size)
    swap_managed_collisions(train_model.model, cfg, facts.registries, world_size)
    modules = embedding_modules(train_model)
    if not modules:
        raise ConfigError("model", [ConfigProblem("model.type", f"model '{cfg.model.type}' built no EmbeddingBagCollection; tzrec-run shards embeddings with TorchRec")])
    updates = plan_table_updates(cfg, facts.registries, modules, device)
    constraints = table_constraints(cfg, modules, updates, device, zch_table_names(list(train_model.modules())))
    _fuse_sparse_updates(modules, updates)
    managed = managed_states(train_model)
    problem = host_memory_problem(modules, updates, world_size, local_world_size, host, managed=managed,
                                  batch_size=batch_size)
    if problem is not None:
        raise PlanError(problem)
    topology = Topology(
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=device.type,
        hbm_cap=hbm_cap,
        ddr_cap=ddr_cap,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=batch_size, constraints=constraints,
        stats=list(stats) if stats is not None else None,
    )
    sharders = with_zch_sharder(get_default_sharders())
    return ShardingSetup(train_model, modules, updates, constraints, sharders, topology, planner, batch_size, managed)


def _fuse_sparse_updates(modules: Sequence[nn.Module], updates: Mapping[str, "TableUpdate"]) -> None:
    """Attach each sharded table's sparse optimizer to its weight (fused into backward by
    TorchRec); data-parallel tables are left to their torch optimizer."""
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    for module in modules:
        for table, weight in embedding_tables(module):
            update = updates[table.name]
            if not update.data_parallel:
                apply_optimizer_in_backward(update.spec.optimizer_class, [weight], dict(update.spec.kwargs))


def _unpooled_data_parallel_problems(module: nn.Module, table: str, path: str, features: Sequence[str]) -> list[ConfigProblem]:
    """A table looked up unpooled (an ``EmbeddingCollection``: sequences) cannot train
    data-parallel on CPU: FBGEMM's CPU dense kernel ignores ``PoolingMode.NONE`` and pools
    every bag, so TorchRec's lookup fails on the first step (``split_with_sizes``)."""
    from torchrec import EmbeddingCollection

    if not isinstance(module, EmbeddingCollection):
        return []
    readers = f" (read by {', '.join(features)})" if features else ""
    return [ConfigProblem(f"{path}.cpu_policy", (
        f"table '{table}'{readers} is looked up unpooled, as a sequence, and FBGEMM's CPU kernel for data-parallel "
        "tables pools every lookup: it cannot train data-parallel on CPU. Give the features reading it a "
        "sparse_optimizer FBGEMM fuses on CPU (sgd, adagrad or rowwise_adagrad), or train on CUDA"))]


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

    features = id_features(cfg.features)
    specs: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    updates: dict[str, TableUpdate] = {}
    for module in embedding_modules:
        for table, _ in embedding_tables(module):
            users = [features[name] for name in table.feature_names if name in features]
            component, path, frozen = cfg.train.sparse_optimizer, "train.sparse_optimizer", False
            for where, feature in users:
                frozen = frozen or not feature.trainable
                if feature.sparse_optimizer is not None:
                    component, path = feature.sparse_optimizer, f"{where}.sparse_optimizer"
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
                    problems += _unpooled_data_parallel_problems(module, table.name, path, [w for w, _ in users])
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
