"""``tzrec-run predict``: score unlabelled rows with a checkpoint's model and write the scores.

Labels, sample weights and group keys are not read: only the feature columns and the columns
``--keep-columns`` names. The model runs in eval mode on the config's device, with the weights
evaluation uses (the EMA averages when ``train.dense_optimizer.ema.use_for_eval``), under
``train.mixed_precision`` when set, in batches of ``data.eval_batch_size`` (else
``data.batch_size``) rows: the same forward as ``evaluate``, so its scores equal
``eval.save_predictions``'s on the same rows.

Each rank scores its share of the input (:mod:`.predict_input`) and the output is one dataset
in input order (:mod:`.predict_output`). Bad rows follow ``data.on_bad_row``: ``"error"``
stops with the file, line and column; ``"skip"`` leaves them out and lists each by its input
row number and problem.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator, Sequence

import attrs
import numpy as np
import pyarrow as pa

from tzrun.data.origin import located
from tzrun.errors import ConfigError, ConfigProblem, DataError
from tzrun.runner.predict_input import Chunk, Skipped, drop_reader_marked, drop_rows, mapped, prefetched, rank_split, read_chunks
from tzrun.runner.predict_output import PredictionSink

__all__ = ["PredictRequest", "PredictResult", "OutputColumns", "RankScores", "declared_per_row", "predict_checkpoint", "prepared_sink",
           "write_predictions"]

log = logging.getLogger("tzrun")


@attrs.frozen
class PredictRequest:
    """What to score and where to write it.

    Attributes:
        input: the rows (file, directory or glob; local or a URL), read by ``data.reader``.
        output: a ``.parquet`` file, or a directory of parts (see :mod:`.predict_output`).
        keep_columns: input columns copied next to the scores.
        outputs: model outputs to write; default: every output with one value per row.
            An output with several values per row (an embedding) is written as a list column.
        overwrite: replace an existing output.
    """

    input: str
    output: str
    keep_columns: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    overwrite: bool = False


@attrs.frozen
class PredictResult:
    """What :func:`predict_checkpoint` returns (totals over every rank on rank 0; this rank's
    own elsewhere).

    Attributes:
        output: where the scores are.
        rows: rows scored and written.
        skipped: rows left out (``data.on_bad_row = "skip"``).
        skipped_listing: where those rows are listed ("" when none).
        seconds: reading, scoring and writing time (from the end of the start-up).
        source: the checkpoint (or export) that scored them.
        start_seconds: the start-up before it: the checkpoint's restore (the model built,
            sharded and loaded) or the export's opening (its program loaded).
    """

    output: str
    rows: int
    skipped: int
    skipped_listing: str
    seconds: float
    source: str
    start_seconds: float = 0.0


class OutputColumns:
    """Collects the chosen model outputs of each scored row, as float32 columns.

    Args:
        wanted: the outputs to write (``--outputs``); empty: the outputs of one value per row.
        per_row: which outputs are one value per row, known before any batch (the model's
            declared outputs, an export's manifest); None when the model declares none, and
            the first batch's shapes decide.
    """

    def __init__(self, wanted: Sequence[str], per_row: Sequence[str] | None = None) -> None:
        self.wanted = tuple(wanted)
        self.per_row = None if per_row is None else tuple(per_row)
        self.names: tuple[str, ...] | None = None
        self.values: dict[str, list[np.ndarray]] = {}

    def add(self, outputs: dict[str, Any], rows: int) -> None:
        """Take the first ``rows`` rows of each chosen output (tensors or arrays)."""
        if self.names is None:
            self.names = self._choose(outputs)
        for name in self.names:
            value = outputs[name]
            value = value[:rows].detach().float().cpu().numpy() if hasattr(value, "detach") else np.asarray(value[:rows], dtype=np.float32)
            if value.ndim == 2 and value.shape[1] == 1:
                value = value[:, 0]
            if value.ndim > 2 or (value.ndim == 2 and name not in self.wanted) or value.shape[0] != rows:
                raise DataError(f"model output {name!r} has shape {list(value.shape)} for {rows} rows: not one value "
                                "(or one vector) per row; pass --outputs with the outputs to write")
            self.values.setdefault(name, []).append(value)

    def _choose(self, outputs: dict[str, Any]) -> tuple[str, ...]:
        if self.wanted:
            unknown = [n for n in self.wanted if n not in outputs]
            if unknown:
                raise DataError(f"--outputs {','.join(unknown)}: not an output of the model (outputs: {', '.join(outputs)})")
            return self.wanted
        if self.per_row is not None:
            if not self.per_row:
                raise DataError(f"the model declares no output with one value per row (outputs: {', '.join(outputs)}); "
                                "pass --outputs with the outputs to write (vectors are written as lists)")
            return self.per_row
        scalar = tuple(n for n, v in outputs.items() if len(v.shape) == 1 or (len(v.shape) == 2 and v.shape[1] == 1))
        if not scalar:
            raise DataError(f"the model has no output with one value per row (outputs: {', '.join(outputs)}); "
                            "pass --outputs with the outputs to write (vectors are written as lists)")
        return scalar

    def table(self) -> dict[str, pa.Array]:
        """The collected columns (none before the first row)."""
        out = {}
        for name in self.names or ():
            value = np.concatenate(self.values[name]) if self.values.get(name) else np.zeros(0, np.float32)
            if value.ndim == 2:
                out[name] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1])
            else:
                out[name] = pa.array(value)
        return out


@attrs.define
class RankScores:
    """One rank's scored rows: outputs, kept columns, and the rows left out."""

    outputs: OutputColumns
    kept: list[pa.Table] = attrs.field(factory=list)
    skipped: Skipped = attrs.field(factory=Skipped)
    rows: int = 0

    def table(self, keep: Sequence[str]) -> pa.Table:
        columns = self.outputs.table()
        clash = [k for k in keep if k in columns]
        if clash:
            raise DataError(f"--keep-columns {','.join(clash)}: named like a model output; keep other columns")
        if self.kept:
            kept = pa.concat_tables(self.kept, promote_options="permissive")
            columns.update({name: kept.column(name) for name in keep})
        return pa.table(columns) if columns else pa.table({})


@attrs.frozen
class _Scored:
    chunk: Chunk
    batch: Any


def _checkpoint_chunks(session: Any, builder: Any, request: PredictRequest, split: Any, batch_size: int,
                       scores: RankScores) -> Iterator[_Scored]:
    """This rank's chunks with their batches built (bad rows left out and listed)."""
    from tzrun.data.reader_bad_rows import read_columns

    d = session.cfg.data
    columns = read_columns(session.reader, list(dict.fromkeys([*session.specs.columns((), None), *request.keep_columns])),
                           d.on_bad_row)

    def build(chunk: Chunk) -> _Scored:
        chunk = drop_reader_marked(chunk, scores.skipped)
        if chunk.table.num_rows == 0:
            return _Scored(chunk, builder.padding())
        try:
            batch, masks = builder.build_rows(chunk.table, chunk.source)
        except DataError as exc:
            raise located(exc, chunk.origin, session.reader) from None
        dropped = np.logical_or.reduce(list(masks.values())) if masks else None
        return _Scored(drop_rows(chunk, dropped, skipped=scores.skipped, masks=masks), batch)

    chunks = read_chunks(session.reader, split, batch_size, columns)
    return prefetched(mapped(chunks, build), d.prefetch_batches, d.reader_nice)


def predict_checkpoint(session: Any, which: str, request: PredictRequest) -> PredictResult:
    """Score ``request.input`` with the checkpoint ``which`` names (``latest``, ``best``, a path
    or ``step-N``) and write the scores (collective: every rank of the job calls it; it starts
    ``session``).

    Raises:
        CheckpointError: for a missing, incomplete or damaged checkpoint, or one written with
            another ``[model]`` or ``[[features]]``.
        DataError: for a bad row under ``data.on_bad_row = "error"``, a missing column, an
            unknown ``--outputs`` name.
        WriteError: when the output exists (without ``overwrite``).
    """
    import torch

    from tzrun.data.features import BatchBuilder
    from tzrun.runner.checkpoint_eval import restore_checkpoint

    start = time.perf_counter()
    path, meta, ema = restore_checkpoint(session, which)
    started = time.perf_counter()
    info, cfg = session.info, session.cfg
    batch_size = cfg.data.eval_batch_size or cfg.data.batch_size
    split = rank_split(session.reader, request.input, batch_size, info.rank, info.world_size)
    if info.rank == 0:
        log.info("predicting %s with %s (step %s) over %d rank(s)%s", request.input, path, meta.get("step"),
                 info.world_size, " with the EMA weights" if ema else "")
    sink = prepared_sink(request, info.rank)
    model = session.built.model.module.model  # the user's model inside DMP and its losses
    autocast = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.train.mixed_precision]
    scores = RankScores(OutputColumns(request.outputs, declared_per_row(session.facts)))
    # no labels, sample weights or group keys: the rows are unlabelled
    builder = BatchBuilder(session.specs, (), None, (), on_bad_row=cfg.data.on_bad_row)
    session.built.model.eval()
    steps = 0
    with torch.no_grad(), session.built.update.eval_weights():
        for scored in _checkpoint_chunks(session, builder, request, split, batch_size, scores):
            outputs = _forward(model, scored.batch, info.device, autocast)
            steps += 1
            _collect(scores, scored, outputs, request.keep_columns)
        for _ in range(split.steps - steps):  # every rank runs as many forwards (TorchRec's collectives)
            _forward(model, builder.padding(), info.device, autocast)
    return write_predictions(sink, scores, request, str(path), (start, started), info.rank, info.world_size)


def declared_per_row(facts: Any) -> tuple[str, ...] | None:
    """The outputs the model declares (``register(..., outputs=...)``) that are one score per
    row: its probabilities and logits (``probs``, ``logits``, ``probs/<task>``, ...); None when
    it declares none. A batch's shapes cannot tell: a ``[B, B]`` similarity of a one-row
    batch is ``[1, 1]``."""
    declare = facts.registries["model"].get(facts.cfg.model.type, "model.type").extras.get("outputs")
    if declare is None:
        return None
    return tuple(n for n in declare(facts.cfg.model.config) if n.split("/", 1)[0] in ("probs", "logits"))


def _forward(model: Any, batch: Any, device: Any, autocast: Any) -> dict[str, Any]:
    import torch

    batch = batch.to(device)
    if autocast is None:
        return model(batch)
    with torch.autocast(device.type, dtype=autocast):
        return model(batch)


def _collect(scores: RankScores, scored: _Scored, outputs: dict[str, Any], keep: Sequence[str]) -> None:
    rows = scored.chunk.table.num_rows
    if rows == 0 or scored.batch.num_rows == 0:
        return
    scores.outputs.add(outputs, rows)
    if keep:
        scores.kept.append(scored.chunk.table.select(list(keep)))
    scores.rows += rows


def prepared_sink(request: PredictRequest, rank: int) -> PredictionSink:
    """The output, cleared by rank 0 before any rank writes (collective)."""
    sink = PredictionSink(request.output, request.overwrite)
    _on_rank0(rank, sink.prepare)
    return sink


def _on_rank0(rank: int, work: Any) -> Any:
    """``work()`` on rank 0, then a barrier (a failure there stops the other ranks through the
    watchdog, as every rank's error does); None on the other ranks."""
    result = work() if rank == 0 else None
    _barrier()
    return result


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _gather(value: Any, world_size: int) -> list[Any]:
    import torch.distributed as dist

    if world_size == 1 or not dist.is_initialized():
        return [value]
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, value)
    return everyone


def write_predictions(sink: PredictionSink, scores: RankScores, request: PredictRequest, source: str,
                      started: tuple[float, float], rank: int, world_size: int) -> PredictResult:
    """Write each rank's part, then (rank 0) make the output whole (collective); ``started``:
    when the start-up began and when it ended (``time.perf_counter()``)."""
    table = scores.table(request.keep_columns)
    part = sink.write_part(rank, table)
    gathered = _gather((part, scores.rows, scores.skipped.rows, scores.skipped.problems, table.schema.names), world_size)
    rows = sum(g[1] for g in gathered)
    skipped = pa.table({"row": pa.array([r for g in gathered for r in g[2]], pa.int64()),
                        "problem": pa.array([p for g in gathered for p in g[3]], pa.string())})
    record = {"rows": rows, "source": source, "input": request.input,
              "columns": next((g[4] for g in gathered if g[4]), [])}
    listing = _on_rank0(rank, lambda: sink.publish([g[0] for g in gathered if g[0]], skipped, record)) or ""
    return PredictResult(request.output, rows, skipped.num_rows, listing, time.perf_counter() - started[1], source,
                         started[1] - started[0])
