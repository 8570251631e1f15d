"""``tzrec-run plot MODEL_DIR``: the run's ``metrics.jsonl`` drawn as PNG files.

* ``loss.png``: the train loss (mean of each log window) and every eval ``loss/*`` over steps;
* ``learning_rates.png``: every param group's learning rate;
* ``eval.png``: one panel per eval metric;
* ``throughput.png``: samples/s and the data-wait fraction.

A figure with nothing to draw (no evaluation yet, say) is not written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tzrun.errors import TzrunError
from tzrun.io.files import METRICS_FILE, read_jsonl

__all__ = ["plot_run"]


def _series(records: Sequence[dict[str, Any]], field: str) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in records:
        for name, value in (r.get(field) or {}).items():
            if value is None:
                continue
            steps, values = out.setdefault(name, ([], []))
            steps.append(int(r["step"]))
            values.append(float(value))
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

    model_dir = Path(model_dir)
    source = model_dir / METRICS_FILE
    if not source.is_file():
        raise TzrunError(f"{source}: no such file; train with the metrics_log stage (on by default) to write it")
    records = read_jsonl(source)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not train and not evals:
        raise TzrunError(f"{source} holds no train or eval records yet")
    out = Path(out_dir) if out_dir is not None else model_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
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

    lrs = _series(train, "learning_rates")
    if lrs:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name, (steps, values) in lrs.items():
            ax.plot(steps, values, label=name)
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
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        axes[0, 0].set_title("eval metrics")
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
