"""Plain-torch stand-ins for TorchRec's embedding collections, so that a model plugin's own
``forward(batch)`` can be exported by ``torch.export`` into a program that needs only torch.

How a model leaves TorchRec (the mechanism, for every model plugin alike): every
``EmbeddingBagCollection`` of the model is swapped for a :class:`PlainEmbeddingBagCollection`
holding the same tables as ``nn.EmbeddingBag`` modules (weights copied); the model's forward is
then called, unchanged, with a :class:`~tzrun.data.batch.Batch` whose ``sparse`` is a
:class:`PlainFeatures` (per feature: flat ids, lengths, weights) instead of a
``KeyedJaggedTensor``. The swapped collections return a :class:`PlainKeyedTensor`, which answers
what models ask of TorchRec's ``KeyedTensor``: ``keys()``, ``values()``, ``to_dict()``,
``[key]``, ``length_per_key()``, ``offset_per_key()``. No TorchRec type is traced, so the
exported graph holds only aten operators.

A model may use ``batch.sparse`` only by handing it to its embedding collections. An
``EmbeddingCollection`` (sequence features) would get the same treatment with ``nn.Embedding``
and padded, jagged outputs (not built yet: a model with one is refused, naming it).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

__all__ = ["PlainFeatures", "PlainKeyedTensor", "PlainEmbeddingBagCollection", "swap_embedding_collections"]


class PlainFeatures:
    """What ``batch.sparse`` is in an exported model: each id feature's flat ``ids`` (int64),
    ``lengths`` (int64, ids per row) and per-id ``weights`` (float32, or None), by name.

    Args:
        features: ``{name: (ids, lengths, weights)}`` in the run's feature order.
    """

    def __init__(self, features: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]) -> None:
        self.features = dict(features)

    def keys(self) -> list[str]:
        """The feature names, in order."""
        return list(self.features)

    def stride(self) -> int:
        """Rows in the batch."""
        return next(iter(self.features.values()))[1].shape[0]


class PlainKeyedTensor:
    """What a :class:`PlainEmbeddingBagCollection` returns: pooled embeddings ``[rows, dim]``
    per feature, side by side, like TorchRec's ``KeyedTensor``."""

    def __init__(self, keys: Sequence[str], parts: Sequence[torch.Tensor]) -> None:
        self._keys = list(keys)
        self._parts = list(parts)

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return torch.cat(self._parts, dim=1)

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self._keys, self._parts))

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._parts[self._keys.index(key)]

    def length_per_key(self) -> list[int]:
        return [int(p.shape[1]) for p in self._parts]

    def offset_per_key(self) -> list[int]:
        offsets = [0]
        for length in self.length_per_key():
            offsets.append(offsets[-1] + length)
        return offsets


class PlainEmbeddingBagCollection(nn.Module):
    """An ``EmbeddingBagCollection`` of plain ``nn.EmbeddingBag`` tables.

    Args:
        tables: ``(name, weight, feature names, pooling)`` per table, in the collection's
            order; ``pooling`` is ``"sum"`` or ``"mean"``.
        is_weighted: the features carry per-id weights (summed with ``per_sample_weights``).
    """

    def __init__(self, tables: Sequence[tuple[str, torch.Tensor, Sequence[str], str]], is_weighted: bool) -> None:
        super().__init__()
        self.is_weighted = is_weighted
        self.embedding_bags = nn.ModuleDict()
        self.table_features: list[tuple[str, list[str]]] = []
        for name, weight, features, pooling in tables:
            bag = nn.EmbeddingBag(weight.shape[0], weight.shape[1], mode=pooling, include_last_offset=False)
            with torch.no_grad():
                bag.weight.copy_(weight.detach().to("cpu", torch.float32))
            self.embedding_bags[name] = bag
            self.table_features.append((name, list(features)))

    def forward(self, features: PlainFeatures) -> PlainKeyedTensor:
        keys, parts = [], []
        for table, names in self.table_features:
            bag = self.embedding_bags[table]
            for name in names:
                ids, lengths, weights = features.features[name]
                offsets = torch.cumsum(lengths, 0) - lengths
                parts.append(bag(ids, offsets, per_sample_weights=weights if self.is_weighted else None))
                keys.append(name)
        return PlainKeyedTensor(keys, parts)


def _plain_of(module: nn.Module) -> nn.Module:
    """The plain twin of one unsharded TorchRec collection."""
    from torchrec import EmbeddingBagCollection

    if not isinstance(module, EmbeddingBagCollection):
        raise NotImplementedError(
            f"{type(module).__name__}: export turns only EmbeddingBagCollection lookups into plain torch so far"
        )
    tables = [
        (t.name, module.embedding_bags[t.name].weight, list(t.feature_names), t.pooling.name.lower())
        for t in module.embedding_bag_configs()
    ]
    return PlainEmbeddingBagCollection(tables, module.is_weighted())


def swap_embedding_collections(model: nn.Module) -> list[str]:
    """Replace, in place, every TorchRec embedding collection of an unsharded ``model`` by its
    plain-torch twin (weights copied). Returns the swapped modules' names.

    Raises:
        NotImplementedError: for a collection kind that has no twin yet (``EmbeddingCollection``).
    """
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    swapped = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)) or not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _plain_of(module))
        swapped.append(name)
    return swapped


def plain_batch(dense: torch.Tensor, sparse: PlainFeatures) -> Any:
    """A :class:`~tzrun.data.batch.Batch` of ``dense`` and ``sparse`` with every row real and
    of weight 1 and no labels: what the model's forward receives in an exported program."""
    from tzrun.data.batch import Batch

    rows = dense.shape[0]
    return Batch(dense, sparse, {}, torch.ones(rows), rows)  # type: ignore[arg-type]
