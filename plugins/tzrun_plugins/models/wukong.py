"""WuKong (Zhang et al., 2024), in TorchEasyRec's shape (``wukong``): stacked FM and linear
compression blocks over the feature embeddings.

The model reads ``n`` fields of width ``d`` (``X``, ``[B, n, d]``): with dense features,
``dense_mlp(dense features)`` (its last width must be ``d``) first, then each id feature's pooled
embedding (all ``d`` wide), in config order, as TorchEasyRec's ``dense`` and ``sparse`` groups. A
WuKong layer maps ``n`` fields to ``m = fmb_feature_num + lcb_feature_num``:

- FMB: ``Z = X (X^T W)`` (``W``: ``n x compressed_feature_num``), flattened,
  ``fmb = linear(mlp(layer_norm(Z)))`` reshaped to ``fmb_feature_num`` fields;
- LCB: ``lcb = (X^T L)^T`` (``L``: ``n x lcb_feature_num``), a linear mix of the fields;
- ``out = layer_norm([fmb, lcb] + R(X))`` over each field's ``d`` values, where ``R`` is an LCB
  to ``m`` fields when ``m != n`` and the identity otherwise.

The layers stack (each next one reads the previous one's ``m`` fields); then
``logits = linear(final_mlp(flatten(X)))``, the linear layer with a bias, as TorchEasyRec's.
Outputs: ``logits`` and ``probs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from tzrun import ModelContext
from tzrun.errors import ConfigError, ConfigProblem
from tzrun_plugins.models._layers import mlp, one_embedding_dim, out_width, positive_units

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    from tzrun import Batch

__all__ = ["WuKongConfig", "WuKongLayerConfig", "build_wukong"]


@attrs.frozen
class WuKongLayerConfig:
    """One ``[[model.wukong_layers]]`` table of ``wukong``.

    Attributes:
        lcb_feature_num: fields the linear compression block outputs.
        fmb_feature_num: fields the FM block outputs.
        compressed_feature_num: columns of the FM block's compression ``W`` (its optimized FM
            crosses every field with this many mixes of them).
        feature_num_hidden_units: layer widths of the MLP over the FM block's layer-normalized
            interactions (a linear layer to ``fmb_feature_num`` fields follows).
    """

    lcb_feature_num: int = attrs.field(validator=attrs.validators.gt(0))
    fmb_feature_num: int = attrs.field(validator=attrs.validators.gt(0))
    compressed_feature_num: int = attrs.field(default=16, validator=attrs.validators.gt(0))
    feature_num_hidden_units: tuple[int, ...] = attrs.field(default=(512,), validator=positive_units)


#: the layers of TorchEasyRec's examples/wukong_criteo.config
_EXAMPLE_LAYERS = (WuKongLayerConfig(16, 16, 24, (512,)), WuKongLayerConfig(16, 16, 24, (512,)))


@attrs.frozen
class WuKongConfig:
    """Options of the ``wukong`` model.

    Attributes:
        dense_hidden_units: layer widths of the MLP over the dense features (used when there are
            any); its output is the first field, so the last width must be the id features'
            ``embedding_dim``.
        wukong_layers: the WuKong layers, input first (none: the final MLP reads the fields).
        final_hidden_units: layer widths of the MLP over the last layer's fields, flattened (a
            linear layer to one logit, with a bias, follows).
    """

    dense_hidden_units: tuple[int, ...] = attrs.field(default=(512, 256, 128, 16), validator=positive_units)
    wukong_layers: tuple[WuKongLayerConfig, ...] = _EXAMPLE_LAYERS
    final_hidden_units: tuple[int, ...] = attrs.field(default=(512, 64), validator=positive_units)


def _problems(cfg: WuKongConfig, ctx: ModelContext) -> tuple[int, list[ConfigProblem]]:
    """The fields' width ``d`` and what keeps ``ctx`` and ``cfg`` from making a model."""
    problems: list[ConfigProblem] = []
    if ctx.sequence_groups:
        problems.append(ConfigProblem("features.sequence", "wukong reads no [[features.sequence]] group; use the din "
                                                           "model for attention over a sequence"))
    dim = one_embedding_dim(ctx, "wukong", "its fields are stacked into one [B, n, d] tensor", problems)
    if not ctx.sparse_features:
        problems.append(ConfigProblem("features.sparse", "wukong needs at least one id feature: its fields are the "
                                                         "id features' embeddings"))
    elif dim and ctx.dense_features:
        units = cfg.dense_hidden_units
        if not units or units[-1] != dim:
            what = f"the last width ({units[-1]})" if units else "empty: with dense features its output"
            problems.append(ConfigProblem("model.dense_hidden_units", (
                f"{what} must equal the embedding_dim of the id features ({dim}), as it is the first field; set "
                f"model.dense_hidden_units = {list(units[:-1]) + [dim]}")))
    return dim, problems


def build_wukong(cfg: WuKongConfig, ctx: ModelContext) -> Any:
    """Build WuKong for ``ctx``'s features.

    Raises:
        ConfigError: when the config has sequence groups (which wukong does not read), no id
            feature, id features of different widths, or a dense MLP whose last width is not
            theirs.
    """
    import torch
    from torch import nn

    from tzrun_plugins.models._sequence_inputs import FeatureInputs, bag_collection

    dim, problems = _problems(cfg, ctx)
    if problems:
        raise ConfigError("model", problems)

    class LinearCompress(nn.Module):
        """LCB: ``(X^T L)^T``, ``L`` an ``n_in x n_out`` weight (Kaiming-uniform, as TorchEasyRec's)."""

        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(n_in, n_out))
            nn.init.kaiming_uniform_(self.weight)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.transpose(1, 2) @ self.weight).transpose(1, 2)

    class FactorizationMachine(nn.Module):
        """FMB: ``linear(mlp(layer_norm(flatten(X (X^T W)))))`` as ``n_out`` fields."""

        def __init__(self, n_in: int, layer: WuKongLayerConfig) -> None:
            super().__init__()
            crossed = n_in * layer.compressed_feature_num
            self.weight = nn.Parameter(torch.empty(n_in, layer.compressed_feature_num))
            nn.init.kaiming_uniform_(self.weight)
            self.norm = nn.LayerNorm(crossed)
            self.mlp = mlp(crossed, layer.feature_num_hidden_units)
            self.out = nn.Linear(out_width(crossed, layer.feature_num_hidden_units), layer.fmb_feature_num * dim)
            self.fields = layer.fmb_feature_num

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            crossed = (x @ (x.transpose(1, 2) @ self.weight)).flatten(1)
            return self.out(self.mlp(self.norm(crossed))).view(-1, self.fields, dim)  # type: ignore[no-any-return]

    class WuKongLayer(nn.Module):
        """``layer_norm([fmb(X), lcb(X)] + residual(X))``."""

        def __init__(self, n_in: int, layer: WuKongLayerConfig) -> None:
            super().__init__()
            self.n_out = layer.fmb_feature_num + layer.lcb_feature_num
            self.fmb = FactorizationMachine(n_in, layer)
            self.lcb = LinearCompress(n_in, layer.lcb_feature_num)
            self.residual = LinearCompress(n_in, self.n_out) if n_in != self.n_out else nn.Identity()
            self.norm = nn.LayerNorm(dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(torch.cat([self.fmb(x), self.lcb(x)], dim=1) + self.residual(x))  # type: ignore[no-any-return]

    class WuKong(nn.Module):
        """The dense MLP's field and the id embeddings, WuKong layers, a final MLP, one logit."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = bag_collection(ctx)
            self.inputs = FeatureInputs(ctx, [f.name for f in ctx.sparse_features])
            self.n_sparse = len(ctx.sparse_features)
            self.has_dense = bool(ctx.dense_features)
            self.dense = mlp(len(ctx.dense_features), cfg.dense_hidden_units if self.has_dense else ())
            fields = self.n_sparse + int(self.has_dense)
            layers = []
            for layer in cfg.wukong_layers:
                layers.append(WuKongLayer(fields, layer))
                fields = layers[-1].n_out
            self.layers = nn.ModuleList(layers)
            self.final = mlp(fields * dim, cfg.final_hidden_units)
            self.output = nn.Linear(out_width(fields * dim, cfg.final_hidden_units), 1)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            bags = self.ebc(batch.sparse) if self.ebc is not None else None
            x = self.inputs(batch.dense, bags, None).view(-1, self.n_sparse, dim)
            if self.has_dense:
                x = torch.cat([self.dense(batch.dense).unsqueeze(1), x], dim=1)
            for layer in self.layers:
                x = layer(x)
            logits = self.output(self.final(x.flatten(1))).squeeze(-1)
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    return WuKong()
