"""What the multi-task models (``mmoe``, ``ple``, ``dbmtl``) share: the validators of their
``[[model.tasks]]`` tables and the ``logits/<task>``, ``probs/<task>`` outputs."""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["task_name", "unique_tasks", "per_task_outputs"]

_TASK_NAME = re.compile(r"[a-z][a-z0-9_]*")


def task_name(instance: Any, attribute: Any, value: str) -> None:
    """attrs validator: a task name is lower_snake (its outputs are ``logits/<name>``, ``probs/<name>``)."""
    if not _TASK_NAME.fullmatch(value):
        raise ValueError(f"task name {value!r} must be lower_snake (letters, digits, _; a letter first)", attribute)


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


def per_task_outputs(names: Sequence[str], logits: Sequence[Any]) -> dict[str, Any]:
    """``logits/<task>`` (each ``[B, 1]`` squeezed to ``[B]``) and ``probs/<task>`` (their sigmoid)."""
    import torch

    outputs: dict[str, torch.Tensor] = {}
    for name, logit in zip(names, logits):
        logit = logit.squeeze(-1)
        outputs[f"logits/{name}"] = logit
        outputs[f"probs/{name}"] = torch.sigmoid(logit)
    return outputs
