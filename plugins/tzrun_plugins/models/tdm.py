"""TDM, tree-based deep model (Zhu et al., KDD 2018), as TorchEasyRec's ``tdm``: the ranking
network that scores a (user, tree node) pair.

The behaviour sequence (the ``[[features.sequence]]`` group ``history``, its features'
embeddings concatenated per position: ``s_t``) is read against its ``query`` (the tree node's
features, the same width: ``q``) by a multi-window attention (TorchEasyRec's
``MultiWindowDINEncoder``):

* each position's weight ``a_t = prelu(linear(mlp([s_t, q * s_t, q])))`` (one PReLU parameter;
  ``attention_hidden_units`` with ``attention_activation``), zero at padding; this is the
  ``multi_window_din`` sequence encoder's module;
* the positions, most recent first, are cut into consecutive windows of ``windows_len`` ids;
  window ``w`` gives ``sum_{t in w} a_t s_t / max(1, ids of the row in w)``; ids past the last
  window are not read;
* the encoding is ``[window_1, ..., window_W, q]``: ``(W + 1) * D`` wide.

It is concatenated with the dense and pooled id features of ``features`` (default: every one
that is not a query feature of ``history``), and goes through ``final_hidden_units``
(``Linear -> ReLU``; with ``final_batch_norm``, ``Linear`` without bias ``-> BatchNorm1d ->
ReLU``) and a linear layer to one logit: the outputs are ``logits`` and ``probs``, as the other
ranking models. The tree, its layer-wise negatives and retrieval by beam search are outside
the model (``tzrec-run tdm-tree``, docs/models.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, out_width, positive_units, unknown_feature_problems

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["TDMConfig", "build_tdm"]

#: TorchEasyRec's example's windows (tdm_taobao.config)
DEFAULT_WINDOWS = (1, 1, 1, 2, 2, 2, 5, 6, 10, 20)


@attrs.frozen
class TDMConfig:
    """Options of the ``tdm`` model.

    Attributes:
        history: the ``[[features.sequence]]`` group of the user's behaviour, whose ``query``
            is the tree node's features; unset: the one sequence group.
        features: dense and id features the final MLP reads beside the encoded sequence;
            empty: every one that is not a query feature of ``history``.
        windows_len: ids per window, most recent first (``multiwindow_din.windows_len``).
        attention_hidden_units: layer widths of the attention MLP over ``[s, q * s, q]``
            (``multiwindow_din.attn_mlp.hidden_units``).
        attention_activation: the attention MLP's activation, ``relu``, ``prelu`` (one
            parameter per layer, as ``nn.PReLU()``) or ``dice`` (Dice, its statistics over the
            real ids).
        final_hidden_units: layer widths of the final MLP (``final.hidden_units``); a linear
            layer to one logit follows.
        final_batch_norm: batch normalisation after each linear layer of the final MLP
            (``final.use_bn``; the linear layers then have no bias).
    """

    history: Optional[str] = None
    features: tuple[str, ...] = ()
    windows_len: tuple[int, ...] = attrs.field(default=DEFAULT_WINDOWS, validator=positive_units)
    attention_hidden_units: tuple[int, ...] = attrs.field(default=(36,), validator=positive_units)
    attention_activation: Literal["relu", "prelu", "dice"] = "relu"
    final_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64, 32), validator=positive_units)
    final_batch_norm: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @windows_len.validator
    def _some_window(self, attribute: Any, value: tuple[int, ...]) -> None:
        if not value:
            raise ValueError("needs at least one window", attribute)

    @attention_hidden_units.validator
    def _some_layer(self, attribute: Any, value: tuple[int, ...]) -> None:
        if not value:
            raise ValueError("the attention MLP needs at least one layer (TorchEasyRec reads its last width)", attribute)


def _history(cfg: TDMConfig, ctx: ModelContext) -> tuple[Optional[str], list[ConfigProblem]]:
    """The history group's name (None when there is none to read) and what is wrong with it."""
    from tzrun.errors import did_you_mean

    groups = [g.name for g in ctx.sequence_groups]
    if not groups:
        return None, [ConfigProblem("features.sequence", "tdm needs the user's behaviour as a [[features.sequence]] "
                                                         "group whose query is the tree node's features; add one")]
    if cfg.history is None:
        if len(groups) > 1:
            return None, [ConfigProblem("model.history", f"several [[features.sequence]] groups ({', '.join(groups)}); "
                                                         "name the behaviour sequence in model.history")]
        name = groups[0]
    elif cfg.history not in groups:
        guess = did_you_mean(cfg.history, groups)
        hint = f"; did you mean '{guess}'?" if guess else ""
        return None, [ConfigProblem("model.history", f"no [[features.sequence]] group named '{cfg.history}' "
                                                     f"(groups: {', '.join(groups)}){hint}")]
    else:
        name = cfg.history
    problems = []
    for j, group in enumerate(ctx.sequence_groups):
        if group.name != name:
            problems.append(ConfigProblem(f"features.sequence[{j}]", f"'{group.name}' is not model.history ('{name}'): "
                                                                      "tdm reads one sequence group; remove it"))
        elif not group.query:
            problems.append(ConfigProblem(f"features.sequence[{j}].query", f"tdm's attention over '{name}' needs the "
                                                                            "tree node: name its features in query"))
    return name, problems


def _mlp_features(cfg: TDMConfig, ctx: ModelContext, history: Optional[str]) -> tuple[list[str], list[ConfigProblem]]:
    """The features of the final MLP beside the sequence, and what is wrong with ``features``."""
    if cfg.features:
        return list(cfg.features), unknown_feature_problems("model.features", cfg.features, ctx)
    query = next((set(g.query) for g in ctx.sequence_groups if g.name == history), set())
    every = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]
    return [n for n in every if n not in query], []


def build_tdm(cfg: TDMConfig, ctx: ModelContext) -> Any:
    """Build TDM's ranking network for ``ctx``'s features and its behaviour sequence.

    Raises:
        ConfigError: when there is no sequence group, ``history`` names none (or is unset with
            several), the group has no ``query``, another group is configured, or ``features``
            names an unknown feature (or one twice).
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_config import group_width
    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection, sequence_embeddings
    from tzrun_plugins.models._sequence_layers import MultiWindowDIN

    history, problems = _history(cfg, ctx)
    features, more = _mlp_features(cfg, ctx, history)
    if problems or more:
        raise ConfigError("model", problems + more)
    group = next(g for g in ctx.sequence_groups if g.name == history)

    class TDM(nn.Module):
        """Multi-window attention over the history, the final MLP over it and ``features``."""

        def __init__(self) -> None:
            super().__init__()
            self.history = group.name
            self.ebc = bag_collection(ctx)
            sequences = sequence_embeddings(ctx)
            assert sequences is not None  # the history group's tables
            self.sequences = sequences
            self.inputs = FeatureInputs(ctx, features)
            width = group_width(ctx, group.name)
            self.attention = MultiWindowDIN(width, cfg.windows_len, cfg.attention_hidden_units,
                                            cfg.attention_activation, recent_first=group.recent_first)
            in_width = self.attention.out_features + self.inputs.width
            self.final = mlp(in_width, cfg.final_hidden_units, batch_norm=cfg.final_batch_norm)
            self.output = nn.Linear(out_width(in_width, cfg.final_hidden_units), 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            sequences = self.sequences(batch)
            sequence, mask = sequences.sequence(self.history)
            encoded = self.attention(sequence, mask, sequences.query(self.history))
            x = torch.cat([encoded, self.inputs(batch.dense, bags, sequences)], dim=1) if self.inputs.width else encoded
            logits = self.output(self.final(x)).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return TDM()
