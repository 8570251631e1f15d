"""The ``[[model.sequence_encoders]]`` tables of ``dssm`` and ``mmoe``, and their checks.

Light to import (no torch): the model configs that hooks.py registers use it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigProblem
from tzrun_plugins.models._layers import each_once, positive_units

__all__ = ["SequenceEncoderConfig", "QUERY_TYPES", "unique_sequences", "group_width", "encoder_width", "encoder_problems",
           "encoders_by_group", "build_encoder"]

#: the encoder types that attend with the candidate (the group's ``query``)
QUERY_TYPES = ("target_attention", "multi_window_din", "simple_attention")

#: each option -> the types that read it
_ONLY = {
    "attention_hidden_units": ("target_attention", "multi_window_din"),
    "attention_activation": ("target_attention", "multi_window_din"),
    "softmax": ("target_attention",),
    "window_lengths": ("multi_window_din",),
    "num_heads": ("self_attention", "self_attention_tzrec"),
    "num_layers": ("self_attention",),
    "feedforward_dim": ("self_attention",),
    "dropout": ("self_attention", "self_attention_tzrec"),
    "attention_dim": ("self_attention_tzrec",),
}
#: num_heads's default per type
_HEADS = {"self_attention": 2, "self_attention_tzrec": 8}


def _positive(instance: Any, attribute: Any, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise ValueError(f"must be >= 1, got {value}", attribute)


def _dropout(instance: Any, attribute: Any, value: Optional[float]) -> None:
    if value is not None and not 0.0 <= value < 1.0:
        raise ValueError(f"must be in [0, 1), got {value}", attribute)


def _units(instance: Any, attribute: Any, value: Optional[tuple[int, ...]]) -> None:
    if value is not None:
        positive_units(instance, attribute, value)


def _windows(instance: Any, attribute: Any, value: Optional[tuple[int, ...]]) -> None:
    if value is not None and (not value or any(n < 1 for n in value)):
        raise ValueError(f"needs at least one window, each at least 1 id long, got {list(value)}", attribute)


@attrs.frozen
class SequenceEncoderConfig:
    """One ``[[model.sequence_encoders]]`` table: how a model encodes one sequence group into a
    vector. A group without a table is encoded with ``mean``.

    Attributes:
        sequence: the name of a ``[[features.sequence]]`` group.
        type: ``"mean"`` (the mean of the real ids' embeddings), ``"target_attention"`` (DIN's
            attention with the group's ``query`` features as the candidate),
            ``"multi_window_din"`` (TorchEasyRec's multi-window DIN: weights pooled per time
            window, the windows and the query concatenated), ``"simple_attention"``
            (dot-product attention with the query), ``"self_attention"`` (a BST-style
            transformer encoder with learned positions, mean of its outputs) or
            ``"self_attention_tzrec"`` (TorchEasyRec's self-attention encoder: Q/K/V
            projections, one multi-head attention, mean of its outputs; no positions).
        attention_hidden_units: ``target_attention``, ``multi_window_din``: layer widths of the
            attention MLP (default ``[64, 32]``).
        attention_activation: ``target_attention``, ``multi_window_din``: the attention MLP's
            activation, ``"relu"`` (default), ``"prelu"`` or ``"dice"``.
        softmax: ``target_attention``: normalise the weights with a masked softmax
            (default true, as TorchEasyRec; false: the DIN paper's raw weights).
        window_lengths: ``multi_window_din``: the windows' lengths in ids, most recent first
            (required).
        num_heads: ``self_attention``, ``self_attention_tzrec``: attention heads (default 2,
            must divide the group's width; ``self_attention_tzrec``: 8, must divide
            ``attention_dim``).
        num_layers: ``self_attention``: encoder layers (default 1).
        feedforward_dim: ``self_attention``: width of each layer's feed-forward block (default 64).
        dropout: ``self_attention``: dropout in each layer; ``self_attention_tzrec``: of the
            attention weights (default 0.0).
        attention_dim: ``self_attention_tzrec``: the width of the projections and of the
            output (default 512, as TorchEasyRec's ``multihead_attn_dim``).
    """

    sequence: str
    type: Literal["mean", "target_attention", "multi_window_din", "simple_attention", "self_attention",
                  "self_attention_tzrec"] = "mean"
    attention_hidden_units: Optional[tuple[int, ...]] = attrs.field(default=None, validator=_units)
    attention_activation: Optional[Literal["relu", "prelu", "dice"]] = None
    softmax: Optional[bool] = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool)))
    window_lengths: Optional[tuple[int, ...]] = attrs.field(default=None, validator=_windows)
    num_heads: Optional[int] = attrs.field(default=None, validator=_positive)
    num_layers: Optional[int] = attrs.field(default=None, validator=_positive)
    feedforward_dim: Optional[int] = attrs.field(default=None, validator=_positive)
    dropout: Optional[float] = attrs.field(default=None, validator=_dropout)
    attention_dim: Optional[int] = attrs.field(default=None, validator=_positive)


#: attrs validator of a model's ``sequence_encoders``: one table per group.
unique_sequences = each_once("sequence", "one encoder per sequence group")


def encoder_problems(encoders: Sequence[SequenceEncoderConfig], ctx: ModelContext, *, model: str,
                     path: str = "model.sequence_encoders", query_free: bool = False) -> list[ConfigProblem]:
    """Problems of ``encoders`` against ``ctx``'s sequence groups: an unknown group, an option
    of another type, a missing option, an encoder that attends with the candidate on a group
    without ``query`` (or at all, with ``query_free``: a tower that never sees the candidate),
    heads that do not divide the width."""
    from tzrun.errors import did_you_mean

    groups = {g.name: g for g in ctx.sequence_groups}
    problems = []
    for i, enc in enumerate(encoders):
        at = f"{path}[{i}]"
        for option, kinds in _ONLY.items():
            if getattr(enc, option) is not None and enc.type not in kinds:
                allowed = " or ".join(f"type = \"{k}\"" for k in kinds)
                problems.append(ConfigProblem(f"{at}.{option}", f"only for {allowed} (this encoder is \"{enc.type}\"); remove it"))
        if enc.type == "multi_window_din" and enc.window_lengths is None:
            problems.append(ConfigProblem(f"{at}.window_lengths", "multi_window_din needs the windows' lengths in ids, "
                                                                  "most recent first: set window_lengths (e.g. [1, 3, 10])"))
        group = groups.get(enc.sequence)
        if group is None:
            guess = did_you_mean(enc.sequence, list(groups))
            hint = f"; did you mean '{guess}'?" if guess else ""
            known = ", ".join(groups) or "none"
            problems.append(ConfigProblem(f"{at}.sequence", f"no [[features.sequence]] group named '{enc.sequence}' (groups: {known}){hint}"))
            continue
        if enc.type in QUERY_TYPES and query_free:
            problems.append(ConfigProblem(
                f"{at}.type", f"{model} cannot use {enc.type}: its towers never see the candidate item together "
                              "with the user's sequence; use \"mean\", \"self_attention\" or \"self_attention_tzrec\""))
        elif enc.type in QUERY_TYPES and not group.query:
            problems.append(ConfigProblem(
                f"{at}.type", f"{enc.type} needs the candidate: set query on the [[features.sequence]] group '{group.name}'"))
        problems += _head_problems(enc, group_width(ctx, group.name), at)
    return problems


def _head_problems(enc: SequenceEncoderConfig, width: int, at: str) -> list[ConfigProblem]:
    if enc.type not in _HEADS:
        return []
    heads = enc.num_heads or _HEADS[enc.type]
    if enc.type == "self_attention" and width % heads:
        return [ConfigProblem(f"{at}.num_heads", f"{heads} heads do not divide the group's width {width}; pick a divisor")]
    dim = enc.attention_dim or 512
    if enc.type == "self_attention_tzrec" and dim % heads:
        return [ConfigProblem(f"{at}.num_heads", f"{heads} heads do not divide attention_dim {dim}; pick a divisor")]
    return []


def encoders_by_group(encoders: Sequence[SequenceEncoderConfig], ctx: ModelContext) -> dict[str, SequenceEncoderConfig]:
    """An encoder config for every sequence group of ``ctx`` (``mean`` where none is set), in
    the groups' config order."""
    given = {e.sequence: e for e in encoders}
    return {g.name: given.get(g.name, SequenceEncoderConfig(sequence=g.name)) for g in ctx.sequence_groups}


def group_width(ctx: ModelContext, name: str) -> int:
    """The width ``D`` of group ``name``'s padded sequence: its features' embedding widths summed,
    plus one per dense sequence."""
    dims = {name: c.embedding_dim for c in ctx.embedding_configs() for name in c.feature_names}
    group = next(g for g in ctx.sequence_groups if g.name == name)
    return int(sum(dims[f.name] for f in group.features)) + len(group.dense)


def encoder_width(cfg: SequenceEncoderConfig, dim: int) -> int:
    """The width of what ``cfg``'s encoder gives for a group of width ``dim``."""
    if cfg.type == "multi_window_din":
        return (len(cfg.window_lengths or ()) + 1) * dim
    if cfg.type == "self_attention_tzrec":
        return cfg.attention_dim or 512
    return dim


def build_encoder(cfg: SequenceEncoderConfig, dim: int, max_len: int, recent_first: bool = False) -> Any:
    """The ``nn.Module`` of ``cfg`` for a group of width ``dim`` and ``max_len`` ids, whose rows'
    most recent id is the first with ``recent_first`` (``keep = "first"``), else the last."""
    from tzrun_plugins.models import _sequence_layers as layers

    units = cfg.attention_hidden_units if cfg.attention_hidden_units is not None else (64, 32)
    activation = cfg.attention_activation or "relu"
    if cfg.type == "target_attention":
        return layers.TargetAttention(dim, units, softmax=cfg.softmax if cfg.softmax is not None else True,
                                      activation=activation)
    if cfg.type == "multi_window_din":
        return layers.MultiWindowDIN(dim, cfg.window_lengths or (), units, activation, recent_first=recent_first)
    if cfg.type == "simple_attention":
        return layers.SimpleAttention()
    if cfg.type == "self_attention":
        return layers.SelfAttentionEncoder(
            dim, max_len, num_heads=cfg.num_heads or 2, num_layers=cfg.num_layers or 1,
            feedforward_dim=cfg.feedforward_dim or 64, dropout=cfg.dropout or 0.0, recent_first=recent_first,
        )
    if cfg.type == "self_attention_tzrec":
        return layers.TorchEasyRecSelfAttention(dim, cfg.attention_dim or 512, num_heads=cfg.num_heads or 8,
                                                dropout=cfg.dropout or 0.0)
    return layers.MeanEncoder()
