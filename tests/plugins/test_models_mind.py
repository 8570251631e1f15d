"""mind equals TorchEasyRec's MIND formula on fixed inputs, draws its routing start from the run's
seed, and names what keeps it from building.

The reference below is an independent plain-torch statement of what TorchEasyRec's ``MIND``
computes (``tzrec/models/mind.py``, ``tzrec/modules/capsule.py`` and ``MatchModel.sim`` of
``tzrec/models/match_model.py``, at commit 54cac31), reading our built model's weights as plain
tensors and written as TorchEasyRec writes it (``sequence_mask``, ``torch.minimum`` against
``±inf`` thresholds, ``torch.max(norm, 1e-7)``):

- the user group through ``user_mlp`` (``relu`` layers, the last linear); the history group
  (its features' embeddings concatenated per position) through ``hist_seq_mlp`` (the same,
  without biases);
- the capsule layer: ``n = max(1, min(max_k, log2(len)))`` interests (all ``max_k`` with
  ``const_caps_num``), routing logits ``randn * stddev`` detached, ``num_iters`` rounds of a
  softmax over the interests (``* scale``, masked), zeroed at padding, the agreement with the
  detached, normalised low capsules added before the last round, ``squash`` of the last;
- ``[user, capsule]`` masked, ``concat_mlp`` (``relu`` per layer), masked, the output linear
  layer without bias, ``F.normalize`` with ``COSINE``;
- the item tower (``relu`` MLP, linear, normalised); label-aware attention
  ``softmax_k(simi_pow * min(<interest, item>, thresh))``; the similarities of ``MatchModel.sim``
  divided by ``temperature``.

The routing's random start is supplied to the reference explicitly: in training it is the
``torch.randn([B, L, max_k])`` draw that follows ``torch.manual_seed`` (what our model draws); in
evaluation, the model's ``routing_init`` buffer. A group is ``[its dense features, then its id
features' mean-pooled embeddings]`` in the order listed, as our model lays them out. The tables
and the bilinear matrix enter the reference as leaf tensors, so their gradients are compared too
(a routing that let gradients through its early rounds, or through its start, fails there).
"""

from __future__ import annotations

from typing import Optional

import attrs
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SequenceGroup, SparseFeature
from tzrun_plugins.models.mind import MINDConfig

OWN, SAMPLED, MAX_LEN = 4, 3, 6
#: per row: the clicked items (oldest first); 0, 1, 3 and 6 ids: 1, 1, 2 and 3 interests when max_k >= 3
CLICKS = [[], [3], [1, 2, 3], [4, 5, 6, 7, 8, 9]]
#: the history group's features and their widths (concatenated per position in this order)
SEQUENCE = {"clicks__item": 4, "clicks__cate": 2}
POOLED = {"user": 4, "item": 3, "cate": 2}


def _ctx(groups: tuple[str, ...] = ("clicks",)) -> ModelContext:
    """Dense d0, d1; pooled id features user, item, cate; sequence groups of clicked items and
    their categories, each feature with its own table."""
    sparse = tuple(SparseFeature(n, n, f"{n}_emb", num_buckets=10) for n in POOLED)
    tables = tuple(EmbeddingTable(f"{n}_emb", 10, d, (n,), "mean") for n, d in POOLED.items())
    seq = [SequenceGroup(g, MAX_LEN, tuple(SparseFeature(f"{n}{'' if g == 'clicks' else '2'}", n, f"{n}{g}_emb", num_buckets=10)
                                           for n in SEQUENCE), ()) for g in groups]
    seq_tables = tuple(EmbeddingTable(f"{n}{g}_emb", 10, d, (f"{n}{'' if g == 'clicks' else '2'}",))
                       for g in groups for n, d in SEQUENCE.items())
    return ModelContext((DenseFeature("d0", "d0"), DenseFeature("d1", "d1")), sparse, tables, torch.device("cpu"),
                        ("click",), sequence_groups=tuple(seq), sequence_tables=seq_tables)


def _batch() -> Batch:
    """``OWN`` rows with every feature, then ``SAMPLED`` items with item ids, categories and dense
    rows (the sequences have the batch's own rows only), as the data path appends a sampler's items."""
    torch.manual_seed(3)
    lengths = [1] * OWN + [0] * SAMPLED + [1, 2, 0, 1] + [1] * SAMPLED + [1] * (OWN + SAMPLED)
    sparse = KeyedJaggedTensor(keys=list(POOLED), values=torch.randint(0, 10, (sum(lengths),)),
                               lengths=torch.tensor(lengths, dtype=torch.int32), stride=OWN + SAMPLED)
    ids = [i for row in CLICKS for i in row]
    sequence = KeyedJaggedTensor(keys=list(SEQUENCE), values=torch.tensor(ids + [(3 * i) % 10 for i in ids]),
                                 lengths=torch.tensor([len(r) for r in CLICKS] * 2, dtype=torch.int32))
    return Batch(torch.randn(OWN + SAMPLED, 2), sparse, {"click": torch.ones(OWN)}, torch.ones(OWN), OWN, sequence=sequence)


def _build(registries, ctx: Optional[ModelContext] = None, **options):
    entry = registries["model"].get("mind", "model.type")
    return entry.build(entry.config(**options), ctx or _ctx())


@pytest.fixture(scope="module")
def registries():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return collect_registries(make_plugin_manager())


# --- TorchEasyRec's formula, in plain torch ---------------------------------------------------

def _linears(module: nn.Module) -> list[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    return [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
            for m in module.modules() if isinstance(m, nn.Linear)]


def _linear(x: torch.Tensor, layer: tuple[torch.Tensor, Optional[torch.Tensor]]) -> torch.Tensor:
    weight, bias = layer
    return x @ weight.T + (0 if bias is None else bias)


def _mlp_then_linear(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """TorchEasyRec's ``user_mlp`` / ``hist_seq_mlp``: ``MLP(hidden_units[:-1])`` then ``Linear``."""
    layers = _linears(module)
    for layer in layers[:-1]:
        x = torch.relu(_linear(x, layer))
    return _linear(x, layers[-1]) if layers else x


def _pooled(names, batch: Batch, tables: dict[str, torch.Tensor]) -> torch.Tensor:
    dense = {"d0": 0, "d1": 1}
    parts = [batch.dense[:, dense[n]:dense[n] + 1] for n in names if n in dense]
    jagged = batch.sparse.to_dict()
    for name in (n for n in names if n not in dense):
        parts.append(torch.stack([tables[name][ids].mean(0) if len(ids) else torch.zeros(tables[name].shape[1])
                                  for ids in jagged[name].to_dense()]))
    return torch.cat(parts, dim=1)


def _history(batch: Batch, tables: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """TorchEasyRec's ``hist.sequence`` ``[B, L, sum of widths]`` (zeros after a row's ids) and
    ``hist.sequence_length``."""
    jagged = batch.sequence.to_dict()
    rows = []
    for r in range(OWN):
        parts = [tables[n][jagged[n].to_dense()[r]] for n in SEQUENCE]
        row = torch.cat(parts, dim=1)
        rows.append(torch.cat([row, torch.zeros(MAX_LEN - row.shape[0], row.shape[1])]))
    return torch.stack(rows), jagged["clicks__item"].lengths()


def sequence_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.arange(0, max_len).unsqueeze(0) < lengths.unsqueeze(1)


def squash(inputs: torch.Tensor, power: float) -> torch.Tensor:
    norm = torch.max(torch.linalg.norm(inputs, dim=-1, keepdim=True), torch.tensor(1e-7))
    return torch.pow(torch.square(norm) / (1 + torch.square(norm)), power) / norm * inputs


def capsule_layer(inputs: torch.Tensor, seq_len: torch.Tensor, bilinear: torch.Tensor, init: torch.Tensor,
                  cfg: MINDConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """TorchEasyRec's ``CapsuleLayer.forward`` with its routing logits' draw ``init`` given."""
    seq_mask = sequence_mask(seq_len, MAX_LEN)
    inputs = inputs * seq_mask.unsqueeze(-1).float()
    if cfg.const_caps_num:
        n_high = torch.zeros_like(seq_len, dtype=torch.float32) + cfg.max_k
    else:
        n_high = torch.maximum(torch.Tensor([1]), torch.minimum(torch.Tensor([cfg.max_k]), torch.log2(seq_len.float())))
    capsule_mask = sequence_mask(n_high, cfg.max_k)
    logits = init.detach() * cfg.routing_logits_stddev
    thresh = (capsule_mask.unsqueeze(1).float() * 2 - 1) * float("inf")
    low = torch.einsum("bsl, lh -> bsh", inputs, bilinear)
    low_detach = low.detach()
    low_detach_norm = F.normalize(low_detach, p=2.0, dim=-1)
    high = torch.Tensor([0])
    for i in range(cfg.num_iters):
        logits = torch.minimum(logits, thresh)
        logits = F.softmax(logits * cfg.routing_logits_scale, dim=2) * seq_mask.unsqueeze(2).float()
        if i + 1 < cfg.num_iters:
            high = torch.einsum("bsh,bsk->bkh", low_detach, logits)
            logits = logits + torch.einsum("bkh, bsh -> bsk", high, low_detach_norm)
        else:
            high = squash(torch.einsum("bsh,bsk->bkh", low, logits), cfg.squash_pow)
    return high * capsule_mask.unsqueeze(-1).float(), capsule_mask


def mind_ref(model: nn.Module, batch: Batch, cfg: MINDConfig, tables: dict[str, torch.Tensor],
             bilinear: torch.Tensor, init: torch.Tensor) -> dict[str, torch.Tensor]:
    """TorchEasyRec's MIND on ``batch``: similarities, embeddings and the user's interests."""
    cosine = cfg.similarity == "cosine"
    user = _mlp_then_linear(_pooled(cfg.user_features, batch, tables)[:OWN], model.user_mlp)
    sequence, seq_len = _history(batch, tables)
    high, mask = capsule_layer(_mlp_then_linear(sequence, model.history_mlp), seq_len, bilinear, init, cfg)
    interests = torch.cat([torch.tile(user.unsqueeze(1), [1, high.shape[1], 1]), high], dim=-1)
    interests = interests * mask.unsqueeze(-1).float()
    for layer in _linears(model.concat_mlp):
        interests = torch.relu(_linear(interests, layer))
    interests = _linear(interests * mask.unsqueeze(-1).float(), _linears(model.user_output)[0])
    interests = F.normalize(interests, p=2.0, dim=-1) if cosine else interests
    items = _pooled(cfg.item_features, batch, tables)
    for layer in _linears(model.item_mlp):
        items = torch.relu(_linear(items, layer))
    items = _linear(items, _linears(model.item_output)[0])
    items = F.normalize(items, p=2.0, dim=1) if cosine else items
    # label_aware_attention
    weight = torch.einsum("bkd, bd->bk", interests, items[:OWN])
    weight = torch.minimum(weight, (mask.float() * 2 - 1) * float("inf")).unsqueeze(-1) * cfg.simi_pow
    user_emb = torch.sum(torch.multiply(F.softmax(weight, dim=1), interests), dim=1)
    pos = torch.sum(torch.multiply(user_emb, items[:OWN]), dim=-1, keepdim=True)
    return {
        "similarity": torch.mm(user_emb, items[:OWN].T) / cfg.temperature,  # in_batch_negative
        "sampled_similarity": torch.cat([pos, torch.matmul(user_emb, items[OWN:].transpose(0, 1))], dim=-1) / cfg.temperature,
        "user_embedding": user_emb,
        "item_embedding": items[:OWN],
        "user_interests": interests,
    }


def _tables(model: nn.Module) -> dict[str, torch.Tensor]:
    tables = {n: model.ebc.embedding_bags[f"{n}_emb"].weight for n in POOLED}
    for collection in model.sequences.collections.values():
        tables.update({n: collection.embeddings[f"{n}clicks_emb"].weight for n in SEQUENCE
                       if f"{n}clicks_emb" in collection.embeddings})
    return {n: t.detach().clone().requires_grad_() for n, t in tables.items()}


def _module_table(model: nn.Module, name: str) -> torch.Tensor:
    if name in POOLED:
        return model.ebc.embedding_bags[f"{name}_emb"].weight
    return next(c.embeddings[f"{name}clicks_emb"].weight for c in model.sequences.collections.values()
                if f"{name}clicks_emb" in c.embeddings)


@pytest.mark.parametrize("options, training", [
    # TorchEasyRec's example (cosine, squash_pow 0.2, simi_pow 20, concat without bias), trained:
    # a fresh draw for the routing's start, dynamic interest counts (1, 1, 2, 3 of 4)
    ({"user_hidden_units": (5, 3), "history_hidden_units": (5, 4), "max_k": 4, "high_dim": 3, "squash_pow": 0.2,
      "concat_hidden_units": (6, 5), "concat_bias": False, "item_hidden_units": (4,), "output_dim": 3, "simi_pow": 20.0,
      "temperature": 0.3}, True),
    # inner product, every user max_k interests, no history MLP, one routing round, evaluated:
    # the start is the model's fixed buffer
    ({"user_hidden_units": (4, 2), "history_hidden_units": (), "max_k": 2, "high_dim": 4, "num_iters": 1,
      "const_caps_num": True, "concat_hidden_units": (3,), "item_hidden_units": (5, 3), "output_dim": 2,
      "similarity": "inner_product", "temperature": 1.0, "simi_pow": 2.0}, False),
    # a start of zeros, two rounds, off-default scale and stddev, trained
    ({"user_hidden_units": (3, 3), "history_hidden_units": (3,), "max_k": 3, "high_dim": 2, "num_iters": 2,
      "routing_init": "zeros", "routing_logits_scale": 5.0, "routing_logits_stddev": 0.5, "concat_hidden_units": (4,),
      "item_hidden_units": (), "output_dim": 4}, True),
    # a soft routing (scale 1): its early rounds' detached capsules show in the bilinear matrix's gradient
    ({"user_hidden_units": (3, 3), "history_hidden_units": (4,), "max_k": 3, "high_dim": 3, "num_iters": 3,
      "routing_logits_scale": 1.0, "concat_hidden_units": (8,), "item_hidden_units": (3,), "output_dim": 3}, True),
])
def test_mind_equals_torcheasyrecs_formula(registries, options, training):
    torch.manual_seed(7)
    cfg = MINDConfig(user_features=("user", "d0"), history="clicks", item_features=("item", "cate", "d1"), **options)
    model = _build(registries, **attrs.asdict(cfg, recurse=False)).train(training)
    batch = _batch()
    torch.manual_seed(11)
    out = model(batch)
    if cfg.routing_init == "zeros":
        init = torch.zeros(OWN, MAX_LEN, cfg.max_k)
    elif training:
        torch.manual_seed(11)
        init = torch.randn(OWN, MAX_LEN, cfg.max_k)  # what the model drew
    else:
        init = model.capsules.routing_init.expand(OWN, -1, -1)
    tables = _tables(model)
    bilinear = model.capsules.bilinear.detach().clone().requires_grad_()
    expected = mind_ref(model, batch, cfg, tables, bilinear, init)
    assert set(out) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(out[name], value)
    assert out["user_interests"].shape == (OWN, cfg.max_k, cfg.output_dim)
    assert out["sampled_similarity"].shape == (OWN, 1 + SAMPLED)
    (out["similarity"].sum() + out["sampled_similarity"].sum()).backward()
    (expected["similarity"].sum() + expected["sampled_similarity"].sum()).backward()
    assert bilinear.grad.abs().sum() > 0  # the capsules reach the similarities (no dead layer hides them)
    torch.testing.assert_close(model.capsules.bilinear.grad, bilinear.grad)
    for name, table in tables.items():
        torch.testing.assert_close(_module_table(model, name).grad, table.grad)


def test_a_user_has_log2_of_its_clicks_interests_at_least_one_at_most_max_k(registries):
    torch.manual_seed(0)
    model = _build(registries, user_features=("user", "d0"), history="clicks", item_features=("item", "cate", "d1"),
                   max_k=2, output_dim=3).eval()
    kept = (model(_batch())["user_interests"].abs().sum(dim=-1) > 0).sum(dim=1)
    assert kept.tolist() == [1, 1, 2, 2]  # 0, 1, 3 and 6 clicks; 6 would have 3 with max_k >= 3
    model = _build(registries, user_features=("user", "d0"), history="clicks", item_features=("item", "cate", "d1"),
                   max_k=2, const_caps_num=True, output_dim=3).eval()
    assert ((model(_batch())["user_interests"].abs().sum(dim=-1) > 0).sum(dim=1)).tolist() == [2, 2, 2, 2]


def test_the_routing_start_follows_the_seed_in_training_and_is_saved_for_evaluation(registries):
    torch.manual_seed(0)
    model = _build(registries, user_features=("user", "d0"), history="clicks", item_features=("item", "cate", "d1"),
                   max_k=4, output_dim=3)
    batch = _batch()
    torch.manual_seed(5)
    first = model(batch)["user_interests"]
    second = model(batch)["user_interests"]
    torch.manual_seed(5)
    again = model(batch)["user_interests"]
    torch.testing.assert_close(again, first)  # the same seed, the same draws: a resumed run trains the same
    assert not torch.allclose(first, second)  # a fresh draw per batch
    model.eval()
    torch.testing.assert_close(model(batch)["user_interests"], model(batch)["user_interests"])
    assert model.state_dict()["capsules.routing_init"].shape == (MAX_LEN, 4)  # exported and checkpointed


def test_mind_exports_the_user_tower_with_its_interests_and_the_item_tower(registries):
    model = _build(registries, user_features=("user", "d0"), history="clicks", item_features=("item", "cate", "d1"))
    assert model.serving_programs == {
        "user_tower": {"outputs": ["user_interests"], "features": ["user", "d0", "clicks"]},
        "item_tower": {"outputs": ["item_embedding"], "features": ["item", "cate", "d1"]},
    }


def _problems(excinfo) -> str:
    return "\n".join(str(p) for p in excinfo.value.problems)


def test_mind_names_what_keeps_it_from_building(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, user_features=("user", "d0", "cate"), history="click", item_features=("item", "cate"))
    text = _problems(excinfo)
    assert "model.history: no [[features.sequence]] group named 'click' (groups: clicks); did you mean 'clicks'?" in text
    assert "model.item_features: cate also in model.user_features; a feature belongs to one tower" in text
    assert ("features.dense[1]: 'd1' is in neither tower: add it to model.user_features or model.item_features, "
            "or remove it") in text
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, _ctx(groups=()), user_features=("user", "d0"), history="clicks", item_features=("item", "cate", "d1"))
    assert ("features.sequence: mind needs the user's behaviour as a [[features.sequence]] group; add one and name it "
            "in model.history") in _problems(excinfo)
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, _ctx(groups=("clicks", "views")), user_features=("user", "d0"), history="clicks",
               item_features=("item", "cate", "d1"))
    assert "features.sequence[1]: 'views' is not model.history ('clicks'): mind reads one sequence group; remove it" in _problems(excinfo)
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, user_features=("user", "item", "cate", "d0"), history="clicks", item_features=("d1",))
    assert "model.item_features: the item tower needs at least one id feature" in _problems(excinfo)


@pytest.mark.parametrize("option, value, message", [
    ("user_hidden_units", (), "needs at least one entry"),
    ("concat_hidden_units", (), "needs at least one entry"),
    ("simi_pow", 0.0, "must be > 0.0"),
    ("routing_logits_scale", -1.0, "must be > 0.0"),
    ("max_k", 0, "must be >= 1"),
])
def test_mind_options_out_of_range_are_refused(option, value, message):
    with pytest.raises(ValueError, match=message):
        MINDConfig(user_features=("user",), history="clicks", item_features=("item",), **{option: value})
