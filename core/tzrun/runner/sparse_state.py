"""Starting values of the fused sparse optimizers' state, written into FBGEMM's own buffers.

FBGEMM's table-batched embedding kernels (``SplitTableBatchedEmbeddingBagsCodegen``) allocate
their optimizer state zero-filled. Adagrad's accumulator (``momentum1``: one value per element
for ``EXACT_ADAGRAD``, one per row for ``EXACT_ROWWISE_ADAGRAD``) can start elsewhere (torch's
``initial_accumulator_value``): after :class:`DistributedModelParallel` has built the model,
:func:`set_initial_accumulators` fills it.

It writes through the fused optimizer's state (``model.fused_optimizer.state``): torchrec's
``EmbeddingFusedOptimizer`` builds each ``<table>.momentum1`` state from the shards'
``split_optimizer_states()``, which are views into the TBE's ``momentum1`` buffer, so filling
them changes what the kernel reads on the next backward (a test checks the updates it makes).
That is per model, per table and on every rank's own shards, unlike TorchEasyRec's
process-global ``FBGEMM_MOMENTUM1_STATE_INIT_VALUE`` environment variable and its monkey patch
of FBGEMM's allocation.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist

__all__ = ["set_initial_accumulators"]

_STATE = "momentum1"


def _local_tensors(state: Any) -> Iterator[torch.Tensor]:
    """The tensors this rank holds of a ShardedTensor, DTensor or plain tensor state."""
    if hasattr(state, "local_shards"):
        for shard in state.local_shards():
            yield from _local_tensors(shard.tensor if hasattr(shard, "tensor") else shard)
    elif hasattr(state, "to_local"):
        yield from _local_tensors(state.to_local())
    elif isinstance(state, torch.Tensor):
        yield state


def _planned_tables(model: torch.nn.Module) -> dict[str, Any]:
    """``{table name: ParameterSharding}`` of every sharded table in the model's plan."""
    plan = getattr(model, "plan", None)
    tables: dict[str, Any] = {}
    for module_plan in getattr(plan, "plan", {}).values():
        tables.update(module_plan)
    return tables


def _on_this_rank(sharding: Any) -> bool:
    ranks = getattr(sharding, "ranks", None)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return ranks is None or rank in ranks


def set_initial_accumulators(model: torch.nn.Module, values: Mapping[str, float]) -> list[str]:
    """Set the ``momentum1`` state of the named embedding tables to a value.

    Call it after :class:`DistributedModelParallel` has built ``model`` and before the first
    step; it fills every shard this rank holds of each named table.

    Args:
        model: the DistributedModelParallel-wrapped model (it has ``fused_optimizer`` and
            ``plan``).
        values: ``{table name: value}``; table names are the ``EmbeddingBagConfig`` names.

    Returns:
        The names of the tables set on this rank, sorted (a table with no shard here is
        left out).

    Raises:
        ValueError: for a name that matches no table of the model, or a table on this rank
            with no fused ``momentum1`` state (an optimizer without one, such as SGD, or a
            table not on a fused kernel).
        TypeError: when ``model`` has no ``fused_optimizer`` (not DistributedModelParallel).
    """
    if not values:
        return []
    if not hasattr(model, "fused_optimizer"):
        raise TypeError(
            f"set_initial_accumulators needs the DistributedModelParallel-wrapped model, got {type(model).__name__}"
        )
    states: dict[str, list[torch.Tensor]] = {}
    for per_param in model.fused_optimizer.state.values():
        for key, state in per_param.items():
            table, _, name = key.rpartition(".")
            if name == _STATE and table in values:
                states.setdefault(table, []).extend(_local_tensors(state))
    planned = _planned_tables(model)
    unknown = sorted(set(values) - set(planned) - set(states))
    if unknown:
        known = ", ".join(sorted(planned)) or "none"
        raise ValueError(f"no embedding table named {', '.join(map(repr, unknown))} (tables: {known})")
    missing = sorted(t for t in values if t not in states and _on_this_rank(planned[t]))
    if missing:
        details = ", ".join(
            f"'{t}' ({getattr(planned[t], 'sharding_type', '?')}, kernel {getattr(planned[t], 'compute_kernel', '?')})"
            for t in missing
        )
        raise ValueError(
            f"no fused {_STATE} state for {details}: its sparse optimizer keeps no accumulator, "
            "or the table is not on a fused FBGEMM kernel"
        )
    with torch.no_grad():
        for table, tensors in states.items():
            for tensor in tensors:
                tensor.fill_(float(values[table]))
    return sorted(states)
