"""The update path around the optimizers: gradient accumulation, fp16 loss scaling, dense
gradient clipping and the EMA of dense weights.

Two kinds of optimizers are stepped differently:

* **per batch**: the fused sparse optimizer (FBGEMM updates the embedding rows inside backward)
  and the CPU data-parallel fallbacks of sparse optimizers. Embeddings are updated at every
  batch with that batch's own gradient.
* **dense** (the dense optimizer and its parts): with ``gradient_accumulation_steps = N`` they
  step once per N batches, on the mean of the N batch gradients.

The loss is scaled once, by the :class:`LossScale` that :class:`~tzrun.runner.model.TrainModel`
and :class:`UpdateOptimizer` share, with ``S / N`` (S: the fp16 loss scale, 1 without a scaler). Dense gradients therefore accumulate to the mean
over the window (times S, which ``GradScaler.unscale_`` removes before clipping). The gradients
that reach the embedding kernels are multiplied back by ``N / S`` with a hook on the embedding
collections' outputs, so the fused sparse optimizers never see a scaled gradient; when fp16
overflowed, the hook hands them zeros instead of inf/NaN, and the scaler skips the dense step.

At a checkpoint boundary a partial window of m < N batches is stepped as the mean of its m
batches (:meth:`UpdateOptimizer.flush`), so no gradient is ever pending in a checkpoint.

No step forces a device sync: a non-finite loss is noted on the device (:class:`NonFiniteWatch`)
and read where the loop syncs anyway (its train log and its checkpoint boundaries). Only
``on_nonfinite_loss = "skip"`` reads the loss at every step, since it must decide whether the
step's updates happen.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, NamedTuple

import torch
from torch import nn

from tzrun.runner.nonfinite import GradientCheck, collective_max

__all__ = ["UpdateOptimizer", "DenseEMA", "LossScale", "NonFinite", "NonFiniteWatch"]


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


class LossScale:
    """How the training loss is scaled for backward, and the last loss seen: what
    :class:`~tzrun.runner.model.TrainModel` (which computes the loss) and
    :class:`UpdateOptimizer` (which steps on it) share.

    Args:
        accumulation: ``train.gradient_accumulation_steps`` (N).
        scaler: the fp16 ``GradScaler`` (S), or None.
        device: the training device.
        skip_nonfinite: ``train.on_nonfinite_loss = "skip"``: a step whose loss is not finite on
            some rank backpropagates :func:`~tzrun.runner.nonfinite.no_update_loss` instead.
    """

    def __init__(self, accumulation: int = 1, scaler: Any = None, device: Any = None, skip_nonfinite: bool = False) -> None:
        self.skip_nonfinite = skip_nonfinite
        #: whether the last training forward's update is skipped (``skip_nonfinite`` only)
        self.skipped = False
        self.accumulation = accumulation
        self.scaler = scaler
        self.device = device
        #: what the gradients reaching the embedding kernels are multiplied by (N / S)
        self.inverse: Any = 1.0
        #: the (detached, unscaled) total loss of the last forward in training
        self.last_loss: torch.Tensor | None = None

    @property
    def scales(self) -> bool:
        """Whether the loss is scaled at all."""
        return self.accumulation > 1 or self.scaler is not None

    def for_backward(self, total: torch.Tensor, module: nn.Module | None = None) -> torch.Tensor:
        """Record a training step's total loss and return what backward runs on (with
        ``skip_nonfinite``, the no-update loss of ``module`` when some rank's loss is not finite)."""
        self.last_loss = total.detach()
        if self.skip_nonfinite and module is not None and not isinstance(total, torch.fx.Proxy):  # not while TorchRec traces
            from tzrun.runner.nonfinite import collectively_finite, no_update_loss

            self.skipped = not collectively_finite(total)
            if self.skipped:
                return no_update_loss(module, total)
        if not self.scales:
            return total
        if self.scaler is None:
            self.inverse = float(self.accumulation)
            return total * (1.0 / self.accumulation)
        scale = self.scaler.scale(torch.ones((), device=self.device))
        self.inverse = self.accumulation / scale
        return total * (scale / self.accumulation)


class NonFinite(NamedTuple):
    """The first training batch whose loss or gradient was not finite (:class:`NonFiniteWatch`)."""

    #: the batch, counted from 1 since this process started training
    batch: int
    #: its loss
    loss: float
    #: the name of its first gradient that was not finite (None when only the loss was not)
    parameter: str | None
    #: that gradient's largest magnitude (NaN, inf, or a value whose square overflows)
    magnitude: float


class NonFiniteWatch:
    """Notes, on the device, the first training batch whose loss or gradient was NaN or
    infinite, so that ``on_nonfinite_loss = "error"`` costs no sync per step; :meth:`first`
    reads it (one sync).

    Args:
        names: the names of the gradients :meth:`see` is given indices into.
    """

    def __init__(self, names: list[str] | None = None) -> None:
        self.names = list(names or [])
        self.batches = 0
        self._first: torch.Tensor | None = None  # the 1-based batch number, 0 for none yet
        self._value: torch.Tensor | None = None
        self._gradient: torch.Tensor | None = None  # index into names, -1 for none
        self._magnitude: torch.Tensor | None = None

    def see(self, loss: torch.Tensor, gradient: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """One training batch's loss, and ``(index, magnitude)`` of its first gradient that is
        not finite (index -1 for none; see :class:`~tzrun.runner.nonfinite.GradientCheck`).
        Device ops only."""
        self.batches += 1
        if self._first is None:
            self._first = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._value = torch.zeros((), dtype=torch.float32, device=loss.device)
            self._gradient = torch.full((), -1, dtype=torch.int64, device=loss.device)
            self._magnitude = torch.zeros((), dtype=torch.float32, device=loss.device)
        bad = ~torch.isfinite(loss)
        if gradient is not None:
            bad = bad | (gradient[0] >= 0)
        fresh = bad & (self._first == 0)
        self._first = torch.where(fresh, self.batches, self._first)
        self._value = torch.where(fresh, loss.float(), self._value)
        if gradient is not None:
            self._gradient = torch.where(fresh, gradient[0], self._gradient)
            self._magnitude = torch.where(fresh, gradient[1].float(), self._magnitude)

    def first(self) -> NonFinite | None:
        """The first batch whose loss or gradient was not finite, or None."""
        if self._first is None:
            return None
        batch = int(self._first)
        if not batch:
            return None
        index = int(self._gradient)  # type: ignore[arg-type]
        return NonFinite(batch, float(self._value), self.names[index] if index >= 0 else None,  # type: ignore[arg-type]
                         float(self._magnitude))  # type: ignore[arg-type]


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
        loss_scale: the :class:`LossScale` the model's ``TrainModel`` scales its loss with
            (its fp16 scaler is this update path's).
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
        loss_scale: LossScale,
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
        self.loss_scale = loss_scale
        self.scaler = loss_scale.scaler
        self.device = device
        self.micro_step = 0  # batches in the current accumulation window
        self.dense_params = [p for opt in self.dense.values() for g in opt.param_groups for p in g["params"]]
        #: the dense optimizers' parameters by name
        self.named_dense_params: dict[str, nn.Parameter] = {}
        for opt in self.dense.values():
            self.named_dense_params.update(getattr(opt, "params", {}))
        self.ema = DenseEMA(self.named_dense_params, ema.decay) if ema is not None else None
        self.ema_for_eval = ema is not None and ema.use_for_eval
        self.on_nonfinite = train.on_nonfinite_loss
        self.nonfinite_steps = 0  # batches whose loss or gradient was not finite (skipped)
        #: why the last skipped batch was skipped ("the loss is not finite", ...)
        self.skip_reason = ""
        #: ``"skip"``: the embeddings' backward runs apart, in :meth:`step`, after the check
        #: (:meth:`_cut`); the pairs (embedding output, the leaf the dense part read instead)
        #: of the current batch
        self._split = self.on_nonfinite == "skip" and self.scaler is None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        embeddings = self._hook_embeddings(model)
        #: the gradient check (None with the fp16 scaler, which skips inf gradients itself)
        self.gradients: GradientCheck | None = None
        if self.scaler is None:
            checked = {n: p for opt in (*self.per_batch.values(), *self.dense.values())
                       for n, p in getattr(opt, "params", {}).items() if type(p) in (torch.Tensor, nn.Parameter)}
            self.gradients = GradientCheck(checked, embeddings, device)
        self.nonfinite = NonFiniteWatch(self.gradients.names if self.gradients is not None else [])

    @staticmethod
    def make_loss_scale(train: Any, device: torch.device) -> LossScale:
        """The :class:`LossScale` of the ``[train]`` config: accumulation and the fp16 scaler."""
        scaler = None
        if train.grad_scaler is not None:
            s = train.grad_scaler
            scaler = torch.amp.GradScaler(
                device.type, init_scale=s.init_scale, growth_factor=s.growth_factor,
                backoff_factor=s.backoff_factor, growth_interval=s.growth_interval,
            )
        return LossScale(train.gradient_accumulation_steps, scaler, device, train.on_nonfinite_loss == "skip")

    # -- loss scaling --------------------------------------------------------------------------

    def _hook_embeddings(self, model: nn.Module) -> list[str]:
        """Hook the gradients that reach each embedding module: unscaled (N / S), noted by the
        gradient check, and zeros instead when not finite under fp16 or ``"skip"``. Returns
        the hooked modules' names."""
        from torchrec.distributed.types import ShardedModule

        modules = [(n, m) for n, m in model.named_modules() if isinstance(m, ShardedModule)]
        self._hooks = [m.register_forward_hook(self._embedding_hook(i)) for i, (_, m) in enumerate(modules)]
        return [n.replace("_dmp_wrapped_module.", "") for n, _ in modules]

    def _embedding_hook(self, index: int) -> Any:
        from torchrec.distributed.types import Awaitable

        def unscale(grad: torch.Tensor) -> torch.Tensor:
            inverse = self.loss_scale.inverse
            if not (isinstance(inverse, float) and inverse == 1.0):
                grad = grad * inverse
            finite = self.gradients.note_embedding(index, grad) if self.gradients is not None else None
            if self.scaler is not None or self.on_nonfinite == "skip":
                # an fp16 overflow, a non-finite loss or gradient: no embedding update for this batch
                finite = torch.isfinite(grad).all() if finite is None else finite
                grad = torch.where(finite, grad, torch.zeros_like(grad))
            return grad

        def on_output(value: Any) -> Any:
            if not torch.is_grad_enabled():
                return value
            if self._split:
                value = self._cut(value)
            for tensor in _embedding_outputs(value):
                if tensor.requires_grad:
                    tensor.register_hook(unscale)
            return value

        def forward_hook(module: nn.Module, inputs: Any, output: Any) -> Any:
            if isinstance(output, Awaitable):
                output.callbacks.append(on_output)
                return output
            return on_output(output)

        return forward_hook

    def _cut(self, value: Any) -> Any:
        """``value`` (an embedding module's output) with each tensor that needs a gradient
        replaced by a detached leaf: the loss's backward stops there, before FBGEMM's fused
        update, and :meth:`step` runs the embeddings' backward from the leaves' gradients once
        every rank found the step's gradients finite."""
        from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedTensor

        def leaf(tensor: torch.Tensor) -> torch.Tensor:
            if not tensor.requires_grad:
                return tensor
            cut = tensor.detach().requires_grad_()
            self._pending.append((tensor, cut))
            return cut

        if isinstance(value, KeyedTensor):
            return KeyedTensor(value.keys(), value.length_per_key(), leaf(value.values()), value.key_dim())
        if isinstance(value, JaggedTensor):
            return JaggedTensor(leaf(value.values()), value.weights_or_none(), value.lengths_or_none(),
                                value.offsets_or_none())
        if isinstance(value, torch.Tensor):
            return leaf(value)
        if isinstance(value, Mapping):
            return {k: self._cut(v) for k, v in value.items()}
        return value  # another kind of output: its backward runs with the loss's, as without "skip"

    def _embeddings_backward(self) -> None:
        """The second half of a ``"skip"`` step's backward: from the leaves' gradients into the
        embedding modules (their all-to-all and FBGEMM's fused update)."""
        pending, self._pending = self._pending, []
        if pending:
            torch.autograd.backward([o for o, _ in pending],
                                    [c.grad if c.grad is not None else torch.zeros_like(c) for _, c in pending])

    # -- the pipeline's calls ------------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every param group of every optimizer (sparse first)."""
        return [g for opt in (*self.per_batch.values(), *self.dense.values()) for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear sparse gradients every batch, dense ones at the start of a window."""
        self._pending.clear()
        for opt in self.per_batch.values():
            opt.zero_grad(set_to_none=set_to_none)
        if self.micro_step == 0:
            for opt in self.dense.values():
                opt.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        """Step the sparse optimizers; at the end of a window, the dense ones.

        With ``on_nonfinite_loss = "error"`` a NaN or infinite loss, or a gradient that is not
        finite (:class:`~tzrun.runner.nonfinite.GradientCheck`), is only noted here (on the
        device, :attr:`nonfinite`); the loop raises at its next train log or checkpoint
        boundary, before anything is saved. With ``"skip"`` (one sync per step for the loss,
        one for the gradients), the batch's updates are dropped instead: the embedding hook
        already gave FBGEMM zeros for a non-finite loss or embedding gradient, the
        data-parallel tables and the dense optimizers do not step, and the accumulation window
        is discarded. Under ``"skip"`` the loss's backward stops at the embedding outputs
        (:meth:`_cut`), so the embeddings' backward, with FBGEMM's fused update of their rows
        and state, runs here, only for a step that is not skipped.
        """
        loss = self.loss_scale.last_loss
        gradient = self.gradients.first() if self.gradients is not None else None
        if loss is not None and self.on_nonfinite == "error":
            self.nonfinite.see(loss, gradient)
        elif loss is not None and (reason := self._skip_reason(loss, gradient)):
            self.skip_reason = reason
            self.nonfinite_steps += 1
            self._pending.clear()  # the embeddings never see the batch
            for opt in (*self.per_batch.values(), *self.dense.values()):
                opt.zero_grad(set_to_none=True)
            self.micro_step = 0
            return
        self._embeddings_backward()
        for opt in self.per_batch.values():
            opt.step()
        self.micro_step += 1
        if self.micro_step == self.accumulation:
            self._dense_step()

    def _skip_reason(self, loss: torch.Tensor, gradient: tuple[torch.Tensor, torch.Tensor] | None) -> str:
        """Why this batch's updates are skipped (``"skip"``), or "" (syncs; collective)."""
        if self.loss_scale.skipped if self.loss_scale.skip_nonfinite else not bool(torch.isfinite(loss)):
            return "the loss is not finite"
        if gradient is None:
            return ""
        index = collective_max(gradient[0])  # every rank skips together (embedding gradients are per rank)
        if index < 0:
            return ""
        assert self.gradients is not None
        return f"the gradient of {self.gradients.names[index]} is not finite (or overflows when squared)"

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
                torch.nn.utils.clip_grad_norm_(params, self.clipping.max_gradient, self.clipping.norm_type)
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
        if stepped and self.ema is not None:
            self.ema.update()

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The update path's own state (scaler, EMA counter and averages); optimizer states are
        saved with the optimizers."""
        return {
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "nonfinite_steps": self.nonfinite_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))

    @contextlib.contextmanager
    def eval_weights(self) -> Iterator[None]:
        """The weights evaluation should use: the EMA averages when ``use_for_eval``."""
        if self.ema is None or not self.ema_for_eval:
            yield
        else:
            with self.ema.swapped_in():
                yield
