"""MaskNet (Wang et al., 2021), in TorchEasyRec's shape (``mask_net``): instance-guided masks.

The model reads ``x0``: every dense feature and every id feature's pooled embedding, concatenated
(dense columns first, then the ids, in config order), as TorchEasyRec's model reads its one
feature group. A MaskBlock takes an input ``v`` and the mask input ``x0``:

``mask = W2 relu(W1 x0 + c1) + c2`` (as wide as ``v``; ``W1``'s width is the aggregation width),
``h = relu(layer_norm(W (v * mask) + c))`` (``hidden_dim`` wide).

Parallel blocks all read ``v = layer_norm(x0)`` and their outputs are concatenated; serial blocks
chain, the first reading ``layer_norm(x0)`` and each next one the previous block's ``h``. Then
``logits = linear(top_mlp(blocks))``, the last linear layer without bias as TorchEasyRec's.
Outputs: ``logits`` and ``probs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, out_width, positive_units

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["MaskNetConfig", "build_mask_net"]


@attrs.frozen
class MaskNetConfig:
    """Options of the ``mask_net`` model.

    Attributes:
        n_mask_blocks: number of MaskBlocks.
        hidden_dim: width of each MaskBlock's output (its ``Linear -> LayerNorm -> ReLU`` layer).
        reduction_ratio: a block's aggregation width (the hidden layer of its mask generator) is
            ``int(ratio * the width of the input it masks)``.
        aggregation_dim: the aggregation width of every block, when above 0 (then
            ``reduction_ratio`` is not used).
        use_parallel: parallel blocks (each masks the normalized inputs; outputs concatenated),
            or serial (each masks the previous block's output).
        top_hidden_units: layer widths of the MLP over the blocks' output (a linear layer to one
            logit, without bias, follows).
    """

    n_mask_blocks: int = attrs.field(default=3, validator=attrs.validators.gt(0))
    hidden_dim: int = attrs.field(default=512, validator=attrs.validators.gt(0))
    reduction_ratio: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
    aggregation_dim: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    use_parallel: bool = True
    top_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64), validator=positive_units)


def _aggregation(cfg: MaskNetConfig, masked: int) -> int:
    return cfg.aggregation_dim or int(masked * cfg.reduction_ratio)


def build_mask_net(cfg: MaskNetConfig, ctx: ModelContext) -> Any:
    """Build MaskNet for ``ctx``'s features.

    Raises:
        ConfigError: when the config has sequence groups (which mask_net does not read), or a
            block's aggregation width comes out as 0.
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection

    every = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]
    problems = []
    if ctx.sequence_groups:
        problems.append(ConfigProblem("features.sequence", "mask_net reads no [[features.sequence]] group; use the din "
                                                           "model for attention over a sequence"))
    width = FeatureInputs(ctx, every).width
    masked = [width] + ([width] * (cfg.n_mask_blocks - 1) if cfg.use_parallel else [cfg.hidden_dim] * (cfg.n_mask_blocks - 1))
    if any(_aggregation(cfg, m) < 1 for m in masked):
        problems.append(ConfigProblem("model.reduction_ratio", (
            f"{cfg.reduction_ratio} times the masked width ({min(masked)}) is below 1: raise it, or set "
            "model.aggregation_dim")))
    if problems:
        raise ConfigError("model", problems)

    class MaskBlock(nn.Module):
        """``relu(layer_norm(W (v * mask(x0)) + c))``, ``mask`` a two-layer MLP over ``x0``."""

        def __init__(self, masked_width: int) -> None:
            super().__init__()
            aggregation = _aggregation(cfg, masked_width)
            self.mask = nn.Sequential(nn.Linear(width, aggregation), nn.ReLU(), nn.Linear(aggregation, masked_width))
            self.hidden = nn.Sequential(nn.Linear(masked_width, cfg.hidden_dim), nn.LayerNorm(cfg.hidden_dim), nn.ReLU())

        def forward(self, v: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
            return self.hidden(v * self.mask(x0))  # type: ignore[no-any-return]

    class MaskNet(nn.Module):
        """Layer-normalized inputs, MaskBlocks in parallel or in series, a top MLP, one logit."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            self.inputs = FeatureInputs(ctx, every)
            self.norm = nn.LayerNorm(width)
            self.blocks = nn.ModuleList(MaskBlock(m) for m in masked)
            blocks_out = cfg.hidden_dim * (cfg.n_mask_blocks if cfg.use_parallel else 1)
            self.top = mlp(blocks_out, cfg.top_hidden_units)
            self.output = nn.Linear(out_width(blocks_out, cfg.top_hidden_units), 1, bias=False)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            x0 = self.inputs(batch.dense, bags, None)
            normed = self.norm(x0)
            if cfg.use_parallel:
                hidden = torch.cat([block(normed, x0) for block in self.blocks], dim=1)
            else:
                hidden = normed
                for block in self.blocks:
                    hidden = block(hidden, x0)
            logits = self.output(self.top(hidden)).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return MaskNet()
