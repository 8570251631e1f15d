"""``tzrec-run predict --export DIR``: score with an export's program through
:class:`tzrun_serving.Predictor` (the manifest's transforms, then the ``torch.export`` program),
reading and writing exactly as ``predict --checkpoint`` does (:mod:`.predict`).

The config gives the reader, ``data.on_bad_row`` and the batch size (``data.eval_batch_size``,
else ``data.batch_size``); the features come from the export's manifest. Each rank scores its
share with no collective but the final gather.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from tzrun.data.origin import located
from tzrun.errors import DataError
from tzrun.runner.predict import OutputColumns, PredictRequest, PredictResult, RankScores, prepared_sink, write_predictions
from tzrun.runner.predict_input import Chunk, drop_reader_marked, drop_rows, mapped, prefetched, rank_split, read_chunks

__all__ = ["predict_export", "open_export"]

log = logging.getLogger("tzrun")


def predict_export(session: Any, export_dir: str, request: PredictRequest) -> PredictResult:
    """Score ``request.input`` with the export at ``export_dir`` (a complete export, or a
    directory of versions with a ``latest`` pointer) and write the scores (collective: every
    rank of the job calls it; it starts ``session``).

    Raises:
        TzrunError: when ``export_dir`` is not a complete export.
        DataError: as for :func:`~tzrun.runner.predict.predict_checkpoint`.
        WriteError: when the output exists (without ``overwrite``).
    """
    from tzrun.data.reader_bad_rows import read_columns

    start = time.perf_counter()
    session.start(probes=())  # the export's program scores: no optimizer, loss, metric or stage is built
    info, d = session.info, session.cfg.data
    predictor = open_export(session.pm, export_dir, d.on_bad_row)
    started = time.perf_counter()
    batch_size = d.eval_batch_size or d.batch_size
    split = rank_split(session.reader, request.input, batch_size, info.rank, info.world_size)
    if info.rank == 0:
        log.info("predicting %s with the export %s over %d rank(s)", request.input, predictor.path, info.world_size)
    sink = prepared_sink(request, info.rank)
    columns = read_columns(session.reader, _raw_columns(predictor, request), d.on_bad_row)
    scores = RankScores(OutputColumns(request.outputs, predictor.per_row_outputs()))

    def encode(chunk: Chunk) -> tuple[Chunk, Any]:
        chunk = drop_reader_marked(chunk, scores.skipped)
        if chunk.table.num_rows == 0:
            return chunk, None
        try:
            inputs, kept, _ = predictor.encode(chunk.table, chunk.source)
        except DataError as exc:
            raise located(exc, chunk.origin, session.reader) from None
        dropped = np.ones(chunk.table.num_rows, dtype=bool)
        dropped[kept] = False
        chunk = drop_rows(chunk, dropped, skipped=scores.skipped, masks=_problems(session, chunk, dropped))
        return chunk, inputs or None

    # the reading thread reads and encodes the next chunks while this one runs the program
    for chunk, inputs in prefetched(mapped(read_chunks(session.reader, split, batch_size, columns), encode),
                                    d.prefetch_batches, d.reader_nice):
        if inputs is None or chunk.table.num_rows == 0:
            continue
        scores.outputs.add(predictor.run(inputs), chunk.table.num_rows)
        if request.keep_columns:
            scores.kept.append(chunk.table.select(list(request.keep_columns)))
        scores.rows += chunk.table.num_rows
    return write_predictions(sink, scores, request, str(predictor.path), (start, started), info.rank, info.world_size)


def open_export(pm: Any, export_dir: str, on_bad_row: str) -> Any:
    """The scorer of the export at ``export_dir``, from the first plugin that opens it.

    Raises:
        PluginError: when no plugin opens exports (the serving plugin is disabled or not installed).
    """
    predictor = pm.hook.tzrun_open_export(path=str(export_dir), on_bad_row=on_bad_row)
    if predictor is None:
        from tzrun.errors import PluginError

        raise PluginError(f"predict --export {export_dir}: no installed plugin reads exports (the first-party "
                         "tzrun_serving plugin is disabled or not installed: see tzrec-run plugins)")
    return predictor


def _raw_columns(predictor: Any, request: PredictRequest) -> list[str]:
    """The raw columns the export's features read, and the kept ones."""
    return list(dict.fromkeys([*predictor.columns(), *request.keep_columns]))


def _problems(session: Any, chunk: Chunk, dropped: np.ndarray) -> dict[str, np.ndarray]:
    """Why each row the export left out was bad, as the config's features see it (problem ->
    mask over the chunk's rows); rows it finds no problem with are named as the export's."""
    from tzrun.data.features import BatchBuilder

    if not dropped.any():
        return {}
    import pyarrow as pa

    rows = np.flatnonzero(dropped)
    try:
        _, masks = BatchBuilder(session.specs, (), None, (), on_bad_row="skip").build_rows(
            chunk.table.take(pa.array(rows)), chunk.source)
    except Exception:  # naming the problem is a courtesy; the rows are listed either way
        masks = {}
    out = {}
    for problem, mask in masks.items():
        full = np.zeros(len(dropped), dtype=bool)
        full[rows[mask]] = True
        out[problem] = full
    named = np.logical_or.reduce(list(out.values())) if out else np.zeros(len(dropped), dtype=bool)
    if (dropped & ~named).any():
        out["a bad value for the export's transforms"] = dropped & ~named
    return out
