"""``tzrec-run plot MODEL_DIR``: the run's ``metrics.jsonl`` drawn as PNG files.

* ``loss.png``: the train loss (mean of each log window) and every eval ``loss/*`` over steps;
* ``learning_rates.png``: every param group's learning rate (groups whose rates are the same at
  every step, such as the fused sparse optimizer's ``sparse/deep_ebc`` and ``sparse/wide_ebc``,
  are one line naming them all);
* ``eval.png``: one panel per eval metric, each evaluation a marked point with the last value
  written beside it (a run evaluated once shows that one point, labelled, over the run's steps);
* ``throughput.png``: samples/s and the data-wait fraction.

A figure with nothing to draw (no evaluation yet, say) is not written. The model dir (and
``--out``) may be a URL (``s3://...``), read and written as every other command does.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

from tzrun.errors import TzrunError
from tzrun.io.files import METRICS_FILE, read_jsonl
from tzrun.io.storage import as_path

__all__ = ["plot_run"]


def _series(records: Sequence[dict[str, Any]], field: str, digits: int | None = None) -> dict[str, tuple[list[int], list[float]]]:
    """``name -> (steps, values)`` of the dict ``field`` of each record; ``digits``: round to
    that many significant digits (a float32 lr of 0.1 is 0.100000001)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in records:
        for name, value in (r.get(field) or {}).items():
            if value is None:
                continue
            steps, values = out.setdefault(name, ([], []))
            steps.append(int(r["step"]))
            values.append(float(f"{value:.{digits}g}") if digits else float(value))
    return out


def _merged(series: dict[str, tuple[list[int], list[float]]]) -> dict[str, tuple[list[int], list[float]]]:
    """``series`` with the ones equal at every step drawn once, under all their names."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    names: dict[tuple[tuple[int, ...], tuple[float, ...]], list[str]] = {}
    for name, (steps, values) in series.items():
        names.setdefault((tuple(steps), tuple(values)), []).append(name)
    for (steps, values), same in names.items():
        out[" = ".join(same)] = (list(steps), list(values))
    return out


def plot_run(model_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw the run's ``metrics.jsonl`` into PNG files in ``out_dir`` (default
    ``<model_dir>/plots``); returns the files written.

    Raises:
        TzrunError: when the model dir has no ``metrics.jsonl`` or it holds no records.
        MissingDependencyError: when matplotlib (the ``plot`` extra) is not installed.
    """
    from tzrun.stack import require_extra

    require_extra("plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    model_dir = as_path(model_dir)
    source = model_dir / METRICS_FILE
    if not source.is_file():
        raise TzrunError(f"{source}: no such file; train with the metrics_log stage (on by default) to write it")
    records = read_jsonl(source)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not train and not evals:
        raise TzrunError(f"{source} holds no train or eval records yet")
    out = as_path(out_dir) if out_dir is not None else model_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    last_step = max(int(r["step"]) for r in records)

    def save(fig: Any, name: str) -> None:
        path = out / name
        for ax in fig.axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps
            if ax.get_yscale() == "linear":
                ax.ticklabel_format(axis="y", useOffset=False)  # 0.1 reads 0.1, not 1e-9 + 1e-1
        fig.tight_layout()
        png = io.BytesIO()  # one write, to a local file or an object store alike
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        path.write_bytes(png.getvalue())
        written.append(path)

    eval_series = _series(evals, "metrics")
    eval_losses = {k: v for k, v in eval_series.items() if k.startswith("loss/")}
    eval_metrics = {k: v for k, v in eval_series.items() if not k.startswith("loss/")}

    if train or eval_losses:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        if train:
            ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss (window mean)")
            named = _series(train, "losses")
            if len(named) > 1:
                for name, (steps, values) in named.items():
                    ax.plot(steps, values, label=f"train {name}", alpha=0.7)
        for name, (steps, values) in eval_losses.items():
            ax.plot(steps, values, marker="o", label=f"eval {name}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(f"loss: {model_dir.name}")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "loss.png")

    lrs = _merged(_series(train, "learning_rates", digits=6))
    if lrs:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name, (steps, values) in lrs.items():
            ax.plot(steps, values, marker="." if len(steps) < 20 else None, label=name)
        positive = [v for _, values in lrs.values() for v in values if v > 0]
        if positive and max(positive) > 20 * min(positive):
            ax.set_yscale("log")  # a dense lr of 0.001 beside a sparse 0.05 is not a line along zero
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.set_title("learning rates")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "learning_rates.png")

    if eval_metrics:
        n = len(eval_metrics)
        fig, axes = plt.subplots(n, 1, figsize=(8, 2.8 * n), squeeze=False)
        for ax, (name, (steps, values)) in zip(axes[:, 0], eval_metrics.items()):
            ax.plot(steps, values, marker="o")
            ax.annotate(f"{values[-1]:.4g}", (steps[-1], values[-1]), textcoords="offset points", xytext=(6, 6))
            ax.set_xlim(0, last_step * 1.05 + 1)  # a run evaluated once: its point where it falls in the run
            ax.margins(y=0.3)  # room for the label
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        evaluations = len({s for steps, _ in eval_metrics.values() for s in steps})
        axes[0, 0].set_title(f"eval metrics ({evaluations} evaluation{'s' if evaluations != 1 else ''}; "
                             "train.save_checkpoints_steps sets how often)")
        save(fig, "eval.png")

    if train:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
        steps = [r["step"] for r in train]
        top.plot(steps, [r["samples_per_s"] for r in train])
        top.set_ylabel("samples/s")
        top.grid(alpha=0.3)
        bottom.plot(steps, [r["data_wait_fraction"] for r in train])
        bottom.set_ylabel("data-wait fraction")
        bottom.set_xlabel("step")
        bottom.grid(alpha=0.3)
        top.set_title("throughput")
        save(fig, "throughput.png")
    return written
