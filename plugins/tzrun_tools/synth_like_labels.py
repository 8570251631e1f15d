"""The labels of ``data synth --like``, drawn from each row's score (:mod:`tzrun_tools.synth_like_draw`).

Label ``k`` has the logit ``score + 0.5 own_k[z] + b_k`` (``own_k`` a per-topic effect of its own,
so that tasks differ) and is drawn as what its losses and metrics accept:

* ``binary``: ``Bernoulli(sigmoid(logit))`` with ``b = logit(0.3)``; a later binary label of a
  config with several is a conversion: 1 only where the first binary label is 1, with
  ``P = sigmoid(logit - 0.5)`` there;
* ``class_index`` (``num_classes`` C, 2 when unbounded): ``floor(C sigmoid(logit + logistic noise))``;
* ``non_negative``: a count, ``Poisson(exp(logit / 2))``;
* ``finite``: ``logit + N(0, 0.5^2)``.

A derived label's source column gets, in each row, a value whose derivation (the run's own
:func:`tzrun.data.labels.derive`) is nearest to the drawn label.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from tzrun_tools.synth_common import sigmoid
from tzrun_tools.synth_like_plan import LabelPlan, SynthLikeError

__all__ = ["label_effects", "draw_labels", "source_values"]

_FIRST_RATE = 0.3


def label_effects(labels: tuple[LabelPlan, ...], rng: np.random.Generator, topics: int) -> np.ndarray:
    """Each label's own per-topic effect, ``[labels, topics]``."""
    return rng.standard_normal((len(labels), topics))


def draw_labels(
    labels: tuple[LabelPlan, ...], own: np.ndarray, score: np.ndarray, topics: np.ndarray, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The value of each label in each row, and the true probability of each binary label."""
    values: dict[str, np.ndarray] = {}
    truth: dict[str, np.ndarray] = {}
    first: Optional[str] = None
    for k, label in enumerate(labels):
        logit = score + 0.5 * own[k][topics]
        if label.domain == "binary":
            if first is None:
                p = sigmoid(logit + math.log(_FIRST_RATE / (1 - _FIRST_RATE)))
                values[label.name] = (rng.random(score.size) < p).astype(np.int8)
                first = label.name
            else:
                given = sigmoid(logit - 0.5)
                p = truth[first] * given
                values[label.name] = (values[first] * (rng.random(score.size) < given)).astype(np.int8)
            truth[label.name] = p
        elif label.domain == "class_index":
            classes = label.num_classes or 2
            noise = rng.logistic(size=score.size)
            values[label.name] = np.minimum(np.floor(classes * sigmoid(logit + noise)), classes - 1).astype(np.float32)
        elif label.domain == "non_negative":
            values[label.name] = rng.poisson(np.exp(np.clip(logit / 2, -10, 10))).astype(np.float32)
        else:
            values[label.name] = (logit + 0.5 * rng.standard_normal(score.size)).astype(np.float32)
    return values, truth


def _candidates(d: Any) -> pa.Array:
    """Source values to derive ``d`` from: its map's keys (and an unmapped value with a default),
    or numbers around its comparison value; as text where it casts."""
    if d.map is not None:
        keys = list(d.map) + (["<other>"] if d.default is not None else [])
        return pa.array(keys, pa.string())
    value = float(d.value if d.value is not None else 0.0)
    numbers = [value - 1.0, value - 0.5, value, value + 0.5, value + 1.0]
    if d.cast is not None:
        return pa.array([repr(x) for x in numbers], pa.string())
    return pa.array(numbers, pa.float64())


def source_values(label: LabelPlan, wanted: np.ndarray, source: str) -> pa.Array:
    """A derived label's source column: per row, the candidate whose derivation is nearest to
    ``wanted`` (the drawn label).

    Raises:
        SynthLikeError: a binary label whose derivation cannot give both 0 and 1.
    """
    from tzrun.data.labels import derive  # the run's own derivation: the data is read back exactly so

    candidates = _candidates(label.derived)
    derived, _ = derive(candidates, label.derived, source, lambda *_: None)
    known = np.where(np.isnan(derived), np.inf, derived.astype(np.float64))
    if label.domain == "binary" and not ({0.0, 1.0} <= set(known.tolist())):
        raise SynthLikeError(f"{source}: {label.path}: no value of column '{label.column}' that data synth --like "
                             f"tries ({', '.join(map(str, candidates.to_pylist()))}) derives both 0 and 1; "
                             "write the label's column yourself")
    nearest = np.argmin(np.abs(known[None, :] - wanted.astype(np.float64)[:, None]), axis=1)
    return candidates.take(pa.array(nearest))
