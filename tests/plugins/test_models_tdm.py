"""tdm equals TorchEasyRec's TDM formula on fixed inputs, and names what keeps it from building.

The reference below is an independent plain-torch statement of what TorchEasyRec's ``TDM``
computes (``tzrec/models/tdm.py`` with ``MultiWindowDINEncoder`` of ``tzrec/modules/sequence.py``
and ``MLP``/``Perceptron`` of ``tzrec/modules/mlp.py``), written as TorchEasyRec writes it:
the sequence padded to the batch's longest row ``T``, ``sequence_mask`` from the lengths,
``attn = PReLU(linear(mlp([s, q * s, q])))`` with one PReLU weight, ``F.pad`` to the windows'
total (negative: cut), ``torch.segment_reduce`` over the windows, each window divided by
``max(min(len - cumsum, window), 1)``, ``[windows, q]`` reshaped; ``mlp_input = [that, the
deep groups]``; ``final`` (``Linear`` without bias, ``BatchNorm1d``, ``ReLU`` with ``use_bn``)
and the output linear layer (``num_class = 1``: one logit, its sigmoid the probability).

TorchEasyRec reads the sequence from its first stored id; our group with ``keep = "first"``
(first id most recent) is that layout. The tables enter the reference as leaf tensors, so the
gradients that reach them are compared too.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SequenceGroup, SparseFeature

ROWS, MAX_LEN = 5, 8
#: per row: the clicked items, most recent first; row 4 has more ids than the test windows hold
CLICKS = [[], [3], [1, 2, 3], [4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 5, 4, 3, 2]]
SEQUENCE = {"clicks__item": ("item_emb", 4), "clicks__cate": ("cate_emb", 2)}


def _ctx(keep: str = "first", query: tuple[str, ...] = ("item", "cate"), groups: tuple[str, ...] = ("clicks",)) -> ModelContext:
    """Dense d0, d1; pooled user (width 3); the tree node's item and cate, sharing their tables
    with the clicks sequence (widths 4 and 2)."""
    sparse = (SparseFeature("user", "user", "user_emb", num_buckets=10),
              SparseFeature("item", "item", "item_emb", num_buckets=10),
              SparseFeature("cate", "cate", "cate_emb", num_buckets=10))
    seq = tuple(SequenceGroup(g, MAX_LEN, tuple(SparseFeature(f"{n}{'' if g == 'clicks' else '2'}", n, t, num_buckets=10)
                                                for n, (t, _) in SEQUENCE.items()), query, keep) for g in groups)
    users = {t: [n for n in ("item", "cate") if f"{n}_emb" == t] for t, _ in SEQUENCE.values()}
    for g in groups:
        for n, (t, _) in SEQUENCE.items():
            users[t].append(f"{n}{'' if g == 'clicks' else '2'}")
    tables = tuple(EmbeddingTable(t, 10, d, tuple(users[t])) for t, d in SEQUENCE.values())
    return ModelContext((DenseFeature("d0", "d0"), DenseFeature("d1", "d1")), sparse,
                        (EmbeddingTable("user_emb", 10, 3, ("user",), "mean"),), torch.device("cpu"), ("click",),
                        sequence_groups=seq, sequence_tables=tables)


def _batch(clicks: Sequence[Sequence[int]] = CLICKS) -> Batch:
    torch.manual_seed(3)
    sparse = KeyedJaggedTensor(keys=["user"], values=torch.randint(0, 10, (ROWS,)), lengths=torch.ones(ROWS, dtype=torch.int32))
    ids = [i for row in clicks for i in row]
    nodes = torch.randint(0, 10, (ROWS,)).tolist()
    sequence = KeyedJaggedTensor(
        keys=["clicks__item", "clicks__cate", "item", "cate"],
        values=torch.tensor(ids + [(3 * i) % 10 for i in ids] + nodes + [(7 * n) % 10 for n in nodes]),
        lengths=torch.tensor([len(r) for r in clicks] * 2 + [1] * (2 * ROWS), dtype=torch.int32),
    )
    return Batch(torch.randn(ROWS, 2), sparse, {"click": torch.ones(ROWS)}, torch.ones(ROWS), ROWS, sequence=sequence)


def _build(registries, ctx: Optional[ModelContext] = None, **options):
    entry = registries["model"].get("tdm", "model.type")
    return entry.build(entry.config(**options), ctx or _ctx())


@pytest.fixture(scope="module")
def registries():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return collect_registries(make_plugin_manager())


# --- TorchEasyRec's formula, in plain torch ---------------------------------------------------

def _tables(model: nn.Module) -> dict[str, torch.Tensor]:
    found = {"user_emb": model.ebc.embedding_bags["user_emb"].weight}
    for collection in model.sequences.collections.values():
        found.update({name: table.weight for name, table in collection.embeddings.items()})
    return {name: weight.detach().clone().requires_grad_() for name, weight in found.items()}


def _perceptrons(module: nn.Module) -> list[list[nn.Module]]:
    """Each ``Linear`` with the modules that follow it up to the next ``Linear``."""
    layers: list[list[nn.Module]] = []
    for m in module.children():
        if isinstance(m, nn.Linear):
            layers.append([m])
        else:
            layers[-1].append(m)
    return layers


def _perceptron(x: torch.Tensor, modules: list[nn.Module], training: bool) -> torch.Tensor:
    """TorchEasyRec's ``Perceptron``: linear, [batch norm], activation (ReLU or one-weight PReLU)."""
    linear = modules[0]
    x = x @ linear.weight.detach().T + (0 if linear.bias is None else linear.bias.detach())
    for m in modules[1:]:
        if isinstance(m, nn.BatchNorm1d):
            x = F.batch_norm(x, m.running_mean.clone(), m.running_var.clone(), m.weight.detach(), m.bias.detach(),
                             training=training, eps=m.eps)
        elif isinstance(m, nn.PReLU):
            x = torch.where(x >= 0, x, m.weight.detach() * x)
        else:
            x = torch.relu(x)
    return x


def multi_window_din(seq: torch.Tensor, lengths: torch.Tensor, query: torch.Tensor, windows: Sequence[int],
                     attention: nn.Module) -> torch.Tensor:
    """TorchEasyRec's ``MultiWindowDINEncoder.forward`` (query as wide as the sequence)."""
    max_seq_length = seq.size(1)
    mask = torch.arange(max_seq_length).unsqueeze(0) < lengths.unsqueeze(1)
    queries = query.unsqueeze(1).expand(-1, max_seq_length, -1)
    out = torch.cat([seq, queries * seq, queries], dim=-1)
    for layer in _perceptrons(attention.mlp):
        out = _perceptron(out, layer, False)
    out = out @ attention.score.weight.detach().T + attention.score.bias.detach()
    out = torch.where(out >= 0, out, attention.prelu.weight.detach() * out)
    att_sequences = out * mask.unsqueeze(2) * seq
    pad = (0, 0, 0, sum(windows) - max_seq_length)
    padded = F.pad(att_sequences, pad).transpose(0, 1)
    result = torch.segment_reduce(padded, reduce="sum", lengths=torch.tensor(windows), axis=0).transpose(0, 1)
    cumsum = torch.tensor([0] + list(torch.tensor(windows).cumsum(0)[:-1]))
    segment_length = torch.min(lengths.unsqueeze(1) - cumsum.unsqueeze(0), torch.tensor(windows))
    result = result / torch.max(segment_length, torch.ones_like(segment_length)).unsqueeze(2)
    return torch.cat([result, query.unsqueeze(1)], dim=1).reshape(result.shape[0], -1)


def tdm_ref(model: nn.Module, batch: Batch, windows: Sequence[int], tables: dict[str, torch.Tensor],
            training: bool) -> torch.Tensor:
    """TorchEasyRec's ``TDM.predict`` on ``batch``: the logits."""
    jagged = batch.sequence.to_dict()
    lengths = jagged["clicks__item"].lengths()
    longest = int(lengths.max())
    rows = []
    for r in range(ROWS):
        row = torch.cat([tables[t][jagged[n].to_dense()[r]] for n, (t, _) in SEQUENCE.items()], dim=1)
        rows.append(torch.cat([row, torch.zeros(longest - row.shape[0], row.shape[1])]))
    query = torch.cat([tables["item_emb"][jagged["item"].values()], tables["cate_emb"][jagged["cate"].values()]], dim=1)
    encoded = multi_window_din(torch.stack(rows), lengths, query, windows, model.attention)
    user = tables["user_emb"][batch.sparse.to_dict()["user"].values()]
    x = torch.cat([encoded, batch.dense, user], dim=1)  # the deep group: d0, d1, user
    for layer in _perceptrons(model.final):
        x = _perceptron(x, layer, training)
    return (x @ model.output.weight.detach().T + model.output.bias.detach()).squeeze(-1)


def _table_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    found = {"user_emb": model.ebc.embedding_bags["user_emb"].weight.grad}
    for collection in model.sequences.collections.values():
        found.update({name: table.weight.grad for name, table in collection.embeddings.items()})
    return found


@pytest.mark.parametrize("options", [
    # TorchEasyRec's example's shape: PReLU attention, batch-normalised final MLP; the windows
    # (6 ids) shorter than the longest row (8): ids past them are not read
    {"windows_len": (1, 2, 3), "attention_hidden_units": (5,), "attention_activation": "prelu",
     "final_hidden_units": (6, 4), "final_batch_norm": True},
    # windows longer than max_len (padding), ReLU attention with two layers, no batch norm
    {"windows_len": (2, 5, 4), "attention_hidden_units": (6, 3), "final_hidden_units": (5,)},
])
@pytest.mark.parametrize("training", [True, False])
def test_tdm_equals_torcheasyrecs_formula(registries, options, training):
    torch.manual_seed(7)
    model = _build(registries, **options)
    for m in model.modules():  # off their initial values, so that a lost PReLU or running stat shows
        if isinstance(m, nn.PReLU):
            m.weight.data.fill_(0.1)
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    model.train(training)
    batch = _batch()
    tables = _tables(model)
    expected = tdm_ref(model, batch, options["windows_len"], tables, training)
    out = model(batch)
    torch.testing.assert_close(out["logits"], expected)
    torch.testing.assert_close(out["probs"], torch.sigmoid(expected))
    out["logits"].sum().backward()
    expected.sum().backward()
    for name, grad in _table_grads(model).items():
        torch.testing.assert_close(grad, tables[name].grad, msg=name)


def test_windows_count_back_from_the_most_recent_id_whatever_the_stored_order(registries):
    torch.manual_seed(1)
    recent_first = _build(registries, _ctx("first"), windows_len=(1, 2, 3), final_hidden_units=(4,))
    oldest_first = _build(registries, _ctx("last"), windows_len=(1, 2, 3), final_hidden_units=(4,))
    oldest_first.load_state_dict(recent_first.state_dict())
    same = oldest_first(_batch([list(reversed(r)) for r in CLICKS]))["logits"]
    torch.testing.assert_close(same, recent_first(_batch())["logits"])
    assert not torch.allclose(oldest_first(_batch())["logits"], same)  # the order is read


def test_tdm_reads_every_feature_but_the_node_by_default_and_features_when_named(registries):
    model = _build(registries)
    assert model.inputs.width == 2 + 3 and model.attention.out_features == 6 * (len((1, 1, 1, 2, 2, 2, 5, 6, 10, 20)) + 1)
    named = _build(registries, features=("user",))
    assert named.inputs.width == 3
    batch = _batch()
    moved = Batch(batch.dense + 1, batch.sparse, batch.labels, batch.weights, ROWS, sequence=batch.sequence)
    torch.testing.assert_close(named(batch)["logits"], named(moved)["logits"])  # d0, d1 not read


def _problems(excinfo) -> str:
    return "\n".join(str(p) for p in excinfo.value.problems)


@pytest.mark.parametrize("ctx, options, message", [
    (_ctx(groups=()), {}, "features.sequence: tdm needs the user's behaviour"),
    (_ctx(groups=("clicks", "views")), {}, "model.history: several [[features.sequence]] groups (clicks, views)"),
    (_ctx(groups=("clicks", "views")), {"history": "clicks"}, "features.sequence[1]: 'views' is not model.history"),
    (_ctx(), {"history": "click"}, "model.history: no [[features.sequence]] group named 'click' (groups: clicks); did you mean 'clicks'?"),
    (_ctx(query=()), {}, "features.sequence[0].query: tdm's attention over 'clicks' needs the tree node"),
    (_ctx(), {"features": ("user", "usr", "user")}, "model.features[1]: no feature named 'usr'"),
])
def test_build_errors_name_the_toml_path(registries, ctx, options, message):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, ctx, **options)
    assert message in _problems(excinfo)


def _config_text(options: dict) -> str:
    """A run config whose ``[model]`` is ``tdm`` with ``options``."""
    body = "\n".join(f"{k} = {list(v) if isinstance(v, tuple) else repr(v)}".replace("'", '"') for k, v in options.items())
    return f"""
[data]
train_input = "x"
labels = ["click"]
[model]
type = "tdm"
{body}
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 1
[[features.sparse]]
name = "user"
num_buckets = 10
embedding_dim = 4
"""


@pytest.mark.parametrize("options, message", [
    ({"windows_len": ()}, "needs at least one window"),
    ({"windows_len": (1, 0)}, "at least 1 unit"),
    ({"attention_hidden_units": ()}, "at least one layer"),
    ({"attention_activation": "tanh"}, "attention_activation"),
])
def test_option_errors(registries, options, message):
    from tzrun.testing import load_config_text

    with pytest.raises(ConfigError, match=message):
        load_config_text(_config_text(options))


@pytest.mark.parametrize("activation", ["relu", "prelu", "dice"])
def test_attention_activation_picks_the_attention_mlps_layers(registries, activation):
    from tzrun.testing import load_config_text
    from tzrun_plugins.models._dice import Dice

    with pytest.raises(ConfigError) as excinfo:  # the partial config misses model_dir and the optimizers only
        load_config_text(_config_text({"attention_activation": activation}))
    assert "attention_activation" not in _problems(excinfo)
    model = _build(registries, attention_activation=activation, attention_hidden_units=(5, 3), final_hidden_units=(4,))
    layers = [type(m) for m in model.attention.mlp if not isinstance(m, nn.Linear)]
    assert layers == [{"relu": nn.ReLU, "prelu": nn.PReLU, "dice": Dice}[activation]] * 2
    model(_batch())["logits"].sum().backward()
    assert all(p.grad is not None for p in model.attention.mlp.parameters())
