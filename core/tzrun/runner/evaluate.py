"""An evaluation pass: the model in eval mode over the eval input, metrics over all ranks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from tzrun.io.files import EVAL_RESULTS, append_jsonl, keep_jsonl
from tzrun.interfaces import EvalResult, RunContext
from tzrun.kernel.registry import Registries
from tzrun.runner.slots import MetricSlot
from tzrun.io.storage import as_path, is_remote

__all__ = ["evaluate", "update_metric", "append_eval_result", "trim_eval_results"]


def evaluate(
    run: RunContext,
    batches: Iterator[Any],
    slots: Sequence[MetricSlot],
    registries: Registries,
    make_pipeline: Any,
    step: int,
) -> EvalResult:
    """Run one evaluation pass (collective) and return every metric over all ranks' rows.

    Every loss is reported too, as ``loss/<name>``: its mean over rows (each batch's loss
    weighted by its real row count). With ``eval.save_predictions``, each rank writes what it
    saw to ``predictions/step-N/rank-R.parquet``: every model output, ``label/<column>``,
    ``weight`` and ``group/<column>`` (the int64 ``group_by`` keys).
    """
    import torchmetrics

    metrics = {
        slot.name: registries["metric"].get(slot.component.type, "metrics").build(slot.component.config).to(run.device)
        for slot in slots
    }
    loss_means: dict[str, torchmetrics.MeanMetric] = {}
    save = run.config.eval.save_predictions
    saved: dict[str, list[torch.Tensor]] = {}
    rows = 0
    started = time.perf_counter()
    model = run.model
    model.eval()
    pipeline = make_pipeline()
    try:
        with torch.no_grad():
            while True:
                try:
                    out = pipeline.progress(batches)
                except StopIteration:
                    break
                losses, outputs, labels, weights, num_rows = out.losses, out.outputs, out.labels, out.weights, out.num_rows
                rows += num_rows
                for slot in slots:
                    update_metric(metrics[slot.name], slot, out, step=step)
                for name, value in losses.items():
                    mean = loss_means.setdefault(name, torchmetrics.MeanMetric().to(run.device))
                    mean.update(value, weight=float(num_rows))
                if save and num_rows:
                    for key, tensor in [*outputs.items(), *((f"label/{k}", v) for k, v in labels.items()), ("weight", weights)]:
                        saved.setdefault(key, []).append(tensor.detach().float().cpu())
                    for key, tensor in out.groups.items():
                        saved.setdefault(f"group/{key}", []).append(tensor.detach().cpu())
    finally:
        if hasattr(pipeline, "detach"):
            pipeline.detach()
        model.train()
    values = {name: float(metric.compute()) for name, metric in metrics.items()}
    values.update({f"loss/{name}": float(mean.compute()) for name, mean in loss_means.items()})
    total_rows = torch.tensor([rows], dtype=torch.int64)
    if torch.distributed.is_initialized() and run.world_size > 1:
        torch.distributed.all_reduce(total_rows)
    if save:
        _save_predictions(run.model_dir, step, run.rank, saved)
    return EvalResult(step=step, metrics=values, rows=int(total_rows.item()), seconds=time.perf_counter() - started)


def append_eval_result(model_dir: Path, result: EvalResult, **extra: Any) -> None:
    """Append one evaluation to ``model_dir/eval_results.jsonl``: ``step``, ``rows``, every
    metric, then ``extra`` (e.g. ``checkpoint`` and ``command`` for ``tzrec-run evaluate``)."""
    append_jsonl(as_path(model_dir) / EVAL_RESULTS, {"step": result.step, "rows": result.rows, **result.metrics, **extra})


def trim_eval_results(model_dir: Path, step: int) -> int:
    """Drop the training run's evaluations after ``step`` from ``eval_results.jsonl`` (on
    resume from the checkpoint of ``step``: an evaluation whose checkpoint was never completed
    runs again). ``tzrec-run evaluate`` lines are kept. Returns how many lines were dropped."""
    return keep_jsonl(as_path(model_dir) / EVAL_RESULTS, lambda r: "command" in r or int(r.get("step", 0)) <= step)


def update_metric(metric: Any, slot: MetricSlot, out: Any, step: int | None = None) -> None:
    """Feed one step's output to a metric: ``update(prediction, label, weight[, group=...])``.

    Raises:
        NonFinitePredictionError: when the metric refuses NaN or infinite predictions (named
            with the output, the metric and ``step``, the evaluation's step).
    """
    prediction, label = out.outputs[slot.prediction], out.labels[slot.label]
    try:
        if slot.group_by is None:
            metric.update(prediction, label, out.weights)
        else:
            metric.update(prediction, label, out.weights, group=out.groups[slot.group_by])
    except ValueError:
        bad = int((~torch.isfinite(prediction)).sum())  # read only after a refusal: no sync per batch
        if not bad:
            raise
        from tzrun.errors import NonFinitePredictionError

        where = "training" if step is None else f"the evaluation at step {step}"
        raise NonFinitePredictionError(
            f"{where}: output {slot.prediction!r} holds {bad} NaN or infinite prediction(s) of "
            f"{prediction.numel()} (metric {slot.name!r}): the model diverged; the checkpoints already "
            "written are unchanged: resume from an earlier one with a lower learning rate, or set "
            'train.on_nonfinite_loss = "skip"'
        ) from None


def _save_predictions(model_dir: Path, step: int, rank: int, saved: dict[str, list[torch.Tensor]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = as_path(model_dir) / "predictions" / f"step-{step}"
    out.mkdir(parents=True, exist_ok=True)
    columns = {k: torch.cat(v).numpy() for k, v in saved.items()}
    weights = columns.get("weight")
    if weights is not None:
        keep = weights > 0
        columns = {k: v[keep] for k, v in columns.items()}
    target = out / f"rank-{rank}.parquet"
    if is_remote(target):
        with target.open("wb") as f:
            pq.write_table(pa.table(columns), f)
    else:
        pq.write_table(pa.table(columns), target)
