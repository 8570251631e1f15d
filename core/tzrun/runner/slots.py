"""Losses and metrics resolved to what they read (torch-free, so ``tzrec-run check`` stays fast).

A run resolves them once, in :class:`~tzrun.runner.facts.RunFacts`; read them there."""

from __future__ import annotations

from typing import Sequence

import attrs

from tzrun.config.schema import Component, RunConfig
from tzrun.errors import ConfigError, ConfigProblem
from tzrun.kernel.registry import Registries

__all__ = ["LossSlot", "MetricSlot", "loss_slots", "metric_slots", "group_columns"]


@attrs.frozen
class LossSlot:
    """A configured loss: its name, the output and label it reads, its weight, its group key."""

    name: str
    prediction: str
    label: str
    weight: float
    group_by: str | None = None


@attrs.frozen
class MetricSlot:
    """A configured metric: its name, the output and label it reads, its component, its group key."""

    name: str
    prediction: str
    label: str
    component: Component
    group_by: str | None = None


def _slot_names(components: Sequence[Component], what: str) -> list[str]:
    names = [c.fields.name or getattr(c.config, "default_name", None) or c.name for c in components]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise ConfigError(
                what,
                [ConfigProblem(f"{what}[{i}].name", f"'{name}' is also the name of {what}[{seen[name]}]; give one a name = \"...\"")],
            )
        seen[name] = i
    return names


def _resolve_slots(cfg: RunConfig, registries: Registries, kind: str, what: str) -> list[tuple[str, str, str, Component]]:
    """``(name, prediction, label, component)`` of each ``[[losses]]`` or ``[[metrics]]`` entry."""
    components = getattr(cfg, what)
    return [
        (
            name,
            c.fields.prediction or registries[kind].get(c.type, what).extras["prediction"],
            c.fields.label or cfg.data.labels[0],
            c,
        )
        for name, c in zip(_slot_names(components, what), components)
    ]


def loss_slots(cfg: RunConfig, registries: Registries) -> list[LossSlot]:
    """Each ``[[losses]]`` entry resolved to what it reads."""
    return [
        LossSlot(n, p, lbl, c.fields.weight, c.fields.group_by)
        for n, p, lbl, c in _resolve_slots(cfg, registries, "loss", "losses")
    ]


def metric_slots(cfg: RunConfig, registries: Registries, what: str = "metrics") -> list[MetricSlot]:
    """Each ``[[metrics]]`` (or ``[[train_metrics]]``) entry resolved to what it reads."""
    return [MetricSlot(n, p, lbl, c, c.fields.group_by) for n, p, lbl, c in _resolve_slots(cfg, registries, "metric", what)]


def group_columns(cfg: RunConfig) -> list[str]:
    """The ``group_by`` columns of every loss and metric, each once."""
    names = [c.fields.group_by for c in (*cfg.losses, *cfg.metrics, *cfg.train_metrics) if c.fields and c.fields.group_by]
    return list(dict.fromkeys(names))

