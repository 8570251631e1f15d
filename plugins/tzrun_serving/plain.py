"""Plain-torch stand-ins for TorchRec's embedding collections, so that a model plugin's own
``forward(batch)`` can be exported by ``torch.export`` into a program that needs only torch.

How a model leaves TorchRec (the mechanism, for every model plugin alike): every
``EmbeddingBagCollection`` of the model is swapped for a :class:`PlainEmbeddingBagCollection`
holding the same tables (weights copied) looked up with ``torch.nn.functional.embedding_bag``;
the model's forward is then called, unchanged, with a :class:`~tzrun.data.batch.Batch` whose
``sparse`` is a :class:`PlainFeatures` (flat ids, lengths per feature and row, weights) instead
of a ``KeyedJaggedTensor``. The swapped collections return a :class:`PlainKeyedTensor`, which answers
what models ask of TorchRec's ``KeyedTensor``: ``keys()``, ``values()``, ``to_dict()``,
``[key]``, ``length_per_key()``, ``offset_per_key()``. No TorchRec type is traced, so the
exported graph holds only aten operators.

Every ``EmbeddingCollection`` (the unpooled lookups of sequence features, see
:mod:`tzrun.sequence`) is swapped for a :class:`PlainEmbeddingCollection` the same way: its
tables looked up with ``torch.nn.functional.embedding``, ``batch.sequence`` a
:class:`PlainSequenceFeatures` (one flat id tensor per key, lengths per key and row), and its
output one :class:`PlainJagged` (``values()``, ``lengths()``, ``offsets()``) per feature, like
TorchRec's ``Dict[str, JaggedTensor]``.

A model may use ``batch.sparse`` and ``batch.sequence`` only by handing them to its embedding
collections.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

__all__ = ["PlainFeatures", "PlainKeyedTensor", "PlainEmbeddingBagCollection", "PlainSequenceFeatures", "PlainJagged",
           "PlainEmbeddingCollection", "swap_embedding_collections"]


class PlainFeatures:
    """What ``batch.sparse`` is in an exported model: every id feature's ids in one flat tensor,
    feature after feature and row after row within a feature (TorchRec's KeyedJaggedTensor
    layout), with ``lengths[f, row]`` ids per row and, in a weighted run, per-id ``weights``.

    Args:
        keys: the run's id features, in order.
        ids: int64 ``[n]``.
        lengths: int64 ``[len(keys), rows]``.
        weights: float32 ``[n]``, or None.
    """

    def __init__(self, keys: Sequence[str], ids: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None) -> None:
        self._keys = list(keys)
        self.ids = ids
        self.lengths = lengths
        self.weights = weights

    def keys(self) -> list[str]:
        """The feature names, in order."""
        return list(self._keys)

    def stride(self) -> int:
        """Rows in the batch."""
        return self.lengths.shape[1]


class PlainSequenceFeatures:
    """What ``batch.sequence`` is in an exported model: each unpooled key's ids in its own flat
    tensor (row after row), with ``lengths[k, row]`` ids per row.

    Args:
        keys: the keys of ``batch.sequence``, in order.
        ids: each key's ids, int64 ``[n_key]``.
        lengths: int64 ``[len(keys), rows]``.
    """

    def __init__(self, keys: Sequence[str], ids: Mapping[str, torch.Tensor], lengths: torch.Tensor) -> None:
        self._keys = list(keys)
        self.ids = dict(ids)
        self.lengths = lengths

    def keys(self) -> list[str]:
        """The keys, in order."""
        return list(self._keys)

    def stride(self) -> int:
        """Rows in the batch."""
        return self.lengths.shape[1]


class PlainJagged:
    """One feature's unpooled embeddings, like TorchRec's ``JaggedTensor``: ``values()``
    ``[n, dim]``, ``lengths()`` ``[rows]``, ``offsets()`` ``[rows + 1]``."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        self._values = values
        self._lengths = lengths

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        return torch.cat([self._lengths.new_zeros(1), torch.cumsum(self._lengths, 0)])


class PlainEmbeddingCollection(nn.Module):
    """An ``EmbeddingCollection`` in plain torch: each feature's ids looked up in its table by
    ``torch.nn.functional.embedding``, unpooled.

    Args:
        tables: ``(name, weight, feature names)`` per table, in the collection's order.
        keys: the keys of ``batch.sequence``, in order (the rows of its lengths).
        remaps: per feature of a ``zch`` table, its table's id-to-row map (raw ids -> rows).
    """

    def __init__(self, tables: Sequence[tuple[str, torch.Tensor, Sequence[str]]], keys: Sequence[str],
                 remaps: Mapping[str, nn.Module] | None = None) -> None:
        super().__init__()
        index = {name: i for i, name in enumerate(keys)}
        self.weights = nn.ParameterList(
            nn.Parameter(w.detach().to("cpu", torch.float32).clone(), requires_grad=False) for _, w, _ in tables)
        self.picks = [(name, t, index[name]) for t, (_, _, names) in enumerate(tables) for name in names]
        self.remaps = nn.ModuleDict(dict(remaps or {}))

    def forward(self, features: PlainSequenceFeatures) -> dict[str, PlainJagged]:
        out = {}
        for name, t, row in self.picks:
            ids = self.remaps[name](features.ids[name]) if name in self.remaps else features.ids[name]
            out[name] = PlainJagged(torch.nn.functional.embedding(ids, self.weights[t]), features.lengths[row])
        return out


class PlainKeyedTensor:
    """What a :class:`PlainEmbeddingBagCollection` returns: pooled embeddings ``[rows, dim]``
    per feature, side by side, like TorchRec's ``KeyedTensor``."""

    def __init__(self, keys: Sequence[str], parts: Sequence[torch.Tensor], stacked: torch.Tensor | None = None) -> None:
        self._keys = list(keys)
        self._parts = list(parts)
        self._stacked = stacked  # [keys, rows, dim], the parts in key order, when they came so

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        if self._stacked is not None:  # one strided copy (2-2.5x a cat of the parts on CPU)
            return self._stacked.transpose(0, 1).reshape(self._stacked.shape[1], -1)
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
    """An ``EmbeddingBagCollection`` in plain torch: the tables of one width are stacked into
    one weight and looked up by one ``embedding_bag`` over every feature's ids (what FBGEMM's
    table-batched kernels do), the features of other tables masked by a per-id weight of 0;
    ``mean`` pooling is a sum with per-id weights ``1 / ids in the row``.

    Args:
        tables: ``(name, weight, feature names, pooling)`` per table, in the collection's
            order; ``pooling`` is ``"sum"`` or ``"mean"``.
        is_weighted: the features carry per-id weights.
        features: the run's id features, in order (the rows of ``PlainFeatures.lengths``).
        remaps: per feature of a ``zch`` table, its table's id-to-row map (raw ids -> rows),
            applied to that feature's ids before the lookup.
    """

    def __init__(self, tables: Sequence[tuple[str, torch.Tensor, Sequence[str], str]], is_weighted: bool,
                 features: Sequence[str], remaps: Mapping[str, nn.Module] | None = None) -> None:
        super().__init__()
        index = {name: i for i, name in enumerate(features)}
        self.remaps = nn.ModuleDict(dict(remaps or {}))
        self.remapped = [(index[name], name) for name in self.remaps]
        self.is_weighted = is_weighted
        self.num_features = len(features)
        self.keys = [name for _, _, names, _ in tables for name in names]
        dims = sorted({int(w.shape[1]) for _, w, _, _ in tables})
        self.weights = nn.ParameterList()
        self.picks: list[list[tuple[str, int]]] = []  # per width: (feature, its row in lengths)
        for g, dim in enumerate(dims):
            members = [t for t in tables if int(t[1].shape[1]) == dim]
            base = torch.zeros(len(features), dtype=torch.int64)
            mask = torch.zeros(len(features))
            mean = torch.zeros(len(features))
            row = 0
            picks = []
            for _, weight, names, pooling in members:
                for name in names:
                    base[index[name]] = row
                    mask[index[name]] = 1.0
                    mean[index[name]] = 1.0 if pooling == "mean" else 0.0
                    picks.append((name, index[name]))
                row += int(weight.shape[0])
            self.weights.append(nn.Parameter(torch.cat([w.detach().to("cpu", torch.float32) for _, w, _, _ in members]),
                                             requires_grad=False))
            self.register_buffer(f"base_{g}", base, persistent=False)
            self.register_buffer(f"mask_{g}", mask, persistent=False)
            self.register_buffer(f"mean_{g}", mean, persistent=False)
            self.picks.append(picks)
        # a width whose tables every feature reads, all summed (DeepFM's, DLRM's): no masking
        # and no per-id weights to compute (the same sums, fewer operators)
        self.whole = [bool(getattr(self, f"mask_{g}").all()) and not bool(getattr(self, f"mean_{g}").any())
                      for g in range(len(dims))]
        # one width read by every feature, in the collection's key order: the lookup's output is
        # the pooled embeddings stacked in key order
        self.stacked = self.whole == [True] and [index[k] for k in self.keys] == list(range(len(features)))

    def forward(self, features: PlainFeatures) -> PlainKeyedTensor:
        ids, lengths = features.ids, features.lengths
        rows = lengths.shape[1]
        flat = lengths.reshape(-1)
        offsets = torch.cumsum(flat, 0) - flat
        n = ids.shape[0]
        feature_of_id = torch.repeat_interleave(torch.arange(self.num_features), lengths.sum(dim=1), output_size=n)
        row_scale = None if all(self.whole) else torch.repeat_interleave(1.0 / flat.clamp(min=1).float(), flat, output_size=n)
        for i, name in self.remapped:  # a zch feature's raw ids -> its table's rows
            ids = torch.where(feature_of_id == i, self.remaps[name](ids), ids)
        pooled: dict[str, torch.Tensor] = {}
        weighted = features.weights if self.is_weighted else None
        for g, weight in enumerate(self.weights):
            per_id: torch.Tensor | None
            if self.whole[g]:
                rows_of_ids, per_id = ids + getattr(self, f"base_{g}")[feature_of_id], weighted
            else:
                mask, mean = getattr(self, f"mask_{g}")[feature_of_id], getattr(self, f"mean_{g}")[feature_of_id]
                rows_of_ids = torch.where(mask > 0, ids + getattr(self, f"base_{g}")[feature_of_id], 0)
                assert row_scale is not None
                per_id = mask * (1.0 + mean * (row_scale - 1.0))  # 1, or 1/len for mean pooling
                if weighted is not None:
                    per_id = per_id * weighted
            out = torch.nn.functional.embedding_bag(rows_of_ids, weight, offsets, mode="sum", per_sample_weights=per_id)
            out = out.view(self.num_features, rows, -1)
            for name, i in self.picks[g]:
                pooled[name] = out[i]
        return PlainKeyedTensor(self.keys, [pooled[name] for name in self.keys], out if self.stacked else None)


def _plain_of(module: nn.Module, features: Sequence[str], sequence_keys: Sequence[str],
              remaps: Mapping[str, nn.Module]) -> nn.Module:
    """The plain twin of one unsharded TorchRec collection (``remaps``: its tables' id-to-row maps)."""
    from torchrec import EmbeddingBagCollection

    if not isinstance(module, EmbeddingBagCollection):  # an EmbeddingCollection
        collection: Any = module
        configs = list(collection.embedding_configs())
        return PlainEmbeddingCollection(
            [(t.name, collection.embeddings[t.name].weight, list(t.feature_names)) for t in configs],
            sequence_keys, _feature_remaps(configs, remaps))
    configs = list(module.embedding_bag_configs())
    tables = [(t.name, module.embedding_bags[t.name].weight, list(t.feature_names), t.pooling.name.lower()) for t in configs]
    return PlainEmbeddingBagCollection(tables, module.is_weighted(), features, _feature_remaps(configs, remaps))


def _feature_remaps(configs: Sequence[Any], remaps: Mapping[str, nn.Module]) -> dict[str, nn.Module]:
    """Each feature of a table that has an id-to-row map -> that map."""
    return {f: remaps[t.name] for t in configs if t.name in remaps for f in t.feature_names}


def swap_embedding_collections(model: nn.Module, features: Sequence[str], sequence_keys: Sequence[str] = (),
                               remaps: Mapping[tuple[str, str], nn.Module] | None = None) -> list[str]:
    """Replace, in place, every TorchRec embedding collection of an unsharded ``model`` by its
    plain-torch twin (weights copied); ``features`` are the keys of ``batch.sparse`` (the pooled
    id features) in order, ``sequence_keys`` those of ``batch.sequence``; ``remaps`` the
    id-to-row map of each ``zch`` table by ``(collection name, table)``, looked up in front of
    the table. Returns the swapped modules' names.
    """
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    swapped = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)) or not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        tables = {table: remap for (collection, table), remap in (remaps or {}).items() if collection == name}
        setattr(parent, child, _plain_of(module, features, sequence_keys, tables))
        swapped.append(name)
    return swapped


def plain_batch(dense: torch.Tensor, sparse: PlainFeatures, sequence: PlainSequenceFeatures,
                sequence_dense: Mapping[str, torch.Tensor] | None = None) -> Any:
    """A :class:`~tzrun.data.batch.Batch` of ``dense``, ``sparse``, ``sequence`` and ``sequence_dense`` with every
    row real and of weight 1 and no labels: what the model's forward receives in an exported
    program."""
    from tzrun import Batch

    rows = dense.shape[0]
    return Batch(dense, sparse, {}, torch.ones(rows), rows, sequence=sequence, sequence_dense=sequence_dense)
