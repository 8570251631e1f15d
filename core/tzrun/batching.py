"""Raw rows to a :class:`~tzrun.Batch` with the core's own feature code (hashing, vocabularies,
boundaries, dense fill/log1p/standardization, sequence truncation, ``data.on_bad_row``): what a
plugin that serves a model (an export's ``Predictor``) uses so that rows are made into inputs
exactly as in training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from tzrun.interfaces import DenseFeature, EmbeddingTable, SequenceGroup, SparseFeature

if TYPE_CHECKING:
    import pyarrow as pa

    from tzrun.data.batch import Batch, SkippedRows

__all__ = ["batch_builder", "SkippedRows"]


def batch_builder(dense: Sequence[DenseFeature], sparse: Sequence[SparseFeature], tables: Sequence[EmbeddingTable],
                  sequence_groups: Sequence[SequenceGroup] = (), sequence_tables: Sequence[EmbeddingTable] = (), *,
                  group_by: Sequence[str] = (), on_bad_row: str = "error") -> Callable[["pa.Table | pa.RecordBatch", str], "Batch"]:
    """A function ``(table, source) -> Batch`` for these features (no labels); ``group_by``
    columns are carried as the batch's group keys (integers, or strings hashed), and
    ``on_bad_row`` is ``"error"`` or ``"skip"`` as ``data.on_bad_row`` says. ``source`` (a file
    name) is named in a :class:`~tzrun.errors.DataError`."""
    from tzrun.data.features import BatchBuilder, FeatureSpecs

    specs = FeatureSpecs(tuple(dense), tuple(sparse), tuple(tables), tuple(sequence_groups), tuple(sequence_tables))
    return BatchBuilder(specs, (), None, tuple(group_by), on_bad_row=on_bad_row)


def __getattr__(name: str) -> object:
    if name == "SkippedRows":  # numpy and torch: loaded on first use
        from tzrun.data.batch import SkippedRows

        return SkippedRows
    raise AttributeError(f"module 'tzrun.batching' has no attribute {name!r}")
