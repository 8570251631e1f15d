"""MMoE, multi-gate mixture of experts (Ma et al., KDD 2018), in TorchEasyRec's shape.

``x = [dense features, embeddings]``; ``num_experts`` expert MLPs read ``x``; each task ``t`` has
a gate ``softmax(linear(gate_mlp(x)))`` over the experts and a tower MLP over the gated mix of
their outputs, then a linear layer to one logit. The outputs are ``logits/<task>`` and
``probs/<task>`` for each task: a loss or metric names the one it reads with ``prediction`` and
its label with ``label``.

With ``[[features.sequence]]`` groups, each group is encoded into one vector by its
``[[model.sequence_encoders]]`` table (``mean``, ``target_attention`` with the group's ``query``
as the candidate, or ``self_attention``; ``mean`` for a group without one) and appended to ``x``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun_plugins.models._layers import mlp, non_empty, out_width, positive_units
from tzrun_plugins.models._multi_task import (TaskConfig, add_inputs, check_inputs, per_task_outputs, read_inputs,
                                                unique_tasks)
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, unique_sequences

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["MMoETaskConfig", "MMoEConfig", "build_mmoe"]


#: one ``[[model.tasks]]`` table (the same as ple's: ``_multi_task.TaskConfig``)
MMoETaskConfig = TaskConfig


@attrs.frozen
class MMoEConfig:
    """Options of the ``mmoe`` model.

    Attributes:
        num_experts: how many expert MLPs.
        expert_hidden_units: layer widths of each expert MLP (at least one layer).
        gate_hidden_units: layer widths of an MLP before each gate's linear layer (empty: the
            gate is linear in the input, as in the paper).
        tasks: the tasks, each with its tower.
        sequence_encoders: how each sequence group is encoded (``[[model.sequence_encoders]]``;
            ``mean`` for a group without a table).
    """

    tasks: tuple[MMoETaskConfig, ...] = attrs.field(validator=unique_tasks("mmoe"))
    num_experts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    expert_hidden_units: tuple[int, ...] = attrs.field(
        default=(512, 256, 128), validator=[non_empty, positive_units]
    )
    gate_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    sequence_encoders: tuple[SequenceEncoderConfig, ...] = attrs.field(default=(), validator=unique_sequences)


def build_mmoe(cfg: MMoEConfig, ctx: ModelContext) -> Any:
    """Build MMoE for ``ctx``'s features.

    Raises:
        ConfigError: when there is no id feature, or a sequence encoder does not fit its group.
    """
    import torch
    from torch import nn

    check_inputs(cfg.sequence_encoders, ctx, "mmoe")

    class MMoE(nn.Module):
        """Shared experts, one gate and one tower per task."""

        def __init__(self) -> None:
            super().__init__()
            self.task_names = [t.name for t in cfg.tasks]
            width = add_inputs(self, cfg.sequence_encoders, ctx)
            self.experts = nn.ModuleList(mlp(width, cfg.expert_hidden_units) for _ in range(cfg.num_experts))
            self.gates = nn.ModuleList(
                nn.Sequential(
                    mlp(width, cfg.gate_hidden_units),
                    nn.Linear(out_width(width, cfg.gate_hidden_units), cfg.num_experts),
                    nn.Softmax(dim=-1),
                )
                for _ in cfg.tasks
            )
            expert_width = cfg.expert_hidden_units[-1]
            self.towers = nn.ModuleList(
                nn.Sequential(mlp(expert_width, t.hidden_units), nn.Linear(out_width(expert_width, t.hidden_units), 1))
                for t in cfg.tasks
            )

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            x = read_inputs(self, batch)
            experts = torch.stack([expert(x) for expert in self.experts], dim=1)  # [B, E, W]
            mixed = [torch.bmm(gate(x).unsqueeze(1), experts).squeeze(1) for gate in self.gates]
            return per_task_outputs(self.task_names, [tower(m) for tower, m in zip(self.towers, mixed)])

    return MMoE()
