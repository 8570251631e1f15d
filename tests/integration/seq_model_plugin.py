"""A test-only sequence model built from tzrun's public API alone (``tzrun.sequence``), as a
third-party plugin would be: registered in-process (``PLUGIN``) or installed as a throwaway
distribution (:func:`install`) so that every rank of a ``torchrun`` job loads it.

``seq_tower``: each sequence group's masked mean, its query and their product, the pooled
features (``batch.sparse``, and the unpooled ones through ``pooled()``) and the dense features,
into one linear layer: ``logits``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch
import torch.fx

import tzrun


@attrs.frozen
class SeqTowerConfig:
    """Options of ``seq_tower`` (none)."""


def build_seq_tower(cfg: SeqTowerConfig, ctx: tzrun.ModelContext) -> Any:
    from torch import nn
    from torchrec import EmbeddingBagCollection

    from tzrun.sequence import SequenceEmbeddings

    unpooled = ctx.unpooled_sparse_features()
    pooled = [f.name for f in ctx.sparse_features if f.name not in unpooled]
    dims = {n: t.embedding_dim for t in (*ctx.tables, *ctx.sequence_tables) for n in t.feature_names}

    class SeqTower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = SequenceEmbeddings(ctx)
            self.ebc = EmbeddingBagCollection(tables=ctx.embedding_bag_configs(), device=ctx.embedding_device) if pooled else None
            width = len(ctx.dense_features) + sum(dims[n] for n in pooled) + sum(dims[n] for n in unpooled)
            for g in ctx.sequence_groups:
                d = sum(dims[f.name] for f in g.features)
                width += d * (3 if g.query else 1)
            self.out = nn.Linear(width, 1)

        def forward(self, batch: Any) -> dict[str, torch.Tensor]:
            out = self.seq(batch)
            parts = [batch.dense]
            if self.ebc is not None:
                parts.append(_in_order(self.ebc(batch.sparse), pooled))
            parts += [out.pooled(n) for n in unpooled]
            for g in ctx.sequence_groups:
                seq, mask = out.sequence(g.name)
                weights = mask.unsqueeze(-1).to(seq.dtype)
                mean = (seq * weights).sum(1) / weights.sum(1).clamp(min=1.0)
                parts.append(mean)
                if g.query:
                    q = out.query(g.name)
                    parts += [q, q * mean]
            logits = self.out(torch.cat(parts, dim=1)).squeeze(1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return SeqTower()


@torch.fx.wrap
def _in_order(keyed: Any, names: list[str]) -> Any:
    """A KeyedTensor's values in the order of ``names`` (a sharded one's order is its plan's)."""
    parts = keyed.to_dict()
    return torch.cat([parts[n] for n in names], dim=1)


class SeqModels:
    @tzrun.hookimpl
    def tzrun_register_models(self, register: Any) -> None:
        register("seq_tower", config=SeqTowerConfig, build=build_seq_tower, description="test-only sequence model")


PLUGIN = SeqModels()


def install(site_dir: Path) -> dict[str, str]:
    """Install this plugin into ``site_dir`` as a distribution; returns the environment
    (``PYTHONPATH``) under which ``tzrec-run`` loads it."""
    from tests.plugin_kit.dists import _python_path, write_distribution

    write_distribution(site_dir, "tzrun-test-seq-models", entry_points={"test_seq_models": "tzrun_test_seq_models:PLUGIN"},
                       modules={"tzrun_test_seq_models": Path(__file__).read_text(encoding="utf-8")})
    return {"PYTHONPATH": _python_path(site_dir)}
