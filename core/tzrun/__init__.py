"""tzrec-run: a plugin-based training framework for recommendation models on TorchRec.

The public plugin API is what ``__all__`` lists; everything else is internal. A plugin marks its
hook implementations with :data:`hookimpl` and registers components through the ``register``
callback each registration hook receives (see :mod:`tzrun.hookspecs`).
"""

from __future__ import annotations

import pluggy

from tzrun.hookspecs import PROJECT_NAME
from tzrun.interfaces import (
    DenseFeature,
    EmbeddingTable,
    EvalResult,
    ItemSampler,
    ModelContext,
    Reader,
    Register,
    RowGroup,
    RunContext,
    SparseFeature,
    SparseOptimizerSpec,
    StepInfo,
    TrainLog,
)

__version__ = "0.1.0"

#: Marks a function or method as a hook implementation of tzrec-run.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = [
    "__version__",
    "hookimpl",
    "DenseFeature",
    "EmbeddingTable",
    "EvalResult",
    "ItemSampler",
    "ModelContext",
    "Reader",
    "Register",
    "RowGroup",
    "RunContext",
    "SparseFeature",
    "SparseOptimizerSpec",
    "StepInfo",
    "TrainLog",
]
