"""The plain-torch twin of an EmbeddingBagCollection (what an export looks ids up with) pools
what TorchRec's own collection pools, on each of its paths: one width read by every feature
and summed (one lookup, no masks, the output already stacked in key order), several widths
and mean pooling (masked lookups), per-id weights."""

from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

from tzrun_serving.plain import PlainFeatures, swap_embedding_collections

FEATURES = ["a", "b", "c"]


def _tables(case: str, weighted: bool) -> list[EmbeddingBagConfig]:
    if case == "one-width-summed":
        return [EmbeddingBagConfig(name=f"t_{f}", num_embeddings=50, embedding_dim=8, feature_names=[f]) for f in FEATURES]
    b = PoolingType.SUM if weighted else PoolingType.MEAN  # TorchRec weights sums only
    return [EmbeddingBagConfig(name="t_a", num_embeddings=50, embedding_dim=8, feature_names=["a"]),
            EmbeddingBagConfig(name="t_b", num_embeddings=30, embedding_dim=4, feature_names=["b"], pooling=b),
            EmbeddingBagConfig(name="t_c", num_embeddings=40, embedding_dim=8, feature_names=["c"])]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("case", ["one-width-summed", "two-widths-and-a-mean"])  # weighted: two widths
def test_the_plain_twin_pools_what_torchrec_pools(case, weighted):
    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.ebc = EmbeddingBagCollection(tables=_tables(case, weighted), is_weighted=weighted)
    rows = 5
    lengths = torch.tensor([[1, 0, 3, 2, 1], [2, 2, 0, 1, 4], [1, 1, 1, 0, 3]])
    ids = torch.cat([torch.randint(0, 30, (int(n),)) for n in lengths.sum(dim=1)])
    weights = torch.rand(ids.shape[0]) if weighted else None
    expected = holder.ebc(KeyedJaggedTensor(keys=FEATURES, values=ids, lengths=lengths.reshape(-1), weights=weights,
                                            stride=rows))
    swap_embedding_collections(holder, FEATURES)
    plain = holder.ebc
    assert plain.stacked == (case == "one-width-summed") and plain.whole == ([True] if plain.stacked else [False, False])
    got = plain(PlainFeatures(FEATURES, ids, lengths, weights))
    assert got.keys() == expected.keys() == FEATURES
    torch.testing.assert_close(got.values(), expected.values(), rtol=1e-6, atol=1e-6)
    for name, value in expected.to_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6)
    assert got.offset_per_key() == expected.offset_per_key()
