"""Feature specs from the config, and Arrow record batches -> :class:`~tzrun.data.batch.Batch`.

Id features: an integer column with ``num_buckets`` must hold ids in ``[0, num_buckets)`` (an id
outside is an error naming the file and column); a column with ``hash_bucket_size`` is hashed
with FNV-1a 64 over the UTF-8 bytes of strings (see :mod:`tzrun.data.hashing`), or taken modulo
``hash_bucket_size`` for integers. List columns give several ids per row; a null gives none.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.config.schema import FeaturesConfig
from tzrun.errors import DataError
from tzrun.interfaces import DenseFeature, EmbeddingTable, SparseFeature

__all__ = ["FeatureSpecs", "feature_specs", "BatchBuilder"]


@attrs.frozen
class FeatureSpecs:
    """The features of a run, derived from ``[features]``."""

    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]
    tables: tuple[EmbeddingTable, ...]

    def columns(self, labels: Sequence[str], sample_weight: str | None, groups: Sequence[str] = ()) -> list[str]:
        """Every input column a batch needs, each once, in a stable order."""
        names = [f.column for f in self.dense] + [f.column for f in self.sparse] + list(labels)
        if sample_weight:
            names.append(sample_weight)
        names.extend(groups)
        return list(dict.fromkeys(names))


def feature_specs(cfg: FeaturesConfig) -> FeatureSpecs:
    """Derive dense/sparse feature specs and embedding tables from a checked config."""
    dense = tuple(DenseFeature(f.name, f.column or f.name, f.fill_value, f.log1p) for f in cfg.dense)
    sparse = []
    tables: dict[str, tuple[int, int, list[str], str]] = {}
    for f in cfg.sparse:
        table = f.table or f"{f.name}_emb"
        spec = SparseFeature(f.name, f.column or f.name, table, f.num_buckets, f.hash_bucket_size)
        sparse.append(spec)
        size, dim, users, pooling = tables.setdefault(table, (spec.num_embeddings, f.embedding_dim, [], f.pooling))
        users.append(f.name)
    return FeatureSpecs(
        dense,
        tuple(sparse),
        tuple(EmbeddingTable(n, s, d, tuple(u), p) for n, (s, d, u, p) in tables.items()),
    )


class BatchBuilder:
    """Turns Arrow record batches into :class:`Batch` objects for one run's features.

    Args:
        specs: the run's features.
        labels: label columns.
        sample_weight: the sample-weight column, if any.
        groups: group-key columns (``group_by`` of losses and metrics): integers, or strings
            hashed with FNV-1a 64.
    """

    def __init__(
        self, specs: FeatureSpecs, labels: Sequence[str], sample_weight: str | None, groups: Sequence[str] = ()
    ) -> None:
        self.specs = specs
        self.labels = tuple(labels)
        self.sample_weight = sample_weight
        self.groups = tuple(dict.fromkeys(groups))

    def __call__(self, table: pa.Table | pa.RecordBatch, source: str) -> "Batch":
        """Build a batch from ``table``; ``source`` (a file name) is named in errors.

        Raises:
            DataError: naming ``source`` and the column, when a column is missing, has the
                wrong type, holds a null label or an id outside its table.
        """
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from tzrun.data.batch import Batch

        rows = table.num_rows
        dense = np.zeros((rows, len(self.specs.dense)), dtype=np.float32)
        for j, feature in enumerate(self.specs.dense):
            dense[:, j] = self._floats(table, feature.column, source, fill=feature.fill_value)
            if feature.log1p:
                np.log1p(np.maximum(dense[:, j], 0.0), out=dense[:, j])
        values, lengths = [], []
        for feature in self.specs.sparse:
            ids, lens = self._ids(table, feature, source)
            values.append(ids)
            lengths.append(lens)
        sparse = KeyedJaggedTensor(
            keys=[f.name for f in self.specs.sparse],
            values=torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
            lengths=torch.from_numpy(np.concatenate(lengths) if lengths else np.zeros(0, np.int32)),
            stride=rows,
        )
        labels = {name: torch.from_numpy(self._floats(table, name, source, fill=None)) for name in self.labels}
        if self.sample_weight:
            weights = self._floats(table, self.sample_weight, source, fill=None)
            if (weights < 0).any():
                raise DataError(f"{source}: column '{self.sample_weight}' (sample_weight) has negative weights")
        else:
            weights = np.ones(rows, dtype=np.float32)
        groups = {name: torch.from_numpy(self._group_keys(table, name, source)) for name in self.groups}
        return Batch(torch.from_numpy(dense), sparse, labels, torch.from_numpy(weights), rows, groups)

    def padding(self) -> "Batch":
        """A one-row batch of weight 0: what a rank with no data left feeds so that every rank
        runs the same number of steps (its collectives must match the other ranks')."""
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from tzrun.data.batch import Batch

        n = len(self.specs.sparse)
        return Batch(
            torch.zeros(1, len(self.specs.dense)),
            KeyedJaggedTensor(
                keys=[f.name for f in self.specs.sparse],
                values=torch.zeros(0, dtype=torch.int64),
                lengths=torch.zeros(n, dtype=torch.int32),
                stride=1,
            ),
            {name: torch.zeros(1) for name in self.labels},
            torch.zeros(1),
            0,
            {name: torch.zeros(1, dtype=torch.int64) for name in self.groups},
        )

    @staticmethod
    def _column(table: pa.Table | pa.RecordBatch, name: str, source: str) -> pa.Array:
        index = table.schema.get_field_index(name)
        if index < 0:
            raise DataError(
                f"{source}: column '{name}' is missing (columns: {', '.join(table.schema.names)}); "
                "fix the feature's column or the data"
            )
        column = table.column(index)
        return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column

    def _floats(self, table: pa.Table | pa.RecordBatch, name: str, source: str, fill: float | None) -> np.ndarray:
        column = self._column(table, name, source)
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)):
            raise DataError(f"{source}: column '{name}' has type {column.type}; expected a number")
        if column.null_count:
            if fill is None:
                raise DataError(f"{source}: column '{name}' has {column.null_count} null value(s); labels and weights cannot be null")
            column = pc.fill_null(column, fill)
        return np.array(column.cast(pa.float32()).to_numpy(zero_copy_only=False), dtype=np.float32, copy=True)

    def _group_keys(self, table: pa.Table | pa.RecordBatch, name: str, source: str) -> np.ndarray:
        column = self._column(table, name, source)
        if column.null_count:
            raise DataError(f"{source}: column '{name}' (a group_by key) has {column.null_count} null value(s); fill them")
        if pa.types.is_integer(column.type):
            return np.array(column.to_numpy(zero_copy_only=False), dtype=np.int64, copy=True)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type):
            from tzrun.data.hashing import fnv1a_64

            return fnv1a_64(column).view(np.int64)
        raise DataError(f"{source}: column '{name}' (a group_by key) has type {column.type}; expected integers or strings")

    def _ids(self, table: pa.Table | pa.RecordBatch, feature: SparseFeature, source: str) -> tuple[np.ndarray, np.ndarray]:
        column = self._column(table, feature.column, source)
        rows = len(column)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            lengths = np.array(column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int32)
            flat = column.flatten()
        else:
            lengths = np.ones(rows, dtype=np.int32)
            if column.null_count:
                lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
            flat = column.drop_null() if column.null_count else column
        ids = self._bucketize(flat, feature, source)
        return ids, lengths

    @staticmethod
    def _bucketize(flat: pa.Array, feature: SparseFeature, source: str) -> np.ndarray:
        where = f"{source}: column '{feature.column}' (feature '{feature.name}')"
        if feature.hash_bucket_size is not None:
            if pa.types.is_integer(flat.type):
                return np.mod(flat.to_numpy(zero_copy_only=False).astype(np.int64), feature.hash_bucket_size)
            if pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type) or pa.types.is_binary(flat.type):
                from tzrun.data.hashing import hash_to_buckets

                return hash_to_buckets(flat, feature.hash_bucket_size)
            raise DataError(f"{where} has type {flat.type}; hash_bucket_size needs strings or integers")
        if not pa.types.is_integer(flat.type):
            raise DataError(
                f"{where} has type {flat.type}; num_buckets needs integer ids (use hash_bucket_size for strings)"
            )
        ids = np.array(flat.to_numpy(zero_copy_only=False), dtype=np.int64, copy=True)
        if ids.size and (ids.min() < 0 or ids.max() >= feature.num_buckets):
            bad = ids[(ids < 0) | (ids >= feature.num_buckets)][0]
            raise DataError(
                f"{where}: id {bad} is outside [0, {feature.num_buckets}); raise num_buckets or use hash_bucket_size"
            )
        return ids
