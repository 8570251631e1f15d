"""PLE, progressive layered extraction (Tang et al., RecSys 2020), as TorchEasyRec's ``ple``.

``x = [dense features, embeddings]`` starts every path: each task's input ``t_k = x`` and the
shared input ``s = x``. Each ``[[model.extraction_networks]]`` level (a CGC layer) has, per task,
``num_task_experts`` expert MLPs reading ``t_k`` and ``num_shared_experts`` shared expert MLPs
reading ``s``. Task ``k``'s next input is its gate's mix of its own and the shared experts'
outputs, ``softmax(linear(t_k))``; below the last level a shared gate ``softmax(linear(s))``
mixes every expert of the level (all tasks' and the shared ones) into the next ``s``. After the
last level each task's input goes through its tower MLP and a linear layer to one logit. The
outputs are ``logits/<task>`` and ``probs/<task>`` for each task.

With ``[[features.sequence]]`` groups, each group is encoded into one vector by its
``[[model.sequence_encoders]]`` table (as ``mmoe``'s) and appended to ``x``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence, cast

import attrs

from tzrun import ModelContext
from tzrun_plugins.models._layers import mlp, non_empty, out_width, positive_units
from tzrun_plugins.models._multi_task import (TaskConfig, add_inputs, check_inputs, per_task_outputs, read_inputs,
                                                unique_tasks)
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, unique_sequences

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["ExtractionNetworkConfig", "PLETaskConfig", "PLEConfig", "build_ple"]


@attrs.frozen
class ExtractionNetworkConfig:
    """One ``[[model.extraction_networks]]`` table of ``ple``: a CGC level.

    Attributes:
        num_task_experts: expert MLPs of each task (TorchEasyRec's ``expert_num_per_task``).
        task_expert_hidden_units: layer widths of each task expert (``task_expert_net``).
        num_shared_experts: shared expert MLPs (``share_num``; 0: none).
        shared_expert_hidden_units: layer widths of each shared expert (``share_expert_net``;
            empty: those of the task experts). Its last width must be theirs: a gate mixes both.
    """

    num_task_experts: int = attrs.field(validator=attrs.validators.ge(1))
    task_expert_hidden_units: tuple[int, ...] = attrs.field(validator=[non_empty, positive_units])
    num_shared_experts: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    shared_expert_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)

    @shared_expert_hidden_units.validator
    def _same_output_width(self, attribute: Any, value: tuple[int, ...]) -> None:
        if value and self.task_expert_hidden_units and value[-1] != self.task_expert_hidden_units[-1]:
            raise ValueError(
                f"the shared experts' last width ({value[-1]}) must be the task experts' "
                f"({self.task_expert_hidden_units[-1]}): a gate mixes both", attribute
            )

    @property
    def shared_units(self) -> tuple[int, ...]:
        """The shared experts' layer widths (the task experts' when unset)."""
        return self.shared_expert_hidden_units or self.task_expert_hidden_units


#: one ``[[model.tasks]]`` table (the same as mmoe's: ``_multi_task.TaskConfig``)
PLETaskConfig = TaskConfig


@attrs.frozen
class PLEConfig:
    """Options of the ``ple`` model.

    Attributes:
        extraction_networks: the CGC levels, input first (at least one).
        tasks: the tasks, each with its tower.
        sequence_encoders: how each sequence group is encoded (``[[model.sequence_encoders]]``;
            ``mean`` for a group without a table).
    """

    extraction_networks: tuple[ExtractionNetworkConfig, ...] = attrs.field(validator=non_empty)
    tasks: tuple[PLETaskConfig, ...] = attrs.field(validator=unique_tasks("ple"))
    sequence_encoders: tuple[SequenceEncoderConfig, ...] = attrs.field(default=(), validator=unique_sequences)


def build_ple(cfg: PLEConfig, ctx: ModelContext) -> Any:
    """Build PLE for ``ctx``'s features.

    Raises:
        ConfigError: when there is no id feature, or a sequence encoder does not fit its group.
    """
    import torch
    from torch import nn

    check_inputs(cfg.sequence_encoders, ctx, "ple")
    num_tasks = len(cfg.tasks)

    def gate(width: int, num_experts: int) -> nn.Module:
        return nn.Sequential(nn.Linear(width, num_experts), nn.Softmax(dim=-1))

    def mix(gate: nn.Module, selector: torch.Tensor, experts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.bmm(gate(selector).unsqueeze(1), torch.stack(list(experts), dim=1)).squeeze(1)

    class ExtractionNetwork(nn.Module):
        """One CGC level: per-task and shared experts, a gate per task, and (below the last
        level) a shared gate over every expert."""

        def __init__(self, level: ExtractionNetworkConfig, width: int, last: bool) -> None:
            super().__init__()
            self.task_experts = nn.ModuleList(
                nn.ModuleList(mlp(width, level.task_expert_hidden_units) for _ in range(level.num_task_experts))
                for _ in range(num_tasks)
            )
            self.shared_experts = nn.ModuleList(
                mlp(width, level.shared_units) for _ in range(level.num_shared_experts)
            )
            per_task = level.num_task_experts + level.num_shared_experts
            self.task_gates = nn.ModuleList(gate(width, per_task) for _ in range(num_tasks))
            every_expert = num_tasks * level.num_task_experts + level.num_shared_experts
            self.shared_gate = None if last else gate(width, every_expert)

        def forward(self, tasks: list[torch.Tensor], shared: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
            shared_out = [expert(shared) for expert in self.shared_experts]
            task_out = [[expert(t) for expert in cast(nn.ModuleList, experts)] for t, experts in zip(tasks, self.task_experts)]
            mixed = [mix(g, t, own + shared_out) for g, t, own in zip(self.task_gates, tasks, task_out)]
            if self.shared_gate is None:
                return mixed, shared
            return mixed, mix(self.shared_gate, shared, [e for own in task_out for e in own] + shared_out)

    class PLE(nn.Module):
        """CGC levels of task and shared experts, then one tower per task."""

        def __init__(self) -> None:
            super().__init__()
            self.task_names = [t.name for t in cfg.tasks]
            width = add_inputs(self, cfg.sequence_encoders, ctx)  # of each task's input and the shared one
            levels = []
            for i, level in enumerate(cfg.extraction_networks):
                levels.append(ExtractionNetwork(level, width, last=i == len(cfg.extraction_networks) - 1))
                width = level.task_expert_hidden_units[-1]
            self.extraction_networks = nn.ModuleList(levels)
            self.towers = nn.ModuleList(
                nn.Sequential(mlp(width, t.hidden_units), nn.Linear(out_width(width, t.hidden_units), 1))
                for t in cfg.tasks
            )

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            x = read_inputs(self, batch)
            tasks, shared = [x] * len(self.task_names), x
            for level in self.extraction_networks:
                tasks, shared = level(tasks, shared)
            return per_task_outputs(self.task_names, [tower(t) for tower, t in zip(self.towers, tasks)])

    return PLE()
