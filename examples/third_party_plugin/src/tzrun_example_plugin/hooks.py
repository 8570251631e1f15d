"""The entry-point target: hookimpls only, nothing heavy imported, nothing registered on import."""

from __future__ import annotations

from typing import Any

import attrs

import tzrun


@attrs.frozen
class SignSGDConfig:
    """TOML options of ``sign_sgd``.

    Attributes:
        lr: the step of every element, ``w -= lr * sign(g)``.
    """

    lr: float = attrs.field(validator=attrs.validators.ge(0.0))


@attrs.frozen
class LabelMeanConfig:
    """``label_mean`` has no options."""


def build_sign_sgd(cfg: SignSGDConfig, params: Any) -> Any:
    from tzrun_example_plugin.components import SignSGD  # torch is imported only now

    return SignSGD(params, lr=cfg.lr)


def build_label_mean(cfg: LabelMeanConfig) -> Any:
    from tzrun_example_plugin.components import LabelMean

    return LabelMean()


@tzrun.hookimpl
def tzrun_register_dense_optimizers(register: tzrun.Register) -> None:
    register("sign_sgd", config=SignSGDConfig, build=build_sign_sgd, description="signSGD: w -= lr * sign(g)")


@tzrun.hookimpl
def tzrun_register_metrics(register: tzrun.Register) -> None:
    register("label_mean", config=LabelMeanConfig, build=build_label_mean, prediction="probs",
             description="weighted mean of the label over all ranks")
