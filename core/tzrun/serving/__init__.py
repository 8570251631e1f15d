"""Serving: exports of a checkpoint (:mod:`tzrun.serving.export`), their manifest
(:mod:`tzrun.serving.manifest`) and the :class:`Predictor` that scores raw rows with one.

``Predictor`` is imported lazily so that ``import tzrun.serving`` stays light."""

from __future__ import annotations

from typing import Any

__all__ = ["Predictor", "Scored", "resolve_export"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tzrun.serving import predictor

        return getattr(predictor, name)
    raise AttributeError(name)
