"""Registers the first-party models."""

from __future__ import annotations

import tzrun
from tzrun_plugins.models import deepfm


@tzrun.hookimpl
def tzrun_register_models(register: tzrun.Register) -> None:
    register("deepfm", config=deepfm.DeepFMConfig, build=deepfm.build_deepfm,
             description="DeepFM: wide + FM + deep MLP over id and dense features")
