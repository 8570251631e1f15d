"""Dense optimizers torch does not ship: Lion and AdaBelief (update rules in
:mod:`tzrun_contrib_optimizers.options`)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional

import torch
from torch import Tensor
from torch.optim import Optimizer

from tzrun_contrib_optimizers.options import AdaBeliefConfig, LionConfig

__all__ = ["Lion", "AdaBelief", "build_lion", "build_adabelief"]


def _check(name: str, lr: float, betas: tuple[float, float], weight_decay: float) -> None:
    if lr < 0:
        raise ValueError(f"{name}: lr must be >= 0, got {lr}")
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ValueError(f"{name}: betas must be in [0, 1), got {betas}")
    if weight_decay < 0:
        raise ValueError(f"{name}: weight_decay must be >= 0, got {weight_decay}")


class _ElementwiseOptimizer(Optimizer):
    """Runs :meth:`update` on every parameter that has a dense gradient."""

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any], lr: float) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"].item()) if isinstance(group["lr"], Tensor) else float(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(
                        f"{type(self).__name__} does not support sparse gradients; embedding tables use a sparse optimizer"
                    )
                self.update(p, p.grad, self.state[p], group, lr)
        return loss


class Lion(_ElementwiseOptimizer):
    """Lion (Chen et al. 2023, Algorithm 2), with decoupled weight decay.

    State per parameter: ``exp_avg`` (the momentum ``m``).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        _check("Lion", lr, betas, weight_decay)
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any], lr: float) -> None:
        (beta1, beta2), decay = group["betas"], group["weight_decay"]
        if not state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        exp_avg = state["exp_avg"]
        if decay:
            p.mul_(1.0 - lr * decay)
        direction = exp_avg.mul(beta1).add_(grad, alpha=1.0 - beta1).sign_()
        p.add_(direction, alpha=-lr)
        exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)


class AdaBelief(_ElementwiseOptimizer):
    """AdaBelief (Zhuang et al. 2020, Algorithm 2; the authors' ``adabelief-pytorch`` 0.2 with
    ``rectify=False``, ``amsgrad=False``, ``weight_decouple=True``).

    State per parameter: ``step``, ``exp_avg`` (``m``) and ``exp_avg_var`` (``s``).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-16,
        weight_decay: float = 0.0,
    ) -> None:
        _check("AdaBelief", lr, betas, weight_decay)
        if eps <= 0:
            raise ValueError(f"AdaBelief: eps must be > 0, got {eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Any], group: dict[str, Any], lr: float) -> None:
        (beta1, beta2), eps, decay = group["betas"], group["eps"], group["weight_decay"]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_var"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        t = int(state["step"].item())
        exp_avg, exp_avg_var = state["exp_avg"], state["exp_avg_var"]
        if decay:
            p.mul_(1.0 - lr * decay)
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        residual = grad - exp_avg
        exp_avg_var.mul_(beta2).addcmul_(residual, residual, value=1.0 - beta2).add_(eps)
        denom = (exp_avg_var.sqrt() / math.sqrt(1.0 - beta2**t)).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-lr / (1.0 - beta1**t))


def build_lion(cfg: LionConfig, params: Iterable[Any]) -> Lion:
    """:class:`Lion` over ``params``."""
    return Lion(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)


def build_adabelief(cfg: AdaBeliefConfig, params: Iterable[Any]) -> AdaBelief:
    """:class:`AdaBelief` over ``params``."""
    return AdaBelief(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
