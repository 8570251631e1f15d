"""Training metrics: the decayed values that train log lines show (``[[train_metrics]]``).

Each configured metric is updated with every training batch's outputs. Every ``decay_step``
steps it is computed over the window's rows (a collective over all ranks, at the same step on
every rank, like evaluation) and reset, and the value shown becomes
``decay_rate * previous + (1 - decay_rate) * window`` (the first window's value as is). Before
the first window there is no value (TorchEasyRec shows 0.0 there).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tzrun.kernel.registry import Registries
from tzrun.runner.slots import MetricSlot
from tzrun.runner.evaluate import update_metric

__all__ = ["TrainMetrics"]


class TrainMetrics:
    """The ``[[train_metrics]]`` of a run on one rank.

    Args:
        slots: the resolved ``[[train_metrics]]`` entries.
        registries: where their components come from.
        device: the training device.
    """

    def __init__(self, slots: Sequence[MetricSlot], registries: Registries, device: Any) -> None:
        self.slots = list(slots)
        self.metrics = {
            s.name: registries["metric"].get(s.component.type, "train_metrics").build(s.component.config).to(device)
            for s in self.slots
        }
        self.values: dict[str, float] = {}
        self.steps = 0

    def __bool__(self) -> bool:
        return bool(self.slots)

    def update(self, out: Any) -> None:
        """Feed one training step's output; close the windows that end at this step."""
        self.steps += 1
        for slot in self.slots:
            metric = self.metrics[slot.name]
            update_metric(metric, slot, out)
            fields = slot.component.fields
            if self.steps % fields.decay_step == 0:
                window = float(metric.compute())
                metric.reset()
                previous = self.values.get(slot.name)
                rate = fields.decay_rate
                self.values[slot.name] = window if previous is None else rate * previous + (1 - rate) * window

    def state_dict(self) -> dict[str, Any]:
        """The decayed values and the step count (the same on every rank)."""
        return {"values": dict(self.values), "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.values = dict(state.get("values", {}))
        self.steps = int(state.get("steps", 0))

    def window_state(self) -> dict[str, Any]:
        """This rank's rows of the windows in progress (saved per rank)."""
        return {name: {k: _copy(v) for k, v in metric.metric_state.items()} for name, metric in self.metrics.items()}

    def load_window_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`window_state` returned (same world size only)."""
        for name, metric in self.metrics.items():
            for key, value in state.get(name, {}).items():
                setattr(metric, key, value)
            metric._update_count = 1 if state.get(name) else 0


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [v.detach().clone() for v in value]
    return value.detach().clone()
