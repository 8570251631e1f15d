"""Wide & Deep (Cheng et al., 2016), in TorchEasyRec's shape.

``logits = wide + linear(deep_mlp([dense features, embeddings]))`` where ``wide`` is the sum over
id features of a small per-id embedding (``wide_embedding_dim`` wide, summed over its entries
too): a linear model over the one-hot ids. Both embedding collections are built on
``ctx.embedding_device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, out_width, positive_units, wide_tables

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["WideAndDeepConfig", "build_wide_and_deep"]


@attrs.frozen
class WideAndDeepConfig:
    """Options of the ``wide_and_deep`` model.

    Attributes:
        deep_hidden_units: layer widths of the deep MLP (a final linear layer to one logit follows).
        wide_embedding_dim: width of the per-id wide embeddings (a multiple of 4, FBGEMM's unit);
            their entries are summed, so the wide part is linear in the ids.
    """

    deep_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64), validator=positive_units)
    wide_embedding_dim: int = attrs.field(default=4, validator=attrs.validators.gt(0))


def build_wide_and_deep(cfg: WideAndDeepConfig, ctx: ModelContext) -> Any:
    """Build Wide & Deep for ``ctx``'s features.

    Raises:
        ConfigError: when there is no id feature or the wide width is not a multiple of 4.
    """
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection

    from tzrun_plugins.models import _order

    problems = []
    if cfg.wide_embedding_dim % 4:
        problems.append(ConfigProblem("model.wide_embedding_dim", f"{cfg.wide_embedding_dim} is not a multiple of 4 (FBGEMM needs one)"))
    if not ctx.sparse_features:
        problems.append(ConfigProblem("features.sparse", "wide_and_deep needs at least one id feature"))
    if problems:
        raise ConfigError("model", problems)

    class WideAndDeep(nn.Module):
        """A linear model over the ids plus an MLP over every feature."""

        def __init__(self) -> None:
            super().__init__()
            self.feature_names = [f.name for f in ctx.sparse_features]
            self.deep_ebc = EmbeddingBagCollection(tables=ctx.embedding_bag_configs(), is_weighted=ctx.is_weighted, device=ctx.embedding_device)
            self.wide_ebc = EmbeddingBagCollection(
                tables=wide_tables(ctx, cfg.wide_embedding_dim), is_weighted=ctx.is_weighted, device=ctx.embedding_device
            )
            deep_in = len(ctx.dense_features) + sum(
                t.embedding_dim * len(t.feature_names) for t in ctx.tables
            )
            self.deep = mlp(deep_in, cfg.deep_hidden_units)
            self.output = nn.Linear(out_width(deep_in, cfg.deep_hidden_units), 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            embedded = _order.in_feature_order(self.deep_ebc(batch.sparse), self.feature_names)
            wide = self.wide_ebc(batch.sparse).values().sum(dim=1)  # a sum over features: order-free
            deep = self.output(self.deep(torch.cat([batch.dense, embedded], dim=1))).squeeze(-1)
            logits = wide + deep
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return WideAndDeep()
