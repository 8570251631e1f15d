"""Registers the first-party item samplers."""

from __future__ import annotations

import tzrun
from tzrun_plugins.samplers import negative


@tzrun.hookimpl
def tzrun_register_samplers(register: tzrun.Register) -> None:
    register("negative", config=negative.NegativeSamplerConfig, build=negative.build_negative_sampler,
             description="negatives drawn from an item table (Parquet or CSV), uniform or weighted by popularity")
