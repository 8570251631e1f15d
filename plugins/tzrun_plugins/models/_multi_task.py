"""What the multi-task models (``mmoe``, ``ple``, ``dbmtl``, ``pepnet``) share: the validators of
their ``[[model.tasks]]`` tables, their input layer (dense features, embeddings and encoded
sequence groups, concatenated) and the ``logits/<task>``, ``probs/<task>`` outputs."""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import positive_units
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, encoder_problems, encoders_by_group

__all__ = ["task_name", "TaskConfig", "unique_tasks", "per_task_outputs", "check_inputs", "add_inputs", "look_up",
           "read_inputs"]

_TASK_NAME = re.compile(r"[a-z][a-z0-9_]*")


def task_name(instance: Any, attribute: Any, value: str) -> None:
    """attrs validator: a task name is lower_snake (its outputs are ``logits/<name>``, ``probs/<name>``)."""
    if not _TASK_NAME.fullmatch(value):
        raise ValueError(f"task name {value!r} must be lower_snake (letters, digits, _; a letter first)", attribute)


@attrs.frozen
class TaskConfig:
    """One ``[[model.tasks]]`` table of ``mmoe`` and ``ple``.

    Attributes:
        name: the task's name: its outputs are ``logits/<name>`` and ``probs/<name>``.
        hidden_units: layer widths of its tower MLP (a linear layer to one logit follows).
    """

    name: str = attrs.field(validator=task_name)
    hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64), validator=positive_units)


def unique_tasks(model: str) -> Any:
    """attrs validator of ``model``'s ``tasks``: at least one, no name twice."""

    def check(instance: Any, attribute: Any, value: Sequence[Any]) -> None:
        if not value:
            raise ValueError(f"{model} needs at least one [[model.tasks]] table", attribute)
        names = [t.name for t in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"task names must differ; {', '.join(twice)} is named twice", attribute)

    return check


def per_task_outputs(names: Sequence[str], logits: Sequence[Any],
                     two_classes: Sequence[bool] = ()) -> dict[str, Any]:
    """Each task's outputs from its ``[B, 1]`` logits: ``logits/<task>`` ``[B]`` and ``probs/<task>``
    ``[B]`` (their sigmoid). A task marked in ``two_classes`` (decided when the model is built, so
    that a traced forward has no branch on shapes) has ``[B, 2]`` logits ``z = [z0, z1]``: they are
    its ``class_logits/<task>``, and its ``logits/<task>`` is ``z1 - z0``, so that ``probs/<task>``
    is ``softmax(z)[:, 1]``, the probability of class 1."""
    import torch

    outputs: dict[str, torch.Tensor] = {}
    for i, (name, logit) in enumerate(zip(names, logits)):
        if i < len(two_classes) and two_classes[i]:
            outputs[f"class_logits/{name}"] = logit
            logit = logit[:, 1] - logit[:, 0]
        else:
            logit = logit.squeeze(-1)
        outputs[f"logits/{name}"] = logit
        outputs[f"probs/{name}"] = torch.sigmoid(logit)
    return outputs


def check_inputs(encoders: Sequence[SequenceEncoderConfig], ctx: ModelContext, model: str,
                 more: Sequence[ConfigProblem] = ()) -> None:
    """Raise the problems of ``model``'s inputs: its sequence encoders against ``ctx``'s groups,
    no id feature, and ``more`` (the model's own).

    Raises:
        ConfigError: with every problem found.
    """
    problems = encoder_problems(encoders, ctx, model=model)
    if not ctx.sparse_features:
        problems.append(ConfigProblem("features.sparse", f"{model} needs at least one id feature"))
    problems += more
    if problems:
        raise ConfigError("model", problems)


def add_inputs(module: Any, encoders: Sequence[SequenceEncoderConfig], ctx: ModelContext) -> int:
    """Give ``module`` the input layer of ``x = [dense features, embeddings, encoded sequence
    groups]`` (its ``ebc``, ``sequences``, ``inputs`` and ``sequence_inputs``, the names a
    checkpoint keeps) and return the width of ``x``; :func:`read_inputs` computes ``x``."""
    from tzrun_plugins.models._sequence_inputs import FeatureInputs, SequenceInputs, bag_collection, sequence_embeddings

    module.ebc = bag_collection(ctx)
    module.sequences = sequence_embeddings(ctx)
    module.inputs = FeatureInputs(ctx, [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features])
    module.sequence_inputs = SequenceInputs(ctx, encoders_by_group(encoders, ctx))
    return int(module.inputs.width + module.sequence_inputs.width)


def look_up(module: Any, batch: Any) -> tuple[Any, Any]:
    """The pooled embeddings and the sequences of ``batch`` through the input layer
    :func:`add_inputs` gave ``module`` (either ``None`` when ``module`` has no such collection),
    for another :class:`~tzrun_plugins.models._sequence_inputs.FeatureInputs` to read as well."""
    bags = module.ebc(batch.sparse) if module.ebc is not None else None
    sequences = module.sequences(batch) if module.sequences is not None else None
    return bags, sequences


def read_inputs(module: Any, batch: Any, looked_up: Optional[tuple[Any, Any]] = None) -> Any:
    """``x`` of ``batch`` through the input layer :func:`add_inputs` gave ``module``: ``[B, width]``
    (from ``looked_up``, :func:`look_up`'s result, when given)."""
    import torch

    bags, sequences = looked_up if looked_up is not None else look_up(module, batch)
    x = module.inputs(batch.dense, bags, sequences)
    if module.sequence_inputs.names:
        x = torch.cat([x, module.sequence_inputs(sequences)], dim=1)
    return x
