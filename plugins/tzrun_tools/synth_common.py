"""What the synthetic-data generators share: per-block random streams, the split and report
writers, argument checks and the exact AUC of a known model's scores."""

from __future__ import annotations

import contextlib
import json
import math
import operator
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

#: The report each generator writes next to its data, last.
REPORT_FILE: str = "synth.json"

__all__ = ["REPORT_FILE", "sigmoid", "power_law", "block_rng", "clear_split", "write_part", "write_report", "auc", "check_int",
           "checked_arguments", "read_document", "nan_to_none", "none_to_nan", "report_fields"]


def power_law(n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The probabilities of ranks ``0 .. n - 1`` under ``P(rank k) ~ (k + 1) ** -alpha``, and
    their cumulative sum (its last value exactly 1, for ``np.searchsorted`` draws)."""
    weight = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    prob = weight / weight.sum()
    cdf = np.cumsum(prob)
    cdf[-1] = 1.0
    return prob, cdf


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def block_rng(seed: int, split: int, block: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(split, block)))


def clear_split(split_dir: Path) -> None:
    """Create ``split_dir`` and delete the part files of an earlier generation in it."""
    split_dir.mkdir(parents=True, exist_ok=True)
    for stale in split_dir.glob("part-*.parquet"):
        stale.unlink()


def write_part(table: pa.Table, split_dir: Path, index: int, row_group_size: int) -> None:
    """Write ``split_dir/part-INDEX.parquet``; it appears under that name only once complete."""
    final = split_dir / f"part-{index:05d}.parquet"
    tmp = split_dir / f".{final.name}.tmp"
    pq.write_table(table, tmp, row_group_size=row_group_size)
    os.replace(tmp, final)


def write_report(out: Path, document: dict[str, Any]) -> None:
    """Write ``out/synth.json`` last and atomically: it only ever describes complete data."""
    tmp = out / f".{REPORT_FILE}.tmp"
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / REPORT_FILE)


# --------------------------------------------------------------------------------------------
# AUC


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney U with average ranks for ties), in float64.

    Args:
        scores: higher means more likely positive; any real dtype, shape [n].
        labels: 0/1 (or bool), shape [n].

    Returns:
        The AUC, or NaN when ``labels`` holds a single class.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    positive = np.asarray(labels).ravel().astype(bool)
    n = scores.size
    n_pos = int(positive.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    new_group = np.empty(n, dtype=bool)
    new_group[0] = True
    np.not_equal(sorted_scores[1:], sorted_scores[:-1], out=new_group[1:])
    starts = np.flatnonzero(new_group)
    stops = np.append(starts[1:], n)
    # 1-based ranks start+1 .. stop share their average (start + 1 + stop) / 2.
    average_rank = np.repeat((starts + stops + 1) / 2.0, stops - starts)
    rank_sum = float(average_rank[positive[order]].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (float(n_pos) * float(n_neg))


# --------------------------------------------------------------------------------------------
# Public entry points


def check_int(name: str, value: Any, minimum: int, hint: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}; {hint}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(
            f"{name} must be an integer >= {minimum}, got {value!r} "
            f"({type(value).__name__}); {hint}"
        ) from None
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}; {hint}")
    return number


def checked_arguments(
    out_dir: str | os.PathLike[str], rows: Any, eval_rows: Any, seed: Any, rows_per_file: Any, row_group_size: Any
) -> tuple[Path, int, int, int, int, int]:
    """``(out, rows, eval_rows, seed, rows_per_file, row_group_size)`` of a ``synth_*`` function,
    checked, with ``eval_rows`` defaulted; creates ``out_dir`` and removes its ``synth.json`` (so
    that it never describes data being rewritten).

    Raises:
        ValueError: an argument is out of range, or ``out_dir`` is an existing file.
    """
    rows = check_int("rows", rows, 1, "pass the number of train rows, e.g. rows=500_000")
    if eval_rows is None:
        eval_rows = max(rows // 10, 1000)
    eval_rows = check_int("eval_rows", eval_rows, 1, "pass the number of eval rows, or None for max(rows // 10, 1000)")
    seed = check_int("seed", seed, 0, "pass a non-negative integer such as seed=0")
    rows_per_file = check_int("rows_per_file", rows_per_file, 1, "pass the maximum rows per parquet file, e.g. 250_000")
    row_group_size = check_int("row_group_size", row_group_size, 1, "pass the rows per parquet row group, e.g. 32_768")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {str(out)!r} is a file; pass a directory (it is created)")
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_FILE).unlink(missing_ok=True)
    return out, rows, eval_rows, seed, rows_per_file, row_group_size


def read_document(out_dir: str | os.PathLike[str], dataset: str) -> dict[str, Any]:
    """The JSON object of ``out_dir/synth.json``, written by ``tzrec-run data synth DATASET``.

    Raises:
        FileNotFoundError: there is no ``synth.json`` (generation never finished).
        ValueError: ``synth.json`` is not a JSON object.
    """
    path = Path(out_dir) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} not found: {str(out_dir)!r} holds no complete synthetic data set; "
            f"generate one with `tzrec-run data synth {dataset} --rows N --out {out_dir}`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(path)!r} is not valid JSON ({e}); regenerate the data") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object; regenerate the data")
    return data


def nan_to_none(value: Any) -> Any:
    """A report value (a float, or a dict of them by label) for JSON: NaN becomes None."""
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    return None if math.isnan(value) else float(value)


def none_to_nan(value: Any) -> Any:
    """The inverse of :func:`nan_to_none`: None becomes NaN, everything else a float."""
    if isinstance(value, dict):
        return {k: none_to_nan(v) for k, v in value.items()}
    return float("nan") if value is None else float(value)


@contextlib.contextmanager
def report_fields(dataset: str) -> Iterator[None]:
    """Reading a report's fields: a missing one is a ``ValueError`` that says to regenerate
    the data with ``tzrec-run data synth DATASET``."""
    try:
        yield
    except KeyError as e:
        raise ValueError(
            f"synthetic data report is missing the field {e.args[0]!r}; regenerate it with "
            f"`tzrec-run data synth {dataset}`"
        ) from None
