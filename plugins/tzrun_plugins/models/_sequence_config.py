"""The ``[[model.sequence_encoders]]`` tables of ``dssm`` and ``mmoe``, and their checks.

Light to import (no torch): the model configs that hooks.py registers use it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigProblem
from tzrun_plugins.models._layers import each_once, positive_units

__all__ = ["SequenceEncoderConfig", "unique_sequences", "group_width", "encoder_problems", "encoders_by_group", "build_encoder"]

_ONLY = {
    "attention_hidden_units": "target_attention",
    "softmax": "target_attention",
    "num_heads": "self_attention",
    "num_layers": "self_attention",
    "feedforward_dim": "self_attention",
    "dropout": "self_attention",
}


def _positive(instance: Any, attribute: Any, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise ValueError(f"must be >= 1, got {value}", attribute)


def _dropout(instance: Any, attribute: Any, value: Optional[float]) -> None:
    if value is not None and not 0.0 <= value < 1.0:
        raise ValueError(f"must be in [0, 1), got {value}", attribute)


def _units(instance: Any, attribute: Any, value: Optional[tuple[int, ...]]) -> None:
    if value is not None:
        positive_units(instance, attribute, value)


@attrs.frozen
class SequenceEncoderConfig:
    """One ``[[model.sequence_encoders]]`` table: how a model encodes one sequence group into a
    vector. A group without a table is encoded with ``mean``.

    Attributes:
        sequence: the name of a ``[[features.sequence]]`` group.
        type: ``"mean"`` (the mean of the real ids' embeddings), ``"target_attention"`` (DIN's
            attention with the group's ``query`` features as the candidate) or
            ``"self_attention"`` (a BST-style transformer encoder with learned positions,
            mean of its outputs).
        attention_hidden_units: ``target_attention``: layer widths of the attention MLP
            (default ``[64, 32]``).
        softmax: ``target_attention``: normalise the weights with a masked softmax
            (default true, as TorchEasyRec; false: the DIN paper's raw weights).
        num_heads: ``self_attention``: attention heads (default 2; must divide the group's width).
        num_layers: ``self_attention``: encoder layers (default 1).
        feedforward_dim: ``self_attention``: width of each layer's feed-forward block (default 64).
        dropout: ``self_attention``: dropout in each layer (default 0.0).
    """

    sequence: str
    type: Literal["mean", "target_attention", "self_attention"] = "mean"
    attention_hidden_units: Optional[tuple[int, ...]] = attrs.field(default=None, validator=_units)
    softmax: Optional[bool] = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool)))
    num_heads: Optional[int] = attrs.field(default=None, validator=_positive)
    num_layers: Optional[int] = attrs.field(default=None, validator=_positive)
    feedforward_dim: Optional[int] = attrs.field(default=None, validator=_positive)
    dropout: Optional[float] = attrs.field(default=None, validator=_dropout)


#: attrs validator of a model's ``sequence_encoders``: one table per group.
unique_sequences = each_once("sequence", "one encoder per sequence group")


def encoder_problems(encoders: Sequence[SequenceEncoderConfig], ctx: ModelContext, *, model: str,
                     path: str = "model.sequence_encoders", query_free: bool = False) -> list[ConfigProblem]:
    """Problems of ``encoders`` against ``ctx``'s sequence groups: an unknown group, an option
    of another type, a ``target_attention`` on a group without ``query`` (or at all, with
    ``query_free``: a tower that never sees the candidate), heads that do not divide the width."""
    from tzrun.errors import did_you_mean

    groups = {g.name: g for g in ctx.sequence_groups}
    problems = []
    for i, enc in enumerate(encoders):
        at = f"{path}[{i}]"
        for option, kind in _ONLY.items():
            if getattr(enc, option) is not None and enc.type != kind:
                problems.append(ConfigProblem(f"{at}.{option}", f"only for type = \"{kind}\" (this encoder is \"{enc.type}\"); remove it"))
        group = groups.get(enc.sequence)
        if group is None:
            guess = did_you_mean(enc.sequence, list(groups))
            hint = f"; did you mean '{guess}'?" if guess else ""
            known = ", ".join(groups) or "none"
            problems.append(ConfigProblem(f"{at}.sequence", f"no [[features.sequence]] group named '{enc.sequence}' (groups: {known}){hint}"))
            continue
        if enc.type == "target_attention" and query_free:
            problems.append(ConfigProblem(
                f"{at}.type", f"{model} cannot use target_attention: its towers never see the candidate item together "
                              "with the user's sequence; use \"mean\" or \"self_attention\""))
        elif enc.type == "target_attention" and not group.query:
            problems.append(ConfigProblem(
                f"{at}.type", f"target_attention needs the candidate: set query on the [[features.sequence]] group '{group.name}'"))
        if enc.type == "self_attention":
            heads = enc.num_heads or 2
            width = group_width(ctx, group.name)
            if width % heads:
                problems.append(ConfigProblem(f"{at}.num_heads", f"{heads} heads do not divide the group's width {width}; pick a divisor"))
    return problems


def encoders_by_group(encoders: Sequence[SequenceEncoderConfig], ctx: ModelContext) -> dict[str, SequenceEncoderConfig]:
    """An encoder config for every sequence group of ``ctx`` (``mean`` where none is set), in
    the groups' config order."""
    given = {e.sequence: e for e in encoders}
    return {g.name: given.get(g.name, SequenceEncoderConfig(sequence=g.name)) for g in ctx.sequence_groups}


def group_width(ctx: ModelContext, name: str) -> int:
    """The width ``D`` of group ``name``'s padded sequence: its features' embedding widths summed."""
    dims = {name: c.embedding_dim for c in ctx.embedding_configs() for name in c.feature_names}
    group = next(g for g in ctx.sequence_groups if g.name == name)
    return sum(dims[f.name] for f in group.features)


def build_encoder(cfg: SequenceEncoderConfig, dim: int, max_len: int, recent_first: bool = False) -> Any:
    """The ``nn.Module`` of ``cfg`` for a group of width ``dim`` and ``max_len`` ids, whose rows'
    most recent id is the first with ``recent_first`` (``keep = "first"``), else the last."""
    from tzrun_plugins.models import _sequence_layers as layers

    if cfg.type == "target_attention":
        units = cfg.attention_hidden_units if cfg.attention_hidden_units is not None else (64, 32)
        return layers.TargetAttention(dim, units, softmax=cfg.softmax if cfg.softmax is not None else True)
    if cfg.type == "self_attention":
        return layers.SelfAttentionEncoder(
            dim, max_len, num_heads=cfg.num_heads or 2, num_layers=cfg.num_layers or 1,
            feedforward_dim=cfg.feedforward_dim or 64, dropout=cfg.dropout or 0.0, recent_first=recent_first,
        )
    return layers.MeanEncoder()
