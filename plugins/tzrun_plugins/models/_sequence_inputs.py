"""The inputs of a tower that may read sequences: named dense and id features, and encoded
sequence groups, each concatenated into one ``[B, W]`` tensor.

An id feature is looked up pooled by the model's ``EmbeddingBagCollection``, or, when its table
lives in the ``EmbeddingCollection`` of the sequences (it shares a table with a sequence
feature: ``ctx.unpooled_sparse_features()``), taken sum-pooled from
:meth:`tzrun.sequence.SequenceFeatures.pooled`. Imported by ``build`` only (torch).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from tzrun import ModelContext
from tzrun_plugins.models import _order
from tzrun_plugins.models._sequence_config import QUERY_TYPES, SequenceEncoderConfig, build_encoder, encoder_width, group_width

__all__ = ["FeatureInputs", "SequenceInputs", "bag_collection", "sequence_embeddings"]


def bag_collection(ctx: ModelContext) -> Optional[nn.Module]:
    """The ``EmbeddingBagCollection`` of ``ctx``'s pooled tables (None when every id feature is
    looked up by the sequences' collection)."""
    from torchrec import EmbeddingBagCollection

    configs = ctx.embedding_bag_configs()
    if not configs:
        return None
    collection: nn.Module = EmbeddingBagCollection(tables=configs, is_weighted=ctx.is_weighted, device=ctx.embedding_device)
    return collection


def sequence_embeddings(ctx: ModelContext) -> Optional[nn.Module]:
    """A :class:`tzrun.sequence.SequenceEmbeddings` of ``ctx`` (None when it has no unpooled table)."""
    if not ctx.embedding_configs():
        return None
    from tzrun.sequence import SequenceEmbeddings

    return SequenceEmbeddings(ctx)


def feature_dims(ctx: ModelContext) -> dict[str, int]:
    """The embedding width of every id feature, pooled or not."""
    dims = {name: t.embedding_dim for t in ctx.tables for name in t.feature_names}
    for config in ctx.embedding_configs():
        for name in config.feature_names:
            dims.setdefault(name, config.embedding_dim)
    return dims


class FeatureInputs(nn.Module):
    """Dense columns and pooled id embeddings of ``names`` (dense and id feature names), in the
    order: dense (config order), bag-looked-up ids (``names`` order), sequence-table ids
    (``names`` order)."""

    dense_columns: torch.Tensor

    def __init__(self, ctx: ModelContext, names: Sequence[str]) -> None:
        super().__init__()
        dense_index = {f.name: i for i, f in enumerate(ctx.dense_features)}
        unpooled = set(ctx.unpooled_sparse_features())
        dims = feature_dims(ctx)
        dense = [dense_index[n] for n in names if n in dense_index]
        self.bag_names = [n for n in names if n in dims and n not in unpooled]
        self.unpooled_names = [n for n in names if n in unpooled]
        self.has_dense = bool(dense)
        self.register_buffer("dense_columns", torch.tensor(dense, dtype=torch.int64), persistent=False)
        self.width = len(dense) + sum(dims[n] for n in self.bag_names + self.unpooled_names)

    def forward(self, dense: torch.Tensor, bags: Any, sequences: Any) -> torch.Tensor:
        parts = []
        if self.has_dense:
            parts.append(dense.index_select(1, self.dense_columns))
        if self.bag_names:
            parts.append(_order.in_feature_order(bags, self.bag_names))
        parts += [sequences.pooled(name) for name in self.unpooled_names]
        return torch.cat(parts, dim=1)


class SequenceInputs(nn.Module):
    """The encoded sequence groups of ``encoders`` (group name -> its encoder's config),
    concatenated in that order."""

    def __init__(self, ctx: ModelContext, encoders: Mapping[str, SequenceEncoderConfig]) -> None:
        super().__init__()
        groups = {g.name: g for g in ctx.sequence_groups}
        self.names = list(encoders)
        self.queries = [encoders[n].type in QUERY_TYPES for n in self.names]
        widths = [group_width(ctx, n) for n in self.names]
        self.encoders = nn.ModuleList(
            build_encoder(encoders[n], width, groups[n].max_len, groups[n].recent_first)
            for n, width in zip(self.names, widths)
        )
        self.width = sum(encoder_width(encoders[n], width) for n, width in zip(self.names, widths))

    def forward(self, sequences: Any) -> torch.Tensor:
        """``[B, width]``: each group encoded, concatenated. One tensor, not a list: TorchRec's
        train pipeline may trace this module as a leaf, and a traced call's result cannot be
        unpacked. Call it only when :attr:`names` is not empty."""
        encoded = []
        for name, reads_query, encoder in zip(self.names, self.queries, self.encoders):
            sequence, mask = sequences.sequence(name)
            query = sequences.query(name) if reads_query else None
            encoded.append(encoder(sequence, mask, query))
        return torch.cat(encoded, dim=1)
