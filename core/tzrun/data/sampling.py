"""Samplers in the data path: items drawn from an item table and appended to each batch, or
each batch's rows replaced by the rows a sampler makes of them.

**Appended items** (a sampler registered as it is, an :class:`~tzrun.interfaces.ItemSampler`).
With ``[data.sampler]``, every batch a :class:`NegativesBuilder` builds has its own ``B`` rows
(labels, weights and groups stay ``[B]``) followed by the ``N = num_negatives`` items the
sampler drew: ``batch.dense`` is ``[B + N, D]`` and ``batch.sparse`` has stride ``B + N``, so
the item tower runs on ``B + N`` items in one embedding lookup, and TorchRec's train pipelines
move and distribute the sampled items with the rest of the batch. A model that uses them reads
``B = batch.weights.shape[0]`` (DSSM's ``sampled_similarity``); the ``N`` items are shared by
every row of the batch, as TorchEasyRec's negative sampler shares them.

The item table is encoded once, when the run starts, with the run's own features (hashing,
vocabularies, boundaries, bucket checks): a feature is *looked up* when the table has its input
column (and its ``weight_column``); the other features are empty (id features) or 0 (dense
features) for sampled items. A bad value in the table stops the run with an error naming the
table and the column.

**Expanded rows** (a sampler registered with ``expands_rows=True``, a
:class:`~tzrun.interfaces.RowSampler`). An :class:`ExpandingBuilder` hands each batch's input
rows (an Arrow table of every column the run reads) to the sampler, which returns the rows to
train on, as many as it makes, labels set (TDM: each row's ancestors and per-level negatives,
the user's columns repeated); those rows are encoded as an input batch is, so ``B`` is their
number and nothing is appended. A weight-0 padding batch is not expanded. Under
``data.on_bad_row = "skip"`` the rows left out are counted by the input rows they came from
(an input row with a bad value counts once, not once per copy), and the rows read are the
input's, so ``data.max_bad_row_fraction`` is a share of input rows.

**Determinism.** The items (or rows) of the batch at step ``index`` of pass ``epoch`` on rank ``rank``
are drawn with ``numpy.random.Generator(PCG64([seed, rank, epoch, index]))``: the same with or
without DataLoader workers or a prefetch thread, and the same when a run is resumed exactly
where it stopped. Ranks draw different items. Evaluation passes are pass 0, so every evaluation
sees the same negatives.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tzrun.data.features import BatchBuilder, FeatureSpecs
from tzrun.errors import DataError
from tzrun.interfaces import ItemSampler, RowSampler

if TYPE_CHECKING:
    from tzrun.config.schema import RunConfig
    from tzrun.data.batch import Batch
    from tzrun.kernel.registry import Registries

__all__ = ["SAMPLED_OUTPUT", "EncodedItems", "NegativesBuilder", "ExpandingBuilder", "batch_rng", "with_sampler"]

log = logging.getLogger(__name__)

#: The model output computed against the sampled items (``[B, 1 + num_negatives]``, the
#: positive in column 0); a model that can use ``[data.sampler]`` declares it among its outputs.
SAMPLED_OUTPUT = "sampled_similarity"

_PADDING_INDEX = 2**32  # the step index of padding batches (never a real step)
#: the column an :class:`ExpandingBuilder` adds to a batch's input rows: each row's index, which
#: the sampler carries into the rows it makes of it, so that bad rows count once per input row
INPUT_ROW = "__tzrun_input_row"
_UNBOUNDED_HINT = ', or set data.on_bad_row = "skip" to leave such rows out'


def batch_rng(seed: int, rank: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of the batch at step ``index`` of pass ``epoch`` on ``rank`` (``seed``:
    ``train.seed``); what every sampler draws with."""
    return np.random.Generator(np.random.PCG64([seed & (2**63 - 1), rank, epoch, index]))


class EncodedItems:
    """An item table encoded with a run's features, ready to be gathered by row.

    Args:
        items: one row per item.
        specs: the run's features.
        source: the table's file, named in errors.

    Raises:
        DataError: naming ``source`` and the column, for a looked-up feature with a bad value,
            or whose ``weight_column`` the table lacks.
    """

    def __init__(self, items: pa.Table, specs: FeatureSpecs, source: str) -> None:
        have = set(items.column_names)
        self.specs = specs
        self.sparse_names = [f.name for f in specs.sparse if f.column in have]
        self.dense_names = [f.name for f in specs.dense if f.column in have]
        for f in specs.sparse:
            if f.column in have and f.weight_column and f.weight_column not in have:
                raise DataError(f"{source}: column '{f.weight_column}' (the weight_column of feature '{f.name}') is "
                                f"missing from the item table, which has '{f.column}'; add it to the table")
        sub = FeatureSpecs(
            tuple(f for f in specs.dense if f.name in self.dense_names),
            tuple(f for f in specs.sparse if f.name in self.sparse_names),
            specs.tables,
        )
        try:
            encoded = BatchBuilder(sub, (), None)(items, source)
        except DataError as exc:
            text = str(exc).replace(_UNBOUNDED_HINT, "").replace(" rows of this batch", " rows of the table")
            raise DataError(f"{text} (in the item table of data.sampler; fix the table)") from None
        self.num_items = items.num_rows
        dense_index = {f.name: j for j, f in enumerate(specs.dense)}
        self._dense_columns = np.array([dense_index[n] for n in self.dense_names], dtype=np.int64)
        self._dense = encoded.dense.numpy()
        self._jagged: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        for name, jagged in encoded.sparse.to_dict().items():
            lengths = jagged.lengths().numpy().astype(np.int64)
            offsets = np.zeros(lengths.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            weights = jagged.weights_or_none()
            self._jagged[name] = (offsets, jagged.values().numpy(), None if weights is None else weights.numpy())

    def dense(self, rows: np.ndarray) -> np.ndarray:
        """``[len(rows), D]`` float32 dense features of the items ``rows`` (0 where not looked up)."""
        out = np.zeros((rows.size, len(self.specs.dense)), dtype=np.float32)
        if self._dense_columns.size:
            out[:, self._dense_columns] = self._dense[rows]
        return out

    def jagged(self, name: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(lengths, values, weights)`` of feature ``name`` for the items ``rows`` (no ids
        where it is not looked up)."""
        if name not in self._jagged:
            return np.zeros(rows.size, dtype=np.int32), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        offsets, values, weights = self._jagged[name]
        lengths = offsets[rows + 1] - offsets[rows]
        starts = np.repeat(offsets[rows] - (np.cumsum(lengths) - lengths), lengths)
        positions = starts + np.arange(int(lengths.sum()), dtype=np.int64)
        return lengths.astype(np.int32), values[positions], None if weights is None else weights[positions]


class NegativesBuilder:
    """A :class:`~tzrun.data.features.BatchBuilder` whose batches carry sampled items (see the
    module docstring).

    Args:
        builder: builds the batch's own rows.
        sampler: the run's item sampler.
        seed: ``train.seed``.
        rank: this process's rank.
    """

    def __init__(self, builder: BatchBuilder, sampler: ItemSampler, seed: int, rank: int) -> None:
        self.builder = builder
        self.sampler = sampler
        self.items = EncodedItems(sampler.items, builder.specs, sampler.source)
        self.seed, self.rank = seed, rank

    def rng(self, epoch: int, index: int) -> np.random.Generator:
        """The generator of the batch at step ``index`` of pass ``epoch`` on this rank."""
        return batch_rng(self.seed, self.rank, epoch, index)

    def build_at(self, table: pa.Table | pa.RecordBatch, source: str, epoch: int, index: int) -> "Batch":
        """The batch of ``table`` (step ``index`` of pass ``epoch``) with its sampled items."""
        return self.append(self.builder(table, source), self.rng(epoch, index), self._positives(table))

    def __call__(self, table: pa.Table | pa.RecordBatch, source: str) -> "Batch":
        """The batch of ``table`` with the items of step 0 of pass 0 (callers that know the
        batch's position use :meth:`build_at`)."""
        return self.build_at(table, source, 0, 0)

    def padding(self, skipped: Any = None) -> "Batch":
        """A weight-0 padding batch, with sampled items like every other batch."""
        return self.append(self.builder.padding(skipped), self.rng(0, _PADDING_INDEX), pa.table({}))

    def _positives(self, table: pa.Table | pa.RecordBatch) -> pa.Table:
        """The rows of ``table`` with a positive sample weight (all rows without a weight column)."""
        import pyarrow.compute as pc

        table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table
        name = self.builder.sample_weight
        if not name or name not in table.column_names:
            return table
        return table.filter(pc.fill_null(pc.greater(table.column(name), 0), False))

    def append(self, batch: "Batch", rng: np.random.Generator, positives: pa.Table) -> "Batch":
        """``batch`` with the items ``rng`` draws appended to its dense and sparse rows;
        ``positives`` are the batch's input rows of positive weight (see :meth:`ItemSampler.sample`)."""
        import torch

        from tzrun.data.batch import Batch

        rows = np.asarray(self.sampler.sample(rng, positives), dtype=np.int64)
        if rows.ndim != 1 or (rows.size and (rows.min() < 0 or rows.max() >= self.items.num_items)):
            raise DataError(f"{self.sampler.source}: the sampler returned rows outside [0, {self.items.num_items})")
        dense = torch.cat([batch.dense, torch.from_numpy(self.items.dense(rows))])
        sparse = _append_rows(batch.sparse, self.items, rows)
        return Batch(dense, sparse, batch.labels, batch.weights, batch.num_rows, batch.groups, batch.skipped, batch.sequence,
                     batch.sequence_dense)


def _append_rows(kjt: Any, items: EncodedItems, rows: np.ndarray) -> Any:
    """``kjt`` with the ids of the items ``rows`` after its own rows, key by key."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = kjt.keys()
    if not keys:
        return KeyedJaggedTensor(keys=[], values=kjt.values(), lengths=kjt.lengths(), stride=kjt.stride() + rows.size)
    own_lengths = kjt.lengths().view(len(keys), -1)
    own_values = torch.split(kjt.values(), kjt.length_per_key())
    weighted = kjt.weights_or_none() is not None
    own_weights = torch.split(kjt.weights(), kjt.length_per_key()) if weighted else ()
    values, lengths, weights = [], [], []
    for k, name in enumerate(keys):
        item_lengths, item_values, item_weights = items.jagged(name, rows)
        lengths += [own_lengths[k], torch.from_numpy(item_lengths).to(own_lengths.dtype)]
        values += [own_values[k], torch.from_numpy(item_values)]
        if weighted:
            extra = item_weights if item_weights is not None else np.ones(item_values.size, dtype=np.float32)
            weights += [own_weights[k], torch.from_numpy(extra)]
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values) if values else kjt.values(),
        lengths=torch.cat(lengths) if lengths else kjt.lengths(),
        weights=torch.cat(weights) if weighted else None,
        stride=kjt.stride() + rows.size,
    )


class ExpandingBuilder:
    """A :class:`~tzrun.data.features.BatchBuilder` that first lets a
    :class:`~tzrun.interfaces.RowSampler` replace each batch's rows (see the module docstring).

    Args:
        builder: encodes the rows the sampler returns.
        sampler: the run's row sampler.
        seed: ``train.seed``.
        rank: this process's rank.
    """

    def __init__(self, builder: BatchBuilder, sampler: RowSampler, seed: int, rank: int) -> None:
        self.builder, self.sampler = builder, sampler
        self.seed, self.rank = seed, rank
        self.specs = builder.specs

    def rng(self, epoch: int, index: int) -> np.random.Generator:
        """The generator of the batch at step ``index`` of pass ``epoch`` on this rank."""
        return batch_rng(self.seed, self.rank, epoch, index)

    def build_at(self, table: pa.Table | pa.RecordBatch, source: str, epoch: int, index: int) -> "Batch":
        """The batch of the rows the sampler makes of ``table`` (step ``index`` of pass ``epoch``).

        Raises:
            DataError: naming the sampler's source, when what it returns is not a table or
                lacks one of ``table``'s columns; and as the builder raises for a bad value.
        """
        from tzrun.data.batch import SkippedRows

        table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table
        out = self.expand(table.append_column(INPUT_ROW, pa.array(np.arange(table.num_rows))), self.rng(epoch, index))
        batch, masks = self.builder.build_rows(out.drop_columns([INPUT_ROW]), source)
        if masks:  # "skip": count the input rows behind the rows left out, once each
            origin = out.column(INPUT_ROW).to_numpy()
            dropped = np.logical_or.reduce(list(masks.values()))
            batch.skipped = SkippedRows(np.unique(origin[dropped]).size,
                                        {p: np.unique(origin[m]).size for p, m in masks.items()})
        batch.skipped.read = table.num_rows
        return batch

    def expand(self, table: pa.Table | pa.RecordBatch, rng: np.random.Generator) -> pa.Table:
        """The rows the sampler makes of ``table`` with ``rng``, checked."""
        table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table
        labels = [name for name in self.builder.labels if name not in self.builder.derived_labels]
        out = self.sampler.expand(rng, table, labels)
        if not isinstance(out, pa.Table):
            raise DataError(f"{self.sampler.source}: the sampler returned {type(out).__name__}, not a pyarrow.Table")
        missing = [c for c in table.column_names if c not in out.column_names]
        if missing:
            raise DataError(f"{self.sampler.source}: the sampler's rows lack the input column(s) {', '.join(missing)}")
        return out

    def __call__(self, table: pa.Table | pa.RecordBatch, source: str) -> "Batch":
        """The batch of ``table`` expanded with the generator of step 0 of pass 0 (callers that
        know the batch's position use :meth:`build_at`)."""
        return self.build_at(table, source, 0, 0)

    def padding(self, skipped: Any = None) -> "Batch":
        """A weight-0 padding batch (not expanded)."""
        return self.builder.padding(skipped)


def with_sampler(builder: BatchBuilder, cfg: "RunConfig", registries: "Registries", rank: int) -> Any:
    """``builder`` as it is without ``[data.sampler]``; otherwise an :class:`ExpandingBuilder`
    over a sampler registered with ``expands_rows=True``, or a :class:`NegativesBuilder` over
    any other (built here: the sampler reads its tables now).

    Raises:
        DataError: for a bad item table (naming the file and the column).
    """
    if cfg.data.sampler is None:
        return builder
    component = cfg.data.sampler
    entry = registries["sampler"].get(component.type, "data.sampler.type")
    sampler = entry.build(component.config)
    if entry.extras.get("expands_rows"):
        if rank == 0:
            log.info("data.sampler: each batch's rows are expanded by sampler '%s' (%s)", component.type, sampler.source)
        return ExpandingBuilder(builder, sampler, cfg.train.seed, rank)
    out = NegativesBuilder(builder, sampler, cfg.train.seed, rank)
    if rank == 0:
        items = out.items
        missing = [f.name for f in builder.specs.sparse if f.name not in items.sparse_names]
        missing += [f.name for f in builder.specs.dense if f.name not in items.dense_names]
        log.info("data.sampler: %d sampled items per batch from %s (%d items); looked up: %s; not in the item "
                 "table (empty for sampled items): %s", sampler.num_negatives, sampler.source, items.num_items,
                 ", ".join(items.sparse_names + items.dense_names) or "none", ", ".join(missing) or "none")
    return out
