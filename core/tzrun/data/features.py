"""Feature specs from the config, and Arrow record batches -> :class:`~tzrun.data.batch.Batch`.

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

from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.config.schema import FeaturesConfig, SparseFeatureConfig
from tzrun.config.sequences import resolved_sequences, table_name, unpooled_tables
from tzrun.data.hashing import fnv1a_64, hash_to_buckets, is_hashable
from tzrun.data.ids import JaggedIds, jagged_ids
from tzrun.data.labels import DerivedLabel, LabelDomain, derive, violations
from tzrun.config.vocab import read_vocab_file
from tzrun.errors import BadRowError, DataError
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
        names += [f.column for g in self.sequence_groups for f in g.features] + list(labels)
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
        f.boundaries, f.separator, f.weight_column, f.pooling,
    )


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
    dense = tuple(DenseFeature(f.name, f.column or f.name, f.fill_value, f.log1p, f.mean, f.std) for f in cfg.dense)
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
        SequenceGroup(group.name, group.max_len, tuple(s for g, s, _ in sequences if g == i), tuple(group.query))
        for i, group in enumerate(cfg.sequence)
    )
    sequence_tables = tuple(EmbeddingTable(n, s, d, tuple(u)) for n, (s, d, u, _) in tables.items() if n in unpooled)
    return FeatureSpecs(dense, tuple(spec for spec, _, _ in sparse), pooled, groups, sequence_tables)


class _BadRows:
    """The bad rows of one batch: reported at once (``error``) or collected (``skip``)."""

    def __init__(self, source: str, rows: int, skip: bool) -> None:
        self.source, self.rows, self.skip = source, rows, skip
        self.masks: dict[str, np.ndarray] = {}

    def found(self, problem: str, bad: np.ndarray, message: Callable[[int], str]) -> None:
        """Rows ``bad`` (a mask over the batch's rows) have ``problem`` (``"<column>: <what>"``);
        ``message(count)`` is the error's text after the file name."""
        if not self.skip:
            detail = f'{message(int(np.count_nonzero(bad)))}, or set data.on_bad_row = "skip" to leave such rows out'
            raise BadRowError(f"{self.source}: {detail}", int(np.flatnonzero(bad)[0]), detail)
        seen = self.masks.get(problem)
        self.masks[problem] = bad if seen is None else seen | bad

    def dropped(self) -> np.ndarray | None:
        """The rows to leave out (``None`` when there are none)."""
        if not self.masks:
            return None
        return np.logical_or.reduce(list(self.masks.values()))

    def counts(self, dropped: np.ndarray) -> "SkippedRows":
        from tzrun.data.batch import SkippedRows

        return SkippedRows(int(np.count_nonzero(dropped)), {p: int(np.count_nonzero(m)) for p, m in self.masks.items()})


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
        # feature name -> (the last dictionary seen, its buckets): see _hashed_dictionary
        self._dictionary_buckets: dict[str, tuple[pa.Array, np.ndarray]] = {}

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
        bad = _BadRows(source, rows, self.on_bad_row == "skip")
        dense = np.zeros((rows, len(self.specs.dense)), dtype=np.float32)
        for j, feature in enumerate(self.specs.dense):
            dense[:, j] = self._floats(table, feature.column, source, fill=feature.fill_value)[0]
        if not np.isfinite(dense).all():
            self._nonfinite_dense(dense, bad)
        for j, feature in enumerate(self.specs.dense):
            if feature.log1p:
                np.log1p(np.maximum(dense[:, j], 0.0), out=dense[:, j])
            if feature.mean != 0.0 or feature.std != 1.0:
                dense[:, j] = (dense[:, j] - np.float32(feature.mean)) / np.float32(feature.std)
        values, lengths, id_weights = [], [], []
        for feature in self._pooled:
            jagged = self._ids(table, feature, source, bad)
            values.append(jagged.ids)
            lengths.append(jagged.lengths)
            if self._weighted:
                id_weights.append(_kjt_weights(jagged, feature.pooling))
        sequence = self._sequences(table, source, bad) + [self._ids(table, f, source, bad) for f in self.specs.unpooled]
        labels = {name: self._label(table, name, source, bad) for name in self.labels}
        if self.sample_weight:
            weights = self._checked(table, self.sample_weight, " (sample_weight)", source, bad, negative=True)
        else:
            weights = np.ones(rows, dtype=np.float32)
        groups = {name: self._group_keys(table, name, source, bad) for name in self.groups}

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
        ), bad.masks

    def _sequences(self, table: pa.Table | pa.RecordBatch, source: str, bad: _BadRows) -> list[JaggedIds]:
        """Each sequence's ids, truncated to its group's last ``max_len``; rows whose aligned
        sequences differ in length are bad (reported before truncation)."""
        out = []
        for group in self.specs.sequence_groups:
            jagged = [self._ids(table, f, source, bad) for f in group.features]
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
            out += [_truncated(j, group.max_len) for j in jagged]
        return out

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
        )

    def _hashed_dictionary(self, column: pa.DictionaryArray, feature: SparseFeature) -> JaggedIds:
        """Ids of a hashed feature read as a dictionary (``dictionary_strings`` of the Parquet
        reader): the dictionary is hashed once, and cached while the next batches have an equal
        one (every batch of a row group shares it), then each row takes its value's bucket; a
        null row has no id, as when the strings are read one by one."""
        dictionary = column.dictionary
        cached = self._dictionary_buckets.get(feature.name)
        # equal values, equal buckets; Arrow answers at once when both share their memory
        if cached is not None and cached[0].equals(dictionary):
            buckets = cached[1]
        else:
            buckets = hash_to_buckets(dictionary, feature.hash_bucket_size)
            self._dictionary_buckets[feature.name] = (dictionary, buckets)
        indices = column.indices
        lengths = np.ones(len(column), dtype=np.int32)
        if column.null_count:
            lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
            indices = indices.drop_null()
        return JaggedIds(buckets[indices.to_numpy(zero_copy_only=False)], lengths)

    @staticmethod
    def _column(table: pa.Table | pa.RecordBatch, name: str, source: str, dictionary: bool = False) -> pa.Array:
        """Column ``name`` as one array; a dictionary-encoded one decoded, unless ``dictionary``."""
        index = table.schema.get_field_index(name)
        if index < 0:
            raise DataError(
                f"{source}: column '{name}' is missing (columns: {', '.join(table.schema.names)}); "
                "fix the feature's column or the data"
            )
        column = table.column(index)
        if isinstance(column, pa.ChunkedArray):
            # chunks of a dictionary column may hold different dictionaries: Arrow unifies them
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type) and not dictionary:
            column = column.dictionary_decode()
        return column

    def _floats(
        self, table: pa.Table | pa.RecordBatch, name: str, source: str, fill: float | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """A numeric column as float32 with its nulls set to ``fill``, or (``fill=None``) to NaN
        and their mask returned next to it (``None`` when there are none)."""
        column = self._column(table, name, source)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)):
            raise DataError(f"{source}: column '{name}' has type {column.type}; expected a number")
        column = column.cast(pa.float32())
        nulls = None
        if column.null_count:
            if fill is None:
                nulls = column.is_null().to_numpy(zero_copy_only=False)
            else:
                column = pc.fill_null(column, fill)
        return np.array(column.to_numpy(zero_copy_only=False), dtype=np.float32, copy=True), nulls

    def _nonfinite_dense(self, dense: np.ndarray, bad: _BadRows) -> None:
        """Set NaN dense values to their features' ``fill_value``; report infinite ones."""
        for j, feature in enumerate(self.specs.dense):
            values = dense[:, j]
            values[np.isnan(values)] = feature.fill_value
            inf = np.isinf(values)
            if inf.any():
                first = values[inf][0]
                bad.found(
                    f"{feature.column}: inf",
                    inf,
                    lambda n: f"column '{feature.column}' (dense feature '{feature.name}') has {n} infinite value(s) "
                    f"in {bad.rows} rows of this batch (first: {first}); fix the data",
                )

    def _label(self, table: pa.Table | pa.RecordBatch, name: str, source: str, bad: _BadRows) -> np.ndarray:
        """A label's values (a derived one computed from its source), its bad values reported:
        null, NaN, infinite, or outside a domain its losses and metrics need."""
        derived = self.derived_labels.get(name)
        if derived is None:
            values, nulls = self._floats(table, name, source)
            column, role = name, ""
        else:
            values, nulls = derive(self._column(table, derived.source, source), derived, source, bad.found)
            column, role = derived.source, f" ({derived.expression})"
        values = self._reported(values, nulls, column, role, bad)
        for domain, outside in violations(values, self.label_domains.get(name, ())):
            first = values[outside][0]
            fix = (f'derive a label with [[data.derived_labels]] (e.g. name = "clicked", source = "{column}", '
                   'op = ">=", value = 4) and name it in data.labels and the loss, or pick a loss for these labels'
                   if domain.domain == "binary" else "fix the data or pick a loss for these labels")
            bad.found(
                f"{column}: outside {domain.domain}",
                outside,
                lambda n: f"column '{column}'{role} has {n} label(s) outside the {domain.domain} domain in {bad.rows} "
                f"rows of this batch (first: {first:g}); {domain.describe()}: {fix}",
            )
        return values

    def _checked(
        self, table: pa.Table | pa.RecordBatch, name: str, role: str, source: str, bad: _BadRows, negative: bool = False
    ) -> np.ndarray:
        """A sample-weight column (``negative=True``), its bad values reported."""
        values, nulls = self._floats(table, name, source)
        return self._reported(values, nulls, name, role, bad, negative)

    @staticmethod
    def _reported(
        values: np.ndarray, nulls: np.ndarray | None, name: str, role: str, bad: _BadRows, negative: bool = False
    ) -> np.ndarray:
        """``values`` of a label (``negative=False``) or sample-weight column, with its null,
        NaN, infinite (and for weights, negative) values reported."""
        finite = np.isfinite(values)
        if nulls is None and finite.all() and not (negative and values.size and values.min() < 0):
            return values
        need = "sample weights must be finite and >= 0" if negative else "labels must be finite numbers"
        where = f"column '{name}'{role} has"
        rows = bad.rows
        if nulls is not None:
            bad.found(f"{name}: null", nulls, lambda n: f"{where} {n} null value(s) in {rows} rows of this batch; {need}")
        nan = np.isnan(values) if nulls is None else np.isnan(values) & ~nulls
        if nan.any():
            bad.found(f"{name}: NaN", nan, lambda n: f"{where} {n} NaN value(s) in {rows} rows of this batch; {need}")
        inf = np.isinf(values)
        if inf.any():
            first = values[inf][0]
            bad.found(
                f"{name}: inf", inf, lambda n: f"{where} {n} infinite value(s) in {rows} rows of this batch (first: {first}); {need}"
            )
        below = finite & (values < 0) if negative else None
        if below is not None and below.any():
            first = values[below][0]
            bad.found(
                f"{name}: negative", below, lambda n: f"{where} {n} negative value(s) in {rows} rows of this batch (first: {first}); {need}"
            )
        return values

    def _group_keys(self, table: pa.Table | pa.RecordBatch, name: str, source: str, bad: _BadRows) -> np.ndarray:
        column = self._column(table, name, source)
        is_int = pa.types.is_integer(column.type)
        if not (is_int or pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type)):
            raise DataError(f"{source}: column '{name}' (a group_by key) has type {column.type}; expected integers or strings")
        if column.null_count:
            bad.found(
                f"{name}: null",
                column.is_null().to_numpy(zero_copy_only=False),
                lambda n: f"column '{name}' (a group_by key) has {n} null value(s) in {bad.rows} rows of this batch; fill them",
            )
            if is_int:
                column = column.fill_null(0)
        if is_int:
            return np.array(column.to_numpy(zero_copy_only=False), dtype=np.int64, copy=True)
        return fnv1a_64(column).view(np.int64)

    def _ids(self, table: pa.Table | pa.RecordBatch, feature: SparseFeature, source: str, bad: _BadRows) -> JaggedIds:
        column = self._column(table, feature.column, source, dictionary=True)
        if pa.types.is_dictionary(column.type):
            if _hashes_dictionary(feature, column):
                return self._hashed_dictionary(column, feature)
            column = column.dictionary_decode()
        weights = self._column(table, feature.weight_column, source) if feature.weight_column else None
        jagged = jagged_ids(column, feature, source, weights)
        ids, rows = jagged.ids, len(column)
        limit = feature.num_buckets
        if limit is not None and ids.size and (ids.min() < 0 or ids.max() >= limit):
            outside = (ids < 0) | (ids >= limit)
            rows_outside = np.zeros(rows, dtype=bool)
            rows_outside[np.repeat(np.arange(rows), jagged.lengths)[outside]] = True
            first = ids[outside][0]
            bad.found(
                f"{feature.column}: id outside [0, {limit})",
                rows_outside,
                lambda n: f"column '{feature.column}' (feature '{feature.name}'): id {first} is outside [0, {limit}) "
                f"({n} of {rows} rows of this batch have an id outside it); raise num_buckets or use hash_bucket_size",
            )
        return jagged


def _hashes_dictionary(feature: SparseFeature, column: pa.DictionaryArray) -> bool:
    """Whether a dictionary column's ids come from hashing its dictionary once: a hashed
    feature of one string (or binary) value per row, without weights, whose dictionary holds
    no null (a null there would be a row with no id)."""
    return (
        feature.hash_bucket_size is not None
        and feature.separator is None
        and feature.weight_column is None
        and is_hashable(column.type.value_type)
        and column.dictionary.null_count == 0
    )


def _kjt_weights(jagged: JaggedIds, pooling: str) -> np.ndarray:
    """A feature's KeyedJaggedTensor weights in a weighted run: its own (or 1), divided by
    the row's id count for ``mean`` pooling (the tables of a weighted run are summed)."""
    weights = jagged.weights if jagged.weights is not None else np.ones(jagged.ids.size, dtype=np.float32)
    if pooling == "mean" and weights.size:
        weights = weights / np.repeat(jagged.lengths, jagged.lengths).astype(np.float32)
    return weights


def _truncated(jagged: JaggedIds, max_len: int) -> JaggedIds:
    """The last ``max_len`` ids of each row (a list's end is its most recent entry)."""
    lengths = jagged.lengths
    if not lengths.size or int(lengths.max()) <= max_len:
        return jagged
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = np.arange(jagged.ids.size) - starts
    keep = position >= np.repeat(lengths, lengths) - max_len
    return JaggedIds(jagged.ids[keep], np.minimum(lengths, max_len).astype(np.int32))


def _kept(values: np.ndarray, lengths: np.ndarray, keep: np.ndarray, rows: int) -> np.ndarray:
    """The jagged ``values`` of the rows ``keep`` selects."""
    return values[keep] if values.size == rows and lengths.all() else values[np.repeat(keep, lengths)]
