"""rocket_launching equals TorchEasyRec's formula on fixed inputs, forward and total loss, and
export serves its light net alone.

The reference below is an independent plain-torch statement of what TorchEasyRec's
``RocketLaunching`` computes (``tzrec/models/rocket_launching.py`` with ``tzrec/modules/mlp.py``,
at commit 54cac31), reading our built model's weights as leaf tensors so that every gradient is
compared too:

- ``s = share_mlp(x)`` (``x`` without one); ``light = MLP(s.detach())``, ``booster = MLP(s)``;
  each a ReLU MLP keeping every layer's output, then a linear layer to the logit;
- ``hint_l2_loss = mean(w * (logit_light - logit_booster.detach())^2)``, ``w`` the sample weights
  divided by their mean;
- ``similarity_i_j`` for light layer ``i`` and the first booster layer ``j`` of its width:
  COSINE ``-0.1 * mean(sum(normalize(b.detach()) * normalize(l), 1) * w)``; otherwise
  ``sqrt(sum(sum((b.detach() - l)^2, 1) * w))``;
- the total: each configured loss on both nets plus the terms above.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.plugins.test_models import _batch, _build, _ctx, registries  # noqa: F401 (a fixture)
from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.runner.model import TrainModel
from tzrun.runner.slots import LossSlot
from tzrun.testing import load_config_text
from tzrun_plugins.models.rocket_launching import distilled_layers

REPO = Path(__file__).resolve().parents[2]
#: dense d0, d1; id features a, b, c with tables of their own (widths 4, 3, 2), mean-pooled
CTX = dict(dims=(4, 3, 2), dense=("d0", "d1"), sparse=("a", "b", "c"), shared=("none", "none"))


def _mlp(h: torch.Tensor, p: dict[str, torch.Tensor], prefix: str, n: int) -> list[torch.Tensor]:
    """TorchEasyRec's MLP with ``return_hidden_layer_feature``: ``relu(linear)`` per layer, each kept."""
    hidden = []
    for k in range(n):
        h = torch.relu(h @ p[f"{prefix}.{k}.0.weight"].T + p[f"{prefix}.{k}.0.bias"])
        hidden.append(h)
    return hidden


def _x(batch: Batch, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[dense, mean of each id feature's embedding rows]``, looked up by hand."""
    parts = [batch.dense]
    for name, ids in batch.sparse.to_dict().items():
        table = p[f"shared.ebc.embedding_bags.{name}_emb.weight"]
        parts.append(torch.stack([table[i].mean(0) if len(i) else torch.zeros(table.shape[1]) for i in ids.to_dense()]))
    return torch.cat(parts, dim=1)


def rocket_ref(p: dict[str, torch.Tensor], batch: Batch, options: dict) -> dict[str, torch.Tensor]:
    """TorchEasyRec's RocketLaunching on ``batch`` in training: both logits and every loss term."""
    s = _x(batch, p)
    for k in range(len(options.get("share_hidden_units", ()))):
        s = torch.relu(s @ p[f"shared.share.{k}.0.weight"].T + p[f"shared.share.{k}.0.bias"])
    light = _mlp(s.detach(), p, "light.layers", len(options["light_hidden_units"]))
    booster = _mlp(s, p, "booster.layers", len(options["booster_hidden_units"]))
    logit_l = (light[-1] @ p["light.output.weight"].T + p["light.output.bias"]).squeeze(-1)
    logit_b = (booster[-1] @ p["booster.output.weight"].T + p["booster.output.bias"]).squeeze(-1)
    w = batch.weights / batch.weights.mean()
    out = {"logits": logit_l, "logits_booster": logit_b,
           "hint_l2_loss": torch.mean((logit_l - logit_b.detach()) ** 2 * w)}
    if options.get("feature_based_distillation"):
        for i, unit in enumerate(options["light_hidden_units"]):
            j = next((j for j, u in enumerate(options["booster_hidden_units"]) if u == unit), None)
            if j is None:
                continue
            b, l = booster[j].detach(), light[i]
            if options.get("feature_distillation_function", "cosine") == "cosine":
                sim = -0.1 * torch.mean(torch.sum(F.normalize(b, p=2, dim=1) * F.normalize(l, p=2, dim=1), dim=1) * w)
            else:
                sim = torch.sqrt(torch.sum(torch.sum(torch.square(b - l), dim=1) * w))
            out[f"similarity_{i}_{j}"] = sim
    return out


def _bce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TorchEasyRec's binary_cross_entropy with sample weights divided by their mean."""
    per_row = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return torch.mean(per_row * weights / weights.mean())


def _weighted(batch: Batch, weights: torch.Tensor) -> Batch:
    torch.manual_seed(3)
    labels = {name: torch.randint(0, 2, (len(weights),)).float() for name in batch.labels}
    return Batch(batch.dense, batch.sparse, labels, weights, batch.num_rows)


OPTIONS = [
    # TorchEasyRec's example's shape, small: two light layers paired with booster layers, cosine
    {"booster_hidden_units": (6, 5, 4), "light_hidden_units": (5, 4), "feature_based_distillation": True},
    # a shared MLP, euclid, a light layer without a booster layer of its width
    {"share_hidden_units": (7,), "booster_hidden_units": (6, 3), "light_hidden_units": (4, 3),
     "feature_based_distillation": True, "feature_distillation_function": "euclid"},
    # no hint losses: the logits alone are distilled
    {"share_hidden_units": (7, 6), "booster_hidden_units": (5, 4), "light_hidden_units": (4,)},
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("weights", [torch.ones(5), torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25])])
def test_rocket_launching_equals_torcheasyrecs_formula_and_total_loss(registries, options, weights):  # noqa: F811
    torch.manual_seed(5)
    model = _build(registries, "rocket_launching", _ctx(**CTX), **options)
    batch = _weighted(_batch(_ctx(**CTX)), weights)
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    expected = rocket_ref(params, batch, options)
    bce = registries["loss"].get("binary_cross_entropy", "t").build(registries["loss"].get(
        "binary_cross_entropy", "t").config())
    slots = [LossSlot("bce", "logits", "click", 1.0), LossSlot("bce_booster", "logits_booster", "click", 1.0)]
    train = TrainModel(model, {"bce": bce, "bce_booster": bce}, slots).train()
    total, step = train(batch)
    assert set(step.outputs) == {"logits", "probs", "logits_booster", "probs_booster"}  # no loss term is an output
    for name in ("logits", "logits_booster"):
        torch.testing.assert_close(step.outputs[name], expected[name].detach())
    terms = sorted(k for k in expected if k.startswith(("hint", "similarity")))
    assert sorted(set(step.losses) - {"bce", "bce_booster"}) == terms
    for name in terms:
        torch.testing.assert_close(step.losses[name], expected[name].detach())
    label = batch.labels["click"]
    ref_total = _bce(expected["logits"], label, weights) + _bce(expected["logits_booster"], label, weights)
    ref_total = ref_total + sum(expected[name] for name in terms)
    torch.testing.assert_close(total, ref_total)
    total.backward()
    ref_total.backward()
    for name, p in model.named_parameters():  # the stopped gradients: light -> shared, hints -> booster
        grad = params[name].grad if params[name].grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(p.grad if p.grad is not None else torch.zeros_like(p), grad, msg=name)


def test_the_shared_part_learns_from_the_booster_alone_and_the_booster_not_from_the_hints(registries):  # noqa: F811
    model = _build(registries, "rocket_launching", _ctx(**CTX), **OPTIONS[1])
    out = model(_batch(_ctx(**CTX)))
    (out["logits"].sum() + out["loss/hint_l2_loss"] + out["loss/similarity_1_1"]).backward()
    assert all(p.grad is None for p in model.booster.parameters())
    assert all(p.grad is None for p in model.shared.parameters())
    assert model.light.output.weight.grad.abs().sum() > 0


def test_evaluation_gives_both_nets_and_no_loss_terms(registries):  # noqa: F811
    model = _build(registries, "rocket_launching", _ctx(**CTX), **OPTIONS[0]).eval()
    out = model(_batch(_ctx(**CTX)))
    assert set(out) == {"logits", "probs", "logits_booster", "probs_booster"}
    torch.testing.assert_close(out["probs_booster"], torch.sigmoid(out["logits_booster"]))


def test_a_loss_named_as_a_models_own_term_is_refused(registries):  # noqa: F811
    model = _build(registries, "rocket_launching", _ctx(**CTX), **OPTIONS[2])
    bce = registries["loss"].get("binary_cross_entropy", "t").build(registries["loss"].get(
        "binary_cross_entropy", "t").config())
    train = TrainModel(model, {"hint_l2_loss": bce}, [LossSlot("hint_l2_loss", "logits", "click", 1.0)])
    with pytest.raises(ConfigError, match="the model adds its own loss hint_l2_loss: give the \\[\\[losses\\]\\] entry"):
        train(_batch(_ctx(**CTX)))


def test_export_serves_the_light_net_with_its_weights_alone(registries):  # noqa: F811
    from tzrun_serving.export import ServingModule, export_model, serving_programs  # noqa: F401

    model = _build(registries, "rocket_launching", _ctx(**CTX), **OPTIONS[1]).eval()
    batch = _batch(_ctx(**CTX))
    with torch.no_grad():
        expected = model(batch)
    served = model.serving_model()
    with torch.no_grad():
        light = served(batch)
    assert set(light) == {"logits", "probs"}
    torch.testing.assert_close(light["logits"], expected["logits"])
    names = {n for n, _ in served.named_parameters()}
    assert names and not any(n.startswith("booster") for n in names)
    assert {n for n, _ in model.named_parameters() if not n.startswith("booster")} == names  # same modules
    assert model.serving_programs["model"]["outputs"] == ["logits", "probs"]


def test_distilled_layers_pair_each_light_layer_with_the_first_booster_layer_of_its_width():
    assert distilled_layers((128, 64), (256, 128, 96, 64)) == {0: 1, 1: 3}  # TorchEasyRec's doc example
    assert distilled_layers((96, 64, 32), (256, 128, 64, 32)) == {1: 2, 2: 3}  # its criteo example
    assert distilled_layers((8, 8), (8, 4, 8)) == {0: 0, 1: 0}
    assert distilled_layers((5,), (4,)) == {}


@pytest.mark.parametrize("override, message", [
    ("model.light_hidden_units=[]", "model.light_hidden_units: needs at least one entry"),
    ("model.booster_hidden_units=[]", "model.booster_hidden_units: needs at least one entry"),
    ("model.share_hidden_units=[0]", "model.share_hidden_units: every layer needs at least 1 unit"),
    ('model.feature_distillation_function="inner_product"', "model.feature_distillation_function"),
])
def test_rocket_launching_option_errors_name_the_option(override, message):
    text = (REPO / "examples" / "rocket_launching_criteo.toml").read_text()
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(text, overrides=[override])
    assert message in str(excinfo.value)


def test_rocket_launching_needs_an_id_feature(registries):  # noqa: F811
    with pytest.raises(ConfigError, match=r"features.sparse: rocket_launching needs at least one id feature"):
        _build(registries, "rocket_launching", _ctx(sparse=(), dims=()))


def test_rocket_launching_defaults_are_torcheasyrecs_example():
    cfg, _ = load_config_text((REPO / "examples" / "rocket_launching_criteo.toml").read_text())
    model = cfg.model.config
    assert cfg.model.type == "rocket_launching" and model.share_hidden_units == ()
    assert (model.booster_hidden_units, model.light_hidden_units) == ((256, 128, 64, 32), (96, 64, 32))
    assert model.feature_based_distillation and model.feature_distillation_function == "cosine"
    assert [(c.fields.prediction if c.fields else None) for c in cfg.losses] == [None, "logits_booster"]


def test_convert_maps_torcheasyrecs_rocket_launching_with_losses_and_metrics_for_both_nets():
    from tests.core.torcheasyrec_examples import ROCKET_LAUNCHING_CRITEO
    from tzrun_tools.convert import convert_pipeline_config

    conversion = convert_pipeline_config(ROCKET_LAUNCHING_CRITEO, "rocket_launching_criteo.config")
    tree = conversion.tree
    assert tree["model"] == {"type": "rocket_launching", "booster_hidden_units": [256, 128, 64, 32],
                             "light_hidden_units": [96, 64, 32], "feature_based_distillation": True,
                             "feature_distillation_function": "cosine"}
    assert [(e["type"], e.get("name"), e.get("prediction")) for e in tree["losses"]] == [
        ("binary_cross_entropy", None, None),
        ("binary_cross_entropy", "binary_cross_entropy_booster", "logits_booster")]
    assert [(e["type"], e.get("name"), e.get("prediction")) for e in tree["metrics"]] == [
        ("auc", None, None), ("auc", "auc_booster", "probs_booster")]
