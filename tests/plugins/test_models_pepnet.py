"""pepnet equals TorchEasyRec's formula on fixed inputs, and names what keeps it from building.

The reference below is an independent plain-torch statement of what TorchEasyRec's ``PEPNet``
computes (``tzrec/models/pepnet.py`` with ``tzrec/modules/personalized_net.py``'s ``GateNU``,
``EPNet`` and ``PPNet`` and ``tzrec/modules/task_tower.py``'s ``TaskTower``, at commit 54cac31),
reading our built model's weights as plain tensors:

- ``gate(z) = gamma * sigmoid(W2 relu(W1 z + b1) + b2)`` (``GateNU``);
- EPNet: ``e = gate([domain, x.detach()]) * x`` (domain first), else ``e = x``;
- PPNet, per task: ``h = e``; per layer ``h = relu(L h) * gate([uia, e.detach()])`` (the gate's
  hidden and output widths the layer's), else ``h = e``;
- ``TaskTower``: ``relu`` MLP, then a linear layer to one logit.

Each group is ``[its dense features, then its id features' mean-pooled embeddings]`` in the
order listed, as our model lays them out (``x``: every feature, dense first). The embedding
tables enter the reference as leaf tensors, so the gradients that reach them (through the gated
values, never through a gate's ``detach``-ed input) are compared too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import attrs
import pytest
import torch
from torch import nn

from tests.plugins.test_models import _batch, _build, _ctx, registries  # noqa: F401 (a fixture)
from tests.plugins.test_models_ple_dbmtl import _layers, _linear  # weights as plain tensors, x W^T + b
from tzrun.errors import ConfigError
from tzrun.testing import load_config_text
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig
from tzrun_plugins.models.pepnet import PEPNetConfig, PEPNetTaskConfig

REPO = Path(__file__).resolve().parents[2]
#: dense d0, d1; id features a, b, c with tables of their own (widths 4, 3, 2), mean-pooled
CTX = dict(dims=(4, 3, 2), dense=("d0", "d1"), sparse=("a", "b", "c"), shared=("none", "none"))
TASKS = (PEPNetTaskConfig("ctr", (5, 3)), PEPNetTaskConfig("cvr", ()), PEPNetTaskConfig("stay", (4,)))


def gate_nu(z: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]], gamma: float) -> torch.Tensor:
    """TorchEasyRec's ``GateNU``: ``gamma * sigmoid(linear(relu(linear(z))))``."""
    first, second = layers
    return gamma * torch.sigmoid(_linear(torch.relu(_linear(z, first)), second))


def task_tower(h: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """TorchEasyRec's ``TaskTower``: its MLP (``relu`` per layer), a linear layer to one logit."""
    for layer in layers[:-1]:
        h = torch.relu(_linear(h, layer))
    return _linear(h, layers[-1]).squeeze(-1)


def _group(names: Sequence[str], batch, tables: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[dense of names, mean of each id feature's embedding rows]``, looked up by hand."""
    dense = {"d0": 0, "d1": 1}
    parts = [batch.dense[:, dense[n]:dense[n] + 1] for n in names if n in dense]
    jagged = batch.sparse.to_dict()
    for name in (n for n in names if n not in dense):
        rows = [tables[name][ids].mean(0) if len(ids) else torch.zeros(tables[name].shape[1])
                for ids in jagged[name].to_dense()]
        parts.append(torch.stack(rows))
    return torch.cat(parts, dim=1)


def pepnet_ref(model: nn.Module, batch, cfg: PEPNetConfig, tables: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """TorchEasyRec's PEPNet on ``batch``, one logit tensor per task."""
    x = _group(("d0", "d1", "a", "b", "c"), batch, tables)
    if cfg.domain_features:
        domain = _group(cfg.domain_features, batch, tables)
        x = gate_nu(torch.cat([domain, x.detach()], dim=1), _layers(model.epnet.gate), cfg.epnet_gamma) * x
    inputs = [x] * len(cfg.tasks)
    if cfg.uia_features:
        gate_input = torch.cat([_group(cfg.uia_features, batch, tables), x.detach()], dim=1)
        inputs = []
        for stack in model.ppnet.tasks:
            h = x
            for layer in stack.layers:
                h = torch.relu(_linear(h, _layers(layer.linear)[0]))
                h = h * gate_nu(gate_input, _layers(layer.gate), cfg.ppnet_gamma)
            inputs.append(h)
    return [task_tower(h, _layers(tower)) for h, tower in zip(inputs, model.towers)]


@pytest.mark.parametrize("options", [
    # both gates, TorchEasyRec's example's shape, small: a one-feature domain group, a uia group
    # mixing dense and id features, gammas off the default so that a lost gamma shows
    {"domain_features": ("c",), "uia_features": ("b", "d1"), "epnet_hidden_unit": 7, "epnet_gamma": 1.5,
     "ppnet_hidden_units": (6, 5), "ppnet_gamma": 3.0},
    # EPNet alone, its hidden width the shared input's (TorchEasyRec's default), a dense domain feature
    {"domain_features": ("d0", "a")},
    # PPNet alone, one layer
    {"uia_features": ("a",), "ppnet_hidden_units": (4,)},
    # neither: every tower reads x
    {},
])
def test_pepnet_equals_torcheasyrecs_formula(registries, options):  # noqa: F811
    torch.manual_seed(5)
    cfg = PEPNetConfig(tasks=TASKS, **options)
    model = _build(registries, "pepnet", _ctx(**CTX), **attrs.asdict(cfg, recurse=False))
    batch = _batch(_ctx(**CTX))
    out = model(batch)
    tables = {n: model.ebc.embedding_bags[f"{n}_emb"].weight.detach().clone().requires_grad_() for n in "abc"}
    expected = pepnet_ref(model, batch, cfg, tables)
    for task, logits in zip(TASKS, expected):
        torch.testing.assert_close(out[f"logits/{task.name}"], logits)
        torch.testing.assert_close(out[f"probs/{task.name}"], torch.sigmoid(logits))
    sum(out[f"logits/{t.name}"].sum() for t in TASKS).backward()
    sum(logits.sum() for logits in expected).backward()
    for name, table in tables.items():  # the gates' copies of x and e pass no gradient back (detach)
        torch.testing.assert_close(model.ebc.embedding_bags[f"{name}_emb"].weight.grad, table.grad)
    assert (model.epnet is not None) == bool(cfg.domain_features) and (model.ppnet is not None) == bool(cfg.uia_features)


def test_pepnet_gates_lie_between_0_and_gamma_and_widths_follow_torcheasyrec(registries):  # noqa: F811
    cfg = PEPNetConfig(tasks=TASKS[:2], domain_features=("c", "d1"), uia_features=("a", "b"),
                       ppnet_hidden_units=(6, 5), epnet_gamma=1.5)
    model = _build(registries, "pepnet", _ctx(**CTX), **attrs.asdict(cfg, recurse=False))
    width = 2 + 4 + 3 + 2  # x: two dense features and three embeddings
    epnet = model.epnet.gate.layers
    assert (epnet[0].in_features, epnet[0].out_features, epnet[2].out_features) == (1 + 2 + width, width, width)
    first, second = model.ppnet.tasks[1].layers
    assert (first.linear.in_features, first.linear.out_features, second.linear.out_features) == (width, 6, 5)
    assert [layer.gate.layers[0].in_features for layer in (first, second)] == [4 + 3 + width] * 2
    assert [layer.gate.layers[2].out_features for layer in (first, second)] == [6, 5]
    assert model.towers[1][-1].in_features == 5
    values = model.epnet.gate(torch.randn(64, 1 + 2 + width) * 50)
    assert 0 <= values.min() and 1.4 < values.max() <= 1.5  # in (0, gamma) (floats saturate at the ends)


def test_pepnet_reads_sequence_groups_into_x_and_gates_by_an_id_of_the_sequence_table(registries):  # noqa: F811
    from tests.plugins import test_sequence_models as seq

    torch.manual_seed(0)
    # x = [d0, d1, user, item, clicks encoded]; item shares its table with the clicks sequence
    model = _build(registries, "pepnet", seq._ctx(), tasks=TASKS[:2], domain_features=("item",),
                   uia_features=("user", "d0"), ppnet_hidden_units=(4,),
                   sequence_encoders=(SequenceEncoderConfig("clicks", "target_attention"),))
    width = 2 + 3 * seq.DIM
    assert model.epnet.gate.layers[0].in_features == seq.DIM + width and model.epnet.gate.layers[2].out_features == width
    assert model.ppnet.tasks[0].layers[0].gate.layers[0].in_features == 1 + seq.DIM + width
    out = model(seq._batch())
    assert out["logits/ctr"].shape == out["logits/cvr"].shape == (seq.ROWS,)
    out["logits/cvr"].sum().backward()
    assert all(p.grad is not None for p in model.sequence_inputs.parameters())
    assert model.sequences.collections[f"dim_{seq.DIM}"].embeddings["item_emb"].weight.grad.abs().sum() > 0


def test_pepnet_build_errors_name_every_feature_problem_at_once(registries):  # noqa: F811
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "pepnet", _ctx(**CTX), tasks=TASKS, domain_features=("cc", "a", "a"),
               uia_features=("d0", "clicks"), sequence_encoders=(SequenceEncoderConfig("clicks"),))
    message = str(excinfo.value)
    assert "model.domain_features[0]: no feature named 'cc' in [[features.dense]] or [[features.sparse]]; did you " \
           "mean 'c'?" in message
    assert "model.domain_features[2]: feature 'a' is named twice" in message
    assert "model.uia_features[1]: no feature named 'clicks'" in message
    assert "model.sequence_encoders[0]" in message and "4 problems" in message
    with pytest.raises(ConfigError, match=r"features.sparse: pepnet needs at least one id feature"):
        _build(registries, "pepnet", _ctx(sparse=(), dims=()), tasks=TASKS)


@pytest.mark.parametrize("override, message", [
    ("model.ppnet_hidden_units=[]",
     "model.ppnet_hidden_units: PPNet gates the layers of each task's stack: with uia_features it needs at least one "
     "layer"),
    ("model.domain_features=[]",
     "model.epnet_hidden_unit: EPNet's gate is built only with domain_features: name them, or remove "
     "epnet_hidden_unit"),
    ("model.epnet_gamma=0.0", "model.epnet_gamma: must be > 0"),
    ("model.ppnet_gamma=-1.0", "model.ppnet_gamma: must be > 0"),
    ("model.epnet_hidden_unit=0", "model.epnet_hidden_unit: must be >= 1"),
    ("model.ppnet_dropout_ratio=[0.1]", "model.ppnet_dropout_ratio: unknown key"),
    ("model.tasks=[]", "model.tasks: pepnet needs at least one [[model.tasks]] table"),
])
def test_pepnet_option_errors_name_the_option(override, message):
    text = (REPO / "examples" / "pepnet_taobao.toml").read_text()
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(text, overrides=[override])
    assert message in str(excinfo.value)


def test_pepnet_defaults_are_torcheasyrecs():
    cfg = PEPNetConfig(tasks=TASKS[:1])
    assert (cfg.epnet_hidden_unit, cfg.epnet_gamma, cfg.ppnet_gamma) == (None, 2.0, 2.0)
    assert cfg.ppnet_hidden_units == (512, 256)  # TorchEasyRec's example's (its proto has no default)
    assert (cfg.domain_features, cfg.uia_features) == ((), ())  # no group: no gate, as TorchEasyRec


def test_pepnet_example_passes_check():
    cfg, _ = load_config_text((REPO / "examples" / "pepnet_taobao.toml").read_text())
    assert cfg.model.type == "pepnet" and cfg.model.config.domain_features == ("occupation",)
    assert len(cfg.model.config.uia_features) == 13 and [t.name for t in cfg.model.config.tasks] == ["ctr", "cvr"]


def test_convert_maps_torcheasyrecs_pepnet_groups_onto_the_gates_and_reports_the_domain_towers():
    from tests.core.torcheasyrec_examples import PEPNET_TAOBAO
    from tzrun_tools.convert import convert_pipeline_config

    conversion = convert_pipeline_config(PEPNET_TAOBAO, "pepnet_taobao.config")
    table = conversion.tree["model"]
    assert table["type"] == "pepnet" and table["domain_features"] == ["occupation"]
    assert table["uia_features"] == ["user_id", "cms_segid", "cms_group_id", "final_gender_code", "age_level",
                                     "pvalue_level", "shopping_level", "new_user_class_level", "adgroup_id",
                                     "cate_id", "campaign_id", "brand", "price"]
    assert table["ppnet_hidden_units"] == [512, 256] and "epnet_hidden_unit" not in table
    assert table["tasks"] == [{"name": "ctr", "hidden_units": [256, 128, 64]},
                              {"name": "cvr", "hidden_units": [256, 128, 64]}]
    skipped = {f.path: f.message for f in conversion.not_converted}
    assert "one tower per task" in skipped["model_config.pepnet.domain_input_name"]
    assert "used only with domain_input_name" in skipped["model_config.pepnet.task_domain_num"]
    assert "dropout has no equivalent" in skipped["model_config.pepnet.ppnet_dropout_ratio"]
    assert not any("feature_groups" in f.path for f in conversion.notes)  # 'all' reads every feature


def _without_group(text: str, name: str) -> str:
    start = text.index(f'    feature_groups {{\n        group_name: "{name}"')
    return text[:start] + text[text.index("    }\n", start) + len("    }\n"):]


def test_convert_pepnet_reports_options_of_a_gate_without_its_group_and_notes_the_shared_input():
    from tests.core.torcheasyrec_examples import PEPNET_TAOBAO
    from tzrun_tools.convert import convert_pipeline_config

    options = ("ppnet_hidden_units: [512, 256]\n epnet_hidden_unit: 64\n epnet_gamma: 1.5\n"
               " ppnet_activation: 'nn.Sigmoid'\n ppnet_gamma: 3.0\n")
    text = PEPNET_TAOBAO.replace("ppnet_hidden_units: [512, 256]\n", options)
    no_domain = _without_group(text, "domain").replace('feature_names: "price"\n        group_type', "group_type", 1)
    conversion = convert_pipeline_config(no_domain, "p.config")
    table = conversion.tree["model"]
    assert "domain_features" not in table and "epnet_gamma" not in table and table["ppnet_gamma"] == 3.0
    skipped = {f.path: f.message for f in conversion.not_converted}
    for name in ("epnet_hidden_unit", "epnet_gamma"):
        assert "there is no group named 'domain'" in skipped[f"model_config.pepnet.{name}"]
    assert skipped["model_config.pepnet.ppnet_activation"] == "tzrec-run's PPNet layers use ReLU"
    assert any(f.message == "the shared input reads every feature here, also price (not in group 'all')"
               for f in conversion.notes)  # price is in the uia group only
    no_uia = convert_pipeline_config(_without_group(text, "uia"), "p.config")
    table = no_uia.tree["model"]
    assert (table["domain_features"], table["epnet_hidden_unit"], table["epnet_gamma"]) == (["occupation"], 64, 1.5)
    assert "uia_features" not in table and "ppnet_hidden_units" not in table
    skipped = {f.path: f.message for f in no_uia.not_converted}
    for name in ("ppnet_hidden_units", "ppnet_activation", "ppnet_dropout_ratio", "ppnet_gamma"):
        assert "there is no group named 'uia'" in skipped[f"model_config.pepnet.{name}"]


def test_convert_pepnet_refuses_what_torcheasyrec_cannot_build():
    from tests.core.torcheasyrec_examples import PEPNET_TAOBAO
    from tzrun_tools.convert import convert_pipeline_config

    no_layers = convert_pipeline_config(PEPNET_TAOBAO.replace("ppnet_hidden_units: [512, 256]\n", ""), "p.config")
    assert "model" not in no_layers.tree
    skipped = {f.path: f.message for f in no_layers.not_converted}
    assert "TorchEasyRec's PPNet fails without layers" in skipped["model_config.pepnet.ppnet_hidden_units"]
    no_all = convert_pipeline_config(PEPNET_TAOBAO.replace('group_name: "all"', 'group_name: "main"'), "p.config")
    assert "model" not in no_all.tree
    assert "reads the feature group named 'all'" in {f.path: f.message for f in no_all.not_converted}["model_config.pepnet"]
