"""Registers the first-party losses."""

from __future__ import annotations

import tzrun
from tzrun_plugins.losses import binary


@tzrun.hookimpl
def tzrun_register_losses(register: tzrun.Register) -> None:
    register("binary_cross_entropy", config=binary.BCEConfig, build=binary.build_bce,
             description="sigmoid cross entropy on logits, sample-weighted", prediction="logits")
