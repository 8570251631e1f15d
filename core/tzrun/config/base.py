"""What every section of the config schema is built from: :class:`Component` (a ``type = "..."``
table) and the validators the schema classes share."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import attrs

__all__ = ["Component"]


@attrs.frozen
class Component:
    """A ``{ type = "name", ...options }`` table.

    Attributes:
        type: the registered name of the component, or ``"plugin:name"`` to pick one plugin's
            (see :meth:`tzrun.kernel.registry.Registry.get`).
        raw: every other key of the table, as TOML gave it.
        config: the plugin's options instance (set by the second pass).
        fields: the core-read keys of the table, structured (set by the second pass):
            :class:`SparseOptimizerFields`, :class:`DenseOptimizerFields`,
            :class:`PartFields`, :class:`LossFields` or :class:`MetricFields`.
        section: the top-level table that configured it (``"export"`` for ``[export]``,
            :mod:`tzrun.config.stage_sections`); empty for one listed where it sits.
    """

    type: str
    raw: Mapping[str, Any] = attrs.field(factory=dict)
    config: Any = None
    fields: Any = None
    section: str = ""

    @property
    def name(self) -> str:
        """The component's name without a plugin qualifier (``lion`` for ``"x:lion"``): what
        results and stage states are named after."""
        return self.type.rpartition(":")[2]


def _in_unit_open(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"must be between 0 and 1 (exclusive), got {value}", attribute)


def _positive(instance: Any, attribute: Any, value: float) -> None:
    if not value > 0:
        raise ValueError(f"must be positive, got {value}", attribute)


def _non_negative(instance: Any, attribute: Any, value: int) -> None:
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}", attribute)


def _non_empty_text(instance: Any, attribute: Any, value: Optional[str]) -> None:
    if value is not None and not value:
        raise ValueError("must not be empty", attribute)
