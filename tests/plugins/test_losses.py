"""Every first-party loss against a direct formula written here, with sample weights, label
smoothing and padding rows (weight 0, which must change nothing)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.core.test_config import MINIMAL
from tzrun.errors import ConfigError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import load_config_text


@pytest.fixture(scope="module")
def registries():
    return collect_registries(make_plugin_manager())


def build(registries, toml: str):
    cfg, _ = load_config_text(MINIMAL, overrides=[f"losses=[{toml}]"])
    component = cfg.losses[0]
    return registries["loss"].get(component.type, "x").build(component.config)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def data(n=9, seed=0, classes=None):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (n,), generator=gen).double()
    weights = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5
    weights[3] = 0.0  # a padding row
    return logits, labels, weights


def weighted(values, weights):
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def with_padding_changed(loss, args, kwargs=None):
    """The loss again after scrambling the padding row's prediction and label."""
    prediction, label, weight = (a.clone() for a in args)
    prediction[3] = prediction[3] * -7 + 3
    label[3] = 1 - label[3]
    return loss(prediction, label, weight, **(kwargs or {}))


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_binary_cross_entropy(registries, smoothing):
    loss = build(registries, f'{{type="binary_cross_entropy", label_smoothing={smoothing}}}')
    x, y, w = data()
    target = [float(t) * (1 - smoothing) + 0.5 * smoothing for t in y]
    per_row = [-(t * math.log(sigmoid(float(v))) + (1 - t) * math.log(1 - sigmoid(float(v)))) for v, t in zip(x, target)]
    assert float(loss(x, y, w)) == pytest.approx(weighted(per_row, w.tolist()), rel=1e-12)
    assert float(with_padding_changed(loss, (x, y, w))) == pytest.approx(float(loss(x, y, w)), rel=1e-12)


@pytest.mark.parametrize(("gamma", "alpha"), [(2.0, 0.25), (0.0, 0.5), (1.5, 0.8)])
def test_binary_focal(registries, gamma, alpha):
    loss = build(registries, f'{{type="binary_focal", gamma={gamma}, alpha={alpha}}}')
    x, y, w = data(seed=1)
    per_row = []
    for v, t in zip(x.tolist(), y.tolist()):
        p = sigmoid(v)
        factor = alpha * t * (1 - p) ** gamma + (1 - alpha) * (1 - t) * p**gamma
        per_row.append(-factor * (t * math.log(p) + (1 - t) * math.log(1 - p)))
    assert float(loss(x, y, w)) == pytest.approx(weighted(per_row, w.tolist()), rel=1e-10)
    assert float(with_padding_changed(loss, (x, y, w))) == pytest.approx(float(loss(x, y, w)), rel=1e-12)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_softmax_cross_entropy(registries, smoothing):
    loss = build(registries, f'{{type="softmax_cross_entropy", num_classes=3, label_smoothing={smoothing}}}')
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 1, 0, 2, 2], dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0, 0.5, 0.0, 1.0, 1.5, 1.0], dtype=torch.float64)
    per_row = []
    for row, label in zip(logits.tolist(), labels.tolist()):
        log_z = math.log(sum(math.exp(v) for v in row))
        q = [smoothing / 3 + (1 - smoothing) * (c == int(label)) for c in range(3)]
        per_row.append(-sum(qc * (v - log_z) for qc, v in zip(q, row)))
    assert float(loss(logits, labels, weights)) == pytest.approx(weighted(per_row, weights.tolist()), rel=1e-12)
    with pytest.raises(ValueError, match=r"needs logits of shape \[B, 3\], got \[7, 2\]"):
        loss(logits[:, :2], labels, weights)


def test_l2(registries):
    loss = build(registries, '{type="l2"}')
    x, _, w = data(seed=3)
    y = torch.randn(len(x), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = weighted([(a - b) ** 2 for a, b in zip(x.tolist(), y.tolist())], w.tolist())
    assert float(loss(x, y, w)) == pytest.approx(expected, rel=1e-12)
    assert float(with_padding_changed(loss, (x, y, w))) == pytest.approx(expected, rel=1e-12)


def jrc_reference(logits, labels, weights, sessions, alpha):
    """TorchEasyRec's JRC as a direct loop: softmax over the session's rows that are the row
    itself or of the other class."""
    n = len(labels)
    ce = []
    ge = []
    for i in range(n):
        z0, z1 = logits[i]
        y = int(labels[i])
        log_z = math.log(math.exp(z0) + math.exp(z1))
        ce.append(log_z - (z1 if y == 1 else z0))
        column = 1 if y == 1 else 0
        pool = [j for j in range(n) if sessions[j] == sessions[i] and (j == i or int(labels[j]) != y)]
        denominator = sum(math.exp(logits[j][column]) for j in pool)
        ge.append(math.log(denominator) - logits[i][column])
    return alpha * weighted(ce, weights) + (1 - alpha) * weighted(ge, weights)


@pytest.mark.parametrize("alpha", [0.5, 0.2])
def test_jrc_matches_the_session_softmax_written_as_a_loop(registries, alpha):
    loss = build(registries, f'{{type="jrc", alpha={alpha}, group_by="session"}}')
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(12, 2, generator=gen, dtype=torch.float64) * 3
    labels = torch.tensor([1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 1], dtype=torch.float64)
    sessions = torch.tensor([7, 7, 7, 3, 3, 3, 3, 9, 9, 11, 5, 5])  # session 11 is alone
    weights = torch.rand(12, generator=gen, dtype=torch.float64) + 0.5
    expected = jrc_reference(logits.tolist(), labels.tolist(), weights.tolist(), sessions.tolist(), alpha)
    assert float(loss(logits, labels, weights, group=sessions)) == pytest.approx(expected, rel=1e-10)
    # large logits stay finite (per-session stabilisation)
    big = loss(logits * 200, labels, weights, group=sessions)
    assert torch.isfinite(big)
    logits.requires_grad_(True)
    loss(logits, labels, weights, group=sessions).backward()
    assert torch.isfinite(logits.grad).all()


def torcheasyrec_jrc(logits, labels, session_ids, alpha, weights=None):
    """TorchEasyRec's ``JRCLoss.forward`` (tzrec/loss/jrc_loss.py, 54cac31) restated: ``[B, B]``
    session and diagonal masks added as ``-1e9``, one cross entropy over the positive rows (on
    ``z1``) and one over the negative rows (on ``z0``); with ``weights``, its ``reduction="none"``
    path and its model's ``mean(loss * w / mean(w))``."""
    from torch.nn import functional as F

    labels = labels.long()
    reduction = "mean" if weights is None else "none"
    ce = F.cross_entropy(logits, labels, reduction=reduction)
    batch_size = labels.shape[0]
    mask = torch.eq(session_ids.unsqueeze(1), session_ids.unsqueeze(0)).float()
    diag_index = torch.arange(batch_size)
    diag = torch.eye(batch_size, dtype=torch.int64)
    pos_num = int(labels.sum())
    neg_num = batch_size - pos_num
    parts = []
    for rows_of, column, y_other, num in ((labels == 1, 1, labels, pos_num), (labels == 0, 0, 1 - labels, neg_num)):
        index = torch.where(rows_of)[0]
        z = logits[:, column].unsqueeze(0).tile([num, 1])
        z = z + ((1 - mask.index_select(0, index)) + (1 - diag.index_select(0, index)) * y_other.unsqueeze(0).tile([num, 1])) * -1e9
        parts.append((index, F.cross_entropy(z, diag_index.index_select(0, index), reduction=reduction), num))
    if weights is None:
        ge = sum(loss * num / batch_size for _, loss, num in parts)
        return alpha * ce + (1 - alpha) * ge
    ge = torch.zeros(batch_size, dtype=logits.dtype)
    for index, loss, _ in parts:
        ge[index] = loss
    return torch.mean((alpha * ce + (1 - alpha) * ge) * weights / weights.mean())


def test_jrc_equals_torcheasyrecs_own_test_value(registries):
    """tzrec/loss/jrc_loss_test.py: two sessions of four rows, alpha 0.5, 0.7199."""
    loss = build(registries, '{type="jrc", group_by="session"}')
    logits = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.3, 0.7], [0.2, 0.8], [0.8, 0.2], [0.55, 0.45], [0.33, 0.67],
                           [0.55, 0.45]])
    labels = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1], dtype=torch.float32)
    sessions = torch.tensor([1, 1, 1, 1, 2, 2, 2, 2])
    assert round(float(loss(logits, labels, torch.ones(8), group=sessions)), 4) == 0.7199
    assert round(float(torcheasyrec_jrc(logits, labels, sessions, 0.5)), 4) == 0.7199


@pytest.mark.parametrize("alpha, weighted", [(0.5, False), (0.3, False), (0.8, True)])
def test_jrc_equals_torcheasyrecs_masked_formula_on_fixed_inputs(registries, alpha, weighted):
    loss = build(registries, f'{{type="jrc", alpha={alpha}, group_by="session"}}')
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(40, 2, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, 2, (40,), generator=gen).double()
    sessions = torch.randint(0, 7, (40,), generator=gen)  # sessions of several rows, some of one class only
    sessions[0] = 99  # and one row alone
    weights = torch.rand(40, generator=gen, dtype=torch.float64) + 0.5 if weighted else torch.ones(40, dtype=torch.float64)
    expected = torcheasyrec_jrc(logits, labels, sessions, alpha, weights if weighted else None)
    torch.testing.assert_close(loss(logits, labels, weights, group=sessions), expected, rtol=1e-10, atol=1e-12)
    merged = loss(logits, labels, weights, group=torch.zeros(40, dtype=torch.int64))  # the session grouping counts
    assert abs(float(merged) - float(expected)) > 1e-3


def test_jrc_needs_two_logits_and_a_group_key(registries):
    loss = build(registries, '{type="jrc", group_by="session"}')
    with pytest.raises(ValueError, match=r"jrc needs two logits per row \(shape \[B, 2\]\), got \[4\]: read a model "
                                         r"output of two classes \(dbmtl: num_classes = 2 and prediction = "
                                         r"\"class_logits/<task>\"\)"):
        loss(torch.zeros(4), torch.zeros(4), torch.ones(4), group=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ConfigError, match=r"losses\[0\].group_by: 'jrc' groups rows: name the column"):
        build(registries, '{type="jrc"}')
    with pytest.raises(ConfigError, match=r"losses\[0\].group_by: 'l2' does not use a group key"):
        build(registries, '{type="l2", group_by="user"}')


@pytest.mark.parametrize("grouped", [False, True])
def test_pairwise_logistic_over_every_ordered_pair(registries, grouped):
    toml = '{type="pairwise_logistic", chunk_rows=3' + (', group_by="query"}' if grouped else "}")
    loss = build(registries, toml)
    gen = torch.Generator().manual_seed(6)
    scores = torch.randn(8, generator=gen, dtype=torch.float64)
    labels = torch.tensor([2.0, 0.0, 1.0, 1.0, 0.0, 3.0, 0.0, 1.0], dtype=torch.float64)
    weights = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.0, 1.0, 1.5, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    total = norm = 0.0
    for i in range(8):
        for j in range(8):
            if labels[i] > labels[j] and (not grouped or groups[i] == groups[j]):
                pw = float(weights[i] * weights[j])
                total += pw * math.log(1 + math.exp(-(float(scores[i]) - float(scores[j]))))
                norm += pw
    kwargs = {"group": groups} if grouped else {}
    assert float(loss(scores, labels, weights, **kwargs)) == pytest.approx(total / norm, rel=1e-12)


def test_in_batch_softmax_with_temperature(registries):
    loss = build(registries, '{type="in_batch_softmax", temperature=0.5}')
    gen = torch.Generator().manual_seed(7)
    sim = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0, 1.0, 0.0, 1.0], dtype=torch.float64)  # row/column 3 is padding
    per_row = []
    for i in range(5):
        candidates = [j for j in range(5) if weights[j] > 0 or j == i]
        log_z = math.log(sum(math.exp(float(sim[i, j]) / 0.5) for j in candidates))
        per_row.append(log_z - float(sim[i, i]) / 0.5)
    assert float(loss(sim, torch.zeros(5), weights)) == pytest.approx(weighted(per_row, weights.tolist()), rel=1e-12)
    with pytest.raises(ValueError, match="square"):
        loss(sim[:, :3], torch.zeros(5), weights)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('{type="binary_focal", alpha=1.0}', r"losses\[0\].alpha: must be between 0 and 1"),
        ('{type="binary_focal", gamma=-1.0}', r"losses\[0\].gamma: must be >= 0"),
        ('{type="in_batch_softmax", temperature=0.0}', r"losses\[0\].temperature: must be > 0"),
        ('{type="softmax_cross_entropy", num_classes=1}', r"losses\[0\].num_classes: must be >= 2"),
    ],
)
def test_loss_option_errors_name_the_key(registries, toml, message):
    with pytest.raises(ConfigError, match=message):
        build(registries, toml)


class _Batch:
    """What TrainModel reads from a batch (traced: every attribute becomes a proxy)."""

    def __init__(self, n: int = 6) -> None:
        g = torch.Generator().manual_seed(0)
        self.dense = torch.randn(n, 4, generator=g)
        self.labels = {"label": (torch.rand(n, generator=g) > 0.5).float()}
        self.weights = torch.ones(n)
        self.groups = {"session": torch.tensor([0, 0, 1, 1, 2, 2])[:n]}
        self.num_rows = n


class _Outputs(torch.nn.Module):
    """A model whose outputs fit every first-party loss."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, batch):
        two = self.linear(batch.dense)
        return {"logits": two[:, 0], "two": two, "square": two[:, :1] @ two[:, 1:].T}


@pytest.mark.parametrize("loss_type, prediction, group_by", [
    ("binary_cross_entropy", "logits", None), ("binary_focal", "logits", None), ("l2", "logits", None),
    ("softmax_cross_entropy", "two", None), ("jrc", "two", "session"), ("pairwise_logistic", "logits", "session"),
    ("in_batch_softmax", "square", None),
])
def test_every_loss_traces_as_a_leaf_and_computes_the_same(loss_type, prediction, group_by):
    # TrainPipelineSparseDist fx-traces the model with its losses: a loss must not break tracing
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries
    from tzrun.runner.model import TrainModel
    from tzrun.runner.slots import LossSlot

    registries = collect_registries(make_plugin_manager())
    entry = registries["loss"].get(loss_type, "losses")
    loss = entry.build(entry.config())
    model = TrainModel(_Outputs(), {loss_type: loss}, [LossSlot(loss_type, prediction, "label", 1.0, group_by)])
    traced = torch.fx.symbolic_trace(model)
    assert any(n.op == "call_function" and n.target.__name__ == "call_loss" for n in traced.graph.nodes)
    batch = _Batch()
    eager, _ = model(batch)
    from_graph = traced(batch)[0]
    assert torch.isfinite(eager) and torch.equal(eager, from_graph)
