"""Torch optimizers that apply FBGEMM's fused embedding updates to whole (data-parallel) tables.

FBGEMM's CPU kernels fuse only SGD, Adagrad and row-wise Adagrad. With ``cpu_policy =
"data_parallel"`` the tables of the other sparse optimizers train data-parallel on CPU: their
gradient is a dense ``rows x dim`` tensor, and one of these optimizers updates it with the rule
FBGEMM's CUDA kernel applies to a touched row, written after FBGEMM's codegen
(``fbgemm_gpu/codegen/genscript/optimizers.py`` in pytorch/FBGEMM: ``adam()``, ``lamb()``,
``lars_sgd()``, ``partial_rowwise_adam()``, ``partial_rowwise_lamb()``). Each row of a
parameter (its last dimension) is one embedding row: the row norms, trust ratios and row-wise
second moments are per row, as in FBGEMM.

What differs from the fused update, by construction:

* every row is updated every step, not just the touched ones: an untouched row has a zero
  gradient, but its moments still decay and its weights still move (Adam's ``m`` keeps pushing
  it, weight decay keeps shrinking it);
* the step counter ``t`` is per parameter (FBGEMM keeps one per kernel; both count the steps
  since the start when every step updates every table);
* ``gradient_clipping`` clamps the table's summed gradient per element; FBGEMM clamps each bag's
  pooled-output gradient before the sum, so a row looked up more than once per batch is clipped
  differently;
* where FBGEMM's formula divides zero by zero (LAMB's trust ratio of a row whose update
  direction is zero, LARS's rate of a row whose gradient and decay are zero) these take the
  step to be zero; FBGEMM would write NaN, and in a data-parallel table every untouched row
  is such a row.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, cast

import torch

__all__ = [
    "ClippedAdamW",
    "FbgemmLamb",
    "FbgemmLarsSGD",
    "FbgemmPartialRowWiseAdam",
    "FbgemmPartialRowWiseLamb",
]

Params = Iterable[Any]


def _row_norm(x: torch.Tensor) -> torch.Tensor:
    return cast(torch.Tensor, torch.linalg.vector_norm(x, dim=-1, keepdim=True))


def _row_mean_square(x: torch.Tensor) -> torch.Tensor:
    return x.square().mean(dim=-1)


def _evaluate(closure: Optional[Callable[[], Any]]) -> Any:
    """The loss of an optimizer's ``closure`` (which recomputes the gradients), if any."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _trust_ratio_step(weight: torch.Tensor, direction: torch.Tensor, lr: float) -> None:
    """``w -= lr * (|w| / |r|) * r`` per row, FBGEMM LAMB's ``weight_new.fma_(grad,
    -learning_rate * true_ratio)``; a zero direction takes no step."""
    direction_norm = _row_norm(direction)
    ratio = torch.where(direction_norm > 0, _row_norm(weight) / direction_norm, torch.zeros_like(direction_norm))
    weight.sub_(lr * ratio * direction)


class ClippedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` on a gradient clamped to ``[-max_gradient, max_gradient]``.

    FBGEMM's ``adam()`` update is AdamW's rule exactly (decoupled weight decay, ``eps`` added
    to the root of the corrected second moment); this adds FBGEMM's ``gradient_clipping``. The
    gradients are clamped in place before the step.

    Args:
        params: the parameters (or parameter groups).
        max_gradient: the clamp bound.
        **adamw: ``torch.optim.AdamW``'s arguments (``lr``, ``betas``, ``eps``,
            ``weight_decay``, ...).
    """

    def __init__(self, params: Params, *, max_gradient: float, **adamw: Any) -> None:
        super().__init__(params, **adamw)
        self.defaults["max_gradient"] = max_gradient
        for group in self.param_groups:
            group.setdefault("max_gradient", max_gradient)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = _evaluate(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.clamp_(-group["max_gradient"], group["max_gradient"])
        super().step()
        return loss


class _RowOptimizer(torch.optim.Optimizer):
    """The shared step: FBGEMM's optional clamp of the gradient, a per-parameter step counter
    ``t`` (1 on the first step), and the subclass's update of each parameter."""

    def __init__(self, params: Params, defaults: dict[str, Any]) -> None:
        if defaults["lr"] < 0:
            raise ValueError(f"lr must be >= 0, got {defaults['lr']}")
        if defaults["gradient_clipping"] and defaults["max_gradient"] <= 0:
            raise ValueError(f"max_gradient must be > 0, got {defaults['max_gradient']}")
        super().__init__(params, defaults)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = _evaluate(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} takes dense gradients (a data-parallel table's)")
                grad = p.grad
                if group["gradient_clipping"]:
                    grad = grad.clamp(-group["max_gradient"], group["max_gradient"])
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    self._init_state(p, state)
                state["step"] += 1
                self._update(p, grad, state, group)
        return loss


class _MomentsOptimizer(_RowOptimizer):
    """Options of FBGEMM's Adam-like optimizers (``lr``, ``eps``, ``beta1``, ``beta2``,
    ``weight_decay``, ``gradient_clipping``, ``max_gradient``, FBGEMM's defaults)."""

    rowwise_second_moment = False

    def __init__(
        self,
        params: Params,
        lr: float,
        eps: float = 1e-8,
        beta1: float = 0.9,
        beta2: float = 0.999,
        weight_decay: float = 0.0,
        gradient_clipping: bool = False,
        max_gradient: float = 1.0,
    ) -> None:
        defaults = dict(
            lr=lr, eps=eps, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
            gradient_clipping=gradient_clipping, max_gradient=max_gradient,
        )
        super().__init__(params, defaults)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["momentum1"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        shape = p.shape[:-1] if self.rowwise_second_moment else p.shape
        state["momentum2"] = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def _moments(
        self, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update ``m`` and ``v``; return the bias-corrected ``m`` and the root of the
        corrected ``v`` plus ``eps`` (per row, broadcastable, for the row-wise forms)."""
        t, beta1, beta2 = state["step"], group["beta1"], group["beta2"]
        m, v = state["momentum1"], state["momentum2"]
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        if self.rowwise_second_moment:
            v.mul_(beta2).add_(_row_mean_square(grad), alpha=1 - beta2)
            denominator = (v / (1 - beta2**t)).sqrt().unsqueeze(-1) + group["eps"]
        else:
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denominator = (v / (1 - beta2**t)).sqrt() + group["eps"]
        return m / (1 - beta1**t), denominator


class FbgemmLamb(_MomentsOptimizer):
    """FBGEMM's LAMB (``lamb()`` in ``fbgemm_gpu/codegen/genscript/optimizers.py``), each row
    its own layer::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        r = m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w
        w -= lr * (|w| / |r|) * r           (|.|: the row's L2 norm)

    State per parameter: ``step``, ``momentum1`` (``m``) and ``momentum2`` (``v``), both
    element-wise.
    """

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        m_hat, denominator = self._moments(grad, state, group)
        _trust_ratio_step(p, m_hat / denominator + group["weight_decay"] * p, group["lr"])


class FbgemmPartialRowWiseLamb(_MomentsOptimizer):
    """FBGEMM's partial row-wise LAMB (``partial_rowwise_lamb()`` in
    ``fbgemm_gpu/codegen/genscript/optimizers.py``): LAMB with one second moment per row::

        v = beta2 * v + (1 - beta2) * mean(g * g over the row)
        m = beta1 * m + (1 - beta1) * g
        r = m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w
        w -= lr * (|w| / |r|) * r           (|.|: the row's L2 norm)

    State per parameter: ``step``, ``momentum1`` (``m``, element-wise) and ``momentum2``
    (``v``, one per row).
    """

    rowwise_second_moment = True

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        m_hat, denominator = self._moments(grad, state, group)
        _trust_ratio_step(p, m_hat / denominator + group["weight_decay"] * p, group["lr"])


class FbgemmPartialRowWiseAdam(_MomentsOptimizer):
    """FBGEMM's partial row-wise Adam (``partial_rowwise_adam()`` in
    ``fbgemm_gpu/codegen/genscript/optimizers.py``): Adam with one second moment per row and
    decoupled weight decay::

        v = beta2 * v + (1 - beta2) * mean(g * g over the row)
        m = beta1 * m + (1 - beta1) * g
        w -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w)

    State per parameter: ``step``, ``momentum1`` (``m``, element-wise) and ``momentum2``
    (``v``, one per row).
    """

    rowwise_second_moment = True

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        m_hat, denominator = self._moments(grad, state, group)
        p.sub_(group["lr"] * (m_hat / denominator + group["weight_decay"] * p))


class FbgemmLarsSGD(_RowOptimizer):
    """FBGEMM's LARS SGD (``lars_sgd()`` in ``fbgemm_gpu/codegen/genscript/optimizers.py``),
    each row its own layer::

        a = lr * eta * |w| / (|g| + weight_decay * |w|)     (|.|: the row's L2 norm)
        m = momentum * m + a * (g + weight_decay * w)
        w -= m

    State per parameter: ``step`` and ``momentum1`` (``m``, element-wise).

    Args:
        params: the parameters (or parameter groups).
        lr: learning rate.
        eta: LARS trust coefficient.
        momentum: momentum factor.
        weight_decay: L2 weight decay.
        gradient_clipping: clamp the gradient to ``[-max_gradient, max_gradient]`` first.
        max_gradient: the clamp bound.
    """

    def __init__(
        self,
        params: Params,
        lr: float,
        eta: float = 0.001,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        gradient_clipping: bool = False,
        max_gradient: float = 1.0,
    ) -> None:
        defaults = dict(
            lr=lr, eta=eta, momentum=momentum, weight_decay=weight_decay,
            gradient_clipping=gradient_clipping, max_gradient=max_gradient,
        )
        super().__init__(params, defaults)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["momentum1"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        weight_decay = group["weight_decay"]
        weight_norm = _row_norm(p)
        denominator = _row_norm(grad) + weight_decay * weight_norm
        rate = torch.where(
            denominator > 0, group["lr"] * group["eta"] * weight_norm / denominator, torch.zeros_like(denominator)
        )
        m = state["momentum1"]
        m.mul_(group["momentum"]).add_(rate * (grad + weight_decay * p))
        p.sub_(m)
