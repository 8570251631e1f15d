"""The ``register`` callbacks of the registration hooks (see :mod:`tzrun.hookspecs`): one
protocol per kind's keywords, so that a type checker refuses a misspelled one. Import them
from :mod:`tzrun.interfaces`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Optional, Protocol, Sequence

__all__ = [
    "Register",
    "RegisterLosses",
    "RegisterLossWeightings",
    "RegisterMetrics",
    "RegisterStages",
    "RegisterModels",
    "RegisterReaders",
]


class Register(Protocol):
    """The ``register`` callback of the registration hooks whose kinds take no kind-specific
    option: sparse and dense optimizers, lr schedules, train pipelines, commands (see
    :mod:`tzrun.hookspecs`). The other kinds have their own: :class:`RegisterLosses`,
    :class:`RegisterLossWeightings`, :class:`RegisterMetrics`, :class:`RegisterStages`,
    :class:`RegisterModels`, :class:`RegisterReaders`, :class:`RegisterSamplers`, so that a type checker refuses a
    misspelled keyword. Each one's keywords are the runtime's (``tzrun.kernel.registry.KINDS``):
    ``tests/plugin_kit/test_contract.py`` holds them equal."""

    def __call__(self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "") -> None: ...


class RegisterLosses(Protocol):
    """``register`` of ``tzrun_register_losses``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        prediction: str = "logits", group: Literal["none", "optional", "required"] = "none",
        labels: Optional[Literal["binary", "class_index", "non_negative", "finite"]] = None,
        reads: Optional[str] = None,
    ) -> None: ...


class RegisterLossWeightings(Protocol):
    """``register`` of ``tzrun_register_loss_weightings``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
    ) -> None: ...


class RegisterMetrics(Protocol):
    """``register`` of ``tzrun_register_metrics``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        prediction: str = "probs", group: Literal["none", "optional", "required"] = "none",
        labels: Optional[Literal["binary", "class_index", "non_negative", "finite"]] = None,
    ) -> None: ...


class RegisterStages(Protocol):
    """``register`` of ``tzrun_register_stages``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
        outputs: Optional[Callable[[Any], Sequence[str]]] = None,
    ) -> None: ...


class RegisterModels(Protocol):
    """``register`` of ``tzrun_register_models``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        outputs: Optional[Callable[[Any], Sequence[str]]] = None,
    ) -> None: ...


class RegisterReaders(Protocol):
    """``register`` of ``tzrun_register_readers``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
    ) -> None: ...


class RegisterSamplers(Protocol):
    """``register`` of ``tzrun_register_samplers``: ``expands_rows=True`` for a sampler whose
    ``build`` returns a :class:`~tzrun.interfaces.RowSampler` (it replaces each batch's rows),
    ``False`` for an :class:`~tzrun.interfaces.ItemSampler` (its items are appended);
    ``check=fn``: ``fn(cfg)`` returns ``(key, message)`` pairs that ``tzrec-run check`` reports."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        expands_rows: bool = False, check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
    ) -> None: ...
