"""The values of ``data synth --like``'s columns, drawn from a latent topic per row.

Every row has a topic ``z`` (one of :data:`TOPICS`). An id column has a pool of up to
:data:`POOL` ids of its range (the whole range when smaller), and each topic owns
:data:`OWNED` of them: a row's id is one of its topic's ids with probability 0.6, any pooled id
with 0.35, and any id of the range with 0.05 (so the whole range is exercised). A sequence's
elements are on the row's topic with the row's *interest* ``s ~ U(0, 1)``, else on a random
topic. A dense value is ``N(shift[z], 0.8^2)`` on the model's scale (after ``log1p``, ``mean`` and
``std``). Ids become values as their feature reads them: integers, vocabulary tokens (id 0 an
out-of-vocabulary token), or numbers inside the id's bucket of ``boundaries``.

A row's *score* (the signal of its labels) is ``0.8 topic[z] + 0.8 mean_c effect_c / sqrt(#c)
+ 0.8 (2 s - 1)`` (the last with sequence groups), where an id's effect is
``sqrt(2) sin(a_c id + b_c)`` (a fixed pseudo-random number per id, variance 1, for ranges of any
size) and a dense value's is its standardized value: the features reveal the topic and carry
effects of their own, so a model beats AUC 0.5 on the labels.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import attrs
import numpy as np
import pyarrow as pa

from tzrun_tools.synth_like_plan import MULTI_VALUED_MAX, ColumnPlan, SynthPlan

__all__ = ["TOPICS", "POOL", "OWNED", "OOV_TOKEN", "Params", "Drawn", "make_params", "item_popularity", "draw_rows"]

TOPICS = 16
POOL = 4096
OWNED = 4
OOV_TOKEN = "<oov>"
_ON_TOPIC, _POOLED = 0.6, 0.95
_ITEM_ON_TOPIC = 0.7


@attrs.frozen
class Params:
    """What is fixed for a seed: per column its id pool, effect frequency and phase and
    per-topic dense shift; per topic its effect; the item catalogue of a sampler's table."""

    pools: dict[str, np.ndarray]
    freq: dict[str, float]
    phase: dict[str, float]
    shift: dict[str, np.ndarray]
    topic_effect: np.ndarray
    catalogue: dict[str, pa.Array]
    catalogue_topics: np.ndarray


@attrs.frozen
class Drawn:
    """One block of rows: the feature columns, the topic, interest and score of each row."""

    columns: dict[str, pa.Array]
    topics: np.ndarray
    score: np.ndarray


def _pool(num_ids: int, rng: np.random.Generator) -> np.ndarray:
    if num_ids <= POOL:
        return rng.permutation(num_ids).astype(np.int64)
    return np.asarray(rng.choice(num_ids, POOL, replace=False), dtype=np.int64)


def make_params(plan: SynthPlan, rng: np.random.Generator) -> Params:
    """The fixed parameters of ``plan``'s data, drawn from ``rng``."""
    pools, freq, phase, shift = {}, {}, {}, {}
    for c in plan.columns:
        pools[c.column] = _pool(max(c.num_ids, 1), rng)
        freq[c.column] = float(rng.uniform(1.0, 1000.0))
        phase[c.column] = float(rng.uniform(0.0, 2 * math.pi))
        shift[c.column] = rng.normal(0.0, 0.6, TOPICS)
    params = Params(pools, freq, phase, shift, rng.standard_normal(TOPICS), {}, np.zeros(0, np.int64))
    return _with_catalogue(plan, params, rng) if plan.item_table is not None else params


def _with_catalogue(plan: SynthPlan, params: Params, rng: np.random.Generator) -> Params:
    """One row per item of the sampler's table: unique ids of the item id column, a topic each,
    and one value of every item-side column drawn on that topic."""
    assert plan.item_table is not None
    by_name = {c.column: c for c in plan.columns}
    item_id = by_name[plan.item_table.item_id]
    size = len(params.pools[item_id.column])
    topics = np.arange(size) % TOPICS
    catalogue = {item_id.column: _as_values(item_id, params.pools[item_id.column], rng)}
    for name in plan.item_table.columns:
        catalogue[name] = _scalar(by_name[name], params, topics, rng)
    return attrs.evolve(params, catalogue=catalogue, catalogue_topics=topics)


def item_popularity(params: Params) -> np.ndarray:
    """The probability that a row's item is each item of the catalogue."""
    topics = params.catalogue_topics
    per_topic = np.bincount(topics, minlength=TOPICS)
    return np.asarray(_ITEM_ON_TOPIC / TOPICS / per_topic[topics] + (1 - _ITEM_ON_TOPIC) / topics.size, dtype=np.float64)


def _ids(column: str, params: Params, topics: np.ndarray, rng: np.random.Generator, num_ids: int) -> np.ndarray:
    pool = params.pools[column]
    u = rng.random(topics.size)
    owned = pool[(topics + TOPICS * rng.integers(0, OWNED, topics.size)) % pool.size]
    pooled = pool[rng.integers(0, pool.size, topics.size)]
    anywhere = rng.integers(0, max(num_ids, 1), topics.size)
    return np.where(u < _ON_TOPIC, owned, np.where(u < _POOLED, pooled, anywhere))


def _as_values(c: ColumnPlan, ids: np.ndarray, rng: np.random.Generator) -> pa.Array:
    """Ids as the column's feature reads them: integers, tokens, or numbers in the id's bucket."""
    if c.kind == "vocab":
        assert c.vocab is not None
        tokens = np.array([OOV_TOKEN, *c.vocab], dtype=object)
        return pa.array(tokens[ids], pa.string())
    if c.kind == "boundaries":
        assert c.boundaries is not None
        edges = np.array(c.boundaries, dtype=np.float64)
        width = max((edges[-1] - edges[0]) / max(edges.size - 1, 1), 1.0)
        low = np.concatenate([[edges[0] - width], edges])[ids]
        high = np.concatenate([edges, [edges[-1] + width]])[ids]
        return pa.array(low + rng.random(ids.size) * (high - low), pa.float64())
    return pa.array(ids.astype(np.int64), pa.int64())


def _dense(c: ColumnPlan, params: Params, topics: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Values whose model input (after log1p, mean and std) is ``N(shift[z], 0.8^2)``."""
    scaled = c.mean + c.std * (params.shift[c.column][topics] + 0.8 * rng.standard_normal(topics.size))
    return np.asarray(np.expm1(np.maximum(scaled, 0.0)) if c.log1p else scaled, dtype=np.float64)


def _scalar(c: ColumnPlan, params: Params, topics: np.ndarray, rng: np.random.Generator) -> pa.Array:
    if c.kind == "dense":
        return pa.array(_dense(c, params, topics, rng).astype(np.float32))
    if c.kind == "weights":
        return pa.array(rng.uniform(0.5, 1.5, topics.size).astype(np.float32))
    return _as_values(c, _ids(c.column, params, topics, rng, c.num_ids), rng)


def _effect(c: ColumnPlan, params: Params, ids: np.ndarray) -> np.ndarray:
    return math.sqrt(2.0) * np.sin(params.freq[c.column] * ids.astype(np.float64) + params.phase[c.column])


def _listed(c: ColumnPlan, values: pa.Array, lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    listed = pa.ListArray.from_arrays(pa.array(offsets), values)
    if c.shape == "list":
        return listed
    text = pa.compute.cast(listed.flatten(), pa.string())
    return pa.compute.binary_join(pa.ListArray.from_arrays(pa.array(offsets), text), c.separator)


class _Block:
    """Draws one block's columns in plan order, keeping each row's score."""

    def __init__(self, plan: SynthPlan, params: Params, rng: np.random.Generator, n: int) -> None:
        self.plan, self.params, self.rng, self.n = plan, params, rng, n
        self.topics = rng.integers(0, TOPICS, n)
        self.interest = rng.random(n)
        self.item: Optional[np.ndarray] = self._items() if params.catalogue else None
        self.lengths: dict[Any, np.ndarray] = {}
        self.effects: list[np.ndarray] = []

    def _items(self) -> np.ndarray:
        topics = self.params.catalogue_topics
        on_topic = self.topics + TOPICS * self.rng.integers(0, np.bincount(topics, minlength=TOPICS)[self.topics])
        anywhere = self.rng.integers(0, topics.size, self.n)
        return np.where(self.rng.random(self.n) < _ITEM_ON_TOPIC, np.minimum(on_topic, topics.size - 1), anywhere)

    def column(self, c: ColumnPlan) -> pa.Array:
        if self.item is not None and c.column in self.params.catalogue:
            if self.plan.item_table is not None and c.column == self.plan.item_table.item_id:
                self.effects.append(_effect(c, self.params, self.item))
            return self.params.catalogue[c.column].take(pa.array(self.item))
        if c.shape == "scalar":
            return self._scalar(c)
        return self._multi(c)

    def _scalar(self, c: ColumnPlan) -> pa.Array:
        if c.kind in ("dense", "weights"):
            values = _scalar(c, self.params, self.topics, self.rng)
            if c.kind == "dense":
                self.effects.append(self._model_input(c, values.to_numpy()))
            return values
        ids = _ids(c.column, self.params, self.topics, self.rng, c.num_ids)
        self.effects.append(_effect(c, self.params, ids))
        return _as_values(c, ids, self.rng)

    @staticmethod
    def _model_input(c: ColumnPlan, x: np.ndarray) -> np.ndarray:
        v = np.log1p(np.maximum(x.astype(np.float64), 0.0)) if c.log1p else x.astype(np.float64)
        return (v - c.mean) / c.std

    def _multi(self, c: ColumnPlan) -> pa.Array:
        key = c.group if c.group is not None else (c.lengths_of or c.column)
        if key not in self.lengths:
            high = c.max_len if c.group is not None else MULTI_VALUED_MAX
            self.lengths[key] = self.rng.integers(0 if c.group is not None else 1, high + 1, self.n)
        lengths = self.lengths[key]
        total = int(lengths.sum())
        if c.kind == "weights":
            return _listed(c, pa.array(self.rng.uniform(0.5, 1.5, total).astype(np.float32)), lengths)
        rows = np.repeat(np.arange(self.n), lengths)
        on_topic = self.rng.random(total) < (self.interest[rows] if c.group is not None else _ON_TOPIC)
        topics = np.where(on_topic, self.topics[rows], self.rng.integers(0, TOPICS, total))
        if c.kind == "dense":  # a dense sequence: one value per id of its group, drawn on that id's topic
            return _listed(c, pa.array(_dense(c, self.params, topics, self.rng).astype(np.float32)), lengths)
        return _listed(c, _as_values(c, _ids(c.column, self.params, topics, self.rng, c.num_ids), self.rng), lengths)

    def score(self) -> np.ndarray:
        score = 0.8 * self.params.topic_effect[self.topics]
        if self.effects:
            score = score + 0.8 * np.sum(self.effects, axis=0) / math.sqrt(len(self.effects))
        if self.plan.columns and any(c.group is not None for c in self.plan.columns):
            score = score + 0.8 * (2.0 * self.interest - 1.0)
        return score


def draw_rows(plan: SynthPlan, params: Params, rng: np.random.Generator, n: int) -> Drawn:
    """``n`` rows of every feature column of ``plan`` (labels are drawn from their score)."""
    block = _Block(plan, params, rng, n)
    columns = {c.column: block.column(c) for c in plan.columns}
    return Drawn(columns, block.topics, block.score())
