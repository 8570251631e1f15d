"""``train.on_nonfinite_loss = "skip"``: a step whose loss is NaN or infinite on any rank runs
no update at all.

FBGEMM's fused sparse optimizers update the embedding rows (and their optimizer state) inside
backward, so a skipped step must keep the embedding lookups out of its backward: the loss the
train pipeline runs backward on is then :func:`no_update_loss`, a zero that reaches only the
dense parameters (with zero gradients, which the update path discards). The decision is taken
where the loss is computed, before backward, and by all ranks together (one all-reduce of a
flag): the embeddings' backward exchanges gradients between ranks, so either every rank runs it
or none does.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["collectively_finite", "no_update_loss"]


def collectively_finite(loss: torch.Tensor) -> bool:
    """Whether ``loss`` is finite on every rank (one device sync; one all-reduce of a flag when
    the default process group has more than one rank)."""
    import torch.distributed as dist

    finite = torch.isfinite(loss.detach()).all()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = finite.to(torch.int32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())
    return bool(finite)


def no_update_loss(module: nn.Module, like: torch.Tensor) -> torch.Tensor:
    """A zero loss whose backward reaches every trainable dense parameter of ``module`` (so that
    DDP's gradient all-reduce runs on every rank as usual) and no embedding lookup."""
    from torchrec.distributed.types import ShardedModule

    sharded = {id(p) for m in module.modules() if isinstance(m, ShardedModule) for p in m.parameters()}
    dense = [p for p in module.parameters() if p.requires_grad and id(p) not in sharded]
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    if not dense:
        return zero.requires_grad_()
    return torch.stack([p.sum() for p in dense]).sum().to(like.dtype) * 0.0 + zero
