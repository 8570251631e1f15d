"""Synthetic data shaped like any config's inputs: ``tzrec-run data synth --like CONFIG OUT_DIR``.

For a checked config (its :class:`~tzrun.runner.facts.RunFacts`) it writes what ``train`` reads:

* every id feature's column within its table's ids (``num_buckets``, ``hash_bucket_size``: integers
  below it; ``vocab``: its tokens and an out-of-vocabulary one; ``boundaries``: numbers in every
  bucket), a string joined on ``separator`` or a list where the feature says so, per-id weights for
  a ``weight_column``;
* dense columns (counts for ``log1p`` features), on the scale ``mean`` and ``std`` expect;
* each sequence group's columns as aligned lists (or joined strings), 0 to ``max_len`` long;
* every label as its losses and metrics need it (:mod:`tzrun_tools.synth_like_labels`), a derived
  label's source column in its stead; the sample weight and ``group_by`` columns;
* with a ``[data.sampler]`` that reads an ``item_table``: ``items.parquet``, one row per item with
  the model's item-side columns (and its popularity as the sampler's ``weight``), the training
  rows' items taken from it (each item keeps its features).

Layout: ``OUT/train/part-NNNNN.parquet``, ``OUT/eval/part-NNNNN.parquet``, ``OUT/items.parquet``
(with a sampler) and, last, ``OUT/synth.json``. The values come from a latent topic per row
(:mod:`tzrun_tools.synth_like_draw`); binary labels carry their true probability, so the report
holds each one's Bayes-optimal AUC (the ceiling of any model on the eval split). Deterministic:
parameters from ``numpy.random.default_rng(seed)``, rows in blocks of 16,384 from
``default_rng(SeedSequence(seed, spawn_key=(split, block)))``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tzrun_tools.synth_common import auc, block_rng, checked_arguments, clear_split, nan_to_none, write_part, write_report
from tzrun_tools.synth_like_draw import TOPICS, Params, draw_rows, item_popularity, make_params
from tzrun_tools.synth_like_labels import draw_labels, label_effects, source_values
from tzrun_tools.synth_like_plan import SynthLikeError, SynthPlan, plan_synth

__all__ = ["LikeSynthReport", "SynthLikeError", "synth_like", "set_overrides", "ITEMS_FILE"]

ITEMS_FILE = "items.parquet"
_BLOCK_ROWS = 16_384
_SPLIT_TRAIN, _SPLIT_EVAL = 1, 2
_FORMAT = "tzrec-run synthetic like-config v1"


@attrs.frozen
class LikeSynthReport:
    """What :func:`synth_like` wrote.

    Attributes:
        out_dir: the directory holding ``train/``, ``eval/`` (and ``items.parquet``).
        config: the config the data is shaped like.
        train_rows, eval_rows, seed: as asked.
        label_means: each label's mean on the train split (a binary label's rate).
        bayes_auc: each binary label's AUC of its true probability on the eval split.
        overrides: the ``--set`` arguments that point the config at the data.
    """

    out_dir: str
    config: str
    train_rows: int
    eval_rows: int
    seed: int
    label_means: dict[str, float]
    bayes_auc: dict[str, float]
    overrides: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-serializable dict (NaN AUCs become None)."""
        return {"out_dir": self.out_dir, "config": self.config, "train_rows": self.train_rows,
                "eval_rows": self.eval_rows, "seed": self.seed, "label_means": self.label_means,
                "bayes_auc": nan_to_none(self.bayes_auc), "set": list(self.overrides)}


@attrs.frozen
class _Model:
    plan: SynthPlan
    params: Params
    own: np.ndarray
    source: str


def _block(model: _Model, seed: int, split: int, index: int) -> tuple[pa.Table, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One block of rows: the table, each label's values and each binary label's probability."""
    rng = block_rng(seed, split, index)
    drawn = draw_rows(model.plan, model.params, rng, _BLOCK_ROWS)
    values, truth = draw_labels(model.plan.labels, model.own, drawn.score, drawn.topics, rng)
    columns: dict[str, pa.Array] = {}
    for label in model.plan.labels:
        if label.from_feature:  # the feature's column, as drawn
            values[label.name] = drawn.columns[label.column].to_numpy().astype(np.float32)
            truth.pop(label.name, None)
            continue
        if label.column in columns:
            continue
        value = values[label.name]
        columns[label.column] = (source_values(label, value, model.source) if label.derived is not None
                                 else pa.array(value))
    columns.update(drawn.columns)
    return pa.table(columns), values, truth


def _write_split(model: _Model, seed: int, split: int, split_dir: Path, rows: int, rows_per_file: int,
                 row_group_size: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Write one split's part files; return its label values and binary labels' probabilities."""
    clear_split(split_dir)
    blocks = [_block(model, seed, split, b) for b in range(-(-rows // _BLOCK_ROWS))]
    whole = pa.concat_tables(b[0] for b in blocks).slice(0, rows)
    for index, start in enumerate(range(0, rows, rows_per_file)):
        write_part(whole.slice(start, rows_per_file), split_dir, index, row_group_size)
    values = {k: np.concatenate([b[1][k] for b in blocks])[:rows] for k in blocks[0][1]}
    truth = {k: np.concatenate([b[2][k] for b in blocks])[:rows] for k in blocks[0][2]}
    return values, truth


def _write_items(plan: SynthPlan, params: Params, out: Path) -> None:
    """``out/items.parquet``: the catalogue, and its popularity as the sampler's weight column."""
    assert plan.item_table is not None
    table = pa.table(dict(params.catalogue))
    if plan.item_table.weight and plan.item_table.weight not in table.column_names:
        table = table.append_column(plan.item_table.weight, pa.array(item_popularity(params).astype(np.float32)))
    tmp = out / f".{ITEMS_FILE}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, out / ITEMS_FILE)


def set_overrides(facts: Any, plan: SynthPlan, out: str) -> tuple[str, ...]:
    """The ``--set`` arguments that point the config of ``facts`` at data written to ``out``."""
    lines = [f'data.train_input="{out}/train"', f'data.eval_input="{out}/eval"']
    if plan.item_table is not None:
        lines.append(f'data.sampler.item_table="{out}/{ITEMS_FILE}"')
        if getattr(facts.cfg.data.sampler.config, "format", "auto") != "auto":
            lines.append('data.sampler.format="parquet"')
    if facts.cfg.data.reader.type != "parquet":
        lines.append('data.reader={type = "parquet"}')
    return tuple(lines)


def _description(plan: SynthPlan) -> dict[str, str]:
    out = {label.column: f"label '{label.name}' ({label.domain}{', derived' if label.derived else ''})"
           for label in plan.labels}
    for c in plan.columns:
        size = f" in [0, {c.num_ids})" if c.kind in ("num_buckets", "vocab") else ""
        out[c.column] = f"{c.path}: {c.kind}{size}, {c.shape}{f' (max_len {c.max_len})' if c.group is not None else ''}"
    return out


def synth_like(
    facts: Any,
    source: str,
    out_dir: str | os.PathLike[str],
    *,
    rows: int,
    eval_rows: int | None = None,
    seed: int = 0,
    rows_per_file: int = 250_000,
    row_group_size: int = 32_768,
) -> LikeSynthReport:
    """Write train and eval data shaped like the config of ``facts`` (see the module docstring).

    Args:
        facts: the config's :class:`~tzrun.runner.facts.RunFacts` (a checked config).
        source: the config's file, named in errors and in the report.
        out_dir: directory to write into (created if missing).
        rows: train rows, >= 1.
        eval_rows: eval rows, >= 1; default ``max(rows // 10, 1000)``.
        seed: non-negative seed of the parameters and of the rows.
        rows_per_file: at most this many rows per Parquet file.
        row_group_size: rows per Parquet row group.

    Returns:
        The report also written to ``out_dir/synth.json``.

    Raises:
        SynthLikeError: a column or label of the config cannot be drawn (one line, its TOML path).
        ValueError: an argument is out of range, or ``out_dir`` is an existing file.
    """
    plan = plan_synth(facts, source)
    out, rows, eval_rows, seed, rows_per_file, row_group_size = checked_arguments(
        out_dir, rows, eval_rows, seed, rows_per_file, row_group_size)
    rng = np.random.default_rng(seed)
    params = make_params(plan, rng)
    model = _Model(plan, params, label_effects(plan.labels, rng, TOPICS), source)
    train, _ = _write_split(model, seed, _SPLIT_TRAIN, out / "train", rows, rows_per_file, row_group_size)
    evaluation, truth = _write_split(model, seed, _SPLIT_EVAL, out / "eval", eval_rows, rows_per_file, row_group_size)
    if plan.item_table is not None:
        _write_items(plan, params, out)
    report = LikeSynthReport(
        out_dir=str(out_dir), config=source, train_rows=rows, eval_rows=eval_rows, seed=seed,
        label_means={k: float(v.mean()) for k, v in train.items()},
        bayes_auc={k: auc(p, evaluation[k]) for k, p in truth.items()},
        overrides=set_overrides(facts, plan, str(out_dir)),
    )
    write_report(out, {**report.to_json(), "format": _FORMAT, "model": facts.cfg.model.type,
                       "columns": _description(plan), "description": __doc__.split("\n\n")[0]})
    return report
