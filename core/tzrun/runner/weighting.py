"""The loss weighting of a run (``[train.loss_weighting]``): how :class:`TrainModel`'s losses
make the training loss.

The plugin's module gets the weighted losses and the parameters that backward gives a ``.grad``:
every parameter that requires one and has no optimizer applied in backward, so the embedding
tables that FBGEMM updates inside backward are not among them (the data-parallel tables of the
CPU policy are). :func:`weigh_losses` is one leaf of TorchRec's fx tracing (``build.py`` wraps
it): a weighting may take gradients, which cannot be traced.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from tzrun.config.schema import RunConfig
from tzrun.kernel.registry import Registries

__all__ = ["LossWeighting", "weigh_losses", "build_loss_weighting", "gradient_parameters"]


def gradient_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``model`` that backward gives a ``.grad`` (see the module docstring)."""
    return [p for p in model.parameters() if p.requires_grad and not hasattr(p, "_in_backward_optimizers")]


class LossWeighting(nn.Module):
    """The run's loss weighting plugin (``None``: the sum), and the parameters it is given,
    found at the first training step (after sharding) and kept: they are the objects the dense
    optimizers step, which never change during a run.

    Args:
        plugin: what the loss weighting's ``build`` returned, or None for the sum.
    """

    def __init__(self, plugin: nn.Module | None = None) -> None:
        super().__init__()
        self.plugin = plugin
        self._params: list[nn.Parameter] | None = None

    def forward(self, model: nn.Module, losses: Mapping[str, torch.Tensor],
                training: bool) -> tuple[torch.Tensor, Mapping[str, torch.Tensor]]:
        if self.plugin is None or not training:
            total = None
            for value in losses.values():
                total = value if total is None else total + value
            assert total is not None, "a run has at least one loss"
            return total, {}
        if self._params is None:
            self._params = gradient_parameters(model)
        return self.plugin(losses, self._params)


def weigh_losses(weighting: LossWeighting, model: nn.Module, losses: Mapping[str, torch.Tensor],
                 training: bool) -> tuple[torch.Tensor, Mapping[str, torch.Tensor]]:
    """``(total loss, weights by loss name)`` of one step (weights empty unless the weighting
    has some to show; evaluation always sums)."""
    return weighting(model, losses, training)


def build_loss_weighting(cfg: RunConfig, registries: Registries, names: Sequence[str]) -> LossWeighting:
    """The run's :class:`LossWeighting` over the losses ``names`` (config order)."""
    component: Any = cfg.train.loss_weighting
    entry = registries["loss_weighting"].get(component.type, "train.loss_weighting.type")
    return LossWeighting(entry.build(component.config, tuple(names)))
