"""PEPNet, parameter and embedding personalized network (Chang et al., KDD 2023), as TorchEasyRec's
``pepnet``: a multi-task model whose shared input and task towers are gated per row.

``x = [dense features, embeddings, encoded sequence groups]`` (TorchEasyRec's ``all`` group). A
gate unit is ``gate(z) = gamma * sigmoid(linear(relu(linear(z))))`` (TorchEasyRec's ``GateNU``),
so each gate value lies in ``(0, gamma)``; the default gamma 2 centres it on 1. With
``domain_features`` (its ``domain`` group), EPNet scales ``x`` element by element by a gate over
``[domain features, stop_gradient(x)]``: ``e = gate_ep([domain, sg(x)]) * x``; without, ``e = x``.
With ``uia_features`` (its ``uia`` group: user, item, author), PPNet gives each task its own
stack of ``ppnet_hidden_units`` layers over ``e``, each layer's output scaled by its own gate over
``[uia features, sg(e)]``: ``h <- relu(linear(h)) * gate_kj([uia, sg(e)])``; without, every task
reads ``e``. Each task's tower MLP and a linear layer to one logit follow. The outputs are
``logits/<task>`` and ``probs/<task>`` for each task, as ``mmoe``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigProblem
from tzrun_plugins.models._layers import mlp, out_width, positive_units, unknown_feature_problems
from tzrun_plugins.models._multi_task import (TaskConfig, add_inputs, check_inputs, look_up, per_task_outputs,
                                                read_inputs, unique_tasks)
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, unique_sequences

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["PEPNetTaskConfig", "PEPNetConfig", "build_pepnet"]


#: one ``[[model.tasks]]`` table (mmoe's: ``_multi_task.TaskConfig``)
PEPNetTaskConfig = TaskConfig


@attrs.frozen
class PEPNetConfig:
    """Options of the ``pepnet`` model.

    Attributes:
        tasks: the tasks, each with its tower.
        domain_features: dense and id features that EPNet's gate reads beside the shared input
            (the ``domain`` group); empty: no EPNet.
        uia_features: dense and id features (user, item, author side) that PPNet's gates read
            beside the shared input (the ``uia`` group); empty: no PPNet.
        epnet_hidden_unit: width of the hidden layer of EPNet's gate (default: the width of the
            shared input). Only with ``domain_features``.
        epnet_gamma: EPNet's gate values lie in ``(0, epnet_gamma)``.
        ppnet_hidden_units: layer widths of each task's PPNet stack, each layer with its own
            gate (at least one layer with ``uia_features``; not used without them).
        ppnet_gamma: PPNet's gate values lie in ``(0, ppnet_gamma)``.
        sequence_encoders: how each sequence group is encoded (``[[model.sequence_encoders]]``;
            ``mean`` for a group without a table).
    """

    tasks: tuple[PEPNetTaskConfig, ...] = attrs.field(validator=unique_tasks("pepnet"))
    domain_features: tuple[str, ...] = ()
    uia_features: tuple[str, ...] = ()
    epnet_hidden_unit: Optional[int] = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    epnet_gamma: float = attrs.field(default=2.0, validator=attrs.validators.gt(0))
    ppnet_hidden_units: tuple[int, ...] = attrs.field(default=(512, 256), validator=positive_units)
    ppnet_gamma: float = attrs.field(default=2.0, validator=attrs.validators.gt(0))
    sequence_encoders: tuple[SequenceEncoderConfig, ...] = attrs.field(default=(), validator=unique_sequences)

    @epnet_hidden_unit.validator
    def _epnet_needs_domain(self, attribute: Any, value: Optional[int]) -> None:
        if value is not None and not self.domain_features:
            raise ValueError("EPNet's gate is built only with domain_features: name them, or remove "
                             "epnet_hidden_unit", attribute)

    @ppnet_hidden_units.validator
    def _ppnet_needs_layers(self, attribute: Any, value: tuple[int, ...]) -> None:
        if self.uia_features and not value:
            raise ValueError("PPNet gates the layers of each task's stack: with uia_features it needs at least "
                             "one layer", attribute)


def _problems(cfg: PEPNetConfig, ctx: ModelContext) -> list[ConfigProblem]:
    """What keeps the gates' features from being read: an unknown feature, one named twice."""
    return (unknown_feature_problems("model.domain_features", cfg.domain_features, ctx)
            + unknown_feature_problems("model.uia_features", cfg.uia_features, ctx))


def build_pepnet(cfg: PEPNetConfig, ctx: ModelContext) -> Any:
    """Build PEPNet for ``ctx``'s features.

    Raises:
        ConfigError: when there is no id feature, a sequence encoder does not fit its group, or
            ``domain_features`` or ``uia_features`` name a feature that is no dense or id feature
            (or one twice).
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_inputs import FeatureInputs

    check_inputs(cfg.sequence_encoders, ctx, "pepnet", _problems(cfg, ctx))

    class Gate(nn.Module):
        """``gamma * sigmoid(linear(relu(linear(z))))``: per-row scales in ``(0, gamma)``."""

        def __init__(self, in_width: int, hidden: int, out: int, gamma: float) -> None:
            super().__init__()
            self.gamma = gamma
            self.layers = nn.Sequential(nn.Linear(in_width, hidden), nn.ReLU(), nn.Linear(hidden, out), nn.Sigmoid())

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return self.gamma * self.layers(z)  # type: ignore[no-any-return]

    class GatedLayer(nn.Module):
        """One PPNet layer: ``relu(linear(h)) * gate(g)``."""

        def __init__(self, in_width: int, width: int, gate_width: int) -> None:
            super().__init__()
            self.linear = nn.Linear(in_width, width)
            self.gate = Gate(gate_width, width, width, cfg.ppnet_gamma)

        def forward(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(h)) * self.gate(g)  # type: ignore[no-any-return]

    class GatedStack(nn.Module):
        """One task's PPNet layers, each gated over the same ``g``."""

        def __init__(self, in_width: int, gate_width: int) -> None:
            super().__init__()
            widths = (in_width,) + cfg.ppnet_hidden_units
            self.layers = nn.ModuleList(GatedLayer(i, o, gate_width) for i, o in zip(widths, widths[1:]))

        def forward(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                h = layer(h, g)
            return h

    class EPNet(nn.Module):
        """``gate([domain features, sg(x)]) * x``."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.inputs = FeatureInputs(ctx, cfg.domain_features)
            self.gate = Gate(self.inputs.width + width, cfg.epnet_hidden_unit or width, width, cfg.epnet_gamma)

        def forward(self, x: torch.Tensor, dense: torch.Tensor, bags: Any, sequences: Any) -> torch.Tensor:
            domain = self.inputs(dense, bags, sequences)
            return self.gate(torch.cat([domain, x.detach()], dim=1)) * x  # type: ignore[no-any-return]

    class PPNet(nn.Module):
        """A stack of gated layers per task, every gate over ``[uia features, sg(e)]``."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.inputs = FeatureInputs(ctx, cfg.uia_features)
            self.tasks = nn.ModuleList(GatedStack(width, self.inputs.width + width) for _ in cfg.tasks)

        def forward(self, e: torch.Tensor, dense: torch.Tensor, bags: Any, sequences: Any) -> torch.Tensor:
            """``[tasks, B, ppnet_hidden_units[-1]]``: one tensor, as TorchRec's train pipeline may
            trace this module as a leaf, whose result cannot be unpacked."""
            g = torch.cat([self.inputs(dense, bags, sequences), e.detach()], dim=1)
            return torch.stack([stack(e, g) for stack in self.tasks])

    class PEPNet(nn.Module):
        """EPNet over the shared input, a PPNet stack and a tower per task."""

        def __init__(self) -> None:
            super().__init__()
            self.task_names = [t.name for t in cfg.tasks]
            width = add_inputs(self, cfg.sequence_encoders, ctx)
            self.epnet = EPNet(width) if cfg.domain_features else None
            self.ppnet = PPNet(width) if cfg.uia_features else None
            if self.ppnet is not None:
                width = cfg.ppnet_hidden_units[-1]
            self.towers = nn.ModuleList(
                nn.Sequential(mlp(width, t.hidden_units), nn.Linear(out_width(width, t.hidden_units), 1))
                for t in cfg.tasks
            )

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            looked_up = look_up(self, batch)
            x = read_inputs(self, batch, looked_up)
            if self.epnet is not None:
                x = self.epnet(x, batch.dense, *looked_up)
            if self.ppnet is not None:
                stacked = self.ppnet(x, batch.dense, *looked_up)
                inputs = [stacked[k] for k in range(len(self.task_names))]
            else:
                inputs = [x] * len(self.task_names)
            return per_task_outputs(self.task_names, [tower(h) for tower, h in zip(self.towers, inputs)])

    return PEPNet()
