"""wukong equals TorchEasyRec's formula on fixed inputs, and names what keeps it from building.

The reference below is an independent plain-torch statement of what TorchEasyRec's ``WuKong``
computes (``tzrec/models/wukong.py`` with ``tzrec/modules/interaction.py``'s ``WuKongLayer``,
``FactorizationMachineBlock`` and ``LinearCompressBlock``, at commit 54cac31), written with
``einsum`` on weight tensors; our model's weights are copied into it, and both must give the same
logits. Its input: ``dense_mlp(dense)`` as the first field (TorchEasyRec's ``dense`` group), then
each id feature's embedding rows mean-pooled, in config order (its ``sparse`` group).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SequenceGroup, SparseFeature
from tzrun.testing import load_config_text

from tests.plugins.test_models_dcn_masknet import _linears, layer_norm_ref, mlp_ref  # TorchEasyRec's MLP, LayerNorm

REPO = Path(__file__).resolve().parents[2]
ROWS = 6
DIM = 4


def _ctx(*, dense: bool = True, dims: tuple[int, ...] = (DIM, DIM, DIM)) -> ModelContext:
    """Dense d0, d1 (with ``dense``) and id features a, b, c (their own mean-pooled tables)."""
    names = ("a", "b", "c")
    sparse = tuple(SparseFeature(n, n, f"{n}_emb", num_buckets=10) for n in names)
    tables = tuple(EmbeddingTable(f"{n}_emb", 10, dim, (n,), "mean") for n, dim in zip(names, dims))
    dense_features = (DenseFeature("d0", "d0"), DenseFeature("d1", "d1")) if dense else ()
    return ModelContext(dense_features, sparse, tables, torch.device("cpu"), ("label",))


def _batch(*, dense: bool = True) -> Batch:
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([1, 2, 1, 3, 1, 2] + [2, 1, 1, 1, 3, 1] + [1, 1, 2, 1, 1, 4], dtype=torch.int32)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=gen)
    sparse = KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths, stride=ROWS)
    columns = torch.randn(ROWS, 2 if dense else 0, generator=gen)
    return Batch(columns, sparse, {"label": torch.zeros(ROWS)}, torch.ones(ROWS), ROWS)


@pytest.fixture(scope="module")
def registries():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return collect_registries(make_plugin_manager())


def _build(registries, ctx: ModelContext, **options):
    torch.manual_seed(0)
    entry = registries["model"].get("wukong", "model.type")
    model = entry.build(entry.config(**options), ctx)
    for p in model.parameters():  # off the default inits (zero biases, unit norms), so every weight shows
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _layer(lcb: int, fmb: int, compressed: int, units: list[int]):
    from tzrun_plugins.models.wukong import WuKongLayerConfig

    return WuKongLayerConfig(lcb_feature_num=lcb, fmb_feature_num=fmb, compressed_feature_num=compressed,
                             feature_num_hidden_units=tuple(units))


def _embeddings(model, batch: Batch) -> torch.Tensor:
    """``[B, 3, DIM]``: the mean of each id feature's rows, from the model's own tables."""
    features = batch.sparse.to_dict()
    fields = []
    for name in ("a", "b", "c"):
        table = model.ebc.embedding_bags[f"{name}_emb"].weight
        fields.append(torch.stack([table[row].mean(dim=0) for row in features[name].to_dense()]))
    return torch.stack(fields, dim=1)


def lcb_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``LinearCompressBlock``: output field ``j`` is ``sum_i weight[i, j] * x_i``."""
    return torch.einsum("bie,ij->bje", x, weight)


def fmb_ref(x: torch.Tensor, fmb) -> torch.Tensor:
    """``FactorizationMachineBlock``: ``Z = X (X^T W)``, flattened, layer norm, MLP, linear, as fields."""
    mixed = torch.einsum("bie,ik->bek", x, fmb.weight)  # X^T W: [B, d, k]
    crossed = torch.einsum("bie,bek->bik", x, mixed).reshape(x.shape[0], -1)  # [B, n * k]
    hidden = mlp_ref(layer_norm_ref(crossed, fmb.norm), _linears(fmb.mlp))
    return (hidden @ fmb.out.weight.t() + fmb.out.bias).reshape(x.shape[0], -1, x.shape[2])


def wukong_layer_ref(x: torch.Tensor, layer) -> torch.Tensor:
    """``WuKongLayer``: ``layer_norm([fmb, lcb] + residual)``, the residual an LCB when the field count changes."""
    out = torch.cat([fmb_ref(x, layer.fmb), lcb_ref(x, layer.lcb.weight)], dim=1)
    residual = lcb_ref(x, layer.residual.weight) if out.shape[1] != x.shape[1] else x
    return layer_norm_ref(out + residual, layer.norm)


def wukong_ref(model, batch: Batch, *, dense: bool = True) -> torch.Tensor:
    x = _embeddings(model, batch)
    if dense:
        x = torch.cat([mlp_ref(batch.dense, _linears(model.dense)).unsqueeze(1), x], dim=1)
    for layer in model.layers:
        x = wukong_layer_ref(x, layer)
    final = mlp_ref(x.reshape(x.shape[0], -1), _linears(model.final))
    return (final @ model.output.weight.t() + model.output.bias).squeeze(-1)


def test_wukong_is_torcheasyrecs_formula(registries):
    # 4 fields (the dense one and a, b, c) -> 5 (an LCB residual) -> 5 (the identity residual)
    model = _build(registries, _ctx(), dense_hidden_units=(5, DIM),
                   wukong_layers=(_layer(2, 3, 2, [6]), _layer(1, 4, 3, [5, 3])), final_hidden_units=(7, 4))
    batch = _batch()
    expected = wukong_ref(model, batch)
    out = model(batch)
    torch.testing.assert_close(out["logits"], expected)
    torch.testing.assert_close(out["probs"], torch.sigmoid(expected))
    assert model.output.bias is not None  # TorchEasyRec's output layer is a plain nn.Linear
    assert model.layers[0].residual.weight.shape == (4, 5) and isinstance(model.layers[1].residual, torch.nn.Identity)
    assert model.layers[0].fmb.weight.shape == (4, 2) and model.layers[1].fmb.norm.normalized_shape == (5 * 3,)
    assert model.final[0].in_features == 5 * DIM
    out["logits"].sum().backward()
    assert all(p.grad is not None for p in model.layers.parameters())


def test_wukong_without_dense_features_or_layers_reads_the_embeddings(registries):
    model = _build(registries, _ctx(dense=False), wukong_layers=(), final_hidden_units=(3,))
    batch = _batch(dense=False)
    torch.testing.assert_close(model(batch)["logits"], wukong_ref(model, batch, dense=False))
    assert model.final[0].in_features == 3 * DIM  # no dense field: the dense MLP is not used


def test_wukong_with_one_layer_and_no_dense_features(registries):
    model = _build(registries, _ctx(dense=False), wukong_layers=(_layer(2, 1, 5, []),), final_hidden_units=())
    batch = _batch(dense=False)
    torch.testing.assert_close(model(batch)["logits"], wukong_ref(model, batch, dense=False))
    assert model.output.in_features == 3 * DIM  # 3 -> 3 fields: the identity residual, then no final MLP


def test_wukong_initializes_its_blocks_kaiming_uniform_as_torcheasyrec(registries):
    entry = registries["model"].get("wukong", "model.type")
    model = entry.build(entry.config(dense_hidden_units=(DIM,), wukong_layers=(_layer(3, 2, 6, [4]),)), _ctx())
    layer = model.layers[0]
    # kaiming_uniform_ of an [n_in, n_out] tensor: bound sqrt(6 / fan_in), fan_in = n_out
    for weight in (layer.lcb.weight, layer.fmb.weight, layer.residual.weight):
        assert weight.abs().max() <= (6 / weight.shape[1]) ** 0.5 and weight.std() > 0
    assert [layer.lcb.weight.shape, layer.fmb.weight.shape, layer.residual.weight.shape] == [(4, 3), (4, 6), (4, 5)]


def test_wukong_defaults_are_torcheasyrecs_example_with_a_dense_mlp_ending_at_the_embedding_width(registries):
    cfg = registries["model"].get("wukong", "model.type").config()
    assert cfg.dense_hidden_units == (512, 256, 128, 16) and cfg.final_hidden_units == (512, 64)
    assert [(x.lcb_feature_num, x.fmb_feature_num, x.compressed_feature_num, x.feature_num_hidden_units)
            for x in cfg.wukong_layers] == [(16, 16, 24, (512,))] * 2


def test_wukong_refuses_a_dense_mlp_that_does_not_end_at_the_embedding_width(registries):
    with pytest.raises(ConfigError, match=(r"model.dense_hidden_units: the last width \(5\) must equal the embedding_dim "
                                           r"of the id features \(4\), as it is the first field; set "
                                           r"model.dense_hidden_units = \[8, 4\]")):
        _build(registries, _ctx(), dense_hidden_units=(8, 5))
    with pytest.raises(ConfigError, match=r"model.dense_hidden_units: empty: with dense features its output must equal"):
        _build(registries, _ctx(), dense_hidden_units=())
    _build(registries, _ctx(dense=False), dense_hidden_units=(8, 5))  # no dense features: not used


def test_wukong_refuses_id_features_of_different_widths_sequences_and_no_id_feature(registries):
    with pytest.raises(ConfigError, match=r"features.sparse: wukong needs one embedding_dim for all id features"):
        _build(registries, _ctx(dims=(4, 4, 8)), dense_hidden_units=(4,))
    with pytest.raises(ConfigError, match=r"features.sequence: wukong reads no \[\[features.sequence\]\] group"):
        _build(registries, attrs.evolve(_ctx(), sequence_groups=(SequenceGroup("clicks", 5, ()),)))
    with pytest.raises(ConfigError, match=r"features.sparse: wukong needs at least one id feature"):
        _build(registries, attrs.evolve(_ctx(), sparse_features=(), tables=()))


@pytest.mark.parametrize("override, message", [
    ("model.wukong_layers=[{lcb_feature_num=0, fmb_feature_num=4}]",
     "model.wukong_layers[0].lcb_feature_num: must be > 0"),
    ("model.wukong_layers=[{lcb_feature_num=4}]",
     "model.wukong_layers[0].fmb_feature_num: required key 'fmb_feature_num' is missing"),
    ("model.wukong_layers=[{lcb_feature_num=4, fmb_feature_num=4, compressed_feature_num=0}]",
     "model.wukong_layers[0].compressed_feature_num: must be > 0"),
    ("model.wukong_layers=[{lcb_feature_num=4, fmb_feature_num=4, feature_num_mlp=[8]}]",
     ("model.wukong_layers[0].feature_num_mlp: unknown key (known keys: lcb_feature_num, fmb_feature_num, "
      "compressed_feature_num, feature_num_hidden_units")),
    ("model.wukong_layers=[{lcb_feature_num=4, fmb_feature_num=4, feature_num_hidden_units=[0]}]",
     "model.wukong_layers[0].feature_num_hidden_units: every layer needs at least 1 unit, got [0]"),
    ("model.final_hidden_units=[8, -1]", "model.final_hidden_units: every layer needs at least 1 unit, got [8, -1]"),
    ("model.final=[8]", "model.final: unknown key (known keys: dense_hidden_units, wukong_layers, final_hidden_units)"),
])
def test_wukong_option_errors_name_the_option(override, message):
    text = (REPO / "examples" / "wukong_criteo.toml").read_text()
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(text, overrides=[override])
    assert message in str(excinfo.value)


def test_wukong_example_passes_check():
    cfg, _ = load_config_text((REPO / "examples" / "wukong_criteo.toml").read_text())
    assert cfg.model.type == "wukong" and cfg.model.config.wukong_layers[1].compressed_feature_num == 24


def test_convert_maps_torcheasyrecs_wukong_and_ends_its_dense_mlp_at_the_embedding_width():
    from tests.core.torcheasyrec_examples import WUKONG_CRITEO
    from tzrun_tools.convert import convert_pipeline_config

    conversion = convert_pipeline_config(WUKONG_CRITEO, "wukong_criteo.config")
    layer = {"lcb_feature_num": 16, "fmb_feature_num": 16, "compressed_feature_num": 24,
             "feature_num_hidden_units": [512]}
    assert conversion.tree["model"] == {"type": "wukong", "dense_hidden_units": [512, 256, 128, 16],
                                        "wukong_layers": [layer, layer], "final_hidden_units": [512, 64]}
    assert any(f.path.endswith("wukong.dense_mlp") and f.message.startswith(
        "[512, 256, 128] ends at 128, not at the id features' embedding_dim 16, which TorchEasyRec refuses")
        for f in conversion.notes)
    # a dense MLP that ends at the embedding width is kept as it is; compressed_feature_num's default written out
    fitting = WUKONG_CRITEO.replace("hidden_units: 128\n      }", "hidden_units: 16\n      }").replace(
        "compressed_feature_num: 24\n", "", 1)
    model = convert_pipeline_config(fitting, "w.config")
    assert model.tree["model"]["dense_hidden_units"] == [512, 256, 16]
    assert model.tree["model"]["wukong_layers"][0]["compressed_feature_num"] == 16
    assert not any("dense_mlp" in f.path for f in model.notes + model.not_converted)
