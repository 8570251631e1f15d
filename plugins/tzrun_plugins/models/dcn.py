"""Deep & Cross Networks, in TorchEasyRec's shape: ``dcn_v1`` (Wang et al., 2017) and ``dcn_v2``
(Wang et al., 2021, the low-rank cross network).

Both read ``x0``: every dense feature and every id feature's pooled embedding, concatenated
(dense columns first, then the ids, in config order), as TorchEasyRec's models read their one
feature group. A cross layer keeps the width of its input:

- v1: ``x_{l+1} = x0 * (x_l . w_l) + b_l + x_l`` (``w_l`` a vector: one scalar per row);
- v2: ``x_{l+1} = x0 * (V_l (U_l x_l) + b_l) + x_l`` (``U_l``: ``rank x d``, ``V_l``: ``d x rank``).

``dcn_v1``: ``logits = linear(final_mlp([cross(x0), deep_mlp(x0)]))``. ``dcn_v2``: an optional
``backbone`` MLP first (the cross network then crosses its output), an optional parallel ``deep``
MLP over ``x0``, then ``logits = linear(final_mlp([cross(backbone(x0)), deep_mlp(x0)]))``. The
last linear layer has no bias, as TorchEasyRec's. Outputs: ``logits`` and ``probs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, out_width, positive_units

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["DCNV1Config", "DCNV2Config", "build_dcn_v1", "build_dcn_v2"]


@attrs.frozen
class DCNV1Config:
    """Options of the ``dcn_v1`` model.

    Attributes:
        cross_num: number of cross layers.
        deep_hidden_units: layer widths of the deep MLP beside the cross network.
        final_hidden_units: layer widths of the MLP over ``[cross, deep]`` (a linear layer to
            one logit, without bias, follows).
    """

    cross_num: int = attrs.field(default=3, validator=attrs.validators.gt(0))
    deep_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128), validator=positive_units)
    final_hidden_units: tuple[int, ...] = attrs.field(default=(64, 32), validator=positive_units)


@attrs.frozen
class DCNV2Config:
    """Options of the ``dcn_v2`` model.

    Attributes:
        backbone_hidden_units: layer widths of an MLP over the inputs whose output the cross
            network crosses (empty: the cross network reads the inputs).
        cross_num: number of cross layers.
        low_rank: the rank of each layer's ``V U`` factorization of its ``d x d`` matrix.
        deep_hidden_units: layer widths of a deep MLP over the inputs, beside the cross network
            (empty: no deep part).
        final_hidden_units: layer widths of the MLP over ``[cross, deep]`` (a linear layer to
            one logit, without bias, follows).
    """

    backbone_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    cross_num: int = attrs.field(default=3, validator=attrs.validators.gt(0))
    low_rank: int = attrs.field(default=32, validator=attrs.validators.gt(0))
    deep_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    final_hidden_units: tuple[int, ...] = attrs.field(default=(128, 32), validator=positive_units)


def _modules(ctx: ModelContext, model: str) -> tuple[Any, Any, Any]:
    """The classes both models are made of (torch is imported by ``build`` only): a base that
    looks up ``x0``, and the two cross networks.

    Raises:
        ConfigError: when the config has sequence groups (which the DCN models do not read).
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection

    if ctx.sequence_groups:
        raise ConfigError("model", [ConfigProblem(
            "features.sequence", f"{model} reads no [[features.sequence]] group; use the din model for attention over "
                                 "a sequence, or mmoe with [[model.sequence_encoders]]")])
    every = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]

    class OverInputs(nn.Module):
        """Holds the embeddings and :meth:`x0`: the dense columns and pooled ids, concatenated."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            self.inputs = FeatureInputs(ctx, every)

        def x0(self, batch: Batch) -> torch.Tensor:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            return self.inputs(batch.dense, bags, None)  # type: ignore[no-any-return]

    class Cross(nn.Module):
        """DCN v1's cross network: ``x_{l+1} = x0 * (x_l . w_l) + b_l + x_l``."""

        def __init__(self, width: int, layers: int) -> None:
            super().__init__()
            weights = [nn.Linear(width, 1, bias=False) for _ in range(layers)]
            for w in weights:
                nn.init.xavier_uniform_(w.weight)
            self.w = nn.ModuleList(weights)
            self.b = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(layers))

        def forward(self, x0: torch.Tensor) -> torch.Tensor:
            x = x0
            for w, b in zip(self.w, self.b):
                x = x0 * w(x) + b + x
            return x

    class CrossV2(nn.Module):
        """DCN v2's low-rank cross network: ``x_{l+1} = x0 * (V_l (U_l x_l) + b_l) + x_l``."""

        def __init__(self, width: int, layers: int, rank: int) -> None:
            super().__init__()
            self.u = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))
            self.v = nn.ModuleList(nn.Linear(rank, width) for _ in range(layers))

        def forward(self, x0: torch.Tensor) -> torch.Tensor:
            x = x0
            for u, v in zip(self.u, self.v):
                x = x0 * v(u(x)) + x
            return x

    return OverInputs, Cross, CrossV2


def build_dcn_v1(cfg: DCNV1Config, ctx: ModelContext) -> Any:
    """Build DCN v1 for ``ctx``'s features.

    Raises:
        ConfigError: when the config has sequence groups (which dcn_v1 does not read).
    """
    import torch
    from torch import nn

    OverInputs, Cross, _ = _modules(ctx, "dcn_v1")

    class DCNV1(OverInputs):  # type: ignore[misc, valid-type]
        """A cross network and a deep MLP side by side, a final MLP, one logit."""

        def __init__(self) -> None:
            super().__init__()
            width = self.inputs.width
            self.cross = Cross(width, cfg.cross_num)
            self.deep = mlp(width, cfg.deep_hidden_units)
            final_in = width + out_width(width, cfg.deep_hidden_units)
            self.final = mlp(final_in, cfg.final_hidden_units)
            self.output = nn.Linear(out_width(final_in, cfg.final_hidden_units), 1, bias=False)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            x0 = self.x0(batch)
            logits = self.output(self.final(torch.cat([self.cross(x0), self.deep(x0)], dim=1))).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return DCNV1()


def build_dcn_v2(cfg: DCNV2Config, ctx: ModelContext) -> Any:
    """Build DCN v2 for ``ctx``'s features.

    Raises:
        ConfigError: when the config has sequence groups (which dcn_v2 does not read).
    """
    import torch
    from torch import nn

    OverInputs, _, CrossV2 = _modules(ctx, "dcn_v2")

    class DCNV2(OverInputs):  # type: ignore[misc, valid-type]
        """An optional backbone MLP, a low-rank cross network, an optional deep MLP beside it,
        a final MLP, one logit."""

        def __init__(self) -> None:
            super().__init__()
            width = self.inputs.width
            self.backbone = mlp(width, cfg.backbone_hidden_units)
            crossed = out_width(width, cfg.backbone_hidden_units)
            self.cross = CrossV2(crossed, cfg.cross_num, cfg.low_rank)
            self.has_deep = bool(cfg.deep_hidden_units)
            self.deep = mlp(width, cfg.deep_hidden_units)
            final_in = crossed + (cfg.deep_hidden_units[-1] if self.has_deep else 0)
            self.final = mlp(final_in, cfg.final_hidden_units)
            self.output = nn.Linear(out_width(final_in, cfg.final_hidden_units), 1, bias=False)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            x0 = self.x0(batch)
            net = self.cross(self.backbone(x0))
            if self.has_deep:
                net = torch.cat([net, self.deep(x0)], dim=1)
            logits = self.output(self.final(net)).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return DCNV2()
