"""DeepFM (Guo et al., 2017), in TorchEasyRec's shape.

``logits = linear(final_mlp([wide, fm, deep]))`` where ``wide`` is the sum over id features of a
small per-id embedding (``wide_embedding_dim``), ``fm`` the factorization-machine interaction of
the id features' embeddings, and ``deep`` an MLP over the dense features and all embeddings.
Without ``final_hidden_units`` the three parts are projected to one logit each and summed.
Both embedding collections are built on the meta device; TorchRec shards and materializes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, positive_units, wide_tables

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["DeepFMConfig", "build_deepfm"]


@attrs.frozen
class DeepFMConfig:
    """Options of the ``deepfm`` model.

    Attributes:
        deep_hidden_units: layer widths of the deep MLP.
        final_hidden_units: layer widths of the MLP over ``[wide, fm, deep]`` (empty: sum of
            three linear projections).
        wide_embedding_dim: width of the per-id wide embeddings (a multiple of 4).
    """

    deep_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64), validator=positive_units)
    final_hidden_units: tuple[int, ...] = attrs.field(default=(64,), validator=positive_units)
    wide_embedding_dim: int = attrs.field(default=4, validator=attrs.validators.gt(0))


def build_deepfm(cfg: DeepFMConfig, ctx: ModelContext) -> Any:
    """Build DeepFM for ``ctx``'s features.

    Raises:
        ConfigError: when the id features' embedding widths differ (FM needs one width) or the
            wide width is not a multiple of 4.
    """
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection

    from tzrun_plugins.models import _order

    dims = {t.embedding_dim for t in ctx.tables}
    problems = []
    if len(dims) > 1:
        problems.append(ConfigProblem("features.sparse", f"deepfm's FM part needs one embedding_dim for all id features, got {sorted(dims)}"))
    if cfg.wide_embedding_dim % 4:
        problems.append(ConfigProblem("model.wide_embedding_dim", f"{cfg.wide_embedding_dim} is not a multiple of 4 (FBGEMM needs one)"))
    if not ctx.sparse_features:
        problems.append(ConfigProblem("features.sparse", "deepfm needs at least one id feature"))
    if problems:
        raise ConfigError("model", problems)

    class DeepFM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.feature_names = [f.name for f in ctx.sparse_features]
            self.embedding_dim = dims.pop()
            self.deep_ebc = EmbeddingBagCollection(tables=ctx.embedding_bag_configs(), is_weighted=ctx.is_weighted, device=ctx.embedding_device)
            self.wide_ebc = EmbeddingBagCollection(
                tables=wide_tables(ctx, cfg.wide_embedding_dim), is_weighted=ctx.is_weighted, device=ctx.embedding_device
            )
            n_sparse = len(self.feature_names)
            deep_in = len(ctx.dense_features) + n_sparse * self.embedding_dim
            self.deep = mlp(deep_in, cfg.deep_hidden_units)
            deep_out = cfg.deep_hidden_units[-1] if cfg.deep_hidden_units else deep_in
            parts = cfg.wide_embedding_dim + self.embedding_dim + deep_out
            self.final = mlp(parts, cfg.final_hidden_units)
            self.output = nn.Linear(cfg.final_hidden_units[-1] if cfg.final_hidden_units else parts, 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            # in config order, whatever the sharding plan's order (it changes with the world size)
            embedded = _order.in_feature_order(self.deep_ebc(batch.sparse), self.feature_names)
            wide = self.wide_ebc(batch.sparse).values()  # summed over features: order-free
            rows = wide.shape[0]
            wide = wide.view(rows, len(self.feature_names), -1).sum(dim=1)
            vectors = embedded.view(rows, len(self.feature_names), self.embedding_dim)
            summed = vectors.sum(dim=1)
            fm = 0.5 * (summed * summed - (vectors * vectors).sum(dim=1))
            deep = self.deep(torch.cat([batch.dense, embedded], dim=1))
            logits = self.output(self.final(torch.cat([wide, fm, deep], dim=1))).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return DeepFM()
