"""The in-batch softmax loss as one ``torch.fx.wrap`` leaf.

TorchRec's ``TrainPipelineSparseDist`` fx-traces the model and its losses; the shape check and
the ``[B, B]`` padding mask look at sizes, which a traced proxy cannot do. Wrapped, the function
runs as it is at every step. Call it as ``_in_batch.in_batch_softmax(...)`` (through the module)
so that tracing sees the wrap.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.nn import functional as F

__all__ = ["in_batch_softmax"]


@torch.fx.wrap
def in_batch_softmax(similarity: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``-log softmax(s_i / temperature)_i`` per row, weighted mean; columns of weight-0 rows
    (padding) are left out of every other row's softmax.

    Raises:
        ValueError: when ``similarity`` is not a square ``[B, B]`` matrix.
    """
    from tzrun_plugins.losses.binary import weighted_mean

    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"in_batch_softmax needs a square [B, B] similarity, got {list(similarity.shape)}")
    logits = similarity / temperature
    padding = (weight <= 0)[None, :] & ~torch.eye(len(weight), dtype=torch.bool, device=weight.device)
    logits = logits.masked_fill(padding, float("-inf"))
    target = torch.arange(len(weight), device=similarity.device)
    return weighted_mean(F.cross_entropy(logits, target, reduction="none"), weight)
