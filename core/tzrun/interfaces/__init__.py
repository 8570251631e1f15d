"""The types that plugins receive and return: the public contract of each component kind.

Nothing here imports torch at module import time, so ``tzrec-run check`` and ``tzrec-run
plugins`` stay fast. Import every name from here; it is defined by topic in a submodule:
:mod:`~tzrun.interfaces.registration` (the ``register`` callbacks), :mod:`~tzrun.interfaces.model`
(what a model builds from, and the sparse optimizer spec), :mod:`~tzrun.interfaces.inputs`
(readers and samplers) and :mod:`~tzrun.interfaces.run` (what lifecycle hooks and stages receive).
"""

from __future__ import annotations

from tzrun.interfaces.inputs import BAD_ROW_COLUMN, BAD_ROW_SEPARATOR, ItemSampler, Reader, RowGroup, RowSampler
from tzrun.interfaces.model import (
    DenseFeature,
    EmbeddingTable,
    ModelContext,
    SequenceGroup,
    SparseFeature,
    SparseOptimizerSpec,
)
from tzrun.interfaces.registration import (
    Register,
    RegisterLosses,
    RegisterLossWeightings,
    RegisterMetrics,
    RegisterModels,
    RegisterReaders,
    RegisterSamplers,
    RegisterStages,
)
from tzrun.interfaces.run import EvalResult, RunContext, StepInfo, TrainLog

__all__ = [
    "Register",
    "RegisterLosses",
    "RegisterLossWeightings",
    "RegisterMetrics",
    "RegisterStages",
    "RegisterModels",
    "RegisterReaders",
    "RegisterSamplers",
    "SparseOptimizerSpec",
    "DenseFeature",
    "SparseFeature",
    "EmbeddingTable",
    "SequenceGroup",
    "ModelContext",
    "RowGroup",
    "Reader",
    "BAD_ROW_COLUMN",
    "BAD_ROW_SEPARATOR",
    "ItemSampler",
    "RowSampler",
    "RunContext",
    "StepInfo",
    "TrainLog",
    "EvalResult",
]
