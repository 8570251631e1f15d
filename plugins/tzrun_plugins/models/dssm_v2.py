"""DSSM-v2 two-tower retrieval, in TorchEasyRec's shape (its ``dssm_v2``).

TorchEasyRec's DSSM-v2 is its DSSM with the embeddings moved out of the towers: one embedding
group for the whole model (its ``dssm`` builds one per tower), looked up once for the batch
padded to the items' rows (``data_config.force_base_data_group``), the user tower reading the
first ``B`` rows of its group. A table is then one table for both towers, and a feature named
in both towers' groups is looked up once and read by each. The towers, the similarity and its
temperature are DSSM's.

tzrec-run's ``dssm`` already looks up one embedding collection for both towers over the batch's
``B + N`` rows (tables shared across towers by ``table``), so ``dssm_v2`` is the same network,
built by :func:`tzrun_plugins.models.dssm.build_two_towers`, with TorchEasyRec's DSSM-v2 input
rule: a feature may be in both ``user_features`` and ``item_features`` (each tower reads the same
pooled embedding, and its table learns from both). Every other option, output and check is
``dssm``'s; its export is ``dssm``'s two programs, ``user_tower`` and ``item_tower``.
"""

from __future__ import annotations

from typing import Any

import attrs

from tzrun import ModelContext
from tzrun_plugins.models.dssm import DSSMConfig, build_two_towers

__all__ = ["DSSMV2Config", "build_dssm_v2"]


@attrs.frozen
class DSSMV2Config(DSSMConfig):
    """Options of the ``dssm_v2`` model: those of ``dssm``.

    Attributes:
        user_features: names of the features (dense or id) and sequence groups of the user tower.
        item_features: names of the features (dense or id) of the item tower; a dense or id
            feature may also be in ``user_features`` (one lookup, read by both towers), every
            feature is in at least one tower, and each tower has at least one id feature.
    """


def build_dssm_v2(cfg: DSSMV2Config, ctx: ModelContext) -> Any:
    """Build DSSM-v2 for ``ctx``'s features.

    Raises:
        ConfigError: when a tower names an unknown feature, a feature is in neither tower, a
            sequence group is in the item tower, or a tower has no id feature.
    """
    return build_two_towers(cfg, ctx, model="dssm_v2", in_both=True)
