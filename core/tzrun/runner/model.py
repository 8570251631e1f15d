"""The module DMP wraps: the user's model, its losses and the loss weighting, and what one
training step returns (:class:`StepOutput`)."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import torch
import torch.fx
from torch import nn

from tzrun.errors import ConfigError, ConfigProblem
from tzrun.interfaces import ModelContext
from tzrun.runner.facts import RunFacts
from tzrun.runner.slots import LossSlot
from tzrun.runner.update import LossScale
from tzrun.runner.weighting import LossWeighting, build_loss_weighting, weigh_losses

torch.fx.wrap("weigh_losses")  # a leaf of TorchRec's tracing: a weighting may take gradients

__all__ = ["MODEL_LOSS_PREFIX", "StepOutput", "split_model_losses", "call_loss", "TrainModel", "build_model", "embedding_modules", "embedding_tables",
           "dense_parameter_names"]


#: A model output named ``loss/<name>`` is a loss term of the model's own (a scalar): added to
#: the training loss as it is, outside the loss weighting, and logged as ``loss/<name>``.
MODEL_LOSS_PREFIX = "loss/"


class StepOutput(NamedTuple):
    """What :class:`TrainModel` returns next to the loss (all detached).

    Attributes:
        loss: the total loss.
        losses: each named loss.
        outputs: the model's outputs, float32.
        labels, weights, num_rows, groups: from the batch.
        loss_weights: the weight of each loss this step, when the loss weighting shows them.
    """

    loss: torch.Tensor
    losses: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    weights: torch.Tensor
    num_rows: int
    groups: dict[str, torch.Tensor]
    loss_weights: Mapping[str, torch.Tensor] = {}


@torch.fx.wrap
def call_loss(loss: nn.Module, prediction: torch.Tensor, label: torch.Tensor, weight: torch.Tensor,
              group: torch.Tensor | None) -> torch.Tensor:
    """One loss on one step, as a leaf of TorchRec's fx tracing.

    ``TrainPipelineSparseDist`` traces :class:`TrainModel` to find the sharded modules' inputs;
    a loss that checks shapes or loops over rows (most do) cannot be traced. Wrapped, every loss
    (first-party or a plugin's) is opaque to the tracer and runs as written at each step.
    """
    if group is None:
        return loss(prediction, label, weight)
    return loss(prediction, label, weight, group=group)


def split_model_losses(outputs: Mapping[str, torch.Tensor],
                       slots: Sequence[LossSlot]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(outputs, terms)``: the model's outputs without its own loss terms, and those terms
    (``loss/<name>`` outputs) by ``<name>``.

    Raises:
        ConfigError: when a term has the name of a ``[[losses]]`` entry.
    """
    terms = {k[len(MODEL_LOSS_PREFIX):]: v for k, v in outputs.items() if k.startswith(MODEL_LOSS_PREFIX)}
    taken = sorted(set(terms) & {slot.name for slot in slots})
    if taken:
        raise ConfigError("losses", [ConfigProblem(
            "losses", f"the model adds its own loss {', '.join(taken)}: give the [[losses]] entry another name")])
    rest = {k: v for k, v in outputs.items() if not k.startswith(MODEL_LOSS_PREFIX)}
    return rest, terms


class TrainModel(nn.Module):
    """The module DMP wraps: the user's model plus its losses.

    The training loss is the loss weighting's total of the ``[[losses]]`` plus the model's own
    loss terms, the outputs named ``loss/<name>`` (:data:`MODEL_LOSS_PREFIX`), which are
    reported with the losses and never reach metrics or predictions.

    ``forward(batch)`` returns ``(loss_for_backward, StepOutput)``, the ``(loss, output)`` pair
    TorchRec's train pipelines expect; everything in the :class:`StepOutput` is detached. In
    training, ``loss_for_backward`` is what the :class:`~tzrun.runner.update.LossScale` makes of
    the total loss (``1 / accumulation steps``, times the fp16 loss scale): the only place the
    loss is ever scaled.

    With ``mixed_precision``, the model and its losses run under ``torch.autocast`` on
    ``device_type`` (the run's device).
    """

    def __init__(
        self,
        model: nn.Module,
        losses: Mapping[str, nn.Module],
        slots: Sequence[LossSlot],
        mixed_precision: str | None = None,
        loss_scale: LossScale | None = None,
        loss_weighting: LossWeighting | None = None,
        device_type: str = "cpu",
    ) -> None:
        super().__init__()
        self.device_type = device_type  # autocast's; known here, never read off the batch (a traced proxy)
        self.model = model
        self.losses = nn.ModuleDict(dict(losses))
        self.slots = list(slots)
        self.loss_weighting = loss_weighting if loss_weighting is not None else LossWeighting()
        self.autocast_dtype = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
        self.loss_scale = loss_scale if loss_scale is not None else LossScale()

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[Any, ...]]:
        if self.autocast_dtype is None:
            outputs, total, values, loss_weights = self._forward(batch)
        else:
            with torch.autocast(self.device_type, dtype=self.autocast_dtype):
                outputs, total, values, loss_weights = self._forward(batch)
        detached = {k: v.detach().float() for k, v in outputs.items()}
        backward = self.loss_scale.for_backward(total, self) if self.training else total
        return backward, StepOutput(total.detach(), values, detached, batch.labels, batch.weights, batch.num_rows, batch.groups,
                                    loss_weights)

    def _forward(self, batch: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor], Any]:
        outputs, terms = split_model_losses(self.model(batch), self.slots)
        weighted = {}
        values = {}
        for slot in self.slots:
            loss = self.losses[slot.name]
            prediction, label = outputs[slot.prediction].float(), batch.labels[slot.label]
            group = None if slot.group_by is None else batch.groups[slot.group_by]
            value = call_loss(loss, prediction, label, batch.weights, group).float()
            values[slot.name] = value.detach()
            weighted[slot.name] = value * slot.weight
        result = weigh_losses(self.loss_weighting, self.model, weighted, self.training)
        total = result[0]
        for name, term in terms.items():
            term = term.float()
            values[name] = term.detach()
            total = total + term
        return outputs, total, values, result[1]


def embedding_modules(model: nn.Module) -> list[nn.Module]:
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    return [m for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]


def embedding_tables(module: nn.Module) -> list[tuple[Any, nn.Parameter]]:
    """``(table config, weight)`` of every table of an unsharded EBC or EC."""
    if hasattr(module, "embedding_bag_configs"):
        return [(t, module.embedding_bags[t.name].weight) for t in module.embedding_bag_configs()]
    return [(t, module.embeddings[t.name].weight) for t in module.embedding_configs()]


def dense_parameter_names(model: nn.Module) -> list[str]:
    """The names of a user model's dense parameters (everything outside its embedding
    collections), as part ``pattern``s see them."""
    embedding = {id(p) for m in embedding_modules(model) for p in m.parameters()}
    return [name for name, p in model.named_parameters() if id(p) not in embedding]


def _check_reads_sequences(model: nn.Module, ctx: ModelContext, model_type: str) -> None:
    """A model on a config with sequence tables must look them up (else they would be
    silently dropped: sequences, and the candidate features sharing their tables)."""
    from torchrec import EmbeddingCollection

    if ctx.sequence_tables and not any(isinstance(m, EmbeddingCollection) for m in model.modules()):
        raise ConfigError("model", [ConfigProblem(
            "model.type", f"model '{model_type}' does not read [[features.sequence]] (it built no EmbeddingCollection; "
                          "tables: " + ", ".join(t.name for t in ctx.sequence_tables) + "); pick a model that reads "
                          "sequences (such as din) or remove [[features.sequence]]")])


def build_model(facts: RunFacts, device: torch.device, loss_scale: LossScale | None = None, *,
                compute_device: str = "cpu") -> TrainModel:
    """The user's model and its losses (the run's resolved loss slots), with embedding
    collections on ``device``; ``compute_device`` (``"cpu"``, ``"cuda"``) is where it runs,
    for ``train.mixed_precision``'s autocast."""
    cfg, registries, specs = facts.cfg, facts.registries, facts.specs
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, device, tuple(cfg.data.labels),
                       specs.sequence_groups, specs.sequence_tables)
    model_entry = registries["model"].get(cfg.model.type, "model.type")
    model = model_entry.build(cfg.model.config, ctx)
    _check_reads_sequences(model, ctx, cfg.model.type)
    slots = facts.loss_slots
    losses = {
        slot.name: registries["loss"].get(c.type, f"losses[{i}].type").build(c.config)
        for i, (slot, c) in enumerate(zip(slots, cfg.losses))
    }
    weighting = build_loss_weighting(cfg, registries, [slot.name for slot in slots])
    return TrainModel(model, losses, slots, cfg.train.mixed_precision, loss_scale, weighting, compute_device)
