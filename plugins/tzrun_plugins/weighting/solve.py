"""The Pareto-efficient loss weights of one step, from the Gram matrix of the losses' gradients.

With ``g_i`` the gradient of loss ``i`` (``K`` losses) over the dense parameters, ``Q = G Gᵀ``
(``Q_ij = <g_i, g_j>``) and minimum weights ``c`` (``c_i >= 0``, ``Σ c < 1``), the weights are
PE-LTR's (Lin et al., RecSys 2019, the ``pe_mtl_loss`` of TorchEasyRec)::

    minimize  ‖Σ_i w_i g_i‖² = wᵀ Q w    subject to  Σ_i w_i = 1,  w_i >= c_i

Two solvers, both on the device in float64 with a fixed sequence of tensor operations (no host
synchronization, no data-dependent Python branch):

* :func:`exact_weights`: the minimum itself. A convex quadratic program over a simplex has its
  minimum in the relative interior of one face; the minimum of the objective on the affine hull
  of each face (``2^K - 1`` of them, a small linear KKT system each, solved as one batch) is a
  candidate, the candidates that lie inside the simplex are feasible, and the feasible one with
  the lowest objective is the minimum.
* :func:`pe_ltr_weights`: PE-LTR's two steps as TorchEasyRec runs them: the minimum with only the
  equality constraint (closed form), then the Euclidean projection of ``w - c`` onto
  ``{x >= 0, Σ x = 1 - Σ c}``. It equals the minimum for 2 losses, or when no weight of the
  closed form is below its minimum; otherwise it can be a point of higher objective.

``Q`` is divided by its trace (the weights do not depend on the scale of the gradients) and
``RIDGE * I`` is added, so every system is regular and ties (gradients that are linearly
dependent) go to the weights of smallest norm, the most even ones.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["RIDGE", "gram_matrix", "exact_weights", "pe_ltr_weights", "project_to_simplex"]

#: Added to the trace-normalized Gram matrix: regularity, and ties broken towards even weights.
RIDGE = 1e-9
#: A face's minimum with a component below ``-_TOLERANCE`` lies outside the simplex.
_TOLERANCE = 1e-9


def gram_matrix(grads: Sequence[Sequence[Tensor | None]], params: Sequence[Tensor]) -> Tensor:
    """``Q_ij = <g_i, g_j>`` summed parameter by parameter, without concatenating them.

    Args:
        grads: per loss, the gradient of each parameter (None where the loss does not reach it).
        params: the parameters, in the order of each ``grads[i]``.

    Returns:
        The ``[K, K]`` float64 Gram matrix on the parameters' device.
    """
    k = len(grads)
    device = params[0].device if params else torch.device("cpu")
    gram = torch.zeros(k, k, dtype=torch.float64, device=device)
    for j, param in enumerate(params):
        rows = [g[j] for g in grads]
        if all(r is None for r in rows):
            continue
        stacked = torch.stack([
            (r if r is not None else torch.zeros_like(param)).reshape(-1).float() for r in rows
        ])
        gram += (stacked @ stacked.T).double()
    return gram


def _regularized(gram: Tensor) -> Tensor:
    gram = gram.double()
    scale = gram.diagonal().sum().clamp_min(torch.finfo(torch.float64).tiny)
    eye = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device)
    return gram / scale + RIDGE * eye


@lru_cache(maxsize=None)
def _face_masks(k: int, device: torch.device) -> Tensor:
    """Every non-empty subset of ``range(k)`` as a ``[2^k - 1, k]`` 0/1 float64 matrix, made on
    ``device`` once (no host-to-device copy per step)."""
    codes = torch.arange(1, 2 ** k, dtype=torch.int64, device=device)
    bits = (codes[:, None] >> torch.arange(k, dtype=torch.int64, device=device)[None, :]) & 1
    return bits.to(torch.float64)


def exact_weights(gram: Tensor, min_weights: Tensor) -> Tensor:
    """The minimum of ``wᵀ Q w`` over ``{Σ w = 1, w >= c}`` (see the module docstring).

    Args:
        gram: ``Q``, ``[K, K]``, symmetric positive semi-definite.
        min_weights: ``c``, ``[K]``, each >= 0, summing to less than 1.

    Returns:
        ``w``, ``[K]`` float64 on ``gram``'s device.
    """
    h = _regularized(gram)
    c = min_weights.to(h)
    k = h.shape[0]
    free = 1.0 - c.sum()
    mask = _face_masks(k, h.device)                                      # [N, K]
    n = mask.shape[0]
    system = torch.zeros(n, k + 1, k + 1, dtype=torch.float64, device=h.device)
    system[:, :k, :k] = h * mask[:, :, None] * mask[:, None, :] + torch.diag_embed(1.0 - mask)
    system[:, :k, k] = mask
    system[:, k, :k] = mask
    rhs = torch.zeros(n, k + 1, dtype=torch.float64, device=h.device)
    rhs[:, :k] = -(h @ c) * mask
    rhs[:, k] = free
    solution: Tensor
    info: Tensor
    solution, info = torch.linalg.solve_ex(system, rhs)
    v = solution[:, :k] * mask
    feasible = (info == 0) & torch.isfinite(v).all(dim=1) & (v >= -_TOLERANCE).all(dim=1)
    v = v.clamp_min(0.0)
    v = v * (free / v.sum(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny))
    w = c + v
    objective = torch.einsum("nk,kl,nl->n", w, h, w)
    objective = torch.where(feasible, objective, torch.full_like(objective, float("inf")))
    best = torch.argmin(objective).reshape(1)
    return w.index_select(0, best)[0]


def project_to_simplex(x: Tensor, total: Tensor) -> Tensor:
    """The Euclidean projection of ``x`` onto ``{y >= 0, Σ y = total}`` (``total > 0``), by
    sorting (Duchi et al., ICML 2008)."""
    u, _ = torch.sort(x, descending=True)
    excess = torch.cumsum(u, dim=0) - total
    count = torch.arange(1, x.shape[0] + 1, dtype=x.dtype, device=x.device)
    inside = (u - excess / count) > 0                                    # true, then false
    rho = (inside.to(torch.int64) * torch.arange(1, x.shape[0] + 1, device=x.device)).max().reshape(1)
    theta = excess.index_select(0, rho - 1) / rho.to(x.dtype)
    return (x - theta).clamp_min(0.0)


def pe_ltr_weights(gram: Tensor, min_weights: Tensor) -> Tensor:
    """PE-LTR's weights as TorchEasyRec computes them (see the module docstring): the closed
    form of ``[[Q, 1], [1ᵀ, 0]] [v; λ] = [-Q c; 1 - Σ c]``, then ``c + `` the projection of
    ``v`` onto ``{x >= 0, Σ x = 1 - Σ c}``.

    Args:
        gram: ``Q``, ``[K, K]``.
        min_weights: ``c``, ``[K]``.

    Returns:
        ``w``, ``[K]`` float64 on ``gram``'s device.
    """
    h = _regularized(gram)
    c = min_weights.to(h)
    k = h.shape[0]
    free = 1.0 - c.sum()
    system = torch.zeros(k + 1, k + 1, dtype=torch.float64, device=h.device)
    system[:k, :k] = h
    system[:k, k] = 1.0
    system[k, :k] = 1.0
    rhs = torch.cat([-(h @ c), free.reshape(1)])
    solution, _ = torch.linalg.solve_ex(system, rhs)
    return c + project_to_simplex(solution[:k], free)
