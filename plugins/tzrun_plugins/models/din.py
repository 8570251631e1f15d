"""DIN, deep interest network (Zhou et al., KDD 2018), in TorchEasyRec's MultiTower-DIN shape.

Towers (``[[model.towers]]``): each an MLP over the dense and id features it names (pooled:
summed id embeddings). Attention towers (``[[model.din_towers]]``): one per sequence group, DIN's
target attention of the group's ``query`` features (the candidate item) over the group's
sequence (:class:`tzrun_plugins.models._sequence_layers.TargetAttention`), giving a ``[B, D]``
vector. All towers' outputs are concatenated, go through ``final_hidden_units`` and a linear
layer to one logit: the outputs are ``logits`` and ``probs``, as the other ranking models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import each_once, mlp, out_width, positive_units, unknown_feature_problems
from tzrun_plugins.models.multi_tower import TowerConfig

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["DINTowerConfig", "DINAttentionConfig", "DINConfig", "build_din"]


#: one ``[[model.towers]]`` table of ``din``: an MLP over pooled features (the same as ``multi_tower``'s)
DINTowerConfig = TowerConfig


@attrs.frozen
class DINAttentionConfig:
    """One ``[[model.din_towers]]`` table of ``din``: target attention over a sequence group.

    Attributes:
        sequence: the name of a ``[[features.sequence]]`` group that sets ``query``.
        attention_hidden_units: layer widths of the attention MLP over ``[q, s, q - s, q * s]``.
        softmax: normalise the attention weights with a softmax over the real ids
            (TorchEasyRec's ``DINEncoder``); false: the DIN paper's raw weights.
        attention_activation: the attention MLP's activation, ``"relu"`` or ``"dice"``
            (TorchEasyRec's ``attn_mlp`` ``activation: "Dice"``).
    """

    sequence: str
    attention_hidden_units: tuple[int, ...] = attrs.field(default=(256, 64), validator=positive_units)
    softmax: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    attention_activation: Literal["relu", "dice"] = "relu"


@attrs.frozen
class DINConfig:
    """Options of the ``din`` model.

    Attributes:
        towers: the MLP towers over pooled features (default: one over every feature).
        din_towers: the attention towers; empty (the default): one per sequence group with the
            default options. When set, each sequence group has exactly one.
        final_hidden_units: layer widths of the MLP over the concatenated towers' outputs
            (a linear layer to one logit follows).
    """

    towers: tuple[DINTowerConfig, ...] = (DINTowerConfig(),)
    din_towers: tuple[DINAttentionConfig, ...] = attrs.field(default=(), validator=each_once("sequence", "one attention tower per sequence group"))
    final_hidden_units: tuple[int, ...] = attrs.field(default=(64,), validator=positive_units)


def _attention_towers(cfg: DINConfig, ctx: ModelContext) -> tuple[tuple[DINAttentionConfig, ...], list[ConfigProblem]]:
    groups = [g.name for g in ctx.sequence_groups]
    towers = cfg.din_towers or tuple(DINAttentionConfig(sequence=name) for name in groups)
    problems = []
    if not groups:
        problems.append(ConfigProblem("features.sequence", "din needs at least one [[features.sequence]] group with a query"))
    for i, tower in enumerate(cfg.din_towers):
        if tower.sequence not in groups:
            problems.append(ConfigProblem(f"model.din_towers[{i}].sequence",
                                          f"no [[features.sequence]] group named '{tower.sequence}' (groups: {', '.join(groups) or 'none'})"))
    named = {t.sequence for t in towers}
    for j, group in enumerate(ctx.sequence_groups):
        if group.name not in named:
            problems.append(ConfigProblem(f"features.sequence[{j}]",
                                          f"'{group.name}' has no [[model.din_towers]] table: add one, or remove the group"))
        elif not group.query:
            problems.append(ConfigProblem(f"features.sequence[{j}].query",
                                          f"din's attention over '{group.name}' needs the candidate: name its features in query"))
    return towers, problems


def build_din(cfg: DINConfig, ctx: ModelContext) -> Any:
    """Build DIN for ``ctx``'s features and sequence groups.

    Raises:
        ConfigError: when there is no sequence group, a group lacks ``query`` or an attention
            tower, an attention tower names an unknown group, or a tower an unknown feature.
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_config import group_width
    from tzrun.sequence import SequenceEmbeddings
    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection
    from tzrun_plugins.models._sequence_layers import TargetAttention

    attention, problems = _attention_towers(cfg, ctx)
    for i, tower in enumerate(cfg.towers):
        problems += unknown_feature_problems(f"model.towers[{i}].features", tower.features, ctx)
    if problems:
        raise ConfigError("model", problems)
    every = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]

    class DIN(nn.Module):
        """MLP towers over pooled features, target-attention towers over sequences, final MLP."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            self.sequences = SequenceEmbeddings(ctx)
            inputs = [FeatureInputs(ctx, t.features or every) for t in cfg.towers]
            self.inputs = nn.ModuleList(inputs)
            self.towers = nn.ModuleList(mlp(i.width, t.hidden_units) for i, t in zip(inputs, cfg.towers))
            self.groups = [t.sequence for t in attention]
            widths = [group_width(ctx, name) for name in self.groups]
            self.attention = nn.ModuleList(
                TargetAttention(w, t.attention_hidden_units, softmax=t.softmax, activation=t.attention_activation)
                for w, t in zip(widths, attention)
            )
            width = sum(out_width(i.width, t.hidden_units) for i, t in zip(inputs, cfg.towers)) + sum(widths)
            self.final = mlp(width, cfg.final_hidden_units)
            self.output = nn.Linear(out_width(width, cfg.final_hidden_units), 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            sequences = self.sequences(batch)
            parts = [tower(inputs(batch.dense, bags, sequences)) for inputs, tower in zip(self.inputs, self.towers)]
            for name, encoder in zip(self.groups, self.attention):
                sequence, mask = sequences.sequence(name)
                parts.append(encoder(sequence, mask, sequences.query(name)))
            logits = self.output(self.final(torch.cat(parts, dim=1))).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return DIN()
