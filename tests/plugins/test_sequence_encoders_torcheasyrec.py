"""multi_window_din, simple_attention, self_attention_tzrec and Dice equal TorchEasyRec's formulas
(tzrec/modules/sequence.py and activation.py at 54cac31) on fixed inputs.

Each reference below is TorchEasyRec's forward restated in plain torch over the padded batch
TorchEasyRec builds (zeros past each row's length, lengths beside), with our module's weights
copied in.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tzrun_plugins.models._dice import Dice
from tzrun_plugins.models._sequence_layers import (
    MultiWindowDIN, SimpleAttention, TargetAttention, TorchEasyRecSelfAttention, recent_first_order,
)

D = 8
PAD = -(2**31) + 1  # TorchEasyRec's score of a padded position


def _padded(lengths, width=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    mask = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    sequence = torch.randn(len(lengths), width, D, generator=gen) * mask.unsqueeze(-1)
    return sequence, mask, torch.tensor(lengths), torch.randn(len(lengths), D, generator=gen)


# --- TorchEasyRec's formulas -------------------------------------------------------------

def tzrec_dice(x, alpha, bn):
    """Dice(hidden_size, dim=3) of [B, L, C]; ``bn`` a BatchNorm1d(C, affine=False)."""
    xt = x.transpose(1, 2)
    p = torch.sigmoid(bn(xt))
    return (alpha.unsqueeze(1) * (1 - p) * xt + p * xt).transpose(1, 2)


def tzrec_mlp(x, linears, dices):
    """MLP(dim=3): Linear then the activation (ReLU, or Dice with ``dices``) per layer."""
    for i, linear in enumerate(linears):
        x = linear(x)
        x = tzrec_dice(x, *dices[i]) if dices else torch.relu(x)
    return x


def tzrec_din(sequence, lengths, query, linears, dices, score):
    """DINEncoder.forward."""
    mask = torch.arange(sequence.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
    queries = query.unsqueeze(1).expand(-1, sequence.size(1), -1)
    attn = score(tzrec_mlp(torch.cat([queries, sequence, queries - sequence, queries * sequence], dim=-1), linears, dices))
    scores = torch.where(mask.unsqueeze(1), attn.transpose(1, 2), torch.full_like(attn.transpose(1, 2), PAD))
    return torch.matmul(F.softmax(scores, dim=-1), sequence).squeeze(1)


def tzrec_simple_attention(sequence, lengths, query):
    """SimpleAttention.forward."""
    mask = torch.arange(sequence.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
    attn = torch.matmul(sequence, query.unsqueeze(2)).squeeze(2)
    scores = F.softmax(torch.where(mask, attn, torch.full_like(attn, PAD)), dim=-1)
    return torch.matmul(scores.unsqueeze(1), sequence).squeeze(1)


def tzrec_multi_window_din(sequence, lengths, query, windows, linears, dices, score, prelu_weight):
    """MultiWindowDINEncoder.forward (windows counted from a row's first id)."""
    max_len = sequence.size(1)
    mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
    queries = query.unsqueeze(1).expand(-1, max_len, -1)
    attn = score(tzrec_mlp(torch.cat([sequence, queries * sequence, queries], dim=-1), linears, dices))
    attn = F.prelu(attn, prelu_weight)
    att_sequences = attn * mask.unsqueeze(2) * sequence
    padded = F.pad(att_sequences, (0, 0, 0, sum(windows) - max_len)).transpose(0, 1)
    result = torch.segment_reduce(padded, reduce="sum", lengths=torch.tensor(windows), axis=0).transpose(0, 1)
    cumsum = torch.tensor(np.cumsum([0] + list(windows)[:-1]))
    segment = torch.min(lengths.unsqueeze(1) - cumsum.unsqueeze(0), torch.tensor(windows))
    result = result / torch.max(segment, torch.ones_like(segment)).unsqueeze(2)
    return torch.cat([result, query.unsqueeze(1)], dim=1).reshape(result.shape[0], -1)


def tzrec_self_attention(sequence, lengths, q, k, v, mha, num_heads):
    """SelfAttentionEncoder.forward (its _attention_mask: a pair of positions attends when both are real)."""
    batch, max_len, _ = sequence.size()
    valid = (torch.arange(max_len).unsqueeze(0).expand(batch, max_len) < lengths.unsqueeze(1)).int()
    attn_mask = ~(valid.unsqueeze(2) * valid.unsqueeze(1)).bool()
    attn_mask = attn_mask.repeat_interleave(repeats=num_heads, dim=0)
    out, _ = mha(q(sequence), k(sequence), v(sequence), attn_mask=attn_mask)
    out = torch.nan_to_num(out, nan=0.0)
    return out.sum(dim=1) / torch.clamp_min(lengths, 1).unsqueeze(1)


# --- helpers ----------------------------------------------------------------------------

def _dices_of(module, seed=1):
    """The (alpha, BatchNorm1d) pairs equal to each Dice of ``module``, alphas set away from 0."""
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for dice in (m for m in module.modules() if isinstance(m, Dice)):
        with torch.no_grad():
            dice.alpha.copy_(torch.randn(dice.alpha.shape, generator=gen))
        bn = nn.BatchNorm1d(dice.alpha.numel(), affine=False)
        bn.train(module.training)
        bn.running_mean.copy_(dice.running_mean)
        bn.running_var.copy_(dice.running_var)
        pairs.append((dice.alpha.detach().clone(), bn))
    return pairs


def _linears(mlp):
    return [m for m in mlp if isinstance(m, nn.Linear)]


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# --- Dice -------------------------------------------------------------------------------

def test_dice_equals_torcheasyrec_in_training_and_evaluation_with_the_same_running_statistics():
    torch.manual_seed(0)
    dice = Dice(D).train()
    (alpha, bn), = _dices_of(nn.Sequential(dice))
    for step in range(3):
        x = torch.randn(4, 5, D) * (step + 1) + step  # full rows: every position real
        _close(dice(x, torch.ones(4, 5, dtype=torch.bool)), tzrec_dice(x, alpha, bn))
    _close(dice.running_mean, bn.running_mean)
    _close(dice.running_var, bn.running_var)  # the unbiased variance, momentum 0.1
    dice.eval(), bn.eval()
    x = torch.randn(3, 6, D)
    _close(dice(x), tzrec_dice(x, alpha, bn))  # the running statistics, whatever the batch


def test_dice_statistics_count_the_real_positions_only():
    torch.manual_seed(0)
    dice = Dice(D).train()
    (alpha, bn), = _dices_of(nn.Sequential(dice))
    sequence, mask, _, _ = _padded([0, 2, 5, 3])
    x = sequence * 3 + 1 + torch.randn_like(sequence) * (~mask).unsqueeze(-1) * 100  # garbage in the padding
    out = dice(x, mask)
    # TorchEasyRec's formula over the real positions alone, as one [N, C] batch (its Dice dim=2)
    real = x[mask]
    p = torch.sigmoid(bn(real))
    _close(out[mask], alpha * (1 - p) * real + p * real)
    _close(dice.running_mean, bn.running_mean)
    _close(dice.running_var, bn.running_var)
    before = dice.running_mean.clone()
    dice(x, torch.zeros_like(mask))  # a batch without a real position moves nothing
    torch.testing.assert_close(dice.running_mean, before)


# --- target attention (din_encoder / din_towers) with Dice -------------------------------

@pytest.mark.parametrize("training", [True, False])
def test_target_attention_with_dice_equals_torcheasyrecs_din_encoder(training):
    torch.manual_seed(0)
    attention = TargetAttention(D, (16, 8), activation="dice").train(training)
    dices = _dices_of(attention.mlp)
    # training: full rows (TorchEasyRec's statistics also count padding); evaluation: any rows
    sequence, _, lengths, query = _padded([5, 5, 5, 5] if training else [0, 1, 3, 5])
    mask = torch.arange(sequence.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
    want = tzrec_din(sequence, lengths, query, _linears(attention.mlp), dices, attention.score)
    _close(attention(sequence, mask, query), want)


# --- simple_attention --------------------------------------------------------------------

def test_simple_attention_equals_torcheasyrecs():
    sequence, mask, lengths, query = _padded([0, 1, 3, 6, 4])
    _close(SimpleAttention()(sequence, mask, query), tzrec_simple_attention(sequence, lengths, query))


# --- multi_window_din --------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["relu", "dice"])
@pytest.mark.parametrize("width", [4, 7, 12])  # shorter than the windows, within, longer (cut)
def test_multi_window_din_equals_torcheasyrecs_for_most_recent_first_rows(activation, width):
    torch.manual_seed(0)
    windows = [1, 2, 4]
    encoder = MultiWindowDIN(D, windows, (16, 8), activation, recent_first=True).eval()
    with torch.no_grad():
        encoder.prelu.weight.fill_(0.3)
    dices = _dices_of(encoder.mlp)
    lengths = [0, 1, 2, min(4, width), width]
    sequence, mask, lengths_t, query = _padded(lengths, width)
    want = tzrec_multi_window_din(sequence, lengths_t, query, windows, _linears(encoder.mlp), dices, encoder.score,
                                  encoder.prelu.weight)
    got = encoder(sequence, mask, query)
    assert got.shape == (5, (len(windows) + 1) * D)
    _close(got, want)


def test_multi_window_din_in_training_with_dice_equals_torcheasyrecs_on_full_rows():
    torch.manual_seed(0)
    encoder = MultiWindowDIN(D, [2, 3], (8,), "dice", recent_first=True).train()
    dices = _dices_of(encoder.mlp)
    sequence, mask, lengths, query = _padded([6, 6, 6])
    want = tzrec_multi_window_din(sequence, lengths, query, [2, 3], _linears(encoder.mlp), dices, encoder.score,
                                  encoder.prelu.weight)
    _close(encoder(sequence, mask, query), want)


def test_multi_window_din_counts_windows_from_the_last_id_for_oldest_first_rows():
    """keep = "last" / "all": the end of a row is its most recent id, so the first window holds the
    last ids; the same rows stored most recent first (keep = "first") give the same output."""
    torch.manual_seed(0)
    oldest_first = MultiWindowDIN(D, [1, 2], (8,), recent_first=False).eval()
    newest_first = MultiWindowDIN(D, [1, 2], (8,), recent_first=True).eval()
    newest_first.load_state_dict(oldest_first.state_dict())
    sequence, mask, lengths, query = _padded([0, 1, 3, 5])
    reversed_rows = torch.stack([torch.cat([row[:n].flip(0), row[n:]]) for row, n in zip(sequence, lengths.tolist())])
    torch.testing.assert_close(recent_first_order(sequence, mask), reversed_rows)
    out = oldest_first(sequence, mask, query)
    _close(out, newest_first(reversed_rows, mask, query))
    # row 3's first window is its last id alone (weight times the id, divided by 1)
    weight = oldest_first.prelu(oldest_first.score(oldest_first.mlp(torch.cat(
        [sequence[3, 4], query[3] * sequence[3, 4], query[3]]).unsqueeze(0))))
    _close(out[3, :D], (weight * sequence[3, 4]).squeeze(0))


# --- self_attention_tzrec ----------------------------------------------------------------

def _tzrec_twin(encoder: TorchEasyRecSelfAttention):
    mha = nn.MultiheadAttention(encoder.attention.embed_dim, encoder.attention.num_heads, batch_first=True)
    mha.load_state_dict(encoder.attention.state_dict())
    return mha.eval()


def test_self_attention_tzrec_equals_torcheasyrecs_self_attention_encoder():
    torch.manual_seed(0)
    encoder = TorchEasyRecSelfAttention(D, 12, num_heads=3).eval()
    mha = _tzrec_twin(encoder)
    sequence, mask, lengths, _ = _padded([0, 1, 3, 6, 4])
    got = encoder(sequence, mask)
    assert got.shape == (5, 12)
    _close(got, tzrec_self_attention(sequence, lengths, encoder.query, encoder.key, encoder.value, mha, 3))
    assert torch.all(got[0] == 0.0)


def test_self_attention_tzrec_ignores_order_and_gives_finite_gradients():
    """No positions: a row's ids in another order give the same output. An empty row and padded
    positions give finite gradients (TorchEasyRec's fully masked rows are NaN before nan_to_num)."""
    torch.manual_seed(0)
    encoder = TorchEasyRecSelfAttention(D, 8, num_heads=2).train()
    sequence, mask, _, _ = _padded([0, 2, 5])
    sequence.requires_grad_(True)
    out = encoder(sequence, mask)
    shuffled = sequence.detach().clone()
    shuffled[2, :5] = shuffled[2, torch.tensor([3, 0, 4, 1, 2])]
    _close(encoder(shuffled, mask)[2], out[2].detach())
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in encoder.parameters())
    assert torch.all(sequence.grad[~mask] == 0.0)
