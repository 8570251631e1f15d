"""Sequence lookups for model plugins: ``[[features.sequence]]`` groups as padded ``[B, L, D]``
tensors with their masks, the candidate's query embeddings, and pooled embeddings of the sparse
features whose tables are looked up unpooled.

A model builds one :class:`SequenceEmbeddings` from its :class:`~tzrun.interfaces.ModelContext`
and calls it on the batch::

    from tzrun.sequence import SequenceEmbeddings

    self.seq = SequenceEmbeddings(ctx)            # in the model's __init__
    out = self.seq(batch)                         # in forward: a SequenceFeatures
    seq, mask = out.sequence("click_seq")         # [B, max_len, D] float, [B, max_len] bool
    q = out.query("click_seq")                    # [B, D], zeros where seq has dense values
    p = out.pooled("adgroup_id")                  # [B, d]

It holds TorchRec ``EmbeddingCollection`` s (one per embedding width: TorchRec wants one width
per collection) over ``ctx.embedding_configs()``; ``DistributedModelParallel`` shards them with
the planner like any embedding collection, and the sparse optimizers, checkpoints, resharding
and ``--init-from`` cover their tables.

A group's dense sequences (``[[features.sequence.dense]]``, ``batch.sequence_dense``) end its
``[B, max_len, D]`` view, after the embeddings, as TorchEasyRec concatenates a sequence's raw
features to its id embeddings per position. The candidate has no value for them: its query
is zeros there, as TorchEasyRec's DIN encoder pads a query narrower than its sequence.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.fx
from torch import nn

from tzrun.interfaces import ModelContext

__all__ = ["SequenceEmbeddings", "SequenceFeatures"]


class SequenceFeatures:
    """The unpooled embeddings of one batch (what :class:`SequenceEmbeddings` returns).

    Args:
        embeddings: each key of ``batch.sequence`` -> its ``JaggedTensor`` of embeddings.
        groups: each group's name -> ``(its features' names, max_len, its query's names)``.
        poolings: each unpooled sparse feature's name -> ``"sum"`` or ``"mean"``.
        dense: each group with dense sequences -> ``[B, max_len, k]`` (``batch.sequence_dense``).
    """

    def __init__(
        self,
        embeddings: Mapping[str, Any],
        groups: Mapping[str, tuple[tuple[str, ...], int, tuple[str, ...]]],
        poolings: Mapping[str, str],
        dense: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.embeddings = dict(embeddings)
        self._groups = dict(groups)
        self._poolings = dict(poolings)
        self._dense = dict(dense or {})

    def sequence(self, group: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A group's sequences, padded.

        Returns:
            ``(seq, mask)``: ``seq`` is ``[B, max_len, D]`` float, ``D`` the sum of the
            group's features' widths (their embeddings concatenated in config order) plus its
            number of dense sequences (their values after the embeddings, in config order);
            each row's ids left-aligned in stored order (oldest first, most recent last), zeros
            after them; ``mask`` is ``[B, max_len]`` bool, True at a real id.

        Raises:
            KeyError: for a name that is no sequence group.
        """
        names, max_len, _ = self._group(group)
        parts = [_padded(self.embeddings[name].values(), self.embeddings[name].lengths(), max_len) for name in names]
        if group in self._dense:
            parts.append(self._dense[group].to(parts[0].dtype))
        lengths = self.embeddings[names[0]].lengths()
        mask = torch.arange(max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
        return torch.cat(parts, dim=-1), mask

    def query(self, group: str) -> torch.Tensor:
        """``[B, D]``: the group's query features' pooled embeddings (see :meth:`pooled`),
        concatenated in the order of its ``query``, then zeros for its dense sequences (the
        same ``D`` as :meth:`sequence`: the candidate has no dense part).

        Raises:
            KeyError: for a group without a ``query`` (or a name that is no group).
        """
        _, _, query = self._group(group)
        if not query:
            raise KeyError(f"sequence group '{group}' has no query (set query = [...] on its [[features.sequence]])")
        parts = [self.pooled(name) for name in query]
        if group in self._dense:
            parts.append(parts[0].new_zeros(parts[0].shape[0], self._dense[group].shape[-1]))
        return torch.cat(parts, dim=-1)

    def pooled(self, feature: str) -> torch.Tensor:
        """``[B, d]``: a sparse feature looked up unpooled
        (``ctx.unpooled_sparse_features()``), pooled as configured (``sum``, or ``mean``);
        zeros for a row with no id.

        Raises:
            KeyError: for a feature that is not looked up unpooled.
        """
        if feature not in self._poolings:
            raise KeyError(f"'{feature}' is not a sparse feature looked up unpooled (those are: "
                           f"{', '.join(self._poolings) or 'none'}); pooled features are in batch.sparse")
        jagged = self.embeddings[feature]
        lengths = jagged.lengths().long()
        values = jagged.values()
        rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths,
                                       output_size=values.shape[0])
        out = values.new_zeros(lengths.numel(), values.shape[-1]).index_add(0, rows, values)
        if self._poolings[feature] == "mean":
            out = out / lengths.clamp(min=1).unsqueeze(1).to(out.dtype)
        return out

    def _group(self, group: str) -> tuple[tuple[str, ...], int, tuple[str, ...]]:
        if group not in self._groups:
            raise KeyError(f"'{group}' is not a sequence group (groups: {', '.join(self._groups) or 'none'})")
        return self._groups[group]


def _padded(values: torch.Tensor, lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Jagged rows ``[N, d]`` (``lengths`` per row) as ``[B, max_len, d]``, left-aligned."""
    lengths = lengths.long()
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths,
                                   output_size=values.shape[0])  # known: torch.export keeps the size symbolic
    starts = torch.cumsum(lengths, 0) - lengths
    position = torch.arange(values.shape[0], device=values.device) - starts[rows]
    out = values.new_zeros(lengths.numel(), max_len, values.shape[-1])
    return out.index_put((rows, position), values)


@torch.fx.wrap
def _sequence_features(
    outputs: Sequence[Any], groups: Mapping[str, tuple[tuple[str, ...], int, tuple[str, ...]]], poolings: Mapping[str, str],
    dense: Mapping[str, torch.Tensor],
) -> SequenceFeatures:
    """The collections' outputs as one :class:`SequenceFeatures` (a leaf of TorchRec's
    pipeline tracing: it looks at the outputs' keys)."""
    embeddings: dict[str, Any] = {}
    for out in outputs:
        embeddings.update(dict(out.items()) if hasattr(out, "items") else out)
    return SequenceFeatures(embeddings, groups, poolings, dense)


class SequenceEmbeddings(nn.Module):
    """The unpooled lookups of a run: TorchRec ``EmbeddingCollection`` s over
    ``ctx.embedding_configs()``, one per embedding width.

    Args:
        ctx: the model context (``ctx.sequence_groups``, ``ctx.sequence_tables``).

    Call it on a batch: it looks up ``batch.sequence`` and returns a
    :class:`SequenceFeatures` (with ``batch.sequence_dense``).
    """

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__()
        from torchrec import EmbeddingCollection

        by_width: dict[int, list[Any]] = {}
        for config in ctx.embedding_configs():
            by_width.setdefault(config.embedding_dim, []).append(config)
        self.collections = nn.ModuleDict({
            f"dim_{width}": EmbeddingCollection(tables=configs, device=ctx.embedding_device)
            for width, configs in sorted(by_width.items())
        })
        self.groups = {g.name: (tuple(f.name for f in g.features), g.max_len, tuple(g.query)) for g in ctx.sequence_groups}
        unpooled = set(ctx.unpooled_sparse_features())
        self.poolings = {f.name: f.pooling for f in ctx.sparse_features if f.name in unpooled}

    def forward(self, batch: Any) -> SequenceFeatures:
        outputs = [collection(batch.sequence) for collection in self.collections.values()]
        return _sequence_features(outputs, self.groups, self.poolings, batch.sequence_dense)
