"""Registers the first-party learning-rate schedules."""

from __future__ import annotations

import tzrun
from tzrun_plugins.schedules import constant


@tzrun.hookimpl
def tzrun_register_lr_schedulers(register: tzrun.Register) -> None:
    register("constant", config=constant.ConstantConfig, build=constant.build_constant,
             description="the optimizer's lr at every step")
