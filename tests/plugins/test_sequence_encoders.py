"""The sequence encoders of din, dssm and mmoe: masking, empty rows, candidate-dependent weights."""

from __future__ import annotations

import pytest
import torch

from tzrun_plugins.models._sequence_layers import (
    MeanEncoder, MultiWindowDIN, SelfAttentionEncoder, SimpleAttention, TargetAttention, TorchEasyRecSelfAttention, masked_softmax,
)

B, L, D = 4, 6, 8


def _padded(lengths=(0, 1, 3, L), seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-aligned padded batch (zeros past each row's length) and its mask."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.arange(L).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    sequence = torch.randn(len(lengths), L, D, generator=gen) * mask.unsqueeze(-1)
    return sequence, mask


def _encoders() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [MeanEncoder(), TargetAttention(D, (16, 8)), TargetAttention(D, (16,), softmax=False),
            SelfAttentionEncoder(D, max_len=L, num_heads=2, num_layers=2, feedforward_dim=16),
            TargetAttention(D, (16, 8), activation="dice"), SimpleAttention(), TorchEasyRecSelfAttention(D, D, num_heads=2),
            MultiWindowDIN(D, (1, 2, 2), (8,), "dice"), MultiWindowDIN(D, (2, 3), (8,), recent_first=True)]


#: the encoders whose output is not one [B, D] vector: multi-window DIN's windows, then the query
WINDOWS = {7: 3, 8: 2}


def test_target_attention_weights_follow_the_candidate_and_skip_padding():
    torch.manual_seed(0)
    attention = TargetAttention(D, (16, 8))
    sequence, mask = _padded()
    query = torch.randn(B, D)
    weights = attention.weights(sequence, mask, query)
    assert weights.shape == (B, L)
    assert torch.all(weights[~mask] == 0.0)  # padded positions weigh nothing
    torch.testing.assert_close(weights[1:].sum(dim=1), torch.ones(B - 1))  # softmax over the real ids
    assert torch.all(weights[0] == 0.0)  # an empty row: no weights, no NaN
    other = attention.weights(sequence, mask, query + torch.randn(B, D))
    assert not torch.allclose(other[2:], weights[2:])  # another candidate, other weights
    assert torch.all(other[~mask] == 0.0)
    encoded = attention(sequence, mask, query)
    torch.testing.assert_close(encoded, torch.einsum("bl,bld->bd", weights, sequence))


def test_target_attention_without_softmax_keeps_the_raw_scores_of_real_ids():
    torch.manual_seed(0)
    attention = TargetAttention(D, (16,), softmax=False)
    sequence, mask = _padded()
    query = torch.randn(B, D)
    weights = attention.weights(sequence, mask, query)
    assert torch.all(weights[~mask] == 0.0)
    q = query[3].expand(L, D)
    s = sequence[3]
    raw = attention.score(attention.mlp(torch.cat([q, s, q - s, q * s], dim=-1))).squeeze(-1)
    torch.testing.assert_close(weights[3], raw)


def test_target_attention_needs_a_query():
    sequence, mask = _padded()
    with pytest.raises(ValueError, match="needs a query"):
        TargetAttention(D, (4,))(sequence, mask)


def test_masked_softmax_of_a_row_with_no_real_position_is_zeros():
    scores = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    weights = masked_softmax(scores, mask)
    torch.testing.assert_close(weights[0], torch.tensor([1 / (1 + torch.e), torch.e / (1 + torch.e), 0.0]))
    assert torch.all(weights[1] == 0.0)


@pytest.mark.parametrize("index", range(9))
@pytest.mark.parametrize("train", [True, False])
def test_every_encoder_gives_zeros_for_an_empty_row_and_ignores_padding(index, train):
    encoder = _encoders()[index].train(train)
    sequence, mask = _padded()
    sequence.requires_grad_(train)
    query = torch.randn(B, D)
    with torch.set_grad_enabled(train):
        out = encoder(sequence, mask, query)
        windows = WINDOWS.get(index, 0)
        assert out.shape == (B, (windows + 1) * D if windows else D) and torch.isfinite(out).all()
        assert torch.all(out[0, :windows * D or D] == 0.0)  # multi-window DIN: zero windows, then the query
        if windows:
            torch.testing.assert_close(out[:, windows * D:], query)
        noisy = sequence + torch.randn(B, L, D) * (~mask).unsqueeze(-1)  # garbage in the padding
        torch.testing.assert_close(encoder(noisy, mask, query), out)
    if train:
        out.sum().backward()
        assert torch.all(sequence.grad[~mask] == 0.0)  # nothing flows into the padding


@pytest.mark.parametrize("index", range(9))
def test_encoders_take_any_length_up_to_max_len(index):
    encoder = _encoders()[index].eval()
    sequence, mask = _padded(lengths=(0, 1, 2, 3))
    query = torch.randn(B, D)
    full = encoder(sequence, mask, query)
    short = encoder(sequence[:, :3], mask[:, :3], query)  # a batch padded only to its longest row
    torch.testing.assert_close(short, full)
    assert encoder(sequence[:, :1], mask[:, :1], query).shape == full.shape


def test_mean_encoder_is_the_mean_of_the_real_ids():
    sequence, mask = _padded()
    out = MeanEncoder()(sequence, mask)
    torch.testing.assert_close(out[2], sequence[2, :3].mean(dim=0))
    torch.testing.assert_close(out[3], sequence[3].mean(dim=0))


def test_self_attention_positions_count_from_the_most_recent_id():
    torch.manual_seed(0)
    encoder = SelfAttentionEncoder(D, max_len=L, num_heads=2).eval()
    sequence, mask = _padded(lengths=(2, 4, 4, 4))
    # row 0's two ids equal row 1's two most recent: same positions 1, 0 but row 1 sees two more ids
    sequence[1, 2:4] = sequence[0, 0:2]
    out = encoder(sequence, mask)
    alone = encoder(sequence[1:2, 2:4].clone(), mask[:1, :2].clone())
    torch.testing.assert_close(alone[0], out[0])
    assert not torch.allclose(out[0], out[1])
    assert encoder.positions.num_embeddings == L
