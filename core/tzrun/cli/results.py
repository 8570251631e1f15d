"""What ``train``, ``evaluate``, ``check`` and ``data synth`` print on standard output: lines for
a person, or with ``--json`` one JSON object for a script (its schema in ``docs/cli.md``).

Logs and errors go to standard error either way, so that standard output holds only the JSON;
on an error nothing is printed there (except ``evaluate``'s result when only its record could
not be written), and the exit code and the error line on standard error tell what happened.
JSON has no NaN: a value that is not finite is written as ``null``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from tzrun.io.storage import redact_url

__all__ = ["print_json", "finite", "train_json", "print_train", "evaluation_json", "print_evaluation"]


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, infinity) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON (as ``env``, ``plugins`` and ``ckpt --json`` do)."""
    print(json.dumps(finite(value), indent=2, allow_nan=False))


def _eval_json(result: Any) -> dict[str, Any]:
    return {"step": result.step, "rows": result.rows, "metrics": dict(result.metrics)}


def train_json(result: Any, model_dir: Any) -> dict[str, Any]:
    """The ``train --json`` object of a :class:`~tzrun.runner.result.TrainResult`."""
    return {
        "model_dir": redact_url(str(model_dir)),
        "steps": result.steps,
        "seconds": result.seconds,
        "samples_per_second": result.samples_per_second,
        "checkpoint": redact_url(str(result.checkpoint)),
        "eval": None if result.eval is None else _eval_json(result.eval),
        "stopped_by": result.stopped_by,
        "stop_reason": result.stop_reason,
    }


def print_train(result: Any, model_dir: Any, as_json: bool) -> None:
    """Print a finished (or signal-stopped) run's result, on rank 0 only."""
    if int(os.environ.get("RANK", 0)) != 0:
        return
    if as_json:
        print_json(train_json(result, model_dir))
        return
    if result.stopped_by is not None:
        print(f"stopped by {result.stopped_by} at step {result.steps}; checkpoint: {redact_url(result.checkpoint)}")
        return
    if result.stop_reason:
        print(f"stopped early at step {result.steps}: {result.stop_reason}")
    print(f"trained {result.steps} steps in {result.seconds:.1f} s ({result.samples_per_second:,.0f} samples/s)")
    if result.eval is not None:
        values = ", ".join(f"{k}={v:.6f}" for k, v in result.eval.metrics.items())
        print(f"final eval at step {result.eval.step} over {result.eval.rows} rows: {values}")
    print(f"checkpoint: {redact_url(result.checkpoint)}")


def evaluation_json(done: Any, recorded_in: str | None) -> dict[str, Any]:
    """The ``evaluate --json`` object of a :class:`~tzrun.runner.checkpoint_eval.CheckpointEvaluation`."""
    return {"checkpoint": redact_url(str(done.checkpoint)), "ema": done.ema, **_eval_json(done.result),
            "seconds": done.result.seconds,
            "recorded_in": None if recorded_in is None else redact_url(recorded_in)}


def print_evaluation(done: Any, recorded_in: str | None, as_json: bool) -> None:
    """Print an evaluation of a checkpoint, and where it was recorded (None: it was not)."""
    if as_json:
        print_json(evaluation_json(done, recorded_in))
        return
    values = ", ".join(f"{k}={v:.6f}" for k, v in done.result.metrics.items())
    weights = " (EMA weights)" if done.ema else ""
    print(f"eval of {redact_url(done.checkpoint)} (step {done.result.step}){weights} over {done.result.rows} rows: {values}")
    if recorded_in is not None:
        print(f"recorded in {redact_url(recorded_in)}")
