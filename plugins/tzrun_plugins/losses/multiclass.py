"""Losses on several logits per row: softmax cross entropy and JRC.

Labels arrive as float columns holding class indices (0, 1, ...); they are cast to integers.
Every loss is a sample-weighted mean, so padding rows (weight 0) contribute nothing.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from tzrun_plugins.losses.binary import weighted_mean

__all__ = ["SoftmaxCEConfig", "JRCConfig", "build_softmax_ce", "build_jrc", "jrc_generative"]


def _open_unit(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be between 0 and 1, got {value}", attribute)


@attrs.frozen
class SoftmaxCEConfig:
    """Options of ``softmax_cross_entropy``: ``-sum_c q_c log softmax(x)_c`` with
    ``q = onehot(label) * (1 - s) + s / C`` (torch's ``cross_entropy`` with ``label_smoothing``).

    Attributes:
        num_classes: when set, the prediction must have this many columns (checked per batch).
        label_smoothing: s above.
    """

    num_classes: Optional[int] = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(2)))
    label_smoothing: float = attrs.field(default=0.0, validator=_open_unit)


@attrs.frozen
class JRCConfig:
    """Options of ``jrc``, the joint ranking-calibration loss (Sheng et al., KDD 2023), on two
    logits per row ``z = [z0, z1]`` and a session key (``group_by``, e.g. a request id).

    ``loss = alpha * CE(z, y) + (1 - alpha) * GE`` where ``GE`` is the weighted mean over rows of:
    for a positive row i, ``-log( exp(z1_i) / (exp(z1_i) + sum_{j in session(i), y_j = 0} exp(z1_j)) )``;
    for a negative row i, ``-log( exp(z0_i) / (exp(z0_i) + sum_{j in session(i), y_j = 1} exp(z0_j)) )``.
    A row alone in its session (or with no row of the other class) contributes 0 to ``GE``.
    This equals TorchEasyRec's ``jrc_loss``, computed with per-session sums instead of a
    ``[B, B]`` mask, so memory stays linear in the batch.

    Attributes:
        alpha: the weight of the calibration (cross entropy) part.
    """

    alpha: float = attrs.field(default=0.5, validator=_open_unit)


def build_softmax_ce(cfg: SoftmaxCEConfig) -> Any:
    """The loss module: ``forward(logits[B, C], label[B], weight[B])``."""
    import torch
    from torch.nn import functional as F

    class SoftmaxCrossEntropy(torch.nn.Module):
        def forward(self, logits: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            if logits.dim() != 2 or (cfg.num_classes is not None and logits.shape[1] != cfg.num_classes):
                expected = f"[B, {cfg.num_classes}]" if cfg.num_classes else "[B, C]"
                raise ValueError(f"softmax_cross_entropy needs logits of shape {expected}, got {list(logits.shape)}")
            per_row = F.cross_entropy(logits, label.long(), reduction="none", label_smoothing=cfg.label_smoothing)
            return weighted_mean(per_row, weight)

    return SoftmaxCrossEntropy()


def jrc_generative(logits: Any, label: Any, session: Any) -> Any:
    """Each row's term of JRC's generative part (see :class:`JRCConfig`), shape ``[B]``."""
    import torch

    _, session_index = torch.unique(session, return_inverse=True)
    sessions = int(session_index.max()) + 1 if session.numel() else 0
    positive = label > 0.5
    out = torch.zeros_like(logits[:, 0])
    for column, own, other in ((1, positive, ~positive), (0, ~positive, positive)):
        z = logits[:, column]
        # log(sum over the session's rows of the other class of exp(z)), stabilised per session
        masked = torch.where(other, z, torch.full_like(z, float("-inf")))
        peak = torch.full((sessions,), float("-inf"), dtype=z.dtype, device=z.device)
        peak = peak.scatter_reduce(0, session_index, masked, reduce="amax")
        safe_peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak)).detach()
        sums = torch.zeros(sessions, dtype=z.dtype, device=z.device).index_add(
            0, session_index, torch.where(other, torch.exp(z - safe_peak[session_index]), torch.zeros_like(z))
        )
        has_other = sums[session_index] > 0
        shift = safe_peak[session_index]
        log_denominator = torch.logaddexp(z - shift, torch.log(sums[session_index].clamp_min(1e-30))) + shift
        term = torch.where(own & has_other, log_denominator - z, torch.zeros_like(z))
        out = out + term
    return out


def build_jrc(cfg: JRCConfig) -> Any:
    """The loss module: ``forward(logits[B, 2], label[B], weight[B], group=session[B])``."""
    import torch
    from torch.nn import functional as F

    class JRC(torch.nn.Module):
        def forward(self, logits: torch.Tensor, label: torch.Tensor, weight: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
            if logits.dim() != 2 or logits.shape[1] != 2:
                raise ValueError(f"jrc needs two logits per row (shape [B, 2]), got {list(logits.shape)}: read a "
                                 "model output of two classes (dbmtl: num_classes = 2 and prediction = "
                                 "\"class_logits/<task>\")")
            calibration = weighted_mean(F.cross_entropy(logits, label.long(), reduction="none"), weight)
            generative = weighted_mean(jrc_generative(logits, label, group), weight)
            return cfg.alpha * calibration + (1 - cfg.alpha) * generative

    return JRC()
