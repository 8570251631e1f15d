"""MultiTower (TorchEasyRec's ``multi_tower``): an MLP tower per group of features, their
outputs concatenated, a final MLP and a linear layer to one logit.

Each ``[[model.towers]]`` names its dense and id features (pooled: each id feature's embeddings
summed, as TorchEasyRec's ``DEEP`` groups do, then concatenated in the tower's order). The
outputs are ``logits`` and ``probs``, as the other ranking models. It reads no behaviour
sequence: a model with target attention over one is ``din`` (TorchEasyRec's ``multi_tower_din``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, out_width, positive_units, unknown_feature_problems

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["TowerConfig", "MultiTowerConfig", "build_multi_tower"]


@attrs.frozen
class TowerConfig:
    """One ``[[model.towers]]`` table of ``multi_tower``.

    Attributes:
        features: names of dense and id (``[[features.sparse]]``) features; empty: all of them.
        hidden_units: layer widths of the tower's MLP.
    """

    features: tuple[str, ...] = ()
    hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64), validator=positive_units)


@attrs.frozen
class MultiTowerConfig:
    """Options of the ``multi_tower`` model.

    Attributes:
        towers: the MLP towers (default: one over every feature).
        final_hidden_units: layer widths of the MLP over the concatenated towers' outputs
            (a linear layer to one logit follows).
    """

    towers: tuple[TowerConfig, ...] = attrs.field(default=(TowerConfig(),),
                                                  validator=attrs.validators.min_len(1))
    final_hidden_units: tuple[int, ...] = attrs.field(default=(64,), validator=positive_units)


def build_multi_tower(cfg: MultiTowerConfig, ctx: ModelContext) -> Any:
    """Build MultiTower for ``ctx``'s features.

    Raises:
        ConfigError: when a tower names an unknown feature, or the config has sequence groups
            (which ``multi_tower`` does not read: use ``din``).
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection

    problems = []
    for i, tower in enumerate(cfg.towers):
        problems += unknown_feature_problems(f"model.towers[{i}].features", tower.features, ctx)
    if ctx.sequence_groups:
        problems.append(ConfigProblem("features.sequence", "multi_tower reads no [[features.sequence]] group; "
                                                           "use the din model for attention over a sequence"))
    if problems:
        raise ConfigError("model", problems)
    every = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]

    class MultiTower(nn.Module):
        """MLP towers over pooled features, a final MLP, one logit."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            inputs = [FeatureInputs(ctx, t.features or every) for t in cfg.towers]
            self.inputs = nn.ModuleList(inputs)
            self.towers = nn.ModuleList(mlp(i.width, t.hidden_units) for i, t in zip(inputs, cfg.towers))
            width = sum(out_width(i.width, t.hidden_units) for i, t in zip(inputs, cfg.towers))
            self.final = mlp(width, cfg.final_hidden_units)
            self.output = nn.Linear(out_width(width, cfg.final_hidden_units), 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            parts = [tower(inputs(batch.dense, bags, None)) for inputs, tower in zip(self.inputs, self.towers)]
            logits = self.output(self.final(torch.cat(parts, dim=1))).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return MultiTower()
