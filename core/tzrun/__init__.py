"""tzrec-run: a plugin-based training framework for recommendation models on TorchRec.

The public plugin API is what ``__all__`` lists; everything else is internal. A plugin marks its
hook implementations with :data:`hookimpl` and registers components through the ``register``
callback each registration hook receives (see :mod:`tzrun.hookspecs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from tzrun.io.files import METRICS_FILE, append_jsonl, keep_jsonl, write_atomic
from tzrun.hookspecs import PROJECT_NAME
from tzrun.io.storage import as_path, filesystem, is_remote, list_files, redact_url, under
from tzrun.interfaces import (
    BAD_ROW_COLUMN,
    BAD_ROW_SEPARATOR,
    DenseFeature,
    EmbeddingTable,
    EvalResult,
    ItemSampler,
    ModelContext,
    Reader,
    Register,
    RegisterLosses,
    RegisterLossWeightings,
    RegisterMetrics,
    RegisterModels,
    RegisterReaders,
    RegisterSamplers,
    RegisterStages,
    RowGroup,
    RowSampler,
    RunContext,
    SequenceGroup,
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
    "as_path",
    "filesystem",
    "is_remote",
    "list_files",
    "redact_url",
    "under",
    "BAD_ROW_COLUMN",
    "BAD_ROW_SEPARATOR",
    "DenseFeature",
    "EmbeddingTable",
    "EvalResult",
    "ItemSampler",
    "ModelContext",
    "Reader",
    "Register",
    "RegisterLosses",
    "RegisterLossWeightings",
    "RegisterMetrics",
    "RegisterModels",
    "RegisterReaders",
    "RegisterSamplers",
    "RegisterStages",
    "RowGroup",
    "RowSampler",
    "RunContext",
    "SequenceGroup",
    "SparseFeature",
    "SparseOptimizerSpec",
    "StepInfo",
    "TrainLog",
    "METRICS_FILE",
    "write_atomic",
    "append_jsonl",
    "keep_jsonl",
    "is_hashable",
    "ClosedFormLR",
    "RowMetric",
    "Batch",
    "Session",
    "CheckpointView",
    "open_checkpoint",
    "find_checkpoint",
]

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from tzrun.data.batch import Batch
    from tzrun.checkpoints import CheckpointView, find_checkpoint, open_checkpoint
    from tzrun.runner.session import Session
    from tzrun.data.hashing import is_hashable
    from tzrun.lr_schedule import ClosedFormLR
    from tzrun.row_metric import RowMetric

#: Public names whose modules import numpy, pyarrow or torch: loaded on first use, so that
#: ``import tzrun`` (every plugin's ``hooks.py``) stays light.
_LAZY = {
    "is_hashable": "tzrun.data.hashing",
    "ClosedFormLR": "tzrun.lr_schedule",
    "RowMetric": "tzrun.row_metric",
    "Batch": "tzrun.data.batch",
    "Session": "tzrun.runner.session",
    "CheckpointView": "tzrun.checkpoints",
    "open_checkpoint": "tzrun.checkpoints",
    "find_checkpoint": "tzrun.checkpoints",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tzrun' has no attribute {name!r}")
