"""Feature specs from the config, and Arrow record batches -> :class:`~tzrun.data.batch.Batch`
(each column read and its bad values found by :mod:`tzrun.data.columns`).

Id features (:mod:`tzrun.data.ids`): an integer column with ``num_buckets`` must hold ids in
``[0, num_buckets)``; a column with ``hash_bucket_size`` is hashed with FNV-1a 64 over the
UTF-8 bytes of strings (see :mod:`tzrun.data.hashing`), or taken modulo ``hash_bucket_size``
for integers; ``vocab`` maps ``vocab[i]`` to ``i + 1`` and other tokens to 0; ``boundaries``
bucketize numbers. List columns, or strings split on ``separator``, give several ids per row;
a null, or a null inside a list, gives none. A ``weight_column`` gives the ids' weights.

Dense features: a null or NaN takes the feature's ``fill_value`` (Parquet written from pandas
stores missing floats as NaN); ``inf`` and ``-inf`` are bad values; then ``log1p`` and
``(x - mean) / std``.

Bad rows (``data.on_bad_row``) are rows with an id outside ``[0, num_buckets)``, an infinite
dense value, a null, NaN or infinite label, a label outside the domain a loss or metric reading
it needs (0/1 for ``binary_cross_entropy``; see :mod:`tzrun.data.labels`), a value a derived
label cannot be computed from, a null, NaN, infinite or negative sample weight, or a null group
key. With ``"error"`` the first problem found stops the run with a
:class:`~tzrun.errors.DataError` naming the file, the column, the problem, how many rows of the
batch have it and the first bad value; with ``"skip"`` those rows are left out of the batch
(every column alike) and counted in its :attr:`~tzrun.data.batch.Batch.skipped`. A batch whose
rows are all bad is a weight-0 padding batch carrying the counts (TorchRec cannot embed a
``KeyedJaggedTensor`` of stride 0). A missing column or a column of the wrong type is an error
either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import attrs
import numpy as np
import pyarrow as pa

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SequenceDenseConfig, SparseFeatureConfig
from tzrun.config.sequences import resolved_sequences, table_name, unpooled_tables
from tzrun.config.vocab import read_vocab_file
from tzrun.data.columns import (
    BadRows,
    HashedDictionaries,
    fill_nonfinite_dense,
    read_floats,
    read_group_keys,
    read_ids,
    read_label,
    read_sample_weights,
)
from tzrun.data.ids import JaggedIds
from tzrun.data.labels import DerivedLabel, LabelDomain
from tzrun.data.sequence_dense import kept_positions, read_sequence_dense
from tzrun.errors import DataError
from tzrun.interfaces import DenseFeature, EmbeddingTable, SequenceGroup, SparseFeature

if TYPE_CHECKING:
    from tzrun.data.batch import Batch, SkippedRows

__all__ = ["FeatureSpecs", "feature_specs", "BatchBuilder"]


@attrs.frozen
class FeatureSpecs:
    """The features of a run, derived from ``[features]``.

    Attributes:
        dense, sparse: the ``[[features.dense]]`` and ``[[features.sparse]]`` features.
        tables: the pooled tables (``batch.sparse``'s).
        sequence_groups: the ``[[features.sequence]]`` groups.
        sequence_tables: the tables looked up unpooled (``batch.sequence``'s): those a sequence
            or a query reads; their sparse features are :attr:`unpooled`.
    """

    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]
    tables: tuple[EmbeddingTable, ...]
    sequence_groups: tuple[SequenceGroup, ...] = ()
    sequence_tables: tuple[EmbeddingTable, ...] = ()

    @property
    def unpooled(self) -> tuple[SparseFeature, ...]:
        """The sparse features looked up unpooled (keys of ``batch.sequence``)."""
        names = {n for t in self.sequence_tables for n in t.feature_names}
        return tuple(f for f in self.sparse if f.name in names)

    @property
    def pooled(self) -> tuple[SparseFeature, ...]:
        """The sparse features looked up pooled (keys of ``batch.sparse``)."""
        names = {n for t in self.sequence_tables for n in t.feature_names}
        return tuple(f for f in self.sparse if f.name not in names)

    def columns(self, labels: Sequence[str], sample_weight: str | None, groups: Sequence[str] = ()) -> list[str]:
        """Every input column a batch needs, each once, in a stable order."""
        names = [f.column for f in self.dense] + [f.column for f in self.sparse]
        names += [f.weight_column for f in self.sparse if f.weight_column]
        for g in self.sequence_groups:
            names += [f.column for f in g.features] + [f.column for f in g.dense]
        names += list(labels)
        if sample_weight:
            names.append(sample_weight)
        names.extend(groups)
        return list(dict.fromkeys(names))


def _sparse_spec(f: SparseFeatureConfig) -> SparseFeature:
    """One id feature's spec (its ``vocab_file`` read).

    Raises:
        DataError: when the ``vocab_file`` cannot be read.
    """
    vocab = f.vocab
    if f.vocab_file is not None:
        try:
            vocab = read_vocab_file(f.vocab_file)
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{f.vocab_file}: the vocab_file of feature '{f.name}' cannot be read: {exc}") from None
    return SparseFeature(
        f.name, f.column or f.name, table_name(f), f.num_buckets, f.hash_bucket_size, vocab,
        f.boundaries, f.separator, f.weight_column, f.pooling, None if f.zch is None else f.zch.size,
    )


def _dense_spec(f: DenseFeatureConfig | SequenceDenseConfig) -> DenseFeature:
    return DenseFeature(f.name, f.column or f.name, f.fill_value, f.log1p, f.mean, f.std)


def feature_specs(cfg: FeaturesConfig) -> FeatureSpecs:
    """Derive dense/sparse feature specs and embedding tables from a checked config.

    A ``vocab_file`` is read here (the specs carry its tokens). When any feature has a
    ``weight_column`` every pooled table is weighted and sum-pooled (see
    :attr:`tzrun.interfaces.EmbeddingTable.weighted`). A table a sequence or a query reads is
    a sequence table (looked up unpooled), with every feature reading it: its sequences first,
    in config order, then its sparse features.

    Raises:
        DataError: when a ``vocab_file`` cannot be read.
    """
    dense = tuple(_dense_spec(f) for f in cfg.dense)
    weighted = any(f.weight_column is not None for f in cfg.sparse)
    unpooled = unpooled_tables(cfg)
    sequences = [(g, _sparse_spec(f), f.embedding_dim) for _, g, f in resolved_sequences(cfg)]
    sparse = [(_sparse_spec(f), f.embedding_dim, f.pooling) for f in cfg.sparse]
    tables: dict[str, tuple[int, int, list[str], str]] = {}
    for spec, dim, pooling in [(s, d, "sum") for _, s, d in sequences] + sparse:
        tables.setdefault(spec.table, (spec.num_embeddings, dim, [], pooling))[2].append(spec.name)
    pooled = tuple(
        EmbeddingTable(n, s, d, tuple(u), "sum" if weighted else p, weighted)
        for n, (s, d, u, p) in tables.items() if n not in unpooled
    )
    groups = tuple(
        SequenceGroup(group.name, group.max_len, tuple(s for g, s, _ in sequences if g == i), tuple(group.query),
                      group.keep, tuple(_dense_spec(f) for f in group.dense))
        for i, group in enumerate(cfg.sequence)
    )
    sequence_tables = tuple(EmbeddingTable(n, s, d, tuple(u)) for n, (s, d, u, _) in tables.items() if n in unpooled)
    return FeatureSpecs(dense, tuple(spec for spec, _, _ in sparse), pooled, groups, sequence_tables)


class BatchBuilder:
    """Turns Arrow record batches into :class:`Batch` objects for one run's features.

    Args:
        specs: the run's features.
        labels: label columns.
        sample_weight: the sample-weight column, if any.
        groups: group-key columns (``group_by`` of losses and metrics): integers, or strings
            hashed with FNV-1a 64.
        on_bad_row: ``"error"`` or ``"skip"`` (``data.on_bad_row``; see the module docstring).
        label_domains: per label, the domains its losses and metrics need
            (:func:`tzrun.data.labels.strictest`); a label outside them is a bad value.
        derived_labels: labels computed from another column (``[[data.derived_labels]]``).
    """

    def __init__(
        self,
        specs: FeatureSpecs,
        labels: Sequence[str],
        sample_weight: str | None,
        groups: Sequence[str] = (),
        *,
        on_bad_row: str = "error",
        label_domains: Mapping[str, Sequence[LabelDomain]] | None = None,
        derived_labels: Sequence[DerivedLabel] = (),
    ) -> None:
        if on_bad_row not in ("error", "skip"):
            raise ValueError(f"on_bad_row must be 'error' or 'skip', not {on_bad_row!r}")
        self.specs = specs
        self.labels = tuple(labels)
        self.sample_weight = sample_weight
        self.groups = tuple(dict.fromkeys(groups))
        self.on_bad_row = on_bad_row
        self.label_domains = {k: tuple(v) for k, v in (label_domains or {}).items()}
        self.derived_labels = {d.name: d for d in derived_labels}
        self._weighted = any(t.weighted for t in specs.tables)
        self._pooled = specs.pooled
        self._sequence_keys = [f.name for g in specs.sequence_groups for f in g.features] + [f.name for f in specs.unpooled]
        self._dictionaries = HashedDictionaries()

    def __call__(self, table: pa.Table | pa.RecordBatch, source: str) -> "Batch":
        """Build a batch from ``table``; ``source`` (a file name) is named in errors.

        Raises:
            DataError: naming ``source`` and the column, when a column is missing or has the
                wrong type, or (``on_bad_row = "error"``) a row holds a bad value.
        """
        return self.build_rows(table, source)[0]

    def build_rows(self, table: pa.Table | pa.RecordBatch, source: str) -> tuple["Batch", dict[str, np.ndarray]]:
        """:meth:`__call__`, and which rows of ``table`` were left out under ``"skip"``: a
        mask over ``table``'s rows per problem (``"<column>: <problem>"``), empty when every
        row is in the batch (``tzrec-run predict`` lists the rows it could not score)."""
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from tzrun.data.batch import Batch

        rows = table.num_rows
        bad = BadRows(source, rows, self.on_bad_row == "skip")
        dense = np.zeros((rows, len(self.specs.dense)), dtype=np.float32)
        for j, feature in enumerate(self.specs.dense):
            dense[:, j] = read_floats(table, feature.column, source, fill=feature.fill_value)[0]
        if not np.isfinite(dense).all():
            fill_nonfinite_dense(dense, self.specs.dense, bad)
        for j, feature in enumerate(self.specs.dense):
            if feature.log1p:
                np.log1p(np.maximum(dense[:, j], 0.0), out=dense[:, j])
            if feature.mean != 0.0 or feature.std != 1.0:
                dense[:, j] = (dense[:, j] - np.float32(feature.mean)) / np.float32(feature.std)
        values, lengths, id_weights = [], [], []
        for feature in self._pooled:
            jagged = read_ids(table, feature, source, bad, self._dictionaries)
            values.append(jagged.ids)
            lengths.append(jagged.lengths)
            if self._weighted:
                id_weights.append(_kjt_weights(jagged, feature.pooling))
        sequence, sequence_dense = self._sequences(table, source, bad)
        sequence += [read_ids(table, f, source, bad, self._dictionaries) for f in self.specs.unpooled]
        labels = {
            name: read_label(table, name, source, bad, self.derived_labels.get(name), self.label_domains.get(name, ()))
            for name in self.labels
        }
        if self.sample_weight:
            weights = read_sample_weights(table, self.sample_weight, source, bad)
        else:
            weights = np.ones(rows, dtype=np.float32)
        groups = {name: read_group_keys(table, name, source, bad) for name in self.groups}

        dropped = bad.dropped()
        skipped = None
        if dropped is not None:
            skipped = bad.counts(dropped)
            keep = ~dropped
            rows_in, rows = rows, int(np.count_nonzero(keep))
            if rows == 0:
                return self.padding(skipped), bad.masks
            values = [_kept(ids, lens, keep, rows_in) for ids, lens in zip(values, lengths)]
            id_weights = [_kept(w, lens, keep, rows_in) for w, lens in zip(id_weights, lengths)]
            lengths = [lens[keep] for lens in lengths]
            sequence = [JaggedIds(_kept(j.ids, j.lengths, keep, rows_in), j.lengths[keep]) for j in sequence]
            sequence_dense = {name: v[keep] for name, v in sequence_dense.items()}
            dense = dense[keep]
            labels = {name: v[keep] for name, v in labels.items()}
            weights = weights[keep]
            groups = {name: v[keep] for name, v in groups.items()}
        sparse = KeyedJaggedTensor(
            keys=[f.name for f in self._pooled],
            values=torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
            lengths=torch.from_numpy(np.concatenate(lengths) if lengths else np.zeros(0, np.int32)),
            weights=torch.from_numpy(np.concatenate(id_weights)) if self._weighted else None,
            stride=rows,
        )
        return Batch(
            torch.from_numpy(dense),
            sparse,
            {name: torch.from_numpy(v) for name, v in labels.items()},
            torch.from_numpy(weights),
            rows,
            {name: torch.from_numpy(v) for name, v in groups.items()},
            skipped,
            KeyedJaggedTensor(
                keys=self._sequence_keys,
                values=torch.from_numpy(np.concatenate([j.ids for j in sequence]) if sequence else np.zeros(0, np.int64)),
                lengths=torch.from_numpy(np.concatenate([j.lengths for j in sequence]) if sequence else np.zeros(0, np.int32)),
                stride=rows,
            ),
            {name: torch.from_numpy(v) for name, v in sequence_dense.items()},
        ), bad.masks

    def _sequences(
        self, table: pa.Table | pa.RecordBatch, source: str, bad: BadRows
    ) -> tuple[list[JaggedIds], dict[str, np.ndarray]]:
        """Each sequence's ids, truncated as its group's ``keep`` says, and each group's dense
        sequences, padded (:mod:`tzrun.data.sequence_dense`); rows whose aligned sequences
        differ in length, and with ``keep = "all"`` rows longer than ``max_len``, are bad
        (reported before truncation)."""
        out, dense = [], {}
        for group in self.specs.sequence_groups:
            jagged = [read_ids(table, f, source, bad, self._dictionaries) for f in group.features]
            first, base = group.features[0], jagged[0].lengths
            for feature, other in zip(group.features[1:], jagged[1:]):
                differ = other.lengths != base
                if differ.any():
                    row = int(np.flatnonzero(differ)[0])
                    bad.found(
                        f"{group.name}: sequences of different lengths",
                        differ,
                        lambda n, f=feature, o=other, r=row: f"column '{f.column}' (sequence '{f.name}' of group "
                        f"'{group.name}') has {o.lengths[r]} id(s) where column '{first.column}' has {base[r]} "
                        f"({n} of {bad.rows} rows of this batch differ); a group's sequences must be aligned",
                    )
            if group.keep == "all":
                _longer_than_max_len(group, first, base, bad)
            out += [_truncated(j, group.max_len, group.keep == "first") for j in jagged]
            if group.dense:
                dense[group.name] = read_sequence_dense(table, group, base, source, bad)
        return out, dense

    def padding(self, skipped: "SkippedRows | None" = None) -> "Batch":
        """A one-row batch of weight 0: what a rank with no data left feeds so that every rank
        runs the same number of steps (its collectives must match the other ranks'), and what
        a batch whose rows were all skipped becomes (with those rows' counts in ``skipped``)."""
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from tzrun.data.batch import Batch

        n = len(self._pooled)
        return Batch(
            torch.zeros(1, len(self.specs.dense)),
            KeyedJaggedTensor(
                keys=[f.name for f in self._pooled],
                values=torch.zeros(0, dtype=torch.int64),
                lengths=torch.zeros(n, dtype=torch.int32),
                weights=torch.zeros(0, dtype=torch.float32) if self._weighted else None,
                stride=1,
            ),
            {name: torch.zeros(1) for name in self.labels},
            torch.zeros(1),
            0,
            {name: torch.zeros(1, dtype=torch.int64) for name in self.groups},
            skipped,
            KeyedJaggedTensor(
                keys=self._sequence_keys,
                values=torch.zeros(0, dtype=torch.int64),
                lengths=torch.zeros(len(self._sequence_keys), dtype=torch.int32),
                stride=1,
            ),
            {g.name: torch.zeros(1, g.max_len, len(g.dense)) for g in self.specs.sequence_groups if g.dense},
        )


def _kjt_weights(jagged: JaggedIds, pooling: str) -> np.ndarray:
    """A feature's KeyedJaggedTensor weights in a weighted run: its own (or 1), divided by
    the row's id count for ``mean`` pooling (the tables of a weighted run are summed)."""
    weights = jagged.weights if jagged.weights is not None else np.ones(jagged.ids.size, dtype=np.float32)
    if pooling == "mean" and weights.size:
        weights = weights / np.repeat(jagged.lengths, jagged.lengths).astype(np.float32)
    return weights


def _longer_than_max_len(group: SequenceGroup, first: SparseFeature, lengths: np.ndarray, bad: BadRows) -> None:
    """Rows of a ``keep = "all"`` group longer than its ``max_len`` are bad rows."""
    longer = lengths > group.max_len
    if longer.any():
        row = int(np.flatnonzero(longer)[0])
        bad.found(
            f"{group.name}: longer than max_len",
            longer,
            lambda n: f"column '{first.column}' (sequence '{first.name}' of group '{group.name}') has {lengths[row]} "
            f"ids, more than max_len = {group.max_len}, and keep = \"all\" truncates none ({n} of {bad.rows} rows "
            "of this batch); raise max_len to the longest row, or set keep = \"last\" or \"first\"",
        )


def _truncated(jagged: JaggedIds, max_len: int, first: bool = False) -> JaggedIds:
    """Each row's last ``max_len`` ids, or its first ``max_len`` with ``first``."""
    lengths = jagged.lengths
    if not lengths.size or int(lengths.max()) <= max_len:
        return jagged
    keep = kept_positions(lengths, max_len, first)
    return JaggedIds(jagged.ids[keep], np.minimum(lengths, max_len).astype(np.int32))


def _kept(values: np.ndarray, lengths: np.ndarray, keep: np.ndarray, rows: int) -> np.ndarray:
    """The jagged ``values`` of the rows ``keep`` selects."""
    return values[keep] if values.size == rows and lengths.all() else values[np.repeat(keep, lengths)]
