"""Which dense optimizer trains which dense parameter: ``train.dense_optimizer.parts`` matched
against the model's parameter names (used by the run, ``plan`` and ``check --params`` alike)."""

from __future__ import annotations

import re
from typing import Sequence

from tzrun.config.schema import Component
from tzrun.errors import ConfigError, ConfigProblem

__all__ = ["assign_parts"]


def assign_parts(names: Sequence[str], parts: Sequence[Component], where: str = "train.dense_optimizer") -> dict[str, list[str]]:
    """Split dense parameter names between the part optimizers (whole-name regex match) and
    the main dense optimizer (key ``dense``; parts are ``dense.parts[<i>]``).

    Raises:
        ConfigError: when a name matches two parts (naming both patterns) or a part matches
            no parameter.
    """
    compiled = [(i, re.compile(part.fields.pattern)) for i, part in enumerate(parts)]
    groups: dict[str, list[str]] = {"dense": []}
    groups.update({f"dense.parts[{i}]": [] for i in range(len(parts))})
    problems = []
    for name in names:
        matched = [i for i, pattern in compiled if pattern.fullmatch(name)]
        if len(matched) > 1:
            a, b = matched[:2]
            problems.append(ConfigProblem(
                f"{where}.parts[{b}].pattern",
                f"parameter '{name}' is matched by parts[{a}] ('{parts[a].fields.pattern}') and parts[{b}] "
                f"('{parts[b].fields.pattern}'); a parameter belongs to one part",
            ))
        groups[f"dense.parts[{matched[0]}]" if matched else "dense"].append(name)
    for i, part in enumerate(parts):
        if not groups[f"dense.parts[{i}]"]:
            sample = ", ".join(list(names)[:6]) + (", ..." if len(names) > 6 else "")
            problems.append(ConfigProblem(
                f"{where}.parts[{i}].pattern",
                f"'{part.fields.pattern}' matches no dense parameter (the pattern must match the whole name; names: {sample}; "
                "see tzrec-run check --params)",
            ))
    if problems:
        raise ConfigError(where, problems)
    return groups
