"""Synthetic Taobao-shaped user/item data with click and buy labels from a known model.

The columns follow the Taobao display-ads data set that TorchEasyRec's ``mmoe_taobao`` and
``dssm_taobao`` examples use (user profile, ad, context, a click sequence), scaled to a CPU
machine; the labels come from a known model, so the best achievable AUC of each label (the
*Bayes AUC*) is known and written next to the data, and the rows have a user-item affinity that a
two-tower model can learn (measured by recall@k).

Layout written by :func:`synth_taobao`::

    out_dir/train/part-00000.parquet, ...
    out_dir/eval/part-00000.parquet, ...
    out_dir/items.parquet         # one row per ad: its features and popularity (data.sampler)
    out_dir/synth.json            # the TaobaoSynthReport plus a description of the model

Columns (in this order), none null:

* labels ``click``, ``buy``: int8 0/1; ``buy`` is 1 only on rows with ``click`` 1.
* user: ``user_id`` (``[0, NUM_USERS)``), ``cms_segid``, ``cms_group_id``,
  ``final_gender_code``, ``age_level``, ``pvalue_level``, ``shopping_level``, ``occupation``,
  ``new_user_class_level``: int64 ids (cardinalities in :data:`USER_CARDINALITIES`), fixed per user.
* item (an ad): ``adgroup_id`` (``[0, NUM_ITEMS)``), ``cate_id``, ``campaign_id``,
  ``customer``, ``brand``: int64 ids (:data:`ITEM_CARDINALITIES`), fixed per ad.
* context: ``pid``: a string, one of two ad positions (``"430548_1007"``, ``"430539_1007"``).
* dense: ``price`` (float32, lognormal, fixed per ad), ``user_pv_7d`` (float32 page views of the
  user in a week, a count), ``item_ctr_7d`` (float32, the ad's click rate in a week: a noisy
  measurement of its quality).
* ``click_50_seq``: ``list<int64>`` of up to 50 ``adgroup_id``s the user clicked recently (0 to 50
  of them; drawn from the user's interests, so they tell about the user; the last is the most recent).
* ``click_50_seq__adgroup_id``, ``click_50_seq__cate_id``, ``click_50_seq__brand``: ``list<int64>``
  aligned with ``click_50_seq`` (same length in each row): the clicked ads' ``adgroup_id`` (equal
  to ``click_50_seq``), ``cate_id`` and ``brand``, the ids the candidate's own columns use, so a
  sequence feature may share the candidate's table (TorchEasyRec's Taobao column names).

Ground-truth model (K = 8 latent dimensions)::

    user u:  vector z_u = S[cms_segid] + A[age_level] + G[gender] + 0.8 N(0, I)
    ad i:    vector v_i = C[cate_id] + 0.5 N(0, I); quality q_i; price; brand effects
    impression: user ~ power law; with prob 0.7 a category ~ softmax(1.5 <z_u, C_c> + log pop_c),
                else ~ pop_c; the ad within the category ~ power law
    click_50_seq: 0 to 50 ads, each drawn like an impression's ad with prob 0.5 of personalized
    click logit = b_c + a <z_u, v_i> + s seq_sim(i, click_50_seq)
                + user_effect(shopping_level, age_level, log user_pv_7d)
                + q_i + brand_c[brand] + pid_effect - w_p standardized(log price)
    seq_sim(i, S) = sum_j softmax_j(cos(v_i, v_j) / 0.1) cos(v_i, v_j) over the ads j of S (0 if empty)
    buy | click logit = b_b + 0.5 a <z_u, v_i> + brand_b[brand] + user_b(shopping_level, occupation)
                - sens[pvalue_level] standardized(log price)
    click ~ Bernoulli(sigmoid(click logit)); buy ~ click * Bernoulli(sigmoid(buy logit))

``seq_sim`` is target attention with a sharp softmax: nearly the similarity of the candidate to the
*closest* ad of the sequence, which the average of the sequence's vectors does not give (a user
with two interests has a mean vector between them, close to neither). The parts of the click logit
are scaled on a calibration sample to variances 0.5 (affinity), 1.3 (sequence), 0.3 (user), 0.5
(ad) and 0.15 (context and price); ``b_c`` gives a 0.25 click rate and ``b_b`` a
0.15 buy rate among clicks. ``bayes_auc['click']`` is the AUC of the true click probability
against ``click`` on the eval split, ``bayes_auc['buy']`` that of ``P(click) * P(buy | click)``
against ``buy``: the ceilings of any model evaluated there.

Retrieval: with ``data.sample_weight = "click"`` (clicked rows only, as TorchEasyRec's
positive-only ``dssm_taobao`` samples), a two-tower model ranks each user's clicked ad among
the other clicked ads of the batch; random ranking gives recall@k = k / (clicked rows per batch).

Determinism as in :mod:`tzrun_tools.synth`: parameters from ``numpy.random.default_rng(seed)``,
rows in blocks of 16,384 from ``default_rng(SeedSequence(seed, spawn_key=(split, block)))``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tzrun_tools.synth_taobao_items import write_taobao_items
from tzrun_tools.synth_taobao_report import TaobaoSynthReport, read_taobao_report
from tzrun_tools.synth_common import (
    power_law,
    auc,
    block_rng,
    checked_arguments,
    clear_split,
    sigmoid,
    write_part,
    write_report,
)

__all__ = [
    "NUM_USERS",
    "NUM_ITEMS",
    "USER_CARDINALITIES",
    "ITEM_CARDINALITIES",
    "DENSE_COLUMNS",
    "LABEL_COLUMNS",
    "SEQUENCE_COLUMN",
    "SEQUENCE_SIDE_COLUMNS",
    "SEQUENCE_LENGTH",
    "PIDS",
    "TaobaoSynthReport",
    "synth_taobao",
    "read_taobao_report",
]

NUM_USERS: int = 4000
NUM_ITEMS: int = 6000

#: Ids of each user column are in ``[0, cardinality)``.
USER_CARDINALITIES: dict[str, int] = {
    "user_id": NUM_USERS,
    "cms_segid": 97,
    "cms_group_id": 13,
    "final_gender_code": 2,
    "age_level": 7,
    "pvalue_level": 4,
    "shopping_level": 3,
    "occupation": 2,
    "new_user_class_level": 5,
}
#: Ids of each ad column are in ``[0, cardinality)``.
ITEM_CARDINALITIES: dict[str, int] = {
    "adgroup_id": NUM_ITEMS,
    "cate_id": 120,
    "campaign_id": 3000,
    "customer": 1500,
    "brand": 600,
}
DENSE_COLUMNS: tuple[str, ...] = ("price", "user_pv_7d", "item_ctr_7d")
LABEL_COLUMNS: tuple[str, ...] = ("click", "buy")
SEQUENCE_COLUMN: str = "click_50_seq"
#: The sequence columns aligned with :data:`SEQUENCE_COLUMN`, each holding the clicked ads' ids of
#: one item column (``click_50_seq__<item column>``).
SEQUENCE_SIDE_COLUMNS: dict[str, str] = {
    f"{SEQUENCE_COLUMN}__{name}": name for name in ("adgroup_id", "cate_id", "brand")
}
SEQUENCE_LENGTH: int = 50
PIDS: tuple[str, ...] = ("430548_1007", "430539_1007")

_BLOCK_ROWS = 16_384
_CALIBRATION_ROWS = 65_536
_SPLIT_TRAIN, _SPLIT_EVAL, _SPLIT_CALIBRATION = 1, 2, 3
_DIM = 8
_PERSONALIZED = 0.7
_PREFERENCE_SHARPNESS = 1.5
_CLICK_RATE = 0.25
_BUY_GIVEN_CLICK = 0.15
_VARIANCES = {"affinity": 0.5, "sequence": 1.3, "user": 0.3, "item": 0.5, "context": 0.15}
_ATTENTION_TEMPERATURE = 0.1
_SEQ_PERSONALIZED = 0.5
_BUY_VARIANCES = {"affinity": 0.25, "brand": 0.4, "user": 0.3, "price": 0.4}

_DESCRIPTION = (
    "Synthetic Taobao-shaped data. Users and ads have latent vectors (dim 8: user = profile "
    "segment + age + gender vectors + noise, ad = category vector + noise); impressions pick a "
    "category by the user's interests (70%) or by popularity (30%). click ~ Bernoulli(sigmoid("
    "b + affinity + similarity of the ad to the closest ads of click_50_seq (softmax attention) + user effects + ad quality + brand + pid - price)); buy ~ click * Bernoulli("
    "sigmoid(b' + affinity/2 + brand + user + price sensitivity by pvalue_level)). "
    "click_50_seq holds ads drawn from the user's interests (click_50_seq__adgroup_id/__cate_id/__brand: "
    "their ids, aligned). bayes_auc[label] is the AUC of the "
    "true probability of the label on the eval split. See the docstring of tzrun_tools.synth_taobao."
)


# --------------------------------------------------------------------------------------------
# Ground-truth model


@dataclass(frozen=True)
class _Model:
    user_columns: dict[str, np.ndarray]  # per user column, the id of each user
    user_vec: np.ndarray  # [U, K]
    user_cdf: np.ndarray  # [U], cumulative P(user)
    user_pref_cdf: np.ndarray  # [U, C], cumulative P(category | user)
    user_pv_mu: np.ndarray  # [U], mean of log page views
    cate_pop_cdf: np.ndarray  # [C]
    item_columns: dict[str, np.ndarray]  # per ad column, the id of each ad
    item_vec: np.ndarray  # [I, K]
    item_by_cate: np.ndarray  # ad ids sorted by category
    item_cdf_by_cate: np.ndarray  # c + cumulative P(ad | category c), aligned with item_by_cate
    item_quality: np.ndarray  # [I]
    price: np.ndarray  # [I] float32
    item_ctr: np.ndarray  # [I] float32
    brand_click: np.ndarray  # [brands]
    brand_buy: np.ndarray  # [brands]
    shopping_click: np.ndarray  # [3]
    age_click: np.ndarray  # [7]
    pv_weight: float
    pid_click: np.ndarray  # [2]
    price_weight: float
    shopping_buy: np.ndarray  # [3]
    occupation_buy: np.ndarray  # [2]
    price_sensitivity: np.ndarray  # [4], by pvalue_level
    log_price_mean: float
    log_price_std: float
    log_pv_mean: float
    log_pv_std: float
    scale: dict[str, float]
    buy_scale: dict[str, float]
    click_bias: float
    buy_bias: float


@dataclass(frozen=True)
class _Rows:
    user: np.ndarray
    item: np.ndarray
    pid: np.ndarray  # 0 or 1
    user_pv: np.ndarray  # float32
    seq_offsets: np.ndarray  # int32 [n + 1]
    seq_items: np.ndarray  # int64


def _draw(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


def _build_model(seed: int) -> _Model:
    rng = np.random.default_rng(seed)
    users = {name: rng.integers(0, card, NUM_USERS) for name, card in USER_CARDINALITIES.items() if name != "user_id"}
    users["user_id"] = np.arange(NUM_USERS)
    user_vec = (
        rng.standard_normal((USER_CARDINALITIES["cms_segid"], _DIM))[users["cms_segid"]] * 0.7
        + rng.standard_normal((USER_CARDINALITIES["age_level"], _DIM))[users["age_level"]] * 0.5
        + rng.standard_normal((USER_CARDINALITIES["final_gender_code"], _DIM))[users["final_gender_code"]] * 0.5
        + 0.8 * rng.standard_normal((NUM_USERS, _DIM))
    ) / math.sqrt(0.49 + 0.25 + 0.25 + 0.64)
    # a power law over ranks; user u has rank user_rank_perm[u]
    user_rank_perm = rng.permutation(NUM_USERS)
    user_cdf = np.cumsum(np.diff(power_law(NUM_USERS, 0.6)[1], prepend=0.0)[user_rank_perm])
    user_cdf[-1] = 1.0

    n_cate = ITEM_CARDINALITIES["cate_id"]
    cate_vec = rng.standard_normal((n_cate, _DIM))
    cate_pop = rng.permutation(np.arange(1, n_cate + 1, dtype=np.float64) ** -0.8)
    cate_pop /= cate_pop.sum()
    pref = _PREFERENCE_SHARPNESS * user_vec @ cate_vec.T + np.log(cate_pop)
    pref = np.exp(pref - pref.max(axis=1, keepdims=True))
    user_pref_cdf = np.cumsum(pref / pref.sum(axis=1, keepdims=True), axis=1)
    user_pref_cdf[:, -1] = 1.0
    cate_pop_cdf = np.cumsum(cate_pop)
    cate_pop_cdf[-1] = 1.0

    # every category holds at least one ad
    cate = np.concatenate([np.arange(n_cate), _draw(cate_pop_cdf, rng.random(NUM_ITEMS - n_cate))])
    rng.shuffle(cate)
    brand = rng.integers(0, ITEM_CARDINALITIES["brand"], NUM_ITEMS)
    customer = rng.integers(0, ITEM_CARDINALITIES["customer"], NUM_ITEMS)
    campaign = rng.integers(0, ITEM_CARDINALITIES["campaign_id"], NUM_ITEMS)
    items = {"adgroup_id": np.arange(NUM_ITEMS), "cate_id": cate, "campaign_id": campaign, "customer": customer, "brand": brand}
    item_vec = cate_vec[cate] + 0.5 * rng.standard_normal((NUM_ITEMS, _DIM))
    order = np.argsort(cate, kind="stable")
    item_pop = rng.random(NUM_ITEMS) ** 3 + 0.02  # a few popular ads per category
    cdf_by_cate = np.zeros(NUM_ITEMS)
    for c in range(n_cate):
        in_cate = cate[order] == c
        within = np.cumsum(item_pop[order[in_cate]])
        cdf_by_cate[in_cate] = c + within / within[-1]
    item_quality = rng.standard_normal(NUM_ITEMS)
    log_price = rng.normal(3.5, 1.0, NUM_ITEMS) + 0.5 * rng.standard_normal(n_cate)[cate]
    price = np.round(np.exp(log_price), 2).astype(np.float32)
    log_price = np.log(price.astype(np.float64))

    model = _Model(
        user_columns=users,
        user_vec=user_vec,
        user_cdf=user_cdf,
        user_pref_cdf=user_pref_cdf,
        user_pv_mu=rng.normal(2.5, 0.8, NUM_USERS),
        cate_pop_cdf=cate_pop_cdf,
        item_columns=items,
        item_vec=item_vec,
        item_by_cate=order,
        item_cdf_by_cate=cdf_by_cate,
        item_quality=item_quality,
        price=price,
        item_ctr=np.zeros(NUM_ITEMS, dtype=np.float32),
        brand_click=rng.standard_normal(ITEM_CARDINALITIES["brand"]) * 0.5,
        brand_buy=rng.standard_normal(ITEM_CARDINALITIES["brand"]),
        shopping_click=rng.standard_normal(3),
        age_click=rng.standard_normal(7) * 0.7,
        pv_weight=0.5,
        pid_click=np.array([0.3, -0.3]),
        price_weight=0.3,
        shopping_buy=rng.standard_normal(3),
        occupation_buy=rng.standard_normal(2) * 0.5,
        price_sensitivity=np.array([1.5, 1.0, 0.5, 0.1]),
        log_price_mean=float(log_price.mean()),
        log_price_std=float(log_price.std()),
        log_pv_mean=0.0,
        log_pv_std=1.0,
        scale={k: 1.0 for k in _VARIANCES},
        buy_scale={k: 1.0 for k in _BUY_VARIANCES},
        click_bias=0.0,
        buy_bias=0.0,
    )
    rows = _draw_rows(model, block_rng(seed, _SPLIT_CALIBRATION, 0), _CALIBRATION_ROWS)
    log_pv = np.log1p(rows.user_pv.astype(np.float64))
    model = dataclasses.replace(model, log_pv_mean=float(log_pv.mean()), log_pv_std=float(log_pv.std()))
    parts = _click_parts(model, rows)
    model = dataclasses.replace(model, scale={k: math.sqrt(_VARIANCES[k] / parts[k].var()) for k in _VARIANCES})
    buy_parts = _buy_parts(model, rows)
    model = dataclasses.replace(model, buy_scale={k: math.sqrt(_BUY_VARIANCES[k] / buy_parts[k].var()) for k in _BUY_VARIANCES})
    click_logit, buy_logit = _logits(model, rows)
    click_bias = _bisect(lambda b: sigmoid(click_logit + b).mean(), _CLICK_RATE)
    p_click = sigmoid(click_logit + click_bias)
    buy_bias = _bisect(lambda b: (p_click * sigmoid(buy_logit + b)).sum() / p_click.sum(), _BUY_GIVEN_CLICK)
    # item_ctr_7d: the ad's click rate over a simulated week of 200 impressions (noisy quality)
    quality_rate = sigmoid(click_bias + model.scale["item"] * (item_quality + model.brand_click[brand]))
    item_ctr = (rng.binomial(200, quality_rate) / 200.0).astype(np.float32)
    return dataclasses.replace(model, click_bias=click_bias, buy_bias=buy_bias, item_ctr=item_ctr)


def _bisect(mean_at: Any, target: float) -> float:
    """The shift ``b`` with ``mean_at(b) == target``, for an increasing ``mean_at``."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_at(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def _draw_items(model: _Model, users: np.ndarray, personalized: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = users.size
    by_user = (model.user_pref_cdf[users] < rng.random(n)[:, None]).sum(axis=1)
    category = np.where(personalized, np.minimum(by_user, model.user_pref_cdf.shape[1] - 1), _draw(model.cate_pop_cdf, rng.random(n)))
    position = np.searchsorted(model.item_cdf_by_cate, category + rng.random(n), side="right")
    return model.item_by_cate[np.minimum(position, NUM_ITEMS - 1)]


def _draw_rows(model: _Model, rng: np.random.Generator, n: int) -> _Rows:
    users = _draw(model.user_cdf, rng.random(n))
    items = _draw_items(model, users, rng.random(n) < _PERSONALIZED, rng)
    pid = (rng.random(n) < 0.4).astype(np.int64)
    user_pv = np.floor(np.exp(model.user_pv_mu[users] + 0.5 * rng.standard_normal(n))).astype(np.float32)
    lengths = rng.integers(0, SEQUENCE_LENGTH + 1, n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    seq_users = np.repeat(users, lengths)
    seq_items = _draw_items(model, seq_users, rng.random(seq_users.size) < _SEQ_PERSONALIZED, rng)
    return _Rows(users, items, pid, user_pv, offsets, seq_items.astype(np.int64))


def _click_parts(model: _Model, rows: _Rows) -> dict[str, np.ndarray]:
    users, items = rows.user, rows.item
    uc, ic = model.user_columns, model.item_columns
    affinity = np.einsum("nk,nk->n", model.user_vec[users], model.item_vec[items])
    log_pv = (np.log1p(rows.user_pv.astype(np.float64)) - model.log_pv_mean) / model.log_pv_std
    user = model.shopping_click[uc["shopping_level"][users]] + model.age_click[uc["age_level"][users]] + model.pv_weight * log_pv
    item = model.item_quality[items] + model.brand_click[ic["brand"][items]]
    price = (np.log(model.price[items].astype(np.float64)) - model.log_price_mean) / model.log_price_std
    context = model.pid_click[rows.pid] - model.price_weight * price
    sequence = _sequence_similarity(model, rows)
    return {"affinity": affinity, "sequence": sequence, "user": user, "item": item, "context": context}


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("nk,nk->n", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _sequence_similarity(model: _Model, rows: _Rows) -> np.ndarray:
    """Per row, the softmax-attention similarity of the candidate ad to the ads of its sequence."""
    n = rows.user.size
    lengths = np.diff(rows.seq_offsets)
    row = np.repeat(np.arange(n), lengths)
    sim = _cosine(model.item_vec[rows.item[row]], model.item_vec[rows.seq_items])
    weight = np.exp(sim / _ATTENTION_TEMPERATURE)  # cos <= 1: at most e^10, no overflow
    total = np.bincount(row, weight, minlength=n)
    weighted = np.bincount(row, weight * sim, minlength=n)
    return np.divide(weighted, total, out=np.zeros(n), where=total > 0)


def _buy_parts(model: _Model, rows: _Rows) -> dict[str, np.ndarray]:
    users, items = rows.user, rows.item
    uc = model.user_columns
    affinity = np.einsum("nk,nk->n", model.user_vec[users], model.item_vec[items])
    price = (np.log(model.price[items].astype(np.float64)) - model.log_price_mean) / model.log_price_std
    return {
        "affinity": affinity,
        "brand": model.brand_buy[model.item_columns["brand"][items]],
        "user": model.shopping_buy[uc["shopping_level"][users]] + model.occupation_buy[uc["occupation"][users]],
        "price": -model.price_sensitivity[uc["pvalue_level"][users]] * price,
    }


def _logits(model: _Model, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """Click logit and buy-given-click logit of each row."""
    click = sum(model.scale[k] * v for k, v in _click_parts(model, rows).items())
    buy = sum(model.buy_scale[k] * v for k, v in _buy_parts(model, rows).items())
    return model.click_bias + click, model.buy_bias + buy


def _schema() -> pa.Schema:
    fields = [pa.field(name, pa.int8(), nullable=False) for name in LABEL_COLUMNS]
    fields += [pa.field(name, pa.int64(), nullable=False) for name in USER_CARDINALITIES]
    fields += [pa.field(name, pa.int64(), nullable=False) for name in ITEM_CARDINALITIES]
    fields.append(pa.field("pid", pa.string(), nullable=False))
    fields += [pa.field(name, pa.float32(), nullable=False) for name in DENSE_COLUMNS]
    fields += [pa.field(name, pa.list_(pa.int64()), nullable=False) for name in (SEQUENCE_COLUMN, *SEQUENCE_SIDE_COLUMNS)]
    return pa.schema(fields)


def _block(model: _Model, seed: int, split: int, index: int) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One block of rows: the table, the true click and buy probabilities, the labels."""
    rng = block_rng(seed, split, index)
    rows = _draw_rows(model, rng, _BLOCK_ROWS)
    click_logit, buy_logit = _logits(model, rows)
    p_click, p_buy_given_click = sigmoid(click_logit), sigmoid(buy_logit)
    click = (rng.random(_BLOCK_ROWS) < p_click).astype(np.int8)
    buy = (click.astype(bool) & (rng.random(_BLOCK_ROWS) < p_buy_given_click)).astype(np.int8)
    arrays: list[pa.Array] = [pa.array(click), pa.array(buy)]
    arrays += [pa.array(model.user_columns[name][rows.user].astype(np.int64)) for name in USER_CARDINALITIES]
    arrays += [pa.array(model.item_columns[name][rows.item].astype(np.int64)) for name in ITEM_CARDINALITIES]
    arrays.append(pa.array(np.array(PIDS, dtype=object)[rows.pid], type=pa.string()))
    arrays += [pa.array(model.price[rows.item]), pa.array(rows.user_pv), pa.array(model.item_ctr[rows.item])]
    offsets = pa.array(rows.seq_offsets)
    arrays.append(pa.ListArray.from_arrays(offsets, pa.array(rows.seq_items)))
    arrays += [
        pa.ListArray.from_arrays(offsets, pa.array(model.item_columns[name][rows.seq_items].astype(np.int64)))
        for name in SEQUENCE_SIDE_COLUMNS.values()
    ]
    table = pa.Table.from_arrays(arrays, schema=_schema())
    return table, p_click, p_click * p_buy_given_click, click, buy


def _write_split(
    model: _Model, seed: int, split: int, split_dir: Path, rows: int, rows_per_file: int, row_group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Write one split's part files; return the true click and buy probabilities and labels."""
    clear_split(split_dir)
    blocks = [_block(model, seed, split, b) for b in range(-(-rows // _BLOCK_ROWS))]
    whole = pa.concat_tables(b[0] for b in blocks).slice(0, rows)
    for index, start in enumerate(range(0, rows, rows_per_file)):
        write_part(whole.slice(start, rows_per_file), split_dir, index, row_group_size)
    return tuple(np.concatenate([b[k] for b in blocks])[:rows] for k in (1, 2, 3, 4))  # type: ignore[return-value]


def synth_taobao(
    out_dir: str | os.PathLike[str],
    *,
    rows: int,
    eval_rows: int | None = None,
    seed: int = 0,
    rows_per_file: int = 250_000,
    row_group_size: int = 32_768,
) -> TaobaoSynthReport:
    """Write a synthetic Taobao-shaped data set with a known Bayes AUC for ``click`` and ``buy``.

    Writes ``out_dir/train/part-NNNNN.parquet``, ``out_dir/eval/part-NNNNN.parquet`` and, last,
    ``out_dir/synth.json`` (removed first, so it never describes incomplete data).

    Args:
        out_dir: directory to write into (created if missing).
        rows: number of train rows, >= 1.
        eval_rows: number of eval rows, >= 1; default ``max(rows // 10, 1000)``.
        seed: non-negative seed of the ground-truth model and of the rows.
        rows_per_file: at most this many rows per parquet file, >= 1.
        row_group_size: rows per parquet row group, >= 1.

    Returns:
        The report also written to ``out_dir/synth.json``.

    Raises:
        ValueError: an argument is out of range, or ``out_dir`` is an existing file.
    """
    out, rows, eval_rows, seed, rows_per_file, row_group_size = checked_arguments(
        out_dir, rows, eval_rows, seed, rows_per_file, row_group_size
    )
    model = _build_model(seed)
    train = _write_split(model, seed, _SPLIT_TRAIN, out / "train", rows, rows_per_file, row_group_size)
    evaluation = _write_split(model, seed, _SPLIT_EVAL, out / "eval", eval_rows, rows_per_file, row_group_size)
    write_taobao_items(model, _PERSONALIZED, out)  # items.parquet: the item table of [data.sampler]

    def aucs(split: tuple[np.ndarray, ...]) -> dict[str, float]:
        p_click, p_buy, click, buy = split
        return {"click": auc(p_click, click), "buy": auc(p_buy, buy)}

    report = TaobaoSynthReport(
        out_dir=str(out),
        train_rows=rows,
        eval_rows=eval_rows,
        seed=seed,
        click_rate=float(train[2].mean()),
        buy_rate=float(train[3].mean()),
        bayes_auc=aucs(evaluation),
        bayes_auc_train=aucs(train),
    )
    document = {
        **report.to_json(),
        "format": "tzrec-run synthetic taobao v2",
        "description": _DESCRIPTION,
        "label_columns": list(LABEL_COLUMNS),
        "user_columns": USER_CARDINALITIES,
        "item_columns": ITEM_CARDINALITIES,
        "dense_columns": list(DENSE_COLUMNS),
        "sequence_column": SEQUENCE_COLUMN,
        "sequence_side_columns": SEQUENCE_SIDE_COLUMNS,
        "context_columns": {"pid": list(PIDS)},
    }
    write_report(out, document)
    return report
