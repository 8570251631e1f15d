"""dcn_v1, dcn_v2 and mask_net equal TorchEasyRec's formulas on fixed inputs.

Each reference below is an independent plain-torch statement of what TorchEasyRec's model
computes (``tzrec/models/dcn.py``, ``dcn_v2.py``, ``masknet.py`` with ``tzrec/modules/
interaction.py``'s ``Cross``/``CrossV2`` and ``tzrec/modules/masknet.py``, at commit 54cac31),
written on weight tensors; our model's weights are copied into it, and both must give the same
logits. The input ``x0`` is built here too: the dense columns, then each id feature's embedding
rows mean-pooled, in config order (TorchEasyRec's one ``DEEP`` group).
"""

from __future__ import annotations

import attrs
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SequenceGroup, SparseFeature

ROWS = 6
DIM = 4


def _ctx(*, sequences: bool = False) -> ModelContext:
    """Dense d0, d1 and id features a, b (their own 4-wide mean-pooled tables)."""
    sparse = tuple(SparseFeature(n, n, f"{n}_emb", num_buckets=10) for n in ("a", "b"))
    tables = tuple(EmbeddingTable(f"{n}_emb", 10, DIM, (n,), "mean") for n in ("a", "b"))
    return ModelContext((DenseFeature("d0", "d0"), DenseFeature("d1", "d1")), sparse, tables,
                        torch.device("cpu"), ("label",))


def _batch() -> Batch:
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([1, 2, 1, 3, 1, 2] + [2, 1, 1, 1, 3, 1], dtype=torch.int32)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=gen)
    sparse = KeyedJaggedTensor(keys=["a", "b"], values=values, lengths=lengths, stride=ROWS)
    return Batch(torch.randn(ROWS, 2, generator=gen), sparse, {"label": torch.zeros(ROWS)}, torch.ones(ROWS), ROWS)


@pytest.fixture(scope="module")
def registries():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return collect_registries(make_plugin_manager())


def _build(registries, name: str, **options):
    torch.manual_seed(0)
    entry = registries["model"].get(name, "model.type")
    model = entry.build(entry.config(**options), _ctx())
    for p in model.parameters():  # off the default inits (zero biases), so every weight shows
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _x0(model, batch: Batch) -> torch.Tensor:
    """``[dense, mean(a's rows), mean(b's rows)]`` from the model's own embedding tables."""
    parts = [batch.dense]
    features = batch.sparse.to_dict()
    for name in ("a", "b"):
        table = model.ebc.embedding_bags[f"{name}_emb"].weight
        ids = features[name]
        parts.append(torch.stack([table[row].mean(dim=0) for row in ids.to_dense()]))
    return torch.cat(parts, dim=1)


def _linears(seq) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (weight, bias) of each Linear -> ReLU layer of one of our MLPs."""
    return [(m.weight, m.bias) for m in seq if isinstance(m, torch.nn.Linear)]


def mlp_ref(x: torch.Tensor, layers) -> torch.Tensor:
    """TorchEasyRec's ``MLP`` with its defaults: ``relu(x W^T + b)`` per layer."""
    for w, b in layers:
        x = torch.relu(x @ w.t() + b)
    return x


def cross_v1_ref(x0: torch.Tensor, ws, bs) -> torch.Tensor:
    """``Cross``: ``x_{l+1} = (x_l w_l) * x0 + b_l + x_l``, ``w_l`` a ``[1, d]`` row."""
    x = x0
    for w, b in zip(ws, bs):
        x = (x @ w.t()) * x0 + b + x
    return x


def cross_v2_ref(x0: torch.Tensor, us, vs, bs) -> torch.Tensor:
    """``CrossV2``: ``x_{l+1} = x0 * (V_l (U_l x_l) + b_l) + x_l``."""
    x = x0
    for u, v, b in zip(us, vs, bs):
        x = x0 * ((x @ u.t()) @ v.t() + b) + x
    return x


def test_dcn_v2_is_torcheasyrecs_formula(registries):
    model = _build(registries, "dcn_v2", backbone_hidden_units=(8, 6), cross_num=2, low_rank=3,
                   deep_hidden_units=(5,), final_hidden_units=(7, 4))
    batch = _batch()
    x0 = _x0(model, batch)
    net = cross_v2_ref(mlp_ref(x0, _linears(model.backbone)), [u.weight for u in model.cross.u],
                       [v.weight for v in model.cross.v], [v.bias for v in model.cross.v])
    net = torch.cat([net, mlp_ref(x0, _linears(model.deep))], dim=1)
    expected = (mlp_ref(net, _linears(model.final)) @ model.output.weight.t()).squeeze(-1)  # no bias
    out = model(batch)
    torch.testing.assert_close(out["logits"], expected)
    torch.testing.assert_close(out["probs"], torch.sigmoid(expected))
    assert model.output.bias is None and model.cross.u[0].weight.shape == (3, 6)


def test_dcn_v2_without_backbone_and_deep_crosses_the_inputs(registries):
    model = _build(registries, "dcn_v2", cross_num=3, low_rank=2, final_hidden_units=(4,))
    batch = _batch()
    x0 = _x0(model, batch)
    net = cross_v2_ref(x0, [u.weight for u in model.cross.u], [v.weight for v in model.cross.v],
                       [v.bias for v in model.cross.v])
    expected = (mlp_ref(net, _linears(model.final)) @ model.output.weight.t()).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)
    assert model.final[0].in_features == 2 + 2 * DIM  # the cross keeps its input's width


def test_dcn_v1_is_torcheasyrecs_formula(registries):
    model = _build(registries, "dcn_v1", cross_num=2, deep_hidden_units=(5, 3), final_hidden_units=(4,))
    batch = _batch()
    x0 = _x0(model, batch)
    crossed = cross_v1_ref(x0, [w.weight for w in model.cross.w], list(model.cross.b))
    net = torch.cat([crossed, mlp_ref(x0, _linears(model.deep))], dim=1)
    expected = (mlp_ref(net, _linears(model.final)) @ model.output.weight.t()).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)
    model(batch)["logits"].sum().backward()
    assert all(p.grad is not None for p in model.cross.parameters())


def test_dcn_v1_initializes_as_torcheasyrec_zero_bias_xavier_weights(registries):
    entry = registries["model"].get("dcn_v1", "model.type")
    model = entry.build(entry.config(), _ctx())
    assert all(torch.all(b == 0) for b in model.cross.b)
    bound = (6 / (2 + 2 * DIM + 1)) ** 0.5  # xavier_uniform of a [1, d] weight
    assert all(w.weight.abs().max() <= bound for w in model.cross.w)


@pytest.mark.parametrize("name", ["dcn_v1", "dcn_v2"])
def test_dcn_models_refuse_sequence_groups(registries, name):
    ctx = attrs.evolve(_ctx(), sequence_groups=(SequenceGroup("clicks", 5, ()),))
    with pytest.raises(ConfigError, match=f"features.sequence: {name} reads no"):
        entry = registries["model"].get(name, "model.type")
        entry.build(entry.config(), ctx)


def test_convert_maps_torcheasyrecs_dcn_models():
    from tests.core.torcheasyrec_examples import DCN_V2_CRITEO
    from tzrun_tools.convert import convert_pipeline_config

    v2 = convert_pipeline_config(DCN_V2_CRITEO, "dcn_v2_criteo.config").tree["model"]
    assert v2 == {"type": "dcn_v2", "backbone_hidden_units": [512, 256, 128], "cross_num": 2, "low_rank": 32,
                  "deep_hidden_units": [512, 256], "final_hidden_units": [128, 32]}
    start, end = DCN_V2_CRITEO.index("    dcn_v2 {"), DCN_V2_CRITEO.index("    metrics {")
    v1 = DCN_V2_CRITEO[:start] + "dcn_v1 { cross {} deep { hidden_units: [8] } final { hidden_units: [4] } }\n" + \
        DCN_V2_CRITEO[end:]
    conversion = convert_pipeline_config(v1, "dcn_v1.config")
    assert conversion.tree["model"] == {"type": "dcn_v1", "cross_num": 3, "deep_hidden_units": [8],
                                        "final_hidden_units": [4]}


def layer_norm_ref(x: torch.Tensor, norm) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last dimension (biased variance)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def mask_block_ref(v: torch.Tensor, x0: torch.Tensor, block) -> torch.Tensor:
    """``MaskBlock``: ``mask = W2 relu(W1 x0 + c1) + c2``; ``relu(layer_norm(W (v * mask) + c))``."""
    first, second = block.mask[0], block.mask[2]
    mask = torch.relu(x0 @ first.weight.t() + first.bias) @ second.weight.t() + second.bias
    linear, norm = block.hidden[0], block.hidden[1]
    return torch.relu(layer_norm_ref((v * mask) @ linear.weight.t() + linear.bias, norm))


@pytest.mark.parametrize("parallel", [True, False])
def test_mask_net_is_torcheasyrecs_formula(registries, parallel):
    model = _build(registries, "mask_net", n_mask_blocks=3, hidden_dim=5, reduction_ratio=1.5, use_parallel=parallel,
                   top_hidden_units=(6, 3))
    batch = _batch()
    x0 = _x0(model, batch)
    normed = layer_norm_ref(x0, model.norm)
    if parallel:  # every block masks layer_norm(x0) under its own mask of x0
        hidden = torch.cat([mask_block_ref(normed, x0, block) for block in model.blocks], dim=1)
    else:  # the first block masks layer_norm(x0), each next one the previous block's output
        hidden = normed
        for block in model.blocks:
            hidden = mask_block_ref(hidden, x0, block)
    expected = (mlp_ref(hidden, _linears(model.top)) @ model.output.weight.t()).squeeze(-1)
    torch.testing.assert_close(model(batch)["logits"], expected)
    width = 2 + 2 * DIM
    # aggregation width int(1.5 * the masked width): x0's in parallel, hidden_dim's after the first serial block
    assert [b.mask[0].out_features for b in model.blocks] == ([15] * 3 if parallel else [15, 7, 7])
    assert all(b.mask[0].in_features == width for b in model.blocks) and model.output.bias is None


def test_mask_net_aggregation_dim_sets_every_blocks_width(registries):
    model = _build(registries, "mask_net", n_mask_blocks=2, hidden_dim=4, aggregation_dim=3, use_parallel=False,
                   top_hidden_units=())
    assert [b.mask[0].out_features for b in model.blocks] == [3, 3]
    assert model.output.in_features == 4  # no top MLP: the last block's output


def test_mask_net_refuses_an_aggregation_width_below_one(registries):
    with pytest.raises(ConfigError, match=r"model.reduction_ratio: 0.01 times the masked width \(10\) is below 1"):
        _build(registries, "mask_net", reduction_ratio=0.01)


def test_convert_maps_torcheasyrecs_mask_net_with_the_aggregation_width_it_uses():
    from tests.core.torcheasyrec_examples import MASKNET_CRITEO
    from tzrun_tools.convert import convert_pipeline_config

    model = convert_pipeline_config(MASKNET_CRITEO, "masknet_criteo.config").tree["model"]
    assert model == {"type": "mask_net", "n_mask_blocks": 3, "hidden_dim": 512, "reduction_ratio": 3.0,
                     "use_parallel": True, "top_hidden_units": [256, 128, 64]}
    # TorchEasyRec's reduction_ratio (default 1.0) wins over aggregation_dim unless it is 0
    ignored = convert_pipeline_config(MASKNET_CRITEO.replace("reduction_ratio: 3", "aggregation_dim: 64"), "m.config")
    assert ignored.tree["model"]["reduction_ratio"] == 1.0 and "aggregation_dim" not in ignored.tree["model"]
    assert any(f.path.endswith("mask_block.aggregation_dim") and f.message.startswith(
        "64: TorchEasyRec uses reduction_ratio (1, its default 1.0 when unset)") for f in ignored.not_converted)
    used = convert_pipeline_config(MASKNET_CRITEO.replace("reduction_ratio: 3", "reduction_ratio: 0 aggregation_dim: 64"),
                                   "m.config").tree["model"]
    assert used["aggregation_dim"] == 64 and "reduction_ratio" not in used
