"""The update path around the optimizers: gradient accumulation, fp16 loss scaling, dense
gradient clipping and the EMA of dense weights.

Two kinds of optimizers are stepped differently:

* **per batch**: the fused sparse optimizer (FBGEMM updates the embedding rows inside backward)
  and the CPU data-parallel fallbacks of sparse optimizers. Embeddings are updated at every
  batch with that batch's own gradient.
* **dense** (the dense optimizer and its parts): with ``gradient_accumulation_steps = N`` they
  step once per N batches, on the mean of the N batch gradients.

The loss is scaled once, in :class:`~tzrun.runner.build.TrainModel`, by ``loss_factor() = S / N``
(S: the fp16 loss scale, 1 without a scaler). Dense gradients therefore accumulate to the mean
over the window (times S, which ``GradScaler.unscale_`` removes before clipping). The gradients
that reach the embedding kernels are multiplied back by ``N / S`` with a hook on the embedding
collections' outputs, so the fused sparse optimizers never see a scaled gradient; when fp16
overflowed, the hook hands them zeros instead of inf/NaN, and the scaler skips the dense step.

At a checkpoint boundary a partial window of m < N batches is stepped as the mean of its m
batches (:meth:`UpdateOptimizer.flush`), so no gradient is ever pending in a checkpoint.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import torch
from torch import nn

__all__ = ["UpdateOptimizer", "DenseEMA"]


class DenseEMA:
    """An exponential moving average of dense weights, updated with torch's own
    ``get_ema_multi_avg_fn`` (the function ``torch.optim.swa_utils.AveragedModel`` uses):
    the first update copies the weights, later ones do ``ema = decay * ema + (1 - decay) * w``.
    """

    def __init__(self, params: Mapping[str, nn.Parameter], decay: float) -> None:
        from torch.optim.swa_utils import get_ema_multi_avg_fn

        self.names = list(params)
        self.params = [params[n] for n in self.names]
        self.averages = [p.detach().clone() for p in self.params]
        self.decay = decay
        self.updates = 0
        self._update = get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def update(self) -> None:
        """Fold the current weights into the average."""
        current = [p.detach() for p in self.params]
        if self.updates == 0:
            torch._foreach_copy_(self.averages, current)
        else:
            self._update(self.averages, current, torch.tensor(self.updates))
        self.updates += 1

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self) -> Iterator[None]:
        """Within the block the model's dense weights are the averages (for evaluation)."""
        saved = [p.detach().clone() for p in self.params]
        for p, a in zip(self.params, self.averages):
            p.copy_(a)
        try:
            yield
        finally:
            for p, s in zip(self.params, saved):
                p.copy_(s)

    def state_dict(self) -> dict[str, Any]:
        """The averages by parameter name, and how many updates they hold."""
        return {"averages": dict(zip(self.names, self.averages)), "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        with torch.no_grad():
            for name, average in zip(self.names, self.averages):
                average.copy_(state["averages"][name])
        self.updates = int(state["updates"])


def _embedding_outputs(value: Any) -> list[torch.Tensor]:
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedTensor

    if isinstance(value, KeyedTensor):
        return [value.values()]
    if isinstance(value, JaggedTensor):
        return [value.values()]
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _embedding_outputs(v)]
    return []


class UpdateOptimizer:
    """What the train pipeline calls ``zero_grad()`` and ``step()`` on (see the module doc).

    Args:
        model: the DMP-wrapped model (its sharded embedding modules get the unscaling hook).
        train_model: the :class:`~tzrun.runner.build.TrainModel` inside it (its
            ``loss_factor`` is set here).
        per_batch: optimizers stepped at every batch (sparse).
        dense: optimizers stepped once per accumulation window.
        train: the ``[train]`` config (accumulation, scaler, clipping).
        ema: the ``ema`` options of the dense optimizer, or None.
        device: the training device.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        train_model: Any,
        per_batch: Mapping[str, Any],
        dense: Mapping[str, Any],
        train: Any,
        ema: Any,
        device: torch.device,
    ) -> None:
        self.per_batch = dict(per_batch)
        self.dense = dict(dense)
        self.accumulation = train.gradient_accumulation_steps
        self.clipping = train.grad_clipping
        self.scaler = None
        if train.grad_scaler is not None:
            s = train.grad_scaler
            self.scaler = torch.amp.GradScaler(
                device.type, init_scale=s.init_scale, growth_factor=s.growth_factor,
                backoff_factor=s.backoff_factor, growth_interval=s.growth_interval,
            )
        self.device = device
        self.micro_step = 0  # batches in the current accumulation window
        self.skipped_steps = 0  # dense steps the scaler skipped (inf/NaN gradients)
        self.last_grad_norm: float | None = None
        self.dense_params = [p for opt in self.dense.values() for g in opt.param_groups for p in g["params"]]
        #: the dense optimizers' parameters by name
        self.named_dense_params: dict[str, nn.Parameter] = {}
        for opt in self.dense.values():
            self.named_dense_params.update(getattr(opt, "params", {}))
        self.ema = DenseEMA(self.named_dense_params, ema.decay) if ema is not None else None
        self.ema_for_eval = ema is not None and ema.use_for_eval
        self.train_model = train_model
        self.on_nonfinite = getattr(train, "on_nonfinite_loss", "error")
        self.nonfinite_steps = 0  # batches whose loss was NaN or infinite (skipped)
        self._inverse: Any = 1.0
        if self.accumulation > 1 or self.scaler is not None:
            self._loss_factor()
            train_model.loss_factor = self._loss_factor
        if self.accumulation > 1 or self.scaler is not None or self.on_nonfinite == "skip":
            self._hook_embeddings(model)

    # -- loss scaling --------------------------------------------------------------------------

    def _loss_factor(self) -> torch.Tensor | float:
        if self.scaler is None:
            self._inverse = float(self.accumulation)
            return 1.0 / self.accumulation
        scale = self.scaler.scale(torch.ones((), device=self.device))
        self._inverse = self.accumulation / scale
        return scale / self.accumulation

    def _hook_embeddings(self, model: nn.Module) -> None:
        from torchrec.distributed.types import Awaitable, ShardedModule

        def unscale(grad: torch.Tensor) -> torch.Tensor:
            inverse = self._inverse
            if not (isinstance(inverse, float) and inverse == 1.0):
                grad = grad * inverse
            if self.scaler is not None or self.on_nonfinite == "skip":
                # an fp16 overflow or a non-finite loss: no embedding update for this batch
                grad = torch.where(torch.isfinite(grad).all(), grad, torch.zeros_like(grad))
            return grad

        def on_output(value: Any) -> Any:
            if torch.is_grad_enabled():
                for tensor in _embedding_outputs(value):
                    if tensor.requires_grad:
                        tensor.register_hook(unscale)
            return value

        def forward_hook(module: nn.Module, inputs: Any, output: Any) -> Any:
            if isinstance(output, Awaitable):
                output.callbacks.append(on_output)
                return output
            return on_output(output)

        self._hooks = [
            m.register_forward_hook(forward_hook) for m in model.modules() if isinstance(m, ShardedModule)
        ]

    # -- the pipeline's calls ------------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every param group of every optimizer (sparse first)."""
        return [g for opt in (*self.per_batch.values(), *self.dense.values()) for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear sparse gradients every batch, dense ones at the start of a window."""
        for opt in self.per_batch.values():
            opt.zero_grad(set_to_none=set_to_none)
        if self.micro_step == 0:
            for opt in self.dense.values():
                opt.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        """Step the sparse optimizers; at the end of a window, the dense ones.

        Raises:
            NonFiniteLossError: when the batch's loss is NaN or infinite and the policy is
                ``"error"`` (before any dense update uses it). With ``"skip"``, the batch's
                updates are dropped instead: the embedding hook already gave FBGEMM zeros, the
                data-parallel tables do not step, and the accumulation window is discarded.
        """
        loss = self.train_model.last_loss
        if loss is not None and not bool(torch.isfinite(loss)):
            if self.on_nonfinite == "error":
                from tzrun.errors import NonFiniteLossError

                raise NonFiniteLossError(f"the training loss is {float(loss)}")
            self.nonfinite_steps += 1
            for opt in (*self.per_batch.values(), *self.dense.values()):
                opt.zero_grad(set_to_none=True)
            self.micro_step = 0
            return
        for opt in self.per_batch.values():
            opt.step()
        self.micro_step += 1
        if self.micro_step == self.accumulation:
            self._dense_step()

    def flush(self) -> bool:
        """Step a partial accumulation window as the mean of its batches (at a checkpoint
        boundary or the end of training). Returns whether there was one."""
        if self.micro_step == 0:
            return False
        factor = self.accumulation / self.micro_step
        with torch.no_grad():
            grads = [p.grad for p in self.dense_params if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, factor)
        self._dense_step()
        return True

    def _dense_step(self) -> None:
        self.micro_step = 0
        if self.scaler is not None:
            for opt in self.dense.values():
                self.scaler.unscale_(opt)
        if self.clipping is not None:
            params = [p for p in self.dense_params if p.grad is not None]
            if self.clipping.by == "norm":
                norm = torch.nn.utils.clip_grad_norm_(params, self.clipping.max_gradient, self.clipping.norm_type)
                self.last_grad_norm = float(norm)
            else:
                torch.nn.utils.clip_grad_value_(params, self.clipping.max_gradient)
        if self.scaler is None:
            for opt in self.dense.values():
                opt.step()
            stepped = True
        else:
            before = self.scaler.get_scale()
            for opt in self.dense.values():
                self.scaler.step(opt)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= before
            self.skipped_steps += not stepped
        if stepped and self.ema is not None:
            self.ema.update()

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The update path's own state (scaler, EMA counter and averages); optimizer states are
        saved with the optimizers."""
        return {
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "skipped_steps": self.skipped_steps,
            "nonfinite_steps": self.nonfinite_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))

    @contextlib.contextmanager
    def eval_weights(self) -> Iterator[None]:
        """The weights evaluation should use: the EMA averages when ``use_for_eval``."""
        if self.ema is None or not self.ema_for_eval:
            yield
        else:
            with self.ema.swapped_in():
                yield
