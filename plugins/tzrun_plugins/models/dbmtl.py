"""DBMTL, deep Bayesian multi-target learning (Alibaba, SIGIR 2019), as TorchEasyRec's ``dbmtl``.

``x = [dense features, embeddings]`` goes through an optional bottom MLP and, with
``expert_hidden_units``, an MMoE (``num_experts`` experts, a ``softmax(linear(gate_mlp(x)))``
gate per task) that gives each task its own input; without it every task reads the bottom's
output. Each task's tower MLP reads its input; a task with ``relation_hidden_units`` then feeds
``[its tower's output, the relation outputs of its relation_tasks]`` (in that order) to its
relation MLP, so a task conditions on the tasks it depends on (the Bayesian chain, e.g.
``cvr`` on ``ctr``). A linear layer to one logit (two with ``num_classes = 2``) follows. The
outputs are ``logits/<task>`` and ``probs/<task>`` for each task, and ``class_logits/<task>``
for a task of two classes (TorchEasyRec's ``num_class: 2``, which its ``jrc_loss`` needs).

With ``[[features.sequence]]`` groups, each group is encoded into one vector by its
``[[model.sequence_encoders]]`` table (as ``mmoe``'s) and appended to ``x``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun_plugins.models._layers import mlp, out_width, positive_units
from tzrun_plugins.models._multi_task import add_inputs, check_inputs, per_task_outputs, read_inputs, task_name, unique_tasks
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, unique_sequences

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["DBMTLTaskConfig", "DBMTLConfig", "build_dbmtl"]


@attrs.frozen
class DBMTLTaskConfig:
    """One ``[[model.tasks]]`` table of ``dbmtl`` (TorchEasyRec's ``BayesTaskTower``).

    Attributes:
        name: the task's name: its outputs are ``logits/<name>`` and ``probs/<name>``.
        hidden_units: layer widths of its tower MLP (``mlp``; empty: none).
        relation_tasks: tasks, listed before this one, whose relation outputs this task's relation
            MLP reads after its own tower's output (``relation_tower_names``).
        relation_hidden_units: layer widths of its relation MLP (``relation_mlp``; empty: none,
            and then ``relation_tasks`` must be empty). A linear layer to the logits follows.
        num_classes: 1 (one logit) or 2 (two logits ``z``, output as ``class_logits/<name>``,
            for ``jrc`` or ``softmax_cross_entropy``; ``logits/<name>`` is then ``z1 - z0`` and
            ``probs/<name>`` the probability of class 1) (``num_class``).
    """

    name: str = attrs.field(validator=task_name)
    hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64), validator=positive_units)
    relation_tasks: tuple[str, ...] = ()
    relation_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    num_classes: int = attrs.field(default=1)

    @num_classes.validator
    def _one_or_two(self, attribute: Any, value: int) -> None:
        if value not in (1, 2):
            raise ValueError(f"must be 1 (one logit) or 2 (two logits, class_logits/{self.name}, for jrc or "
                             f"softmax_cross_entropy), got {value}", attribute)

    @relation_hidden_units.validator
    def _relation_needs_mlp(self, attribute: Any, value: tuple[int, ...]) -> None:
        if self.relation_tasks and not value:
            raise ValueError("relation_tasks are read by the relation MLP: set its widths", attribute)


def _relations_come_first(instance: Any, attribute: Any, value: tuple[DBMTLTaskConfig, ...]) -> None:
    earlier: list[str] = []
    for task in value:
        for name in task.relation_tasks:
            if name not in earlier:
                where = "itself" if name == task.name else (
                    f"'{name}', which is no task" if name not in {t.name for t in value}
                    else f"'{name}', which is listed after it")
                raise ValueError(f"task '{task.name}' relates to {where}; a task's relation_tasks must be listed "
                                 f"before it (tasks so far: {', '.join(earlier) or 'none'})", attribute)
        if len(set(task.relation_tasks)) != len(task.relation_tasks):
            raise ValueError(f"task '{task.name}' names a relation task twice", attribute)
        earlier.append(task.name)


@attrs.frozen
class DBMTLConfig:
    """Options of the ``dbmtl`` model.

    Attributes:
        tasks: the tasks, each with its tower and relations.
        bottom_hidden_units: layer widths of the shared bottom MLP (``bottom_mlp``; empty: none).
        expert_hidden_units: layer widths of each MMoE expert (``expert_mlp``; empty: no MMoE).
        num_experts: how many MMoE experts (``num_expert``).
        gate_hidden_units: layer widths of an MLP before each gate's linear layer (``gate_mlp``).
        sequence_encoders: how each sequence group is encoded (``[[model.sequence_encoders]]``;
            ``mean`` for a group without a table).
    """

    tasks: tuple[DBMTLTaskConfig, ...] = attrs.field(validator=[unique_tasks("dbmtl"), _relations_come_first])
    bottom_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    expert_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    num_experts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    gate_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    sequence_encoders: tuple[SequenceEncoderConfig, ...] = attrs.field(default=(), validator=unique_sequences)

    @gate_hidden_units.validator
    def _gates_need_experts(self, attribute: Any, value: tuple[int, ...]) -> None:
        if value and not self.expert_hidden_units:
            raise ValueError("the gates are the MMoE's: set expert_hidden_units", attribute)


def build_dbmtl(cfg: DBMTLConfig, ctx: ModelContext) -> Any:
    """Build DBMTL for ``ctx``'s features.

    Raises:
        ConfigError: when there is no id feature, or a sequence encoder does not fit its group.
    """
    import torch
    from torch import nn

    check_inputs(cfg.sequence_encoders, ctx, "dbmtl")
    index = {t.name: i for i, t in enumerate(cfg.tasks)}

    class DBMTL(nn.Module):
        """Bottom MLP, optional MMoE, task towers, relation MLPs over the related tasks."""

        def __init__(self) -> None:
            super().__init__()
            self.task_names = [t.name for t in cfg.tasks]
            self.relations = [[index[n] for n in t.relation_tasks] for t in cfg.tasks]
            width = add_inputs(self, cfg.sequence_encoders, ctx)
            self.bottom = mlp(width, cfg.bottom_hidden_units)
            width = out_width(width, cfg.bottom_hidden_units)
            self.experts = nn.ModuleList()
            self.gates = nn.ModuleList()
            if cfg.expert_hidden_units:
                self.experts.extend(mlp(width, cfg.expert_hidden_units) for _ in range(cfg.num_experts))
                self.gates.extend(
                    nn.Sequential(mlp(width, cfg.gate_hidden_units),
                                  nn.Linear(out_width(width, cfg.gate_hidden_units), cfg.num_experts),
                                  nn.Softmax(dim=-1))
                    for _ in cfg.tasks
                )
                width = cfg.expert_hidden_units[-1]
            self.towers = nn.ModuleList(mlp(width, t.hidden_units) for t in cfg.tasks)
            widths: list[int] = []  # each task's relation output width
            relation_mlps = []
            for task in cfg.tasks:
                tower = out_width(width, task.hidden_units)
                relation_in = tower + sum(widths[index[n]] for n in task.relation_tasks)
                relation_mlps.append(mlp(relation_in, task.relation_hidden_units))
                widths.append(out_width(relation_in, task.relation_hidden_units))
            self.relation_mlps = nn.ModuleList(relation_mlps)
            self.outputs = nn.ModuleList(nn.Linear(w, t.num_classes) for w, t in zip(widths, cfg.tasks))
            self.two_classes = [t.num_classes == 2 for t in cfg.tasks]

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            x = read_inputs(self, batch)
            x = self.bottom(x)
            if len(self.experts) > 0:
                experts = torch.stack([expert(x) for expert in self.experts], dim=1)  # [B, E, W]
                inputs = [torch.bmm(gate(x).unsqueeze(1), experts).squeeze(1) for gate in self.gates]
            else:
                inputs = [x] * len(self.task_names)
            related: list[torch.Tensor] = []
            for tower, relation_mlp, relations, task_input in zip(self.towers, self.relation_mlps, self.relations, inputs):
                related.append(relation_mlp(torch.cat([tower(task_input)] + [related[i] for i in relations], dim=1)))
            return per_task_outputs(self.task_names, [out(r) for out, r in zip(self.outputs, related)], self.two_classes)

    return DBMTL()
