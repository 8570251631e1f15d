"""MIND, multi-interest network with dynamic routing (Li et al., 2019), in TorchEasyRec's shape.

The user tower turns a user into ``K`` interest vectors:

* the user features (``user_features``: dense and id) through ``user_hidden_units`` (``ReLU``
  layers, the last one linear): ``u``;
* the behaviour sequence (the ``[[features.sequence]]`` group ``history``, its features'
  embeddings concatenated per position) through ``history_hidden_units`` (the same shape,
  without biases), then the B2I capsule layer of
  :class:`tzrun_plugins.models._capsule.CapsuleLayer`: ``max_k`` interest capsules by dynamic
  routing, of which a row keeps ``clamp(log2(its length), 1, max_k)`` (rounded up), or all with
  ``const_caps_num``;
* each kept capsule concatenated to ``u``, through ``concat_hidden_units`` (``ReLU`` on every
  layer) and a linear layer without bias to ``output_dim``, L2-normalised with ``cosine``:
  ``user_interests`` ``[B, max_k, output_dim]``, zeros where a row has fewer interests.

The item tower is DSSM's: an MLP over ``item_features`` and a linear layer to ``output_dim``
(normalised with ``cosine``). In training and evaluation, label-aware attention reads the
interests with the row's own item: ``user_embedding = sum_k softmax_k(simi_pow * <interest_k,
item>) interest_k``, not normalised again (as TorchEasyRec). The similarities are DSSM's with
that embedding: ``similarity`` ``[B, B]`` and ``sampled_similarity`` ``[B, 1 + N]`` with
``[data.sampler]`` (the sampled items follow the batch's ``B`` rows, see docs/retrieval.md),
both divided by ``temperature``.

``tzrec-run export`` writes the user tower (``user_interests``) and the item tower
(``item_embedding``) as two programs: serving retrieves with each interest vector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, non_empty, out_width, positive_units, unknown_feature_problems

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["MINDConfig", "build_mind", "mind_outputs"]


@attrs.frozen
class MINDConfig:
    """Options of the ``mind`` model.

    Attributes:
        user_features: names of the dense and id features of the user MLP.
        history: the ``[[features.sequence]]`` group of the user's behaviour (the capsules' input).
        item_features: names of the dense and id features of the item tower (at least one id).
        user_hidden_units: layer widths of the user MLP (``ReLU`` layers, the last linear).
        history_hidden_units: layer widths applied to each position of the sequence before the
            capsules (no biases; ``ReLU`` layers, the last linear); ``[]``: none.
        max_k: the most interests a user has.
        high_dim: the width of an interest capsule.
        num_iters: dynamic routing rounds.
        routing_logits_scale: the routing logits are multiplied by it before each softmax.
        routing_logits_stddev: the standard deviation of the routing logits' random start.
        routing_init: ``"normal"`` (a random start) or ``"zeros"``.
        squash_pow: the power of the squash ``(|s|² / (1 + |s|²))^squash_pow s / |s|``.
        const_caps_num: every user has ``max_k`` interests (else ``log2`` of its sequence length).
        concat_hidden_units: layer widths of the MLP over ``[user MLP, capsule]`` (``ReLU`` on each).
        concat_bias: whether that MLP's layers have biases.
        item_hidden_units: layer widths of the item tower's MLP.
        output_dim: the width of an interest and of an item embedding.
        simi_pow: the label-aware attention's sharpness (its scores are multiplied by it).
        similarity: ``"cosine"`` (L2-normalised interests and items) or ``"inner_product"``.
        temperature: the similarities are divided by it.
        gather_negatives: with ``[data.sampler]`` on several ranks, score every row against the
            sampled items of every rank (as ``dssm``).
    """

    user_features: tuple[str, ...] = attrs.field(validator=non_empty)
    history: str
    item_features: tuple[str, ...] = attrs.field(validator=non_empty)
    user_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=[non_empty, positive_units])
    history_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=positive_units)
    max_k: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    high_dim: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    num_iters: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    routing_logits_scale: float = attrs.field(default=20.0, validator=attrs.validators.gt(0.0))
    routing_logits_stddev: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    routing_init: Literal["normal", "zeros"] = "normal"
    squash_pow: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
    const_caps_num: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    concat_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=[non_empty, positive_units])
    concat_bias: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    item_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=positive_units)
    output_dim: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    simi_pow: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))
    similarity: Literal["cosine", "inner_product"] = "cosine"
    temperature: float = attrs.field(default=0.1, validator=attrs.validators.gt(0.0))
    gather_negatives: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


def mind_outputs(cfg: object) -> tuple[str, ...]:
    """The outputs of ``mind``: DSSM's and the user's interests."""
    return ("similarity", "sampled_similarity", "user_embedding", "item_embedding", "user_interests")


def _history_problems(cfg: MINDConfig, ctx: ModelContext) -> list[ConfigProblem]:
    from tzrun.errors import did_you_mean

    groups = [g.name for g in ctx.sequence_groups]
    if not groups:
        return [ConfigProblem("features.sequence", "mind needs the user's behaviour as a [[features.sequence]] group; "
                                                   "add one and name it in model.history")]
    problems = []
    if cfg.history not in groups:
        guess = did_you_mean(cfg.history, groups)
        hint = f"; did you mean '{guess}'?" if guess else ""
        problems.append(ConfigProblem("model.history", f"no [[features.sequence]] group named '{cfg.history}' "
                                                       f"(groups: {', '.join(groups)}){hint}"))
    for j, name in enumerate(groups):
        if name != cfg.history and cfg.history in groups:
            problems.append(ConfigProblem(f"features.sequence[{j}]", f"'{name}' is not model.history ('{cfg.history}'): "
                                                                      "mind reads one sequence group; remove it"))
    return problems


def _problems(cfg: MINDConfig, ctx: ModelContext) -> list[ConfigProblem]:
    problems = unknown_feature_problems("model.user_features", cfg.user_features, ctx)
    problems += unknown_feature_problems("model.item_features", cfg.item_features, ctx)
    both = sorted(set(cfg.user_features) & set(cfg.item_features))
    if both:
        problems.append(ConfigProblem("model.item_features", f"{', '.join(both)} also in model.user_features; a feature belongs to one tower"))
    assigned = set(cfg.user_features) | set(cfg.item_features)
    names = {"dense": [f.name for f in ctx.dense_features], "sparse": [f.name for f in ctx.sparse_features]}
    for kind, features in names.items():
        for i, name in enumerate(features):
            if name not in assigned:
                problems.append(ConfigProblem(f"features.{kind}[{i}]", f"'{name}' is in neither tower: add it to "
                                                                       "model.user_features or model.item_features, or remove it"))
    sparse = {f.name for f in ctx.sparse_features}
    if not any(name in sparse for name in cfg.item_features):
        problems.append(ConfigProblem("model.item_features", "the item tower needs at least one id feature"))
    return problems + _history_problems(cfg, ctx)


def build_mind(cfg: MINDConfig, ctx: ModelContext) -> Any:
    """Build MIND for ``ctx``'s features.

    Raises:
        ConfigError: when a tower names an unknown feature, a feature is in both towers or in
            neither, the item tower has no id feature, or ``history`` names no sequence group
            (or another group is configured).
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    from tzrun_plugins.models import _gather
    from tzrun_plugins.models._capsule import CapsuleLayer, interest_mask, label_aware_attention
    from tzrun_plugins.models._sequence_config import group_width
    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection, sequence_embeddings

    problems = _problems(cfg, ctx)
    if problems:
        raise ConfigError("model", problems)
    history = next(g for g in ctx.sequence_groups if g.name == cfg.history)
    cosine = cfg.similarity == "cosine"

    def last_linear(width: int, units: tuple[int, ...], bias: bool) -> nn.Module:
        """``ReLU`` layers for all but the last width, a linear layer to the last (TorchEasyRec's
        ``user_mlp`` and ``hist_seq_mlp``); an identity for no widths."""
        if not units:
            return nn.Identity()
        hidden = mlp(width, units[:-1], bias=bias)
        return nn.Sequential(hidden, nn.Linear(out_width(width, units[:-1]), units[-1], bias=bias))

    class MIND(nn.Module):
        """User tower with capsules, item tower, label-aware attention, similarities."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            sequences = sequence_embeddings(ctx)
            assert sequences is not None  # the history group's tables (checked above)
            self.sequences = sequences
            self.user_inputs = FeatureInputs(ctx, cfg.user_features)
            self.user_mlp = last_linear(self.user_inputs.width, cfg.user_hidden_units, True)
            width = group_width(ctx, cfg.history)
            self.history_mlp = last_linear(width, cfg.history_hidden_units, False)
            self.capsules = CapsuleLayer(
                out_width(width, cfg.history_hidden_units), cfg.high_dim, cfg.max_k, history.max_len,
                num_iters=cfg.num_iters, scale=cfg.routing_logits_scale, stddev=cfg.routing_logits_stddev,
                squash_pow=cfg.squash_pow, const_caps_num=cfg.const_caps_num, random_init=cfg.routing_init == "normal")
            self.concat_mlp = mlp(cfg.user_hidden_units[-1] + cfg.high_dim, cfg.concat_hidden_units, bias=cfg.concat_bias)
            self.user_output = nn.Linear(cfg.concat_hidden_units[-1], cfg.output_dim, bias=False)
            self.item_inputs = FeatureInputs(ctx, cfg.item_features)
            self.item_mlp = mlp(self.item_inputs.width, cfg.item_hidden_units)
            self.item_output = nn.Linear(out_width(self.item_inputs.width, cfg.item_hidden_units), cfg.output_dim)
            # what `tzrec-run export` writes: each tower alone (items embedded offline, users online)
            self.serving_programs = {
                "user_tower": {"outputs": ["user_interests"], "features": [*cfg.user_features, cfg.history]},
                "item_tower": {"outputs": ["item_embedding"], "features": list(cfg.item_features)},
            }

        def interests(self, dense: torch.Tensor, bags: Any, sequences: Any, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            """``[B, max_k, output_dim]`` interests of the batch's own rows, and their ``[B, max_k]`` mask."""
            user = self.user_mlp(self.user_inputs(dense, bags, sequences)[:rows])
            sequence, mask = sequences.sequence(cfg.history)
            low = self.history_mlp(sequence)
            capsules = self.capsules(low, mask, self.capsules.initial_logits(low))
            kept = interest_mask(mask.sum(dim=1), cfg.max_k, cfg.const_caps_num)
            weights = kept.to(capsules.dtype).unsqueeze(-1)
            x = torch.cat([user.unsqueeze(1).expand(-1, cfg.max_k, -1), capsules], dim=-1) * weights
            y = self.user_output(self.concat_mlp(x) * weights)
            return (F.normalize(y, p=2.0, dim=-1) if cosine else y), kept

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            sequences = self.sequences(batch)
            rows = batch.weights.shape[0]  # the batch's own rows; sampled items follow them
            interests, kept = self.interests(batch.dense, bags, sequences, rows)
            items = self.item_output(self.item_mlp(self.item_inputs(batch.dense, bags, sequences)))
            items = F.normalize(items, p=2.0, dim=-1) if cosine else items
            item, sampled = items[:rows], items[rows:]
            if cfg.gather_negatives:
                sampled = _gather.gather_rows(sampled)
            user = label_aware_attention(interests, item, kept, cfg.simi_pow)
            own = (user * item).sum(dim=1, keepdim=True)
            return {
                "similarity": user @ item.t() / cfg.temperature,
                "sampled_similarity": torch.cat([own, user @ sampled.t()], dim=1) / cfg.temperature,
                "user_embedding": user,
                "item_embedding": item,
                "user_interests": interests,
            }

    return MIND()
