"""The item table of the synthetic Taobao data (``out_dir/items.parquet``): one row per ad.

Columns: the ad's ids (``adgroup_id``, ``cate_id``, ``campaign_id``, ``customer``, ``brand``)
and dense features (``price``, ``item_ctr_7d``), as the rows of :mod:`tzrun_tools.synth_taobao`
hold them (they are fixed per ad), and ``popularity``: the ad's exact share of impressions under
the ground-truth model (summing to 1). It is the item table of ``[data.sampler]`` in
``examples/dssm_taobao_sampled.toml``: uniform negatives ignore ``popularity``, weighted ones
draw ads as often as they are shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ITEM_TABLE", "taobao_items", "write_taobao_items"]

#: The item table's file name under the data set's directory.
ITEM_TABLE = "items.parquet"


def _impression_shares(model: Any, personalized: float) -> np.ndarray:
    """Each ad's probability of being the ad of an impression (see ``_draw_items``)."""
    p_user = np.diff(model.user_cdf, prepend=0.0)
    preference = np.diff(model.user_pref_cdf, axis=1, prepend=0.0)
    p_cate_pop = np.diff(model.cate_pop_cdf, prepend=0.0)
    p_cate = personalized * (p_user @ preference) + (1 - personalized) * p_cate_pop
    order = model.item_by_cate
    cate_sorted = model.item_columns["cate_id"][order]
    within = model.item_cdf_by_cate - cate_sorted  # cumulative share within the ad's category
    starts = np.r_[True, cate_sorted[1:] != cate_sorted[:-1]]
    previous = np.where(starts, 0.0, np.r_[0.0, within[:-1]])
    shares = np.zeros(order.size)
    shares[order] = p_cate[cate_sorted] * (within - previous)
    return shares / shares.sum()


def taobao_items(model: Any, personalized: float) -> pa.Table:
    """The item table of a ground-truth model (see the module docstring)."""
    columns = {name: pa.array(np.asarray(values, dtype=np.int64)) for name, values in model.item_columns.items()}
    columns["price"] = pa.array(np.asarray(model.price, dtype=np.float32))
    columns["item_ctr_7d"] = pa.array(np.asarray(model.item_ctr, dtype=np.float32))
    columns["popularity"] = pa.array(_impression_shares(model, personalized))
    return pa.table(columns)


def write_taobao_items(model: Any, personalized: float, out_dir: Path) -> Path:
    """Write ``out_dir/items.parquet``; return its path."""
    path = out_dir / ITEM_TABLE
    pq.write_table(taobao_items(model, personalized), path)
    return path
