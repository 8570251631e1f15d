"""Options and checks of the first-party loss weightings (torch-free: ``tzrec-run check`` reads
them without importing torch). The weightings themselves are in :mod:`tzrun_plugins.weighting.pareto`."""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Sequence

import attrs

__all__ = ["MAX_EXACT_LOSSES", "SumConfig", "ParetoConfig", "build_sum", "build_pareto", "check_pareto"]

#: The exact solver solves ``2^K - 1`` small systems: up to 4,095 of 13 x 13.
MAX_EXACT_LOSSES = 12


@attrs.frozen
class SumConfig:
    """``sum`` takes no options."""


def _check_min_weights(instance: Any, attribute: Any, value: Mapping[str, float]) -> None:
    for name, weight in value.items():
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"the minimum weight of '{name}' must be 0 or more, got {weight}", attribute)
    total = sum(value.values())
    if total >= 1.0:
        raise ValueError(f"must sum to less than 1 (the weights sum to 1), got {total:g}", attribute)


@attrs.frozen
class ParetoConfig:
    """Options of the ``pareto`` loss weighting.

    Attributes:
        min_weights: the smallest weight of a loss, by its name (``[[losses]]`` ``name``, or its
            type); each at least 0, together less than 1; a loss left out has 0 (TorchEasyRec's
            ``pareto_min_loss_weight`` of the loss's task tower).
        solver: ``"exact"`` (default) finds the minimum of ``‖Σ w_i g_i‖²`` over the allowed
            weights (up to 12 losses); ``"pe_ltr"`` runs PE-LTR's two steps as TorchEasyRec does
            (closed form, then projection onto the allowed weights), which gives the same
            weights for 2 losses, or when no weight of the closed form is below its minimum.
    """

    min_weights: dict[str, float] = attrs.field(factory=dict, validator=_check_min_weights)
    solver: Literal["exact", "pe_ltr"] = "exact"


def build_sum(cfg: SumConfig, names: Sequence[str]) -> Any:
    """The ``sum`` weighting (a :class:`~tzrun_plugins.weighting.pareto.SumWeighting`)."""
    from tzrun_plugins.weighting.pareto import SumWeighting

    return SumWeighting()


def build_pareto(cfg: ParetoConfig, names: Sequence[str]) -> Any:
    """The ``pareto`` weighting over the losses ``names`` (a
    :class:`~tzrun_plugins.weighting.pareto.ParetoWeighting`)."""
    from tzrun_plugins.weighting.pareto import ParetoWeighting

    return ParetoWeighting(names, cfg.min_weights, cfg.solver)


def check_pareto(cfg: ParetoConfig, names: Sequence[str]) -> list[tuple[str, str]]:
    """The problems of a ``pareto`` table given the run's loss names: a minimum weight of a loss
    the run does not have, or more losses than the exact solver takes."""
    from tzrun.errors import did_you_mean

    problems = []
    for name in cfg.min_weights:
        if name not in names:
            guess = did_you_mean(name, names)
            hint = f"; did you mean '{guess}'?" if guess else ""
            problems.append((f"min_weights.{name}", f"no loss named '{name}' (losses: {', '.join(names)}){hint}"))
    if cfg.solver == "exact" and len(names) > MAX_EXACT_LOSSES:
        problems.append(("solver", f"the exact solver takes at most {MAX_EXACT_LOSSES} losses, the run has "
                                   f"{len(names)}; use solver = \"pe_ltr\""))
    return problems
