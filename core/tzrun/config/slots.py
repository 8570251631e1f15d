"""Where the core schema holds component tables, what kind each is, and which of its keys
tzrec-run reads itself: the one table the config loader (:mod:`tzrun.config.load`) and the
generated configuration reference (:mod:`tzrun_tools.reference`) both follow."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional

import attrs

from tzrun.config.schema import (
    DenseOptimizerFields,
    LossFields,
    MetricFields,
    PartFields,
    SparseOptimizerFields,
    TrainMetricFields,
)

__all__ = ["Slot", "COMPONENT_SLOTS"]


@attrs.frozen
class Slot:
    """A place in the core schema that holds component tables (``{ type = "...", ... }``).

    Attributes:
        kind: the component kind (a :data:`tzrun.kernel.registry.KINDS` key) its ``type`` names.
        fields: the class of the table's keys that tzrec-run reads itself (None: only ``type``).
        omit: keys of ``fields`` that this place refuses, with the reason.
    """

    kind: str
    fields: Optional[type] = None
    omit: Mapping[str, str] = attrs.field(factory=dict)


#: Every place in :class:`~tzrun.config.schema.RunConfig` that holds a component, by schema path
#: (array levels without brackets). The loader resolves exactly these places, in this order: a
#: path below another slot's path is a core key of that slot's ``fields`` class. Adding a slot
#: is one entry here plus its schema field; a ``Component`` field missing here makes
#: :func:`tzrun_tools.reference.config_reference` raise.
COMPONENT_SLOTS: Mapping[str, Slot] = MappingProxyType({
    "model": Slot("model"),
    "data.reader": Slot("reader"),
    "data.sampler": Slot("sampler"),
    "train.sparse_optimizer": Slot("sparse_optimizer", SparseOptimizerFields),
    "train.sparse_optimizer.lr_schedule": Slot("lr_scheduler"),
    "train.dense_optimizer": Slot("dense_optimizer", DenseOptimizerFields),
    "train.dense_optimizer.lr_schedule": Slot("lr_scheduler"),
    "train.dense_optimizer.parts": Slot("dense_optimizer", PartFields),
    "train.dense_optimizer.parts.lr_schedule": Slot("lr_scheduler"),
    "train.pipeline": Slot("train_pipeline"),
    "train.stages": Slot("stage"),
    "train.loss_weighting": Slot("loss_weighting"),
    "features.sparse.sparse_optimizer": Slot("sparse_optimizer", SparseOptimizerFields, {
        "lr_schedule": "per-table sparse optimizers share ``train.sparse_optimizer.lr_schedule``, "
                       "applied to their own ``lr``",
    }),
    "features.sequence.features.sparse_optimizer": Slot("sparse_optimizer", SparseOptimizerFields, {
        "lr_schedule": "per-table sparse optimizers share ``train.sparse_optimizer.lr_schedule``, "
                       "applied to their own ``lr``",
    }),
    "features.sparse.zch.eviction_policy": Slot("eviction_policy"),
    "features.sparse.zch.admission": Slot("admission_filter"),
    "features.sequence.features.zch.eviction_policy": Slot("eviction_policy"),
    "features.sequence.features.zch.admission": Slot("admission_filter"),
    "losses": Slot("loss", LossFields),
    "metrics": Slot("metric", MetricFields),
    "train_metrics": Slot("metric", TrainMetricFields),
})
