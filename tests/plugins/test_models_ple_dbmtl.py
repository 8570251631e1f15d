"""ple equals TorchEasyRec's formula on fixed inputs; its options are checked.

The reference below is an independent plain-torch statement of TorchEasyRec's module (its
``PLE`` with ``ExtractionNet`` and ``TaskTower``), reading
the weights of our built model as plain tensors: the input ``x = [dense features, mean-pooled
embeddings]`` is looked up by hand, every MLP layer is ``relu(x W^T + b)``, every gate a softmax
over a linear layer, and the outputs are compared per task.
"""

from __future__ import annotations

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

