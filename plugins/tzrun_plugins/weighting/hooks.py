"""Registers the first-party loss weightings."""

from __future__ import annotations

import tzrun


@tzrun.hookimpl
def tzrun_register_loss_weightings(register: tzrun.RegisterLossWeightings) -> None:
    from tzrun_plugins.weighting import options

    register("sum", config=options.SumConfig, build=options.build_sum,
             description="the total loss is the sum of the losses times their weight (the default)")
    register("pareto", config=options.ParetoConfig, build=options.build_pareto, check=options.check_pareto,
             description="Pareto-efficient loss weights at every step (PE-LTR, TorchEasyRec's pe_mtl_loss), with min_weights")
