"""DSSM two-tower retrieval (Huang et al., 2013), in TorchEasyRec's shape.

A user tower and an item tower, each an MLP over the features the config assigns to it by name
(dense features and embeddings concatenated) followed by a linear layer to ``output_dim``.
With ``similarity = "cosine"`` both embeddings are L2-normalised. The outputs:

* ``similarity``: the ``[B, B]`` matrix ``user_embedding @ item_embeddingᵀ / temperature``
  (row ``i``: user ``i`` against every item of the batch; its positive is column ``i``), which
  ``in_batch_softmax`` and ``recall_at_k`` / ``hit_rate_at_k`` with ``in_batch = true`` read;
* ``sampled_similarity``: with ``[data.sampler]``, the ``[B, 1 + N]`` matrix of each user
  against its own item (column 0) and the ``N`` items sampled for the batch (TorchEasyRec's
  similarity with a negative sampler), ``/ temperature``, which ``sampled_softmax`` and
  ``recall_at_k`` / ``hit_rate_at_k`` with ``sampled = true`` read. The sampled items are the
  batch's rows after its own ``B = batch.weights.shape[0]`` (see docs/retrieval.md); the
  item tower runs on all ``B + N`` rows, the user tower on the first ``B``; with
  ``gather_negatives``, every rank's sampled items are the negatives (``[B, 1 + world_size * N]``);
* ``user_embedding`` and ``item_embedding`` (``[B, output_dim]``).

One embedding collection serves both towers, so a table may be shared across them (an item id
and a sequence of clicked item ids).

A tower may name ``[[features.sequence]]`` groups among its features: each is encoded into one
vector by its ``[[model.sequence_encoders]]`` table (``mean`` or ``self_attention``; ``mean``
for a group without one) and concatenated to the tower's input. Only the user tower may: the
sampled negative items of ``[data.sampler]`` carry no sequences. ``target_attention`` is refused:
the user tower never sees the candidate item, so there is no query to attend with.

``dssm_v2`` (:mod:`tzrun_plugins.models.dssm_v2`) is this model with a feature allowed in both
towers; :func:`build_two_towers` builds either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, non_empty, out_width, positive_units, unknown_feature_problems
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, encoder_problems, encoders_by_group, unique_sequences

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["DSSMConfig", "build_dssm", "build_two_towers"]


@attrs.frozen
class DSSMConfig:
    """Options of the ``dssm`` model.

    Attributes:
        user_features: names of the features (dense or id) of the user tower.
        item_features: names of the features (dense or id) of the item tower; every feature
            belongs to exactly one tower, and each tower has at least one id feature.
        user_hidden_units: layer widths of the user tower's MLP.
        item_hidden_units: layer widths of the item tower's MLP.
        output_dim: the width of both towers' embeddings.
        similarity: ``"cosine"`` (L2-normalised embeddings) or ``"inner_product"``.
        temperature: the similarity is divided by it (with cosine, 0.05-0.2 lets the softmax
            be sharp enough; a loss's own ``temperature`` divides again).
        gather_negatives: with ``[data.sampler]`` on several ranks, score every row against the
            sampled items of every rank (their embeddings are all-gathered, gradients flow back):
            ``sampled_similarity`` is ``[B, 1 + world_size * N]``. The same on one process.
        sequence_encoders: how each sequence group named in a tower is encoded
            (``[[model.sequence_encoders]]``; ``mean`` for a group without a table).
    """

    user_features: tuple[str, ...] = attrs.field(validator=non_empty)
    item_features: tuple[str, ...] = attrs.field(validator=non_empty)
    user_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=positive_units)
    item_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=positive_units)
    output_dim: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    similarity: Literal["cosine", "inner_product"] = "cosine"
    temperature: float = attrs.field(default=0.1, validator=attrs.validators.gt(0.0))
    gather_negatives: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    sequence_encoders: tuple[SequenceEncoderConfig, ...] = attrs.field(default=(), validator=unique_sequences)


def _tower_problems(cfg: DSSMConfig, ctx: ModelContext, model: str, in_both: bool) -> list[ConfigProblem]:
    problems = unknown_feature_problems("model.user_features", cfg.user_features, ctx, sequences=True)
    problems += unknown_feature_problems("model.item_features", cfg.item_features, ctx, sequences=True)
    both = sorted(set(cfg.user_features) & set(cfg.item_features))
    if both and not in_both:
        problems.append(ConfigProblem("model.item_features", f"{', '.join(both)} also in model.user_features; a feature belongs to one tower"))
    assigned = set(cfg.user_features) | set(cfg.item_features)
    for i, f in enumerate(ctx.dense_features):
        if f.name not in assigned:
            problems.append(ConfigProblem(f"features.dense[{i}]", f"'{f.name}' is in neither tower: add it to model.user_features or model.item_features, or remove it"))
    for i, s in enumerate(ctx.sparse_features):
        if s.name not in assigned:
            problems.append(ConfigProblem(f"features.sparse[{i}]", f"'{s.name}' is in neither tower: add it to model.user_features or model.item_features, or remove it"))
    for j, g in enumerate(ctx.sequence_groups):
        if g.name not in assigned:
            problems.append(ConfigProblem(f"features.sequence[{j}]", f"'{g.name}' is in neither tower: add it to model.user_features or model.item_features, or remove it"))
    groups = {g.name for g in ctx.sequence_groups}
    for i, name in enumerate(cfg.item_features):
        if name in groups:
            problems.append(ConfigProblem(f"model.item_features[{i}]", f"'{name}' is a sequence group: sequences belong to the "
                                                                        "user tower (sampled negative items carry none); move it to model.user_features"))
    problems += encoder_problems(cfg.sequence_encoders, ctx, model=model, query_free=True)
    sparse = {f.name for f in ctx.sparse_features} | {g.name for g in ctx.sequence_groups}
    for tower in ("user", "item"):
        if not any(name in sparse for name in getattr(cfg, f"{tower}_features")):
            problems.append(ConfigProblem(f"model.{tower}_features", f"the {tower} tower needs at least one id feature"))
    return problems


def build_dssm(cfg: DSSMConfig, ctx: ModelContext) -> Any:
    """Build DSSM for ``ctx``'s features.

    Raises:
        ConfigError: when a tower names an unknown feature, a feature is in both towers or in
            neither, or a tower has no id feature.
    """
    return build_two_towers(cfg, ctx, model="dssm", in_both=False)


def build_two_towers(cfg: DSSMConfig, ctx: ModelContext, *, model: str, in_both: bool) -> Any:
    """Build the two towers of ``dssm`` (and ``dssm_v2``) for ``ctx``'s features.

    Args:
        cfg: the model's options.
        ctx: the run's features.
        model: the model's name, for messages.
        in_both: whether a feature may feed both towers (``dssm_v2``): it is looked up once
            and each tower reads the same pooled embedding.

    Raises:
        ConfigError: when a tower names an unknown feature, a feature is in neither tower (or,
            without ``in_both``, in both), or a tower has no id feature.
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    from tzrun_plugins.models import _gather
    from tzrun_plugins.models._sequence_inputs import FeatureInputs, SequenceInputs, bag_collection, sequence_embeddings

    problems = _tower_problems(cfg, ctx, model, in_both)
    if problems:
        raise ConfigError("model", problems)
    encoders = encoders_by_group(cfg.sequence_encoders, ctx)

    class Tower(nn.Module):
        """The dense columns, id features and encoded sequence groups of one side, an MLP, a
        linear layer to ``output_dim``."""

        def __init__(self, features: tuple[str, ...], units: tuple[int, ...]) -> None:
            super().__init__()
            self.inputs = FeatureInputs(ctx, features)
            self.sequence_inputs = SequenceInputs(ctx, {n: e for n, e in encoders.items() if n in features})
            width = self.inputs.width + self.sequence_inputs.width
            self.mlp = mlp(width, units)
            self.output = nn.Linear(out_width(width, units), cfg.output_dim)

        def forward(self, dense: torch.Tensor, bags: Any, sequences: Any, rows: Any = None) -> torch.Tensor:
            x = self.inputs(dense, bags, sequences)
            if rows is not None:
                x = x[:rows]  # the batch's own rows: the sequences have no others
            if self.sequence_inputs.names:
                x = torch.cat([x, self.sequence_inputs(sequences)], dim=1)
            y = self.output(self.mlp(x))
            return F.normalize(y, dim=-1) if cfg.similarity == "cosine" else y

    class DSSM(nn.Module):
        """User tower, item tower, in-batch and sampled similarities."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            self.sequences = sequence_embeddings(ctx)
            self.user_tower = Tower(cfg.user_features, cfg.user_hidden_units)
            self.item_tower = Tower(cfg.item_features, cfg.item_hidden_units)
            # what `tzrec-run export` writes: each tower alone (items embedded offline, users online)
            self.serving_programs = {
                "user_tower": {"outputs": ["user_embedding"], "features": list(cfg.user_features)},
                "item_tower": {"outputs": ["item_embedding"], "features": list(cfg.item_features)},
            }

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            sequences = self.sequences(batch) if self.sequences is not None else None
            rows = batch.weights.shape[0]  # the batch's own rows; sampled items follow them
            user = self.user_tower(batch.dense, bags, sequences, rows)
            items = self.item_tower(batch.dense, bags, sequences)
            item, sampled = items[:rows], items[rows:]
            if cfg.gather_negatives:
                sampled = _gather.gather_rows(sampled)
            own = (user * item).sum(dim=1, keepdim=True)
            return {
                "similarity": user @ item.t() / cfg.temperature,
                "sampled_similarity": torch.cat([own, user @ sampled.t()], dim=1) / cfg.temperature,
                "user_embedding": user,
                "item_embedding": item,
            }

    return DSSM()
