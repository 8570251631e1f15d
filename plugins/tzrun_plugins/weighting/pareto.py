"""The first-party loss weightings: ``sum`` (the default) and ``pareto``.

``pareto`` is PE-LTR (Lin et al., "A Pareto-Efficient Algorithm for Multiple Objective
Optimization in E-Commerce Recommendation", RecSys 2019), the ``pe_mtl_loss`` that TorchEasyRec's
``use_pareto_loss_weight`` turns on. At every training step it takes the gradient ``g_i`` of
each loss (its ``weight`` applied) over the dense parameters, solves::

    minimize ‖Σ_i w_i g_i‖²  subject to  Σ_i w_i = 1,  w_i >= min_weights[i]

and trains on ``Σ_i w_i loss_i`` with the weights held constant (no gradient flows through
them). See :mod:`tzrun_plugins.weighting.solve` for the two solvers.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import Tensor, nn

from tzrun_plugins.weighting.solve import exact_weights, gram_matrix, pe_ltr_weights

__all__ = ["SumWeighting", "ParetoWeighting"]


class SumWeighting(nn.Module):
    """The total loss is the sum of the (weighted) losses."""

    def forward(self, losses: Mapping[str, Tensor], params: Sequence[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        total = None
        for value in losses.values():
            total = value if total is None else total + value
        assert total is not None, "a run has at least one loss"
        return total, {}


class ParetoWeighting(nn.Module):
    """Pareto-efficient weights of the losses, recomputed at every training step.

    Args:
        names: the losses, in config order.
        min_weights: the smallest weight of each loss named (others 0).
        solver: ``"exact"`` or ``"pe_ltr"``.
    """

    def __init__(self, names: Sequence[str], min_weights: Mapping[str, float], solver: str = "exact") -> None:
        super().__init__()
        self.names = list(names)
        self.min_weights = [float(min_weights.get(name, 0.0)) for name in self.names]
        self.solve = exact_weights if solver == "exact" else pe_ltr_weights
        self._min_on_device: Tensor | None = None

    def _min_weights(self, device: torch.device) -> Tensor:
        """``min_weights`` as a tensor on ``device``, copied there once (a copy per step would
        wait for the device)."""
        if self._min_on_device is None or self._min_on_device.device != device:
            self._min_on_device = torch.tensor(self.min_weights, dtype=torch.float64, device=device)
        return self._min_on_device

    def weights(self, losses: Sequence[Tensor], params: Sequence[Tensor]) -> Tensor:
        """The ``[K]`` float64 weights of ``losses`` from their gradients over ``params``."""
        params = list(params)
        if len(losses) == 1 or not params:
            return torch.ones(len(losses), dtype=torch.float64, device=losses[0].device) / len(losses)
        grads = [
            torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            for loss in losses
        ]
        gram = gram_matrix(grads, params)
        return self.solve(gram, self._min_weights(gram.device))

    def forward(self, losses: Mapping[str, Tensor], params: Sequence[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        values = [losses[name] for name in self.names]
        w = self.weights(values, params).detach()
        total = (torch.stack(values) * w.to(values[0].dtype)).sum()
        return total, {name: w[i].float() for i, name in enumerate(self.names)}
