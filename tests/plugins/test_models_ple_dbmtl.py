"""ple and dbmtl equal TorchEasyRec's formulas on fixed inputs; their options are checked.

Each reference below is an independent plain-torch statement of TorchEasyRec's module (its
``PLE`` with ``ExtractionNet`` and ``TaskTower``; its ``DBMTL`` with the ``MMoE`` module), reading
the weights of our built model as plain tensors: the input ``x = [dense features, mean-pooled
embeddings]`` is looked up by hand, every MLP layer is ``relu(x W^T + b)``, every gate a softmax
over a linear layer, and the outputs are compared per task.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from torch import nn

from tests.plugins.test_models import ROWS, _batch, _build, _ctx, registries  # noqa: F401 (a fixture)
from tzrun.errors import ConfigError
from tzrun_plugins.models.ple import ExtractionNetworkConfig, PLETaskConfig

#: two dense features and two id features with tables of their own, mean-pooled
CTX = dict(dims=(4, 3), dense=("d0", "d1"), sparse=("a", "b"), shared=("none", "none"))


def _layers(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (weight, bias) of each linear layer of ``module``, in order, as detached copies."""
    return [(m.weight.detach().clone(), m.bias.detach().clone()) for m in module.modules() if isinstance(m, nn.Linear)]


def _mlp(x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    for weight, bias in layers:
        x = torch.relu(x @ weight.T + bias)
    return x


def _linear(x: torch.Tensor, layer: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return x @ layer[0].T + layer[1]


def _gate(selector: torch.Tensor, layer: tuple[torch.Tensor, torch.Tensor], experts: list[torch.Tensor]) -> torch.Tensor:
    """TorchEasyRec's gate: ``softmax(linear(selector))`` weights the experts' outputs."""
    weights = torch.softmax(_linear(selector, layer), dim=1)
    return sum(weights[:, i:i + 1] * e for i, e in enumerate(experts))


def _x(model: nn.Module, batch) -> torch.Tensor:
    """``[dense, mean of each id feature's embeddings (zeros for none)]``, looked up by hand."""
    parts = [batch.dense]
    jagged = batch.sparse.to_dict()
    for name in ("a", "b"):
        table = model.ebc.embedding_bags[f"{name}_emb"].weight.detach()
        rows = []
        for ids in jagged[name].to_dense():
            rows.append(table[ids].mean(0) if len(ids) else torch.zeros(table.shape[1]))
        parts.append(torch.stack(rows))
    return torch.cat(parts, dim=1)


def _ple_reference(model: nn.Module, x: torch.Tensor, levels: tuple[ExtractionNetworkConfig, ...],
                   num_tasks: int) -> list[torch.Tensor]:
    """TorchEasyRec's PLE: ExtractionNet levels (the last without a shared gate), TaskTowers."""
    tasks, shared = [x] * num_tasks, x
    for i, (level, net) in enumerate(zip(levels, model.extraction_networks)):
        shared_experts = [_mlp(shared, _layers(e)) for e in net.shared_experts]
        task_experts = [[_mlp(tasks[k], _layers(e)) for e in net.task_experts[k]] for k in range(num_tasks)]
        outs = [_gate(tasks[k], _layers(net.task_gates[k])[0], task_experts[k] + shared_experts)
                for k in range(num_tasks)]
        if i < len(levels) - 1:
            every = [e for experts in task_experts for e in experts] + shared_experts
            shared = _gate(shared, _layers(net.shared_gate)[0], every)
        tasks = outs
    logits = []
    for k, tower in enumerate(model.towers):
        layers = _layers(tower)
        logits.append(_linear(_mlp(tasks[k], layers[:-1]), layers[-1]).squeeze(-1))
    return logits


@pytest.mark.parametrize("levels", [
    # TorchEasyRec's example's shape, small: three levels, more experts further up
    (ExtractionNetworkConfig(2, (8, 6), 2, (7, 6)), ExtractionNetworkConfig(3, (5,), 3), ExtractionNetworkConfig(1, (4,), 2)),
    (ExtractionNetworkConfig(2, (5,)),),  # one level, no shared expert
])
def test_ple_equals_torcheasyrecs_formula(registries, levels):  # noqa: F811
    torch.manual_seed(3)
    tasks = (PLETaskConfig("ctr", (4, 3)), PLETaskConfig("cvr", ()), PLETaskConfig("stay", (2,)))
    model = _build(registries, "ple", _ctx(**CTX), extraction_networks=levels, tasks=tasks)
    batch = _batch(_ctx(**CTX))
    out = model(batch)
    expected = _ple_reference(model, _x(model, batch), levels, len(tasks))
    for task, logits in zip(tasks, expected):
        torch.testing.assert_close(out[f"logits/{task.name}"], logits)
        torch.testing.assert_close(out[f"probs/{task.name}"], torch.sigmoid(logits))
    out["logits/ctr"].sum().backward()
    reached = model.extraction_networks[0].task_experts[2][0][0].weight.grad is not None
    assert reached == (len(levels) > 1)  # another task's experts reach ctr through a shared gate only


def test_ple_shared_experts_must_end_as_wide_as_the_task_experts():
    with pytest.raises(ValueError, match="shared experts' last width \\(4\\) must be the task experts' \\(5\\)"):
        ExtractionNetworkConfig(2, (5,), 1, (4,))


def test_ple_needs_an_id_feature(registries):  # noqa: F811
    with pytest.raises(ConfigError, match="ple needs at least one id feature"):
        _build(registries, "ple", _ctx(sparse=(), dims=()), extraction_networks=(ExtractionNetworkConfig(1, (4,)),),
               tasks=(PLETaskConfig("ctr"),))


def _dbmtl_reference(model: nn.Module, x: torch.Tensor, cfg) -> list[torch.Tensor]:
    """TorchEasyRec's DBMTL: bottom MLP, MMoE module (when set), task MLPs, relation MLPs over
    ``[task_net, relation_net of each related tower]`` in tower order, a linear layer per task."""
    net = _mlp(x, _layers(model.bottom))
    if cfg.expert_hidden_units:
        experts = [_mlp(net, _layers(e)) for e in model.experts]
        inputs = []
        for gate in model.gates:
            layers = _layers(gate)
            inputs.append(_gate(_mlp(net, layers[:-1]), layers[-1], experts))
    else:
        inputs = [net] * len(cfg.tasks)
    task_net = {t.name: _mlp(inputs[i], _layers(model.towers[i])) for i, t in enumerate(cfg.tasks)}
    relation_net: dict[str, torch.Tensor] = {}
    for i, t in enumerate(cfg.tasks):
        if t.relation_hidden_units:
            joined = torch.cat([task_net[t.name]] + [relation_net[n] for n in t.relation_tasks], dim=1)
            relation_net[t.name] = _mlp(joined, _layers(model.relation_mlps[i]))
        else:
            relation_net[t.name] = task_net[t.name]
    return [_linear(relation_net[t.name], _layers(model.outputs[i])[0]).squeeze(-1) for i, t in enumerate(cfg.tasks)]


@pytest.mark.parametrize("options", [
    # TorchEasyRec's example's shape, small: a bottom MLP, cvr's relation MLP reads ctr's tower
    {"bottom_hidden_units": (8,)},
    # with the MMoE (gate MLPs too), a chain of three tasks, a relation MLP without relations
    {"bottom_hidden_units": (9, 7), "expert_hidden_units": (6, 5), "num_experts": 3, "gate_hidden_units": (4,)},
    # no bottom, linear gates, no tower MLPs
    {"expert_hidden_units": (5,), "num_experts": 2, "towers": ()},
])
def test_dbmtl_equals_torcheasyrecs_formula(registries, options):  # noqa: F811
    from tzrun_plugins.models.dbmtl import DBMTLConfig, DBMTLTaskConfig

    torch.manual_seed(4)
    towers = options.pop("towers", (4, 3))
    tasks = (DBMTLTaskConfig("ctr", towers, relation_hidden_units=(2,) if "num_experts" in options else ()),
             DBMTLTaskConfig("cvr", towers, relation_tasks=("ctr",), relation_hidden_units=(3,)),
             DBMTLTaskConfig("pay", (), relation_tasks=("cvr", "ctr"), relation_hidden_units=(4, 2)))
    cfg = DBMTLConfig(tasks=tasks, **options)
    model = _build(registries, "dbmtl", _ctx(**CTX), **attrs.asdict(cfg, recurse=False))
    batch = _batch(_ctx(**CTX))
    out = model(batch)
    expected = _dbmtl_reference(model, _x(model, batch), cfg)
    for task, logits in zip(tasks, expected):
        torch.testing.assert_close(out[f"logits/{task.name}"], logits)
        torch.testing.assert_close(out[f"probs/{task.name}"], torch.sigmoid(logits))
    out["logits/pay"].sum().backward()
    assert model.relation_mlps[1][0].weight.grad is not None  # pay reads cvr's relation output
    assert all(p.grad is None for p in model.outputs[1].parameters())  # but not its logit


def _din_encoder_reference(encoder: nn.Module, query: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
    """TorchEasyRec's ``DINEncoder``: zero-padded ``[B, T, D]`` sequences, scores
    ``linear(mlp([q, s, q - s, q * s]))`` with ``-(2**31) + 1`` at padded positions, softmax over
    the positions, the weighted sum of the (padded) sequence."""
    longest = max(1, max(len(r) for r in rows))
    sequence = torch.stack([torch.cat([r, torch.zeros(longest - len(r), query.shape[1])]) for r in rows])
    mask = torch.arange(longest).unsqueeze(0) < torch.tensor([len(r) for r in rows]).unsqueeze(1)
    queries = query.unsqueeze(1).expand(-1, longest, -1)
    layers = _layers(encoder)
    hidden = _mlp(torch.cat([queries, sequence, queries - sequence, queries * sequence], dim=-1), layers[:-1])
    scores = _linear(hidden, layers[-1]).transpose(1, 2)  # [B, 1, T]
    scores = torch.where(mask.unsqueeze(1), scores, torch.ones_like(scores) * (-(2**31) + 1))
    return torch.matmul(torch.softmax(scores, dim=-1), sequence).squeeze(1)


def test_dbmtl_with_a_sequence_group_and_two_classes_equals_torcheasyrecs_formula(registries):  # noqa: F811
    """TorchEasyRec's dbmtl_taobao_seq.config and dbmtl_taobao_jrc.config, small: the group read
    through a DIN encoder of its query, appended to x; cvr of two classes (``num_class: 2``), its
    ``probs`` TorchEasyRec's ``probs1`` (the softmax's class 1)."""
    from tests.plugins import test_sequence_models as seq
    from tzrun_plugins.models._sequence_config import SequenceEncoderConfig
    from tzrun_plugins.models.dbmtl import DBMTLConfig, DBMTLTaskConfig

    torch.manual_seed(5)
    tasks = (DBMTLTaskConfig("ctr", (4, 3)),
             DBMTLTaskConfig("cvr", (4, 3), relation_tasks=("ctr",), relation_hidden_units=(3,), num_classes=2))
    encoders = (SequenceEncoderConfig("clicks", "target_attention", attention_hidden_units=(6, 5)),)
    cfg = DBMTLConfig(tasks=tasks, bottom_hidden_units=(8,), sequence_encoders=encoders)
    model = _build(registries, "dbmtl", seq._ctx(), **attrs.asdict(cfg, recurse=False))
    batch = seq._batch()
    out = model(batch)
    user = model.ebc.embedding_bags["user_emb"].weight.detach()[torch.tensor([0, 1, 2, 3])]
    items = model.sequences.collections[f"dim_{seq.DIM}"].embeddings["item_emb"].weight.detach()
    query = items[torch.tensor([1, 2, 3, 4])]
    clicks = _din_encoder_reference(model.sequence_inputs.encoders[0], query,
                                    [items[torch.tensor(row, dtype=torch.long)] for row in seq.CLICKS])
    x = torch.cat([batch.dense, user, query, clicks], dim=1)
    ctr, cvr = _dbmtl_reference(model, x, cfg)
    torch.testing.assert_close(out["logits/ctr"], ctr)
    torch.testing.assert_close(out["probs/ctr"], torch.sigmoid(ctr))
    assert cvr.shape == (seq.ROWS, 2) and "class_logits/ctr" not in out
    torch.testing.assert_close(out["class_logits/cvr"], cvr)
    torch.testing.assert_close(out["probs/cvr"], torch.softmax(cvr, dim=1)[:, 1])
    torch.testing.assert_close(out["logits/cvr"], cvr[:, 1] - cvr[:, 0])
    out["probs/ctr"].sum().backward()
    assert all(p.grad is not None for p in model.sequence_inputs.parameters())  # the attention trains


def test_dbmtl_tasks_have_one_or_two_classes_and_declare_their_outputs(registries):  # noqa: F811
    from tzrun_plugins.models.dbmtl import DBMTLConfig, DBMTLTaskConfig

    with pytest.raises(ValueError, match=r"must be 1 \(one logit\) or 2 \(two logits, class_logits/ctr, for jrc"):
        DBMTLTaskConfig("ctr", num_classes=3)
    cfg = DBMTLConfig(tasks=(DBMTLTaskConfig("ctr", num_classes=2), DBMTLTaskConfig("cvr")))
    declared = registries["model"].get("dbmtl", "model.type").extras["outputs"](cfg)
    assert sorted(declared) == ["class_logits/ctr", "logits/ctr", "logits/cvr", "probs/ctr", "probs/cvr"]


@pytest.mark.parametrize(("tasks", "fix"), [
    ('[{name="ctr", num_classes=2}, {name="cvr"}]', "set prediction to one of class_logits/ctr"),
    ('[{name="ctr"}, {name="cvr"}]', "dbmtl as configured outputs no class_logits"),
])
def test_check_refuses_jrc_reading_one_logit_per_row(tasks, fix):
    """jrc needs two-class logits (registered with reads="class_logits"): reading a task's one
    logit passed check and failed the first step on its shape; now check names the fix."""
    from tests.conftest import REPO, cli
    from tzrun.errors import EXIT_CONFIG

    proc = cli(["check", str(REPO / "examples" / "dbmtl_taobao.toml"), "--no-data", "--set", f"model.tasks={tasks}",
                "--set", 'losses=[{type="jrc", label="click", prediction="logits/ctr", group_by="user_id"}]'])
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert ("losses[0].prediction: loss 'jrc' reads class_logits outputs, but 'logits/ctr' is another kind; "
            f"{fix}") in proc.stderr
    assert proc.stderr.count("\n  ") == 1, proc.stderr  # that one problem


@pytest.mark.parametrize("tasks, message", [
    ((("ctr", ("cvr",)), ("cvr", ())), "task 'ctr' relates to 'cvr', which is listed after it"),
    ((("ctr", ("ctr",)),), "task 'ctr' relates to itself"),
    ((("ctr", ()), ("cvr", ("click",))), "task 'cvr' relates to 'click', which is no task"),
])
def test_dbmtl_relations_name_tasks_listed_before(tasks, message):
    from tzrun_plugins.models.dbmtl import DBMTLConfig, DBMTLTaskConfig

    with pytest.raises(ValueError, match=message):
        DBMTLConfig(tasks=tuple(DBMTLTaskConfig(n, relation_tasks=r, relation_hidden_units=(4,)) for n, r in tasks))


def test_dbmtl_relation_tasks_need_a_relation_mlp_and_gates_need_experts():
    from tzrun_plugins.models.dbmtl import DBMTLConfig, DBMTLTaskConfig

    with pytest.raises(ValueError, match="relation_tasks are read by the relation MLP"):
        DBMTLTaskConfig("cvr", relation_tasks=("ctr",))
    with pytest.raises(ValueError, match="the gates are the MMoE's: set expert_hidden_units"):
        DBMTLConfig(tasks=(DBMTLTaskConfig("ctr"),), gate_hidden_units=(4,))


def test_convert_maps_dbmtl_s_mmoe_and_relations_and_reports_what_torcheasyrec_ignores():
    from tests.core.torcheasyrec_examples import DBMTL_TAOBAO
    from tzrun_tools.convert import convert_pipeline_config

    model = DBMTL_TAOBAO[DBMTL_TAOBAO.index("    dbmtl {"):]
    mmoe = model.replace("# expert_mlp {\n        #     hidden_units: [512, 256, 128]\n        # }\n        # num_expert: 3",
                         "expert_mlp { hidden_units: [8] }\n num_expert: 2\n gate_mlp { hidden_units: [4] }")
    mmoe = mmoe.replace('label_name: "clk"', 'label_name: "clk"\n relation_tower_names: "cvr"', 1)
    conversion = convert_pipeline_config(DBMTL_TAOBAO.replace(model, mmoe), "dbmtl.config")
    table = conversion.tree["model"]
    assert {k: table[k] for k in ("bottom_hidden_units", "expert_hidden_units", "num_experts", "gate_hidden_units")} == {
        "bottom_hidden_units": [512], "expert_hidden_units": [8], "num_experts": 2, "gate_hidden_units": [4]}
    assert "relation_tasks" not in table["tasks"][0] and table["tasks"][1]["relation_tasks"] == ["ctr"]
    skipped = {f.path: f.message for f in conversion.not_converted}
    assert "only with a relation_mlp" in skipped["model_config.dbmtl.task_towers[0].relation_tower_names"]
    bottom = convert_pipeline_config(DBMTL_TAOBAO.replace("    dbmtl {", "    dbmtl {\n"
                                                          " mask_net { n_mask_blocks: 1 mask_block { hidden_dim: 4 } }", 1),
                                     "dbmtl.config")
    assert "model" not in bottom.tree
    skipped = {f.path: f.message for f in bottom.not_converted}
    assert "MaskNet bottom has no equivalent" in skipped["model_config.dbmtl.mask_net"]


def test_convert_maps_dbmtl_s_two_classes_to_jrc_on_class_logits_and_its_sequence_group_to_din_attention():
    from tests.core.torcheasyrec_examples import DBMTL_TAOBAO_JRC, DBMTL_TAOBAO_SEQ
    from tzrun_tools.convert import convert_pipeline_config

    jrc = convert_pipeline_config(DBMTL_TAOBAO_JRC, "dbmtl_taobao_jrc.config").tree
    assert [t.get("num_classes") for t in jrc["model"]["tasks"]] == [2, 2]
    assert [(loss["type"], loss["prediction"], loss["label"], loss["group_by"]) for loss in jrc["losses"]] == [
        ("jrc", "class_logits/ctr", "clk", "user_id"), ("jrc", "class_logits/cvr", "buy", "user_id")]
    assert [m["prediction"] for m in jrc["metrics"]] == ["probs/ctr", "probs/cvr"]  # TorchEasyRec's probs1
    three = convert_pipeline_config(DBMTL_TAOBAO_JRC.replace("num_class: 2", "num_class: 3", 1), "jrc.config")
    assert "num_classes" not in three.tree["model"]["tasks"][0]
    skipped = {f.path: f.message for f in three.not_converted}
    assert skipped["model_config.dbmtl.task_towers[0].num_class"] == (
        "tzrec-run's dbmtl outputs one logit per task (or two, num_classes = 2)")
    seq = convert_pipeline_config(DBMTL_TAOBAO_SEQ, "dbmtl_taobao_seq.config").tree
    assert seq["model"]["sequence_encoders"] == [
        {"sequence": "click_50_seq", "type": "target_attention", "attention_hidden_units": [32, 8]}]
    group = seq["features"]["sequence"][0]
    assert group["query"] == ["adgroup_id", "cate_id", "brand"] and len(group["features"]) == 3
    assert all("num_classes" not in t for t in seq["model"]["tasks"])
