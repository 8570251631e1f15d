"""The components themselves (imports torch)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torchmetrics import Metric


class SignSGD(torch.optim.Optimizer):
    """signSGD (Bernstein et al. 2018): ``w -= lr * sign(g)``."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-float(group["lr"]))
        return None


class LabelMean(Metric):
    """``sum(w * y) / sum(w)`` over every row of every rank: two sums, which torchmetrics adds
    up across ranks. Rows of weight 0 (padding) add nothing to either."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("weighted_labels", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weights", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, prediction: torch.Tensor, label: torch.Tensor, weight: Optional[torch.Tensor] = None) -> None:
        label = label.reshape(-1).to(torch.float64)
        weight = torch.ones_like(label) if weight is None else weight.reshape(-1).to(torch.float64)
        self.weighted_labels += (weight * label).sum()
        self.weights += weight.sum()

    def compute(self) -> torch.Tensor:
        return self.weighted_labels / self.weights
