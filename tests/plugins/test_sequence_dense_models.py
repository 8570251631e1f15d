"""Dense sequences in the models: the group's ``[B, max_len, D]`` view is TorchEasyRec's layout
(embeddings, then raw values, per position; the query zero-padded), and din and mmoe through
each encoder train on it."""

from __future__ import annotations

import pytest
import torch

from tests.plugins.test_sequence_models import CLICKS, DIM, MAX_LEN, ROWS, registries  # noqa: F401 (a fixture)
from tests.plugins.test_sequence_models import _batch as _id_batch
from tzrun.data.batch import Batch
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SequenceGroup, SparseFeature
from tzrun.sequence import SequenceEmbeddings
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig
from tzrun_plugins.models.din import DINAttentionConfig, DINTowerConfig

K = 2  # dense sequences: a price and a time gap per click


def _ctx() -> ModelContext:
    sparse = (SparseFeature("user", "user", "user_emb", num_buckets=10), SparseFeature("item", "item", "item_emb", num_buckets=10))
    clicks = SequenceGroup("clicks", MAX_LEN, (SparseFeature("clicks__item", "clicks", "item_emb", num_buckets=10),),
                           ("item",), dense=(DenseFeature("clicks__price", "price"), DenseFeature("clicks__gap", "gap")))
    return ModelContext(
        (DenseFeature("d0", "d0"), DenseFeature("d1", "d1")), sparse, (EmbeddingTable("user_emb", 10, DIM, ("user",)),),
        torch.device("cpu"), ("click", "buy"), sequence_groups=(clicks,),
        sequence_tables=(EmbeddingTable("item_emb", 10, DIM, ("clicks__item", "item")),),
    )


def _values(scale: float = 1.0) -> torch.Tensor:
    """``[ROWS, MAX_LEN, K]``: row r's i-th click has price ``scale * (r + i)`` and gap ``-i``, zeros after."""
    out = torch.zeros(ROWS, MAX_LEN, K)
    for r, row in enumerate(CLICKS):
        for i in range(len(row)):
            out[r, i] = torch.tensor([scale * (r + i), -float(i)])
    return out


def _batch(scale: float = 1.0, items=(1, 2, 3, 4)) -> Batch:
    """test_sequence_models' batch with clicks of either label and the dense sequences."""
    batch = _id_batch(items)
    batch.labels["click"] = torch.tensor([0.0, 1.0, 0.0, 1.0])
    batch.sequence_dense = {"clicks": _values(scale)}
    return batch


def test_the_sequence_view_is_torcheasyrecs_layout():
    """TorchEasyRec's ``SequenceEmbeddingGroupImpl``: each sequence feature padded to the longest
    row and concatenated on the last axis, id embeddings then the raw feature; DINEncoder pads
    the query with zeros to the sequence's width."""
    torch.manual_seed(0)
    embeddings = SequenceEmbeddings(_ctx())
    table = embeddings.collections["dim_8"].embeddings["item_emb"].weight.detach()
    out = embeddings(_batch())
    seq, mask = out.sequence("clicks")
    expected = torch.zeros(ROWS, MAX_LEN, DIM + K)
    for r, row in enumerate(CLICKS):
        for i, item in enumerate(row):
            expected[r, i] = torch.cat([table[item], _values()[r, i]])
    torch.testing.assert_close(seq, expected)
    assert mask.tolist() == [[i < len(row) for i in range(MAX_LEN)] for row in CLICKS]
    query = torch.nn.functional.pad(table[torch.tensor([1, 2, 3, 4])], (0, K))
    torch.testing.assert_close(out.query("clicks"), query)


def _train(model, steps: int = 3) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        batch = _batch()
        logits = next(v for k, v in model(batch).items() if k.startswith("logits"))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels["click"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_din_trains_on_a_dense_sequence_and_its_attention_reads_it(registries):
    torch.manual_seed(0)
    model = registries["model"].get("din", "model.type")
    model = model.build(model.config(towers=(DINTowerConfig(hidden_units=(8,)),), final_hidden_units=(4,),
                                     din_towers=(DINAttentionConfig("clicks", attention_hidden_units=(8,)),)), _ctx())
    losses = _train(model)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        assert not torch.allclose(model(_batch(scale=1.0))["logits"], model(_batch(scale=3.0))["logits"])


@pytest.mark.parametrize(("encoder", "options", "width"), [
    ("mean", {}, DIM + K), ("target_attention", {}, DIM + K), ("self_attention", {"num_heads": 1}, DIM + K),
    ("multi_window_din", {"window_lengths": (1, 2)}, 3 * (DIM + K)), ("simple_attention", {}, DIM + K),
    ("self_attention_tzrec", {"attention_dim": 12, "num_heads": 3}, 12),
])
def test_mmoe_trains_on_a_dense_sequence_through_each_encoder(registries, encoder, options, width):
    from tzrun_plugins.models.mmoe import MMoETaskConfig

    torch.manual_seed(0)
    entry = registries["model"].get("mmoe", "model.type")
    model = entry.build(entry.config(tasks=(MMoETaskConfig("ctr", (4,)),), num_experts=2, expert_hidden_units=(8,),
                                     sequence_encoders=(SequenceEncoderConfig("clicks", encoder, **options),)), _ctx())
    assert model.sequence_inputs.width == width
    losses = _train(model)
    assert all(torch.isfinite(torch.tensor(losses)))
    model.eval()
    with torch.no_grad():
        assert not torch.allclose(model(_batch(scale=1.0))["logits/ctr"], model(_batch(scale=3.0))["logits/ctr"])
