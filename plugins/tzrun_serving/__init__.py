"""The way out of a run, a first-party plugin: exports of a checkpoint
(:mod:`tzrun_serving.export`), their manifest (:mod:`tzrun_serving.manifest`), the
:class:`Predictor` that scores raw rows with one, exports written during training (the
``export`` stage, ``[export]``), embedding delta dumps (the ``embedding_deltas`` stage,
:mod:`tzrun_serving.deltas`), and the commands ``tzrec-run export`` and ``tzrec-run ckpt
apply-deltas``. It is written against tzrec-run's public API only.

``Predictor`` is imported lazily so that ``import tzrun_serving`` stays light."""

from __future__ import annotations

from typing import Any

__all__ = ["Predictor", "Scored", "resolve_export"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tzrun_serving import predictor

        return getattr(predictor, name)
    raise AttributeError(name)
