"""What follows from a checked config and its components, worked out once (torch-free).

A :class:`RunFacts` is the one place that resolves the config's derived facts: the feature
specs (vocabulary files read), the resolved ``[[losses]]``, ``[[metrics]]`` and
``[[train_metrics]]`` slots, the label sources, the ``group_by`` columns and the input columns
a batch reads. The :class:`~tzrun.runner.session.Session` owns one; ``check`` (preflight), the
model builder, the planner, retention (``eval.best_metric``) and evaluation all read it there,
so two commands cannot disagree on them. It needs no process group and imports no torch, so
``tzrec-run check`` stays fast.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from tzrun.config.schema import RunConfig
from tzrun.kernel.registry import Registries
from tzrun.runner.label_domains import derived_labels, label_domains
from tzrun.runner.slots import LossSlot, MetricSlot, group_columns, loss_slots, metric_slots

if TYPE_CHECKING:
    from tzrun.data.features import FeatureSpecs
    from tzrun.data.labels import DerivedLabel, LabelDomain

__all__ = ["RunFacts"]


class RunFacts:
    """The derived facts of one config, each computed on first use and then kept.

    Args:
        cfg: the checked config.
        registries: the components it was checked against.
    """

    def __init__(self, cfg: RunConfig, registries: Registries) -> None:
        self.cfg = cfg
        self.registries = registries

    @functools.cached_property
    def specs(self) -> FeatureSpecs:
        """The features: dense and sparse specs, embedding tables (vocabulary files read)."""
        from tzrun.data.features import feature_specs

        return feature_specs(self.cfg.features)

    @functools.cached_property
    def loss_slots(self) -> list[LossSlot]:
        """Each ``[[losses]]`` entry resolved to what it reads."""
        return loss_slots(self.cfg, self.registries)

    @functools.cached_property
    def metric_slots(self) -> list[MetricSlot]:
        """Each ``[[metrics]]`` entry (evaluation) resolved to what it reads."""
        return metric_slots(self.cfg, self.registries, "metrics")

    @functools.cached_property
    def train_metric_slots(self) -> list[MetricSlot]:
        """Each ``[[train_metrics]]`` entry resolved to what it reads."""
        return metric_slots(self.cfg, self.registries, "train_metrics")

    def slots(self, what: str) -> list[LossSlot] | list[MetricSlot]:
        """The resolved slots of ``what``: ``"losses"``, ``"metrics"`` or ``"train_metrics"``."""
        return {"losses": self.loss_slots, "metrics": self.metric_slots, "train_metrics": self.train_metric_slots}[what]

    @functools.cached_property
    def group_columns(self) -> list[str]:
        """The ``group_by`` columns of every loss and metric, each once."""
        return group_columns(self.cfg)

    @functools.cached_property
    def derived_labels(self) -> tuple[DerivedLabel, ...]:
        """``[[data.derived_labels]]`` as the batch builder takes them."""
        return derived_labels(self.cfg)

    @functools.cached_property
    def label_domains(self) -> dict[str, tuple[LabelDomain, ...]]:
        """Per label, the domains the batch builder checks it against."""
        return label_domains(self.cfg, self.registries)

    @functools.cached_property
    def label_sources(self) -> list[str]:
        """The columns ``data.labels`` are read from: a derived label's source in its stead."""
        from tzrun.data.labels import label_sources  # pyarrow: only when a run or a check needs it

        return label_sources(self.cfg.data.labels, self.derived_labels)

    @functools.cached_property
    def input_columns(self) -> list[str]:
        """Every input column a batch reads: the features', the labels' (a derived label's
        source column in its stead), the sample weight and the ``group_by`` columns."""
        return self.specs.columns(self.label_sources, self.cfg.data.sample_weight, self.group_columns)

    @functools.cached_property
    def eval_result_keys(self) -> list[str]:
        """The keys an evaluation reports: each metric's name and ``loss/<name>`` of each loss."""
        return [s.name for s in self.metric_slots] + [f"loss/{s.name}" for s in self.loss_slots]
