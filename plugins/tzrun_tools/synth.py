"""Synthetic Criteo-shaped click data drawn from a known ground-truth model.

The data has the columns of Criteo's display-advertising data set (a 0/1 ``label``, 13
integer-count features ``int_0..int_12`` and 26 categorical features ``cat_0..cat_25``), but
the labels come from a known model, so the best achievable AUC (the *Bayes AUC*: the AUC of the
true click probability against the drawn labels) is known and written next to the data. A
model trained on it can be judged against that ceiling instead of against folklore numbers.

Layout written by :func:`synth_criteo`::

    out_dir/train/part-00000.parquet, part-00001.parquet, ...
    out_dir/eval/part-00000.parquet, ...
    out_dir/synth.json            # the SynthReport plus a description of the model

Columns (in this order):

* ``label``: int8, 0 or 1, never null.
* ``int_0..int_12``: float32, non-negative whole numbers, ``floor(exp(mu_d + s_d * N(0, 1)))``
  (a heavy-tailed count like Criteo's integer features, with many zeros). Columns
  ``int_0``, ``int_2``, ``int_6`` and ``int_11`` are null (empty in Criteo) in 2-5% of rows.
* ``cat_0..cat_25``: int64 ids in ``[0, CRITEO_CARDINALITIES[c])``, never null. Ids are drawn
  from a power law over ranks, ``P(rank k) ~ (k + 1) ** -alpha_c`` with ``alpha_c`` in
  ``[1.05, 1.25]``, and rank ``k`` is mapped to id ``perm_c[k]`` by a per-column random
  permutation (so frequent ids are not simply the small ones).

Ground-truth model::

    logit = bias
          + sum_c first_order_c[id_c]                               (26 columns)
          + sum_{(a, b) in PAIRS} <u_a[id_a], u_b[id_b]>            (4 pairs, dim 4)
          + sum_d w_d * (log1p(x_d, nulls as 0) - m_d) / s_d        (13 dense columns)
    label ~ Bernoulli(sigmoid(logit))

* ``first_order_c[id] = sigma_c * N(0, 1) * damp_c(id)``, with ``sigma_c`` uniform in
  ``[0.15, 0.5]`` before the scaling below.
* ``PAIRS = (cat_5, cat_13), (cat_8, cat_16), (cat_19, cat_22), (cat_21, cat_24)``: small
  vocabularies (3 to 105 ids), so every pair of ids is seen often;
  ``u_c[id] = N(0, I_4) * damp_c(id)`` before the scaling below.
* ``damp_c(id) = min(1, P(id) / 0.005)`` shrinks the effects of rare ids: ids seen in at least
  0.5% of rows carry their full effect, ids seen in 0.05% a tenth of it. So the signal sits on
  ids a one-epoch run over a few hundred thousand rows sees hundreds of times, not on tail ids
  seen a handful of times (those are still drawn, as in Criteo, and carry little signal).
* ``w_d ~ N(0, 1)`` before the scaling below; ``m_d`` and ``s_d`` are the mean and standard
  deviation of ``log1p(x_d)`` (nulls as 0).
* Calibration: on a fixed sample of 65,536 rows drawn from the model, ``m_d`` and ``s_d`` are
  measured, then the first-order effects, the pair vectors and the dense weights are each
  scaled by one factor so that the three parts of the logit have variances 1.2, 0.1 and 0.4
  (so the Bayes AUC hardly depends on the seed), and ``bias`` is set by bisection so that the
  mean click probability is 0.25.

Measured on seeds 0-2 (300k train rows): positive rate 0.25, Bayes AUC 0.79-0.80 (0.775-0.785
without the pairs, 0.74 from the first-order part alone). A logistic regression on the ids and
``log1p`` of the dense columns, or a DeepFM (dim 16), trained for one epoch with batch size
2048 gets within about 0.015-0.02 of the Bayes AUC.

All model parameters come from ``numpy.random.default_rng(seed)``. Rows are drawn in blocks of
16,384; block ``b`` of split ``s`` (train 1, eval 2; calibration is 3) uses the generator
``default_rng(SeedSequence(seed, spawn_key=(s, b)))``. Hence the same seed gives byte-identical
files (on the same numpy / pyarrow build), the model does not depend on ``rows``, the first
``n`` rows of a split do not depend on ``rows``, ``rows_per_file`` or ``row_group_size``, and
the eval rows do not depend on the train rows.

With seed 0 the positive rate is about 0.25 and the Bayes AUC about 0.79.

With ``drift=True`` (``tzrec-run data synth criteo --drift``) the columns of
:data:`tzrun_tools.synth_drift.DRIFT_COLUMNS` (``cat_2``, ``cat_3``, ``cat_11``, ``cat_15``,
``cat_20``) are open id spaces that drift (:mod:`tzrun_tools.synth_drift`): new ids keep arriving
over the rows, old ones fade, and the ids are 63-bit integers without a bound. Their fixed
first-order effects are replaced by each id's own effect, a fourth part of the logit calibrated to
variance 1.0 (the other three keep theirs). Row ``t`` of the train split is at time ``t``; the eval
split comes after the train split (its row ``j`` at time ``rows + j``), as a next day's data would,
so with drift the eval rows depend on ``rows``. The other columns hold the values they hold
without drift.
"""

from __future__ import annotations

import math
import os
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from tzrun_tools.synth_drift import (
    DRIFT_COLUMNS,
    DRIFT_LEARNABLE_LOOKUPS,
    DRIFT_LIFETIME,
    DRIFT_SLOTS,
    Drift,
    build_drift,
    draw_drift,
    drift_effect,
    scale_drift,
)
from tzrun_tools.synth_report import SynthReport, read_report
from tzrun_tools.synth_common import (
    power_law,
    REPORT_FILE,
    auc,
    block_rng,
    checked_arguments,
    clear_split,
    sigmoid,
    write_part,
    write_report,
)

__all__ = [
    "CRITEO_NUM_DENSE",
    "CRITEO_NUM_SPARSE",
    "CRITEO_CARDINALITIES",
    "KAGGLE_CARDINALITIES",
    "kaggle_cardinalities",
    "DENSE_COLUMNS",
    "SPARSE_COLUMNS",
    "LABEL_COLUMN",
    "SynthReport",
    "synth_criteo",
    "read_report",
    "REPORT_FILE",
]

CRITEO_NUM_DENSE: int = 13
CRITEO_NUM_SPARSE: int = 26

# A scaled-down Criteo (Kaggle display-advertising challenge): the small vocabularies are kept
# as they are, the large ones (up to 10M ids) are shrunk to at most 4,000 ids, keeping their
# order of sizes. 33,406 ids in all, so a DeepFM can learn them from one pass over ~300k rows.
CRITEO_CARDINALITIES: tuple[int, ...] = (
    1000,  # cat_0   (Criteo C1:  1,460)
    500,  # cat_1   (C2:    583)
    4000,  # cat_2   (C3:  10,131,227)
    3000,  # cat_3   (C4:   2,202,608)
    300,  # cat_4   (C5:      305)
    24,  # cat_5   (C6:       24)
    1500,  # cat_6   (C7:   12,517)
    600,  # cat_7   (C8:      633)
    3,  # cat_8   (C9:        3)
    2000,  # cat_9   (C10:  93,145)
    1500,  # cat_10  (C11:   5,683)
    4000,  # cat_11  (C12: 8,351,593)
    1000,  # cat_12  (C13:   3,194)
    27,  # cat_13  (C14:      27)
    1500,  # cat_14  (C15:  14,992)
    3000,  # cat_15  (C16: 5,461,306)
    10,  # cat_16  (C17:      10)
    1500,  # cat_17  (C18:   5,652)
    800,  # cat_18  (C19:   2,173)
    4,  # cat_19  (C20:       4)
    3000,  # cat_20  (C21: 7,046,547)
    18,  # cat_21  (C22:      18)
    15,  # cat_22  (C23:      15)
    2000,  # cat_23  (C24: 286,181)
    105,  # cat_24  (C25:     105)
    2000,  # cat_25  (C26: 142,572)
)

#: The cardinalities of the Criteo Kaggle display-advertising data (C1..C26), for
#: ``synth_criteo(cardinalities=kaggle_cardinalities(cap))``: tables of the real sizes.
KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593, 3_194,
    27, 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
)


def kaggle_cardinalities(cap: int = 1_000_000) -> tuple[int, ...]:
    """:data:`KAGGLE_CARDINALITIES`, each capped at ``cap`` rows (as a hashed table would be)."""
    return tuple(min(c, cap) for c in KAGGLE_CARDINALITIES)


DENSE_COLUMNS: tuple[str, ...] = tuple(f"int_{i}" for i in range(CRITEO_NUM_DENSE))
SPARSE_COLUMNS: tuple[str, ...] = tuple(f"cat_{i}" for i in range(CRITEO_NUM_SPARSE))
LABEL_COLUMN: str = "label"


# Ground-truth model constants (immutable; documented in the module docstring).
_BLOCK_ROWS = 16_384
_CALIBRATION_ROWS = 65_536
_SPLIT_TRAIN, _SPLIT_EVAL, _SPLIT_CALIBRATION = 1, 2, 3
_TARGET_POSITIVE_RATE = 0.25
_ZIPF_ALPHA_RANGE = (1.05, 1.25)
_FIRST_ORDER_SIGMA_RANGE = (0.15, 0.5)
_FULL_EFFECT_FREQ = 5e-3
_PAIRS: tuple[tuple[int, int], ...] = ((5, 13), (8, 16), (19, 22), (21, 24))
_INTERACTION_DIM = 4
_FIRST_ORDER_VARIANCE = 1.2
_INTERACTION_VARIANCE = 0.1
_DENSE_VARIANCE = 0.4
_DRIFT_VARIANCE = 1.0
_DENSE_MU_RANGE = (-0.5, 3.5)
_DENSE_SIGMA_RANGE = (0.8, 1.8)
_NULL_DENSE_COLUMNS: tuple[int, ...] = (0, 2, 6, 11)
_NULL_RATE_RANGE = (0.02, 0.05)

_DESCRIPTION = (
    "Synthetic Criteo-shaped data. label ~ Bernoulli(sigmoid(logit)) with "
    "logit = bias + sum_c first_order_c[cat_c] "
    "+ sum over pairs "
    + ", ".join(f"(cat_{a},cat_{b})" for a, b in _PAIRS)
    + f" of <u_a[cat_a], u_b[cat_b]> (dim {_INTERACTION_DIM}) "
    "+ sum_d w_d * standardized(log1p(int_d, nulls as 0)); the three parts have variances "
    f"{_FIRST_ORDER_VARIANCE}, {_INTERACTION_VARIANCE} and {_DENSE_VARIANCE}. "
    "Categorical ids follow a power law over a per-column permutation of ids; the effects of "
    f"ids rarer than {_FULL_EFFECT_FREQ:g} of rows are shrunk in proportion to their "
    "frequency. int_d = floor(lognormal), with nulls in "
    + ", ".join(f"int_{d}" for d in _NULL_DENSE_COLUMNS)
    + f" (2-5% of rows). bias is calibrated to a {_TARGET_POSITIVE_RATE} positive rate. "
    "bayes_auc is the AUC of the true click probability on the eval split: the best any model "
    "can reach there. All parameters come from numpy.random.default_rng(seed); see the "
    "docstring of tzrun_tools.synth for the details."
)

_DRIFT_DESCRIPTION = (
    "With --drift, " + ", ".join(SPARSE_COLUMNS[c] for c in DRIFT_COLUMNS) + " are open id spaces that drift: "
    f"each has {DRIFT_SLOTS} popularity slots (a power law), and each slot's id is replaced by a new one every "
    f"{DRIFT_LIFETIME} rows (it rises for {DRIFT_LIFETIME} rows, then fades for {DRIFT_LIFETIME}), so about "
    f"{2 * DRIFT_SLOTS} ids of a column are live at any row and {DRIFT_SLOTS} new ones arrive every "
    f"{DRIFT_LIFETIME} rows. Ids are pseudo-random 63-bit integers; each carries an effect of its own "
    f"(a normal drawn from the id, shrunk for ids seen fewer than {DRIFT_LEARNABLE_LOOKUPS:g} times in their "
    f"life), together a part of the logit of variance {_DRIFT_VARIANCE}. The eval split follows the train "
    "split in time. See tzrun_tools.synth_drift."
)


# --------------------------------------------------------------------------------------------
# Ground-truth model


@dataclass(frozen=True)
class _Column:
    """One categorical column of the ground truth, indexed by frequency rank."""

    cdf: np.ndarray  # float64 [card], cumulative P(rank <= k); cdf[-1] == 1
    perm: np.ndarray  # int64 [card], id of rank k
    first_order: np.ndarray  # float64 [card], first-order effect of rank k


@dataclass(frozen=True)
class _Model:
    columns: tuple[_Column, ...]
    pair_vectors: tuple[tuple[np.ndarray, np.ndarray], ...]  # per pair: u_a, u_b by rank
    dense_mu: np.ndarray  # [13]
    dense_sigma: np.ndarray  # [13]
    null_rate: np.ndarray  # [13], 0 for columns without nulls
    dense_weight: np.ndarray  # [13]
    dense_mean: np.ndarray  # [13], of log1p(x, nulls as 0)
    dense_std: np.ndarray  # [13]
    bias: float
    drift: Drift | None = None


@dataclass(frozen=True)
class _Raw:
    """Rows drawn from the data distribution, before the label."""

    ranks: tuple[np.ndarray, ...]  # per categorical column, int64 ranks
    dense: np.ndarray  # float32 [13, n], nulls stored as 0
    null: np.ndarray  # bool [13, n]
    drift_slots: tuple[np.ndarray, ...] = ()  # per drifting column, int64 slots
    drift_ids: tuple[np.ndarray, ...] = ()  # per drifting column, int64 ids


def _build_model(seed: int, cardinalities: tuple[int, ...] = CRITEO_CARDINALITIES, drift: bool = False) -> _Model:
    rng = np.random.default_rng(seed)
    columns: list[_Column] = []
    damps = []
    for card in cardinalities:
        prob, cdf = power_law(card, rng.uniform(*_ZIPF_ALPHA_RANGE))
        perm = rng.permutation(card).astype(np.int64)
        damp = np.minimum(1.0, prob / _FULL_EFFECT_FREQ)
        sigma = rng.uniform(*_FIRST_ORDER_SIGMA_RANGE)
        first_order = sigma * rng.standard_normal(card) * damp
        if drift and len(columns) in DRIFT_COLUMNS:
            first_order = np.zeros(card)  # the drifting ids carry the column's effects
        columns.append(_Column(cdf=cdf, perm=perm, first_order=first_order))
        damps.append(damp)
    pair_vectors = []
    for a, b in _PAIRS:
        u_a = rng.standard_normal((cardinalities[a], _INTERACTION_DIM))
        u_b = rng.standard_normal((cardinalities[b], _INTERACTION_DIM))
        pair_vectors.append((u_a * damps[a][:, None], u_b * damps[b][:, None]))
    dense_mu = rng.uniform(*_DENSE_MU_RANGE, size=CRITEO_NUM_DENSE)
    dense_sigma = rng.uniform(*_DENSE_SIGMA_RANGE, size=CRITEO_NUM_DENSE)
    null_rate = np.zeros(CRITEO_NUM_DENSE)
    null_rate[list(_NULL_DENSE_COLUMNS)] = rng.uniform(
        *_NULL_RATE_RANGE, size=len(_NULL_DENSE_COLUMNS)
    )
    dense_weight = rng.standard_normal(CRITEO_NUM_DENSE)

    model = _Model(
        columns=tuple(columns),
        pair_vectors=tuple(pair_vectors),
        dense_mu=dense_mu,
        dense_sigma=dense_sigma,
        null_rate=null_rate,
        dense_weight=dense_weight,
        dense_mean=np.zeros(CRITEO_NUM_DENSE),
        dense_std=np.ones(CRITEO_NUM_DENSE),
        bias=0.0,
        drift=build_drift(seed) if drift else None,
    )
    # Calibrate on a fixed sample of the same model: the dense standardization, the scale of
    # each of the three parts of the logit (so the Bayes AUC hardly depends on the seed), and
    # the bias (so the positive rate does not).
    raw = _draw_raw(model, block_rng(seed, _SPLIT_CALIBRATION, 0), _CALIBRATION_ROWS)
    log_dense = np.log1p(raw.dense.astype(np.float64))
    dense_std = log_dense.std(axis=1)
    model = dataclasses.replace(
        model,
        dense_mean=log_dense.mean(axis=1),
        dense_std=np.where(dense_std > 0, dense_std, 1.0),
    )
    first, pairs, dense, drifting = _logit_parts(model, raw)
    first_scale = math.sqrt(_FIRST_ORDER_VARIANCE / first.var())
    pair_scale = math.sqrt(math.sqrt(_INTERACTION_VARIANCE / pairs.var()))
    dense_scale = math.sqrt(_DENSE_VARIANCE / dense.var())
    model = dataclasses.replace(
        model,
        columns=tuple(
            _Column(cdf=c.cdf, perm=c.perm, first_order=c.first_order * first_scale)
            for c in model.columns
        ),
        pair_vectors=tuple((u_a * pair_scale, u_b * pair_scale) for u_a, u_b in pair_vectors),
        dense_weight=dense_weight * dense_scale,
        drift=None if model.drift is None else scale_drift(model.drift, math.sqrt(_DRIFT_VARIANCE / drifting.var())),
    )
    logit = _logit(model, raw)
    return dataclasses.replace(model, bias=_calibrate_bias(logit, _TARGET_POSITIVE_RATE))


def _calibrate_bias(logit: np.ndarray, target: float) -> float:
    """The shift ``b`` with ``mean(sigmoid(logit + b)) == target`` (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if sigmoid(logit + mid).mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _draw_raw(model: _Model, rng: np.random.Generator, n: int, start: int = 0) -> _Raw:
    """``n`` rows from time ``start`` on (the time matters only to the drifting columns)."""
    ranks = []
    for column in model.columns:
        rank = np.searchsorted(column.cdf, rng.random(n), side="right")
        np.minimum(rank, len(column.cdf) - 1, out=rank)
        ranks.append(rank.astype(np.int64, copy=False))
    normal = rng.standard_normal((CRITEO_NUM_DENSE, n))
    dense = np.floor(np.exp(model.dense_mu[:, None] + model.dense_sigma[:, None] * normal))
    null = rng.random((CRITEO_NUM_DENSE, n)) < model.null_rate[:, None]
    dense[null] = 0.0
    raw = _Raw(ranks=tuple(ranks), dense=dense.astype(np.float32), null=null)
    if model.drift is None:
        return raw
    slots, ids = draw_drift(model.drift, rng, start, n)
    return dataclasses.replace(raw, drift_slots=slots, drift_ids=ids)


def _logit_parts(model: _Model, raw: _Raw) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The first-order, pairwise, dense and drifting parts of the logit (without the bias)."""
    n = raw.dense.shape[1]
    first = np.zeros(n, dtype=np.float64)
    for column, rank in zip(model.columns, raw.ranks):
        first += column.first_order[rank]
    pairs = np.zeros(n, dtype=np.float64)
    for (a, b), (u_a, u_b) in zip(_PAIRS, model.pair_vectors):
        pairs += np.einsum("nk,nk->n", u_a[raw.ranks[a]], u_b[raw.ranks[b]])
    standardized = (np.log1p(raw.dense.astype(np.float64)) - model.dense_mean[:, None]) / (
        model.dense_std[:, None]
    )
    drifting = np.zeros(n) if model.drift is None else drift_effect(model.drift, raw.drift_slots, raw.drift_ids)
    return first, pairs, model.dense_weight @ standardized, drifting


def _logit(model: _Model, raw: _Raw) -> np.ndarray:
    first, pairs, dense, drifting = _logit_parts(model, raw)
    return model.bias + first + pairs + dense + drifting


@dataclass(frozen=True)
class _Block:
    table_columns: dict[str, np.ndarray]
    dense_null: np.ndarray  # bool [13, n]
    logit: np.ndarray  # float64 [n]

    def slice(self, start: int, stop: int) -> _Block:
        return _Block(
            table_columns={k: v[..., start:stop] for k, v in self.table_columns.items()},
            dense_null=self.dense_null[:, start:stop],
            logit=self.logit[start:stop],
        )


def _generate_block(model: _Model, rng: np.random.Generator, start: int = 0) -> _Block:
    raw = _draw_raw(model, rng, _BLOCK_ROWS, start)
    logit = _logit(model, raw)
    label = (rng.random(_BLOCK_ROWS) < sigmoid(logit)).astype(np.int8)
    columns: dict[str, np.ndarray] = {LABEL_COLUMN: label, "dense": raw.dense}
    for name, column, rank in zip(SPARSE_COLUMNS, model.columns, raw.ranks):
        columns[name] = column.perm[rank]
    if model.drift is not None:
        for index, ids in zip(model.drift.columns, raw.drift_ids):
            columns[SPARSE_COLUMNS[index]] = ids
    return _Block(table_columns=columns, dense_null=raw.null, logit=logit)


def _iter_pieces(
    model: _Model, seed: int, split: int, rows: int, rows_per_file: int, start: int
) -> Iterator[list[_Block]]:
    """Yield, for each output file in order, the block slices that make up its rows (the first
    at time ``start``)."""
    cached: tuple[int, _Block] | None = None
    for file_start in range(0, rows, rows_per_file):
        file_stop = min(rows, file_start + rows_per_file)
        pieces = []
        for block_index in range(file_start // _BLOCK_ROWS, (file_stop - 1) // _BLOCK_ROWS + 1):
            if cached is None or cached[0] != block_index:
                block = _generate_block(model, block_rng(seed, split, block_index), start + block_index * _BLOCK_ROWS)
                cached = (block_index, block)
            block_start = block_index * _BLOCK_ROWS
            lo = max(file_start, block_start) - block_start
            hi = min(file_stop, block_start + _BLOCK_ROWS) - block_start
            pieces.append(cached[1].slice(lo, hi))
        yield pieces


def _schema() -> pa.Schema:
    fields = [pa.field(LABEL_COLUMN, pa.int8(), nullable=False)]
    fields += [pa.field(name, pa.float32()) for name in DENSE_COLUMNS]
    fields += [pa.field(name, pa.int64(), nullable=False) for name in SPARSE_COLUMNS]
    return pa.schema(fields)


def _to_table(pieces: list[_Block], schema: pa.Schema) -> pa.Table:
    def cat(key: str) -> np.ndarray:
        return np.concatenate([p.table_columns[key] for p in pieces], axis=-1)

    dense = cat("dense")
    null = np.concatenate([p.dense_null for p in pieces], axis=1)
    arrays = [pa.array(cat(LABEL_COLUMN), type=pa.int8())]
    for d in range(CRITEO_NUM_DENSE):
        mask = null[d] if null[d].any() else None
        arrays.append(pa.array(dense[d], type=pa.float32(), mask=mask))
    arrays += [pa.array(cat(name), type=pa.int64()) for name in SPARSE_COLUMNS]
    return pa.Table.from_arrays(arrays, schema=schema)


def _write_split(
    model: _Model,
    seed: int,
    split: int,
    split_dir: Path,
    rows: int,
    rows_per_file: int,
    row_group_size: int,
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Write one split's part files, its first row at time ``start``; return its true logits and
    labels."""
    clear_split(split_dir)
    schema = _schema()
    logits, labels = [], []
    for index, pieces in enumerate(_iter_pieces(model, seed, split, rows, rows_per_file, start)):
        write_part(_to_table(pieces, schema), split_dir, index, row_group_size)
        logits += [p.logit for p in pieces]
        labels += [p.table_columns[LABEL_COLUMN] for p in pieces]
    return np.concatenate(logits), np.concatenate(labels)


def synth_criteo(
    out_dir: str | os.PathLike[str],
    *,
    rows: int,
    eval_rows: int | None = None,
    seed: int = 0,
    rows_per_file: int = 250_000,
    row_group_size: int = 32_768,
    cardinalities: tuple[int, ...] = CRITEO_CARDINALITIES,
    drift: bool = False,
) -> SynthReport:
    """Write a synthetic Criteo-shaped data set with a known Bayes AUC.

    Writes ``out_dir/train/part-NNNNN.parquet``, ``out_dir/eval/part-NNNNN.parquet`` and, last,
    ``out_dir/synth.json``. An existing ``synth.json`` is removed first and stale
    ``part-*.parquet`` files of ``train/`` and ``eval/`` are deleted, so a crash never leaves a
    ``synth.json`` describing incomplete data; each part file appears under its final name
    only once complete.

    Args:
        out_dir: directory to write into (created if missing).
        rows: number of train rows, >= 1.
        eval_rows: number of eval rows, >= 1; default ``max(rows // 10, 1000)``.
        seed: non-negative seed of the ground-truth model and of the rows.
        rows_per_file: at most this many rows per parquet file, >= 1.
        row_group_size: rows per parquet row group, >= 1.
        cardinalities: ids of each of the 26 categorical columns (default: the small
            :data:`CRITEO_CARDINALITIES` of the examples; :func:`kaggle_cardinalities` for tables
            of the real data's sizes).
        drift: make ``cat_2``, ``cat_3``, ``cat_11``, ``cat_15`` and ``cat_20`` open id
            spaces where new ids keep arriving and old ones fade (:mod:`tzrun_tools.synth_drift`);
            the eval split then follows the train split in time.

    Returns:
        The report also written to ``out_dir/synth.json``.

    Raises:
        ValueError: an argument is out of range, or ``out_dir`` is an existing file.
    """
    out, rows, eval_rows, seed, rows_per_file, row_group_size = checked_arguments(
        out_dir, rows, eval_rows, seed, rows_per_file, row_group_size
    )
    cardinalities = tuple(int(c) for c in cardinalities)
    if len(cardinalities) != CRITEO_NUM_SPARSE or min(cardinalities) < 1:
        raise ValueError(f"cardinalities: {CRITEO_NUM_SPARSE} positive counts expected, got {cardinalities}")
    model = _build_model(seed, cardinalities, drift)
    train_logit, train_label = _write_split(
        model, seed, _SPLIT_TRAIN, out / "train", rows, rows_per_file, row_group_size
    )
    eval_logit, eval_label = _write_split(
        model, seed, _SPLIT_EVAL, out / "eval", eval_rows, rows_per_file, row_group_size, rows if drift else 0
    )
    report = SynthReport(
        out_dir=str(out),
        train_rows=rows,
        eval_rows=eval_rows,
        seed=seed,
        positive_rate=float(train_label.mean()),
        bayes_auc=auc(eval_logit, eval_label),
        bayes_auc_train=auc(train_logit, train_label),
        cardinalities=cardinalities,
        drift_columns=tuple(SPARSE_COLUMNS[c] for c in DRIFT_COLUMNS) if drift else (),
    )
    document = {
        **report.to_json(),
        "format": "tzrec-run synthetic criteo v1",
        "description": _DESCRIPTION,
        "label_column": LABEL_COLUMN,
        "dense_columns": list(DENSE_COLUMNS),
        "sparse_columns": list(SPARSE_COLUMNS),
        "interaction_pairs": [[SPARSE_COLUMNS[a], SPARSE_COLUMNS[b]] for a, b in _PAIRS],
        "null_columns": [DENSE_COLUMNS[d] for d in _NULL_DENSE_COLUMNS],
        "bias": model.bias,
        **({"drift": _DRIFT_DESCRIPTION} if drift else {}),
    }
    write_report(out, document)
    return report
