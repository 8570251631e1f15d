"""dssm_v2 equals TorchEasyRec's DSSM-v2 formula on fixed inputs, shares dssm's network, and names
what keeps it from building.

The reference below is an independent plain-torch statement of what TorchEasyRec's ``DSSMV2``
computes (``tzrec/models/dssm_v2.py`` with ``MatchModel.sim`` of ``tzrec/models/match_model.py``,
at commit 54cac31), reading our built model's weights as plain tensors:

- one embedding group for the model, looked up once over the batch's ``B + N`` rows (its
  ``force_base_data_group``): a feature in both towers' groups is one lookup of one table;
- a tower: ``relu`` MLP over its group, a linear layer to ``output_dim``, ``F.normalize`` with
  ``COSINE``; the user tower reads its group's first ``B`` rows, the item tower all of them;
- ``similarity = user @ item[:B]^T / temperature`` with in-batch negatives, and
  ``[sum(user * item[:B]), user @ item[B:]^T] / temperature`` with a sampler's ``N`` items.

A group is ``[its dense features, then its id features' mean-pooled embeddings]`` in the order
listed, as our model lays them out. The tables enter the reference as leaf tensors, so the
gradients that reach them (from both towers, for a feature in both) are compared too.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tests.plugins.test_models import _build, _ctx, registries  # noqa: F401 (a fixture)
from tests.plugins.test_models_pepnet import _group  # a group looked up by hand
from tests.plugins.test_models_ple_dbmtl import _layers, _linear  # weights as plain tensors, x W^T + b
from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.testing import load_config_text
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig
from tzrun_plugins.models.dssm_v2 import DSSMV2Config

REPO = Path(__file__).resolve().parents[2]
#: dense d0, d1; id features a, b, c with tables of their own (widths 4, 3, 2), mean-pooled
CTX = dict(dims=(4, 3, 2), dense=("d0", "d1"), sparse=("a", "b", "c"), shared=("none", "none"))
OWN, SAMPLED = 4, 3


def _batch_with_items(item_features: tuple[str, ...]) -> Batch:
    """``OWN`` rows with ids for every feature (some rows empty), then ``SAMPLED`` items with ids
    for ``item_features`` only and dense rows, as the data path appends a sampler's items."""
    torch.manual_seed(3)
    keys = ["a", "b", "c"]
    lengths, values = [], []
    for key in keys:
        own = [1, 2, 0, 1] if key == "a" else [1] * OWN
        items = [1] * SAMPLED if key in item_features else [0] * SAMPLED
        lengths += own + items
        values.append(torch.randint(0, 10, (sum(own) + sum(items),)))
    sparse = KeyedJaggedTensor(keys=keys, values=torch.cat(values), lengths=torch.tensor(lengths, dtype=torch.int32),
                               stride=OWN + SAMPLED)
    return Batch(torch.randn(OWN + SAMPLED, 2), sparse, {"click": torch.zeros(OWN)}, torch.ones(OWN), OWN)


def tower(x: torch.Tensor, module: nn.Module, cosine: bool) -> torch.Tensor:
    """TorchEasyRec's ``DSSMTower``: its MLP (``relu`` per layer), the output linear layer, and the
    L2 normalisation of ``COSINE``."""
    layers = _layers(module)
    for layer in layers[:-1]:
        x = torch.relu(_linear(x, layer))
    y = _linear(x, layers[-1])
    return F.normalize(y, p=2.0, dim=1) if cosine else y


def dssm_v2_ref(model: nn.Module, batch: Batch, cfg: DSSMV2Config,
                tables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TorchEasyRec's DSSM-v2 on ``batch``: both similarities and both embeddings."""
    rows = batch.weights.shape[0]
    cosine = cfg.similarity == "cosine"
    user = tower(_group(cfg.user_features, batch, tables)[:rows], model.user_tower, cosine)
    items = tower(_group(cfg.item_features, batch, tables), model.item_tower, cosine)
    item, sampled = items[:rows], items[rows:]
    own = torch.sum(torch.multiply(user, item), dim=-1, keepdim=True)
    return {
        "similarity": torch.mm(user, item.T) / cfg.temperature,  # in_batch_negative
        "sampled_similarity": torch.cat([own, torch.matmul(user, sampled.transpose(0, 1))], dim=-1) / cfg.temperature,
        "user_embedding": user,
        "item_embedding": item,
    }


@pytest.mark.parametrize("options", [
    # a feature in both towers (a: one table, one lookup, read by each), cosine, off-default temperature
    {"user_features": ("a", "b", "d0"), "item_features": ("a", "c", "d1"), "user_hidden_units": (5, 3),
     "item_hidden_units": (4,), "output_dim": 3, "similarity": "cosine", "temperature": 0.3},
    # TorchEasyRec's defaults (inner product, temperature 1), a dense feature in both, no item MLP
    {"user_features": ("a", "b", "d0", "d1"), "item_features": ("c", "d1"), "user_hidden_units": (4,),
     "item_hidden_units": (), "output_dim": 2, "similarity": "inner_product", "temperature": 1.0},
])
def test_dssm_v2_equals_torcheasyrecs_formula(registries, options):  # noqa: F811
    torch.manual_seed(7)
    cfg = DSSMV2Config(**options)
    model = _build(registries, "dssm_v2", _ctx(**CTX), **attrs.asdict(cfg, recurse=False))
    batch = _batch_with_items(cfg.item_features)
    out = model(batch)
    tables = {n: model.ebc.embedding_bags[f"{n}_emb"].weight.detach().clone().requires_grad_() for n in "abc"}
    expected = dssm_v2_ref(model, batch, cfg, tables)
    assert set(out) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(out[name], value)
    assert out["sampled_similarity"].shape == (OWN, 1 + SAMPLED)
    (out["similarity"].sum() + out["sampled_similarity"].sum()).backward()
    (expected["similarity"].sum() + expected["sampled_similarity"].sum()).backward()
    for name, table in tables.items():  # a feature in both towers: its table learns from both
        torch.testing.assert_close(model.ebc.embedding_bags[f"{name}_emb"].weight.grad, table.grad)


def test_a_feature_in_both_towers_is_one_table_that_moves_both_embeddings(registries):  # noqa: F811
    model = _build(registries, "dssm_v2", _ctx(**CTX), user_features=("a", "b", "d0"), item_features=("a", "c", "d1"))
    assert sorted(model.ebc.embedding_bags) == ["a_emb", "b_emb", "c_emb"]
    batch = _batch_with_items(("a", "c"))
    before = model(batch)
    with torch.no_grad():
        model.ebc.embedding_bags["a_emb"].weight.add_(1.0)
    after = model(batch)
    assert not torch.allclose(after["user_embedding"], before["user_embedding"])
    assert not torch.allclose(after["item_embedding"], before["item_embedding"])
    # the serving programs: each tower takes the shared feature as an input of its own
    assert model.serving_programs["user_tower"]["features"] == ["a", "b", "d0"]
    assert model.serving_programs["item_tower"]["features"] == ["a", "c", "d1"]


def test_dssm_v2_is_dssms_network_and_loads_its_weights(registries):  # noqa: F811
    options = dict(user_features=("a", "b", "d0"), item_features=("c", "d1"), user_hidden_units=(4,), output_dim=3)
    torch.manual_seed(0)
    dssm = _build(registries, "dssm", _ctx(**CTX), **options)
    torch.manual_seed(1)
    v2 = _build(registries, "dssm_v2", _ctx(**CTX), **options)
    assert sorted(dssm.state_dict()) == sorted(v2.state_dict())  # a dssm checkpoint's keys, one for one
    v2.load_state_dict(dssm.state_dict())
    batch = _batch_with_items(("c",))
    for name, value in dssm(batch).items():
        torch.testing.assert_close(v2(batch)[name], value)


def test_dssm_still_refuses_a_feature_in_both_towers_and_dssm_v2_takes_it(registries):  # noqa: F811
    both = dict(user_features=("a", "b", "d0"), item_features=("a", "c", "d1"))
    with pytest.raises(ConfigError, match=r"model.item_features: a also in model.user_features; a feature belongs "
                                          r"to one tower"):
        _build(registries, "dssm", _ctx(**CTX), **both)
    _build(registries, "dssm_v2", _ctx(**CTX), **both)


def _problems(excinfo) -> str:
    return "\n".join(str(p) for p in excinfo.value.problems)


def test_dssm_v2_build_errors_name_every_problem_at_once(registries):  # noqa: F811
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dssm_v2", _ctx(**CTX), user_features=("aa", "d0", "d0"), item_features=("d1",))
    assert _problems(excinfo) == "\n".join([
        "model.user_features[0]: no feature named 'aa' in [[features.dense]], [[features.sparse]] or "
        "[[features.sequence]]; did you mean 'a'?",
        "model.user_features[2]: feature 'd0' is named twice",
        "features.sparse[0]: 'a' is in neither tower: add it to model.user_features or model.item_features, or remove it",
        "features.sparse[1]: 'b' is in neither tower: add it to model.user_features or model.item_features, or remove it",
        "features.sparse[2]: 'c' is in neither tower: add it to model.user_features or model.item_features, or remove it",
        "model.user_features: the user tower needs at least one id feature",
        "model.item_features: the item tower needs at least one id feature",
    ])


def test_dssm_v2_keeps_sequences_in_the_user_tower_and_encodes_them_without_a_query(registries):  # noqa: F811
    from tests.plugins import test_sequence_models as seq

    # clicks (a sequence group) shares its table with the item tower's candidate id: one table for both towers
    model = _build(registries, "dssm_v2", seq._ctx(), user_features=("user", "clicks", "d0"),
                   item_features=("item", "d1"), sequence_encoders=(SequenceEncoderConfig("clicks", "mean"),))
    out = model(seq._batch())
    (out["similarity"].sum()).backward()
    grad = model.sequences.collections[f"dim_{seq.DIM}"].embeddings["item_emb"].weight.grad
    clicked = {i for row in seq.CLICKS for i in row}
    assert all(grad[i].abs().sum() > 0 for i in clicked | {1, 2, 3, 4})  # the clicks (user) and the items
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dssm_v2", seq._ctx(), user_features=("user", "clicks", "d0"),
               item_features=("item", "clicks", "d1"),
               sequence_encoders=(SequenceEncoderConfig("clicks", "target_attention"),))
    message = _problems(excinfo)
    assert "model.item_features[1]: 'clicks' is a sequence group: sequences belong to the user tower" in message
    assert "model.sequence_encoders[0].type: dssm_v2 cannot use target_attention" in message


def test_dssm_v2_example_passes_check_with_its_sequence_sharing_the_item_towers_tables():
    cfg, _ = load_config_text((REPO / "examples" / "dssm_v2_taobao.toml").read_text())
    assert cfg.model.type == "dssm_v2" and isinstance(cfg.model.config, DSSMV2Config)
    assert "click_seq" in cfg.model.config.user_features
    assert [f.table for f in cfg.features.sequence[0].features] == ["adgroup_id_emb", "cate_id_emb", "brand_emb"]
    assert {"adgroup_id", "cate_id", "brand"} <= set(cfg.model.config.item_features)


def test_convert_maps_torcheasyrecs_dssm_v2_onto_dssm_v2():
    from tests.core.torcheasyrec_examples import DSSM_V2_TAOBAO
    from tzrun_tools.convert import convert_pipeline_config

    conversion = convert_pipeline_config(DSSM_V2_TAOBAO, "dssm_v2_taobao.config")
    model = conversion.tree["model"]
    assert model["type"] == "dssm_v2"
    assert model["user_features"][-1] == "click_50_seq" and model["item_features"][-1] == "price"
    assert (model["user_hidden_units"], model["item_hidden_units"]) == ([512, 256, 128], [512, 256, 128])
    assert (model["output_dim"], model["similarity"], model["temperature"]) == (64, "inner_product", 1.0)
    assert model["sequence_encoders"] == [{"sequence": "click_50_seq", "type": "mean"}]
    reported = "\n".join(str(finding) for finding in conversion.not_converted + conversion.notes)
    assert "data_config.force_base_data_group" in reported and "data_config.negative_sampler" in reported

    # a feature in both towers' groups stays in both (dssm keeps it in the user tower and reports it)
    both = DSSM_V2_TAOBAO.replace('feature_names: "pid"\n', 'feature_names: "pid"\n        feature_names: "cate_id"\n', 1)
    twice = convert_pipeline_config(both, "both.config").tree["model"]
    assert "cate_id" in twice["user_features"] and "cate_id" in twice["item_features"]
    v1 = convert_pipeline_config(both.replace("dssm_v2 {", "dssm {"), "v1.config")
    assert "cate_id" not in v1.tree["model"]["item_features"]


def test_convert_notes_a_dssm_table_looked_up_from_both_towers_and_not_a_dssm_v2_one():
    from tests.core.torcheasyrec_examples import DSSM_V2_TAOBAO
    from tzrun_tools.convert import convert_pipeline_config

    # the clicked ads' cate_id named into the item tower's cate_id table (TorchEasyRec's default name cate_id_emb)
    shared = DSSM_V2_TAOBAO.replace('                feature_name: "cate_id"\n',
                                    '                feature_name: "cate_id"\n                embedding_name: "cate_id_emb"\n', 1)
    assert shared != DSSM_V2_TAOBAO
    for model, noted in (("dssm", True), ("dssm_v2", False)):
        conversion = convert_pipeline_config(shared.replace("dssm_v2 {", f"{model} {{"), f"{model}.config")
        group = conversion.tree["features"]["sequence"][0]
        assert [f.get("table") for f in group["features"]] == [None, "cate_id_emb", None]
        notes = [str(f) for f in conversion.notes if f.path == f"model_config.{model}.item_tower"]
        assert bool(notes) == noted, notes
        if noted:
            assert notes[0].startswith(f"model_config.dssm.item_tower: cate_id_emb: looked up by features of both "
                                       "towers; TorchEasyRec's dssm gives each tower its own embedding group")
