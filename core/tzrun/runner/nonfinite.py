"""``train.on_nonfinite_loss``: non-finite losses and gradients.

A gradient counts as not finite when one of its elements is NaN or infinite, or so large that
its square overflows float32 (about 1.8e19): Adam, Adagrad and RMSprop accumulate squared
gradients, so such a gradient turns their state infinite and freezes its weights for good.
:class:`GradientCheck` finds the first such parameter on the device, without a sync.

With ``"skip"``, a step whose loss is NaN or infinite on any rank runs no update at all.

FBGEMM's fused sparse optimizers update the embedding rows (and their optimizer state) inside
backward, so a skipped step must keep the embedding lookups out of its backward: the loss the
train pipeline runs backward on is then :func:`no_update_loss`, a zero that reaches only the
dense parameters (with zero gradients, which the update path discards). The decision is taken
where the loss is computed, before backward, and by all ranks together (one all-reduce of a
flag): the embeddings' backward exchanges gradients between ranks, so either every rank runs it
or none does. A gradient that is not finite under a finite loss is found only after backward:
for that the update path (:class:`~tzrun.runner.update.UpdateOptimizer`) splits a ``"skip"``
step's backward at the embedding outputs and runs the embeddings' half only for a step it keeps.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

__all__ = ["GradientCheck", "collective_max", "collectively_finite", "no_update_loss"]


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


def collective_max(value: torch.Tensor) -> int:
    """The largest of an integer scalar over every rank (one device sync; one all-reduce when the
    default process group has more than one rank)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.detach().to(torch.int64).reshape(1).clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.reshape(()))


def squares_finite(magnitude: torch.Tensor) -> torch.Tensor:
    """Whether a gradient whose largest magnitude is ``magnitude`` is finite and squares to a
    finite float32 (device op; NaN counts as not finite)."""
    magnitude = magnitude.float()
    return torch.isfinite(magnitude * magnitude)


class GradientCheck:
    """Finds, on the device, the first parameter whose gradient is not finite (or overflows
    when squared, see the module doc): the named parameters' ``.grad``, then the gradients
    that reach each embedding module (noted by the update path's hook on their outputs).

    Args:
        params: the parameters whose ``.grad`` is checked, by name (in the order names are
            searched).
        embeddings: the names of the embedding modules whose output gradients are noted.
        device: the training device.
    """

    def __init__(self, params: Mapping[str, torch.Tensor], embeddings: list[str], device: torch.device) -> None:
        self.params = dict(params)
        self.names = [*(f"'{n}'" for n in self.params), *(f"the embedding lookups of '{m}'" for m in embeddings)]
        self.device = device
        #: per embedding module, the largest gradient magnitude that reached it in this batch
        self.embedding_magnitudes = torch.zeros(len(embeddings), dtype=torch.float32, device=device)
        self._positions: dict[tuple[int, ...], torch.Tensor] = {}

    def note_embedding(self, module: int, grad: torch.Tensor) -> torch.Tensor:
        """Note a gradient reaching embedding module ``module``; returns whether it is finite
        (a device bool)."""
        if grad.numel() == 0:
            return torch.ones((), dtype=torch.bool, device=grad.device)
        magnitude = grad.detach().abs().amax().float()
        slot = self.embedding_magnitudes[module]
        slot.copy_(torch.maximum(slot, magnitude.to(slot.device)))
        return squares_finite(magnitude)

    def first(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index, magnitude)`` of the first gradient not finite since the last call, as
        device scalars (index into :attr:`names`, -1 for none), and start the next batch."""
        held = [(i, p.grad) for i, p in enumerate(self.params.values()) if _checkable(p.grad)]
        everything = self.embedding_magnitudes.clone()
        if held:  # one fused max-magnitude reduction over every gradient
            magnitudes = torch._foreach_norm([g for _, g in held], float("inf"))
            everything = torch.cat([torch.stack([m.float().to(self.device) for m in magnitudes]), everything])
        self.embedding_magnitudes.zero_()
        if everything.numel() == 0:
            return torch.full((), -1, dtype=torch.int64, device=self.device), torch.zeros((), device=self.device)
        bad = ~squares_finite(everything)
        at = bad.to(torch.int8).argmax()
        index = torch.where(bad.any(), self._position_table(tuple(i for i, _ in held))[at], -1)
        return index, everything[at]

    def _position_table(self, held: tuple[int, ...]) -> torch.Tensor:
        """Where each checked magnitude's name is in :attr:`names` (cached per set of held grads)."""
        table = self._positions.get(held)
        if table is None:
            first_embedding = len(self.params)
            table = torch.tensor([*held, *range(first_embedding, len(self.names))], dtype=torch.int64, device=self.device)
            self._positions[held] = table
        return table


def _checkable(grad: object) -> bool:
    return type(grad) is torch.Tensor and grad.layout == torch.strided and grad.numel() > 0


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
