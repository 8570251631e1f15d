"""DLRM (Naumov et al., 2019), in TorchRec's layout (``torchrec.models.dlrm.DLRM``).

``dense = bottom_mlp(dense features)`` has the embedding width ``D``; the pairwise dot products of
``[dense, e_1, ..., e_F]`` (each pair once, no self-products) are concatenated with ``dense``
(and, with ``arch_with_sparse``, with every embedding, as TorchEasyRec's ``dlrm`` does) and fed to
``top_mlp`` and a final linear layer: ``logits``. Embeddings are built on ``ctx.embedding_device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, non_empty, one_embedding_dim, out_width, positive_units

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["DLRMConfig", "build_dlrm"]


@attrs.frozen
class DLRMConfig:
    """Options of the ``dlrm`` model.

    Attributes:
        dense_hidden_units: layer widths of the bottom MLP over the dense features; the last one
            must equal the id features' ``embedding_dim`` (the dense vector joins the dot products).
        top_hidden_units: layer widths of the top MLP over the interactions (a final linear layer
            to one logit follows).
        arch_with_sparse: also feed the embeddings themselves to the top MLP.
    """

    dense_hidden_units: tuple[int, ...] = attrs.field(
        default=(64, 16), validator=[non_empty, positive_units]
    )
    top_hidden_units: tuple[int, ...] = attrs.field(default=(64, 32), validator=positive_units)
    arch_with_sparse: bool = False


def build_dlrm(cfg: DLRMConfig, ctx: ModelContext) -> Any:
    """Build DLRM for ``ctx``'s features.

    Raises:
        ConfigError: when there is no dense or no id feature, the id features' widths differ,
            or the bottom MLP's last width is not the embedding width.
    """
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection

    from tzrun_plugins.models import _order

    problems: list[ConfigProblem] = []
    dim = one_embedding_dim(ctx, "dlrm", "its dot products need one width", problems)
    if not ctx.dense_features:
        problems.append(ConfigProblem("features.dense", "dlrm needs at least one dense feature for its bottom MLP"))
    if not ctx.sparse_features:
        problems.append(ConfigProblem("features.sparse", "dlrm needs at least one id feature"))
    elif dim and cfg.dense_hidden_units[-1] != dim:
        problems.append(ConfigProblem(
            "model.dense_hidden_units",
            f"the last width ({cfg.dense_hidden_units[-1]}) must equal the embedding_dim of the id features ({dim}); "
            f"set model.dense_hidden_units = {list(cfg.dense_hidden_units[:-1]) + [dim]}",
        ))
    if problems:
        raise ConfigError("model", problems)

    class DLRM(nn.Module):
        """Bottom MLP, embeddings, pairwise dot interaction, top MLP."""

        pair_rows: torch.Tensor
        pair_cols: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.feature_names = [f.name for f in ctx.sparse_features]
            self.embedding_dim = dim
            n = len(self.feature_names) + 1
            self.ebc = EmbeddingBagCollection(tables=ctx.embedding_bag_configs(), is_weighted=ctx.is_weighted, device=ctx.embedding_device)
            self.dense_arch = mlp(len(ctx.dense_features), cfg.dense_hidden_units)
            rows, cols = torch.triu_indices(n, n, offset=1)
            self.register_buffer("pair_rows", rows, persistent=False)
            self.register_buffer("pair_cols", cols, persistent=False)
            top_in = dim + n * (n - 1) // 2 + (dim * (n - 1) if cfg.arch_with_sparse else 0)
            self.over_arch = mlp(top_in, cfg.top_hidden_units)
            self.output = nn.Linear(out_width(top_in, cfg.top_hidden_units), 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            dense = self.dense_arch(batch.dense)
            embedded = _order.in_feature_order(self.ebc(batch.sparse), self.feature_names)
            vectors = embedded.view(dense.shape[0], len(self.feature_names), self.embedding_dim)
            combined = torch.cat([dense.unsqueeze(1), vectors], dim=1)
            products = torch.bmm(combined, combined.transpose(1, 2))
            parts = [dense, products[:, self.pair_rows, self.pair_cols]]
            if cfg.arch_with_sparse:
                parts.append(embedded)
            logits = self.output(self.over_arch(torch.cat(parts, dim=1))).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return DLRM()
