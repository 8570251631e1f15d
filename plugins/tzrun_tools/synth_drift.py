"""The drifting id columns of ``tzrec-run data synth criteo --drift``: an open id space where new
ids keep arriving over the rows and old ones fade, so that the ids outnumber any table a run can
afford, and each id carries an effect of its own on the label (a row shared with another id by a
hash costs AUC).

Each drifting column has :data:`DRIFT_SLOTS` popularity *slots*, drawn by a power law
(``P(slot k) ~ (k + 1) ** -alpha`` with ``alpha`` uniform in :data:`DRIFT_ALPHA_RANGE`). A slot is
held by a succession of ids, its *generations*: generation ``g`` of slot ``k`` rises during
:data:`DRIFT_LIFETIME` rows and fades during the next ``DRIFT_LIFETIME``, when generation ``g + 1``
rises in its place. At row ``t`` (the row's index in the train split; eval rows come after the last
train row) with ``x = (t + phase_k) / DRIFT_LIFETIME``, ``e = floor(x)`` and ``p = x - e``, the row
takes generation ``e + 1`` (rising) with probability ``p``, else generation ``e`` (fading);
``phase_k`` is uniform in ``[0, DRIFT_LIFETIME)``, so the slots change hands evenly over the rows.
So about ``2 * DRIFT_SLOTS`` ids of a column are live at any row, and ``rows / DRIFT_LIFETIME *
DRIFT_SLOTS`` new ones arrive over ``rows`` rows.

An id is ``splitmix64((g * DRIFT_SLOTS + k) ^ salt) & (2**63 - 1)``: a pseudo-random 63-bit
integer, distinct per (slot, generation), as hashed production ids look. Its effect on the logit
is ``sigma * z(id) * damp_k``: ``z`` a standard normal drawn from the id by a hash (Box-Muller over
two splitmix64 outputs), ``damp_k = min(1, P(slot k) * DRIFT_LIFETIME / DRIFT_LEARNABLE_LOOKUPS)``,
so an id seen fewer than :data:`DRIFT_LEARNABLE_LOOKUPS` times in its life carries a share of the
effect in proportion. ``sigma`` is scaled, for all drifting columns together, at calibration.

All parameters come from ``default_rng(SeedSequence(seed, spawn_key=(4, 0)))``; rows draw their
slot and generation from the block's generator after every other column, so the other columns'
values are those of the same seed without ``--drift``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tzrun_tools.synth_common import power_law

__all__ = [
    "DRIFT_COLUMNS",
    "DRIFT_SLOTS",
    "DRIFT_LIFETIME",
    "DRIFT_ALPHA_RANGE",
    "DRIFT_LEARNABLE_LOOKUPS",
    "Drift",
    "DriftColumn",
    "build_drift",
    "draw_drift",
    "drift_effect",
    "scale_drift",
]

#: The columns that drift: Criteo's C3, C4, C12, C16 and C21, its id columns of millions of ids.
DRIFT_COLUMNS: tuple[int, ...] = (2, 3, 11, 15, 20)
#: Popularity slots per drifting column (about twice as many ids are live at any row).
DRIFT_SLOTS: int = 1000
#: Rows an id rises for, and again fades for.
DRIFT_LIFETIME: int = 50_000
#: The power law's exponent over the slots, per column: flatter than the fixed columns'.
DRIFT_ALPHA_RANGE: tuple[float, float] = (0.8, 1.0)
#: Lifetime lookups from which an id carries its whole effect.
DRIFT_LEARNABLE_LOOKUPS: float = 20.0

_MASK63 = np.uint64(2**63 - 1)
_SIGMA_RANGE = (0.15, 0.5)


@dataclass(frozen=True)
class DriftColumn:
    """One drifting column: its slots' popularity, phases and damping, and its hash salts."""

    cdf: np.ndarray  # float64 [DRIFT_SLOTS], cumulative P(slot <= k)
    phase: np.ndarray  # float64 [DRIFT_SLOTS], in [0, DRIFT_LIFETIME)
    damp: np.ndarray  # float64 [DRIFT_SLOTS]
    sigma: float
    id_salt: np.uint64
    effect_salt: np.uint64


@dataclass(frozen=True)
class Drift:
    """The drifting columns (indices into the sparse columns) and their parameters."""

    columns: tuple[int, ...]
    specs: tuple[DriftColumn, ...]


def build_drift(seed: int) -> Drift:
    """The drifting columns' parameters for ``seed`` (before the calibration's scaling)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(4, 0)))
    specs = []
    for _ in DRIFT_COLUMNS:
        prob, cdf = power_law(DRIFT_SLOTS, rng.uniform(*DRIFT_ALPHA_RANGE))
        salts = rng.integers(0, 2**63, size=2, dtype=np.int64).astype(np.uint64)
        specs.append(DriftColumn(
            cdf=cdf,
            phase=rng.uniform(0.0, DRIFT_LIFETIME, size=DRIFT_SLOTS),
            damp=np.minimum(1.0, prob * DRIFT_LIFETIME / DRIFT_LEARNABLE_LOOKUPS),
            sigma=float(rng.uniform(*_SIGMA_RANGE)),
            id_salt=salts[0],
            effect_salt=salts[1],
        ))
    return Drift(columns=DRIFT_COLUMNS, specs=tuple(specs))


def draw_drift(drift: Drift, rng: np.random.Generator, start: int, n: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The slots and ids of rows ``start .. start + n - 1``, one array of each per drifting column.

    Args:
        drift: the drifting columns.
        rng: the block's generator (consumed: two uniforms per row and column).
        start: the time (row index) of the first row.
        n: rows.

    Returns:
        ``(slots, ids)``: int64 arrays ``[n]`` per drifting column.
    """
    time = np.arange(start, start + n, dtype=np.float64)
    slots, ids = [], []
    for spec in drift.specs:
        slot = np.searchsorted(spec.cdf, rng.random(n), side="right")
        np.minimum(slot, DRIFT_SLOTS - 1, out=slot)
        x = (time + spec.phase[slot]) / DRIFT_LIFETIME
        epoch = np.floor(x)
        generation = epoch.astype(np.int64) + (rng.random(n) < x - epoch)
        index = (generation * DRIFT_SLOTS + slot).astype(np.uint64)
        slots.append(slot.astype(np.int64, copy=False))
        ids.append((_splitmix64(index ^ spec.id_salt) & _MASK63).astype(np.int64))
    return tuple(slots), tuple(ids)


def drift_effect(drift: Drift, slots: tuple[np.ndarray, ...], ids: tuple[np.ndarray, ...]) -> np.ndarray:
    """The drifting columns' part of the logit: the sum of each row's ids' effects."""
    total = np.zeros(len(slots[0]), dtype=np.float64)
    for spec, slot, id_ in zip(drift.specs, slots, ids):
        total += spec.sigma * spec.damp[slot] * _normal_of(id_.astype(np.uint64) ^ spec.effect_salt)
    return total


def scale_drift(drift: Drift, factor: float) -> Drift:
    """``drift`` with every column's effects multiplied by ``factor``."""
    return dataclasses.replace(drift, specs=tuple(dataclasses.replace(s, sigma=s.sigma * factor) for s in drift.specs))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 (wrapping arithmetic): a bijection that mixes every bit."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def _normal_of(keys: np.ndarray) -> np.ndarray:
    """A standard normal per uint64 key, the same for the same key (Box-Muller)."""
    first = _splitmix64(keys)
    second = _splitmix64(first)
    u1 = ((first >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]
    u2 = (second >> np.uint64(11)).astype(np.float64) * 2.0**-53
    normal: np.ndarray = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return normal
