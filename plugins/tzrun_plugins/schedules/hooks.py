"""Registers the first-party learning-rate schedules (see docs/schedules.md)."""

from __future__ import annotations

import tzrun
from tzrun_plugins.schedules import config


@tzrun.hookimpl
def tzrun_register_lr_schedulers(register: tzrun.Register) -> None:
    register("constant", config=config.ConstantConfig, build=config.build_constant,
             description="the optimizer's lr at every step")
    register("exponential_decay", config=config.ExponentialDecayConfig, build=config.build_exponential_decay,
             description="linear warmup, then lr * decay_factor ** (steps / decay_size), floored at min_learning_rate")
    register("manual_step", config=config.ManualStepConfig, build=config.build_manual_step,
             description="learning_rates[i] from step schedule_sizes[i] on")
    register("cosine_annealing", config=config.CosineAnnealingConfig, build=config.build_cosine_annealing,
             description="linear warmup, then half a cosine down to min_learning_rate over T_max steps")
    register("cosine_annealing_warm_restarts", config=config.CosineAnnealingWarmRestartsConfig,
             build=config.build_cosine_annealing_warm_restarts,
             description="linear warmup, then cosine cycles of T_0, T_0 * T_mult, ... steps (SGDR)")
