"""Registers the first-party samplers."""

from __future__ import annotations

import tzrun
from tzrun_plugins.samplers import negative, tdm


@tzrun.hookimpl
def tzrun_register_samplers(register: tzrun.RegisterSamplers) -> None:
    register("negative", config=negative.NegativeSamplerConfig, build=negative.build_negative_sampler,
             description="negatives drawn from an item table (Parquet or CSV), uniform or weighted by popularity")
    register("tdm", config=tdm.TDMSamplerConfig, build=tdm.build_tdm_sampler, expands_rows=True,
             check=tdm.check_tdm_sampler,
             description="TDM's rows: each clicked item's ancestors as positives, per-level negatives from its tree")
