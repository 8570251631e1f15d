"""Conformance checks: each component, built from its options, does what its kind requires,
on a tiny synthetic input, before any training.

``tzrec-run check`` (and every run, before its first step) runs them on every component the
config names; :func:`tzrun.testing.check_component` runs them on one. Each failure names the
component, the plugin (and distribution) that registered it, and the rule it breaks:

* dense optimizer: ``build(cfg, params)`` returns a ``torch.optim.Optimizer``; ``step()`` on a
  toy parameter keeps it finite, and leaves a param group whose lr is 0 where it was;
* sparse optimizer: ``build(cfg)`` returns a :class:`tzrun.SparseOptimizerSpec`;
* lr schedule: ``build(cfg, optimizer)`` returns an ``LRScheduler``; its first lrs (and those of
  3 steps) are finite and non-negative, and a group whose base lr is 0 stays at 0;
* loss: ``build(cfg)`` returns an ``nn.Module``; ``forward(prediction, label, weight)`` returns
  a finite scalar whose gradient reaches the prediction;
* metric: ``build(cfg)`` returns a ``torchmetrics.Metric``; ``update(prediction, label,
  weight)`` accepts tzrec-run's arguments; every state is a tensor or a list of tensors;
  ``compute()`` works; two instances updated with the two halves of the rows and merged
  (``merge_state``, what a distributed compute does) give the one-instance value;
* stage: ``build(cfg)`` works and the object's hooks pass :func:`tzrun.kernel.hookcheck.hook_problems`.

The synthetic input has 8 rows, the last of weight 0 (padding); the prediction is ``[8]``
(binary outputs) or, when that is refused, ``[8, 2]`` (two classes); ``[8, 8]`` for components
registered with ``prediction="similarity"``. Models, readers and train pipelines need the data
and features: they are checked when the run builds them.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterator

import attrs

from tzrun.config.schema import Component, RunConfig
from tzrun.config.slots import COMPONENT_SLOTS
from tzrun.kernel.hookcheck import hook_problems
from tzrun.kernel.registry import Entry, Registries

__all__ = ["PROBED_KINDS", "component_problems", "config_components", "config_conformance_problems"]

ROWS = 8


def config_components(cfg: RunConfig) -> Iterator[tuple[str, str, Component]]:
    """``(TOML path, kind, component)`` of every component ``cfg`` names, in schema order."""

    def walk(value: Any, path: str, schema: str) -> Iterator[tuple[str, str, Component]]:
        if isinstance(value, Component):
            slot = COMPONENT_SLOTS.get(schema)
            if slot is not None:
                yield path, slot.kind, value
            value = value.fields
        if isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                yield from walk(item, f"{path}[{i}]", schema)
        elif attrs.has(type(value)):
            for field in attrs.fields(type(value)):
                sub = f"{path}.{field.name}" if path else field.name
                yield from walk(getattr(value, field.name), sub, f"{schema}.{field.name}" if schema else field.name)

    yield from walk(cfg, "", "")


def config_conformance_problems(cfg: RunConfig, registries: Registries,
                                kinds: Collection[str] | None = None) -> list[tuple[str, str]]:
    """``(TOML path, message)`` for every component of ``cfg`` that breaks a rule of its kind
    (of ``kinds`` only when given: the kinds a command builds)."""
    probed = PROBED_KINDS if kinds is None else PROBED_KINDS & frozenset(kinds)
    problems = []
    for path, kind, component in config_components(cfg):
        if kind not in probed:
            continue
        entry = registries[kind].get(component.type, f"{path}.type")
        group = getattr(component.fields, "group_by", None) is not None
        problems.extend((path, message) for message in component_problems(entry, component.config, group=group))
    return problems


def component_problems(entry: Entry, options: Any, *, group: bool | None = None) -> list[str]:
    """What ``entry`` built from ``options`` (an instance of its config class) does wrong.

    Args:
        entry: the registered component.
        options: its options.
        group: pass ``group=`` keys to a loss or metric (default: when it is registered with
            ``group="required"``).

    Returns:
        One message per broken rule, naming the component, its plugin and the rule; empty when
        it conforms (and for kinds that are not probed).
    """
    probe = _PROBES.get(entry.kind)
    if probe is None:
        return []
    if group is None:
        group = entry.extras.get("group") == "required"
    who = f"{entry.kind.replace('_', ' ')} '{entry.name}' (plugin {entry.shown()})"
    try:
        return [f"{who} breaks a rule: {rule}" for rule in probe(entry, options, group)]
    except _Broken as broken:
        return [f"{who} breaks a rule: {broken}"]


class _Broken(Exception):
    """A rule the component broke, with what happened."""


def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise _Broken(f"{what} (it raised {type(exc).__name__}: {exc})") from exc


def _inputs(entry: Entry, shape: tuple[int, ...], group: bool, *, grad: bool = False) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=gen, dtype=torch.float32)
    prediction = torch.sigmoid(logits) if entry.extras.get("prediction") == "probs" else logits
    prediction.requires_grad_(grad)
    label = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    weight = torch.ones(ROWS)
    weight[-1] = 0.0
    args: dict[str, Any] = {"prediction": prediction, "label": label, "weight": weight}
    if group:
        args["group"] = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3], dtype=torch.int64)
    return args


def _shapes(entry: Entry) -> list[tuple[int, ...]]:
    return [(ROWS, ROWS)] if entry.extras.get("prediction") == "similarity" else [(ROWS,), (ROWS, 2)]


def _first_shape_that_works(entry: Entry, run: Callable[[tuple[int, ...]], list[str]]) -> list[str]:
    """Run ``run`` on each prediction shape; the problems of the first, unless another works."""
    first: BaseException | None = None
    for shape in _shapes(entry):
        try:
            return run(shape)
        except _Broken as broken:
            first = first or broken
    assert first is not None
    raise first


def _dense_optimizer(entry: Entry, options: Any, group: bool) -> list[str]:
    import torch

    moving, frozen = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    groups = [{"params": [moving]}, {"params": [frozen], "lr": 0.0}]
    opt = _call("build(cfg, params) must return a torch.optim.Optimizer", entry.build, options, groups)
    if not isinstance(opt, torch.optim.Optimizer):
        raise _Broken(f"build(cfg, params) must return a torch.optim.Optimizer, not {type(opt).__name__}")
    moving.grad, frozen.grad = torch.full((4,), 0.5), torch.full((4,), 0.5)
    _call("step() on a toy parameter must work", opt.step)
    rules = []
    if not torch.isfinite(moving).all():
        rules.append(f"step() must keep parameters finite (got {moving.tolist()})")
    if not torch.equal(frozen.detach(), torch.ones(4)):
        rules.append("a param group whose lr is 0 is frozen and must not move (mind decoupled weight decay)")
    return rules


def _sparse_optimizer(entry: Entry, options: Any, group: bool) -> list[str]:
    from tzrun.interfaces import SparseOptimizerSpec

    spec = _call("build(cfg) must return a tzrun.SparseOptimizerSpec", entry.build, options)
    if not isinstance(spec, SparseOptimizerSpec):
        raise _Broken(f"build(cfg) must return a tzrun.SparseOptimizerSpec, not {type(spec).__name__}")
    return []


def _lr_scheduler(entry: Entry, options: Any, group: bool) -> list[str]:
    import math

    import torch

    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.0}])
    sched = _call("build(cfg, optimizer) must return an LRScheduler", entry.build, options, opt)
    if not isinstance(sched, torch.optim.lr_scheduler.LRScheduler):
        raise _Broken(f"build(cfg, optimizer) must return a torch.optim.lr_scheduler.LRScheduler, not {type(sched).__name__}")
    history = [list(_call("get_last_lr() must work", sched.get_last_lr))]
    for _ in range(3):
        opt.step()
        _call("step() must work", sched.step)
        history.append(list(sched.get_last_lr()))
    rules = []
    if any(len(lrs) != 2 or not all(math.isfinite(lr) and lr >= 0 for lr in lrs) for lrs in history):
        rules.append(f"get_last_lr() must give one finite, non-negative lr per param group (got {history})")
    elif any(lrs[1] != 0 for lrs in history):
        rules.append(f"a param group whose base lr is 0 must stay at 0 (got {[lrs[1] for lrs in history]})")
    return rules


def _loss(entry: Entry, options: Any, group: bool) -> list[str]:
    import torch

    module = _call("build(cfg) must return an nn.Module", entry.build, options)
    if not isinstance(module, torch.nn.Module):
        raise _Broken(f"build(cfg) must return a torch.nn.Module, not {type(module).__name__}")

    def run(shape: tuple[int, ...]) -> list[str]:
        args = _inputs(entry, shape, group, grad=True)
        prediction = args.pop("prediction")
        call = "forward(prediction, label, weight" + (", group=...)" if group else ")")
        loss = _call(f"{call} must work on a [{', '.join(map(str, shape))}] prediction", module,
                     prediction, args.pop("label"), args.pop("weight"), **args)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not torch.isfinite(loss).all():
            return [f"{call} must return a finite scalar tensor (got {loss!r})"]
        _call("backward() of the loss must work", loss.backward)
        if prediction.grad is None or not torch.isfinite(prediction.grad).all():
            return ["the loss's gradient must reach the prediction and be finite (is the prediction detached?)"]
        return []

    return _first_shape_that_works(entry, run)


def _metric(entry: Entry, options: Any, group: bool) -> list[str]:
    import torch
    import torchmetrics

    def make() -> Any:
        metric = _call("build(cfg) must return a torchmetrics.Metric (with update() and compute())", entry.build, options)
        if not isinstance(metric, torchmetrics.Metric):
            raise _Broken(f"build(cfg) must return a torchmetrics.Metric, not {type(metric).__name__}")
        return metric

    def update(metric: Any, args: dict[str, Any], rows: slice) -> None:
        part = {k: v[rows] for k, v in args.items()}
        call = "update(prediction, label, weight" + (", group=...)" if group else ")")
        _call(f"{call} must accept tzrec-run's arguments (not torchmetrics' update(preds, target))", metric.update,
              part.pop("prediction"), part.pop("label"), part.pop("weight"), **part)

    def run(shape: tuple[int, ...]) -> list[str]:
        args = _inputs(entry, shape, group)
        whole = make()
        update(whole, args, slice(None))
        bad = [n for n, v in whole.metric_state.items()
               if not (isinstance(v, torch.Tensor) or (isinstance(v, list) and all(isinstance(x, torch.Tensor) for x in v)))]
        if bad:
            raise _Broken(f"every state must be a tensor or a list of tensors (add_state); {', '.join(bad)} is not")
        expected = _call("compute() must work after update()", whole.compute)
        if len(shape) == 2 and shape[0] == shape[1]:
            return []  # an in-batch similarity has no row split
        first, second = make(), make()
        update(first, args, slice(0, ROWS // 2))
        update(second, args, slice(ROWS // 2, None))
        _call("merge_state() of two instances must work (what a distributed compute does)", first.merge_state, second)
        merged = _call("compute() must work after merge_state()", first.compute)
        if not _close(expected, merged):
            return [f"the rows split over two instances and merged (merge_state) must give the one-instance value: "
                    f"{merged!r} != {expected!r}; use states that sum (dist_reduce_fx='sum') or concatenate ('cat')"]
        return []

    return _first_shape_that_works(entry, run)


def _close(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-5, atol=1e-7, equal_nan=True))


def _stage(entry: Entry, options: Any, group: bool) -> list[str]:
    stage = _call("build(cfg) must work", entry.build, options)
    return [p.split(": ", 1)[1] for p in hook_problems(stage, "x")]


def _admission_filter(entry: Entry, options: Any, group: bool) -> list[str]:
    import torch

    admit = _call("build(cfg) must work", entry.build, options)
    counts = torch.tensor([1, 5, 2, 9, 1, 3], dtype=torch.int64)
    answer = _call("the filter must take a 1-d int64 tensor of counts", admit, counts)
    if not (isinstance(answer, tuple) and len(answer) == 2):
        return ["the filter must return (mask, threshold)"]
    mask = answer[0]
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == counts.shape):
        return ["its mask must be a bool tensor shaped like the counts"]
    if not torch.equal(mask, admit(counts.clone())[0]):
        return ["it must decide alike on equal counts (every rank and every resume must)"]
    return []


def _eviction_policy(entry: Entry, options: Any, group: bool) -> list[str]:
    import torch
    from torchrec.modules.mc_modules import MCHEvictionPolicy, MCHManagedCollisionModule
    from torchrec.sparse.jagged_tensor import JaggedTensor

    policy = _call("build(cfg, admission) must work", entry.build, options, None)
    if not isinstance(policy, MCHEvictionPolicy):
        return [f"build(cfg, admission) must return a torchrec MCHEvictionPolicy, not {type(policy).__name__}"]
    module = MCHManagedCollisionModule(zch_size=4, device=torch.device("cpu"), eviction_policy=policy, eviction_interval=1)
    for step in range(3):
        ids = JaggedTensor(values=torch.tensor([step, step, 7, 9], dtype=torch.int64), lengths=torch.tensor([2, 2]))
        out = _call("TorchRec's managed-collision module must run with it", module, {"t": ids})
        rows = out["t"].values()
        if bool(((rows < 0) | (rows >= 4)).any()):
            return [f"ids must map to rows in [0, 4), got {rows.tolist()}"]
    return []


_PROBES: dict[str, Callable[[Entry, Any, bool], list[str]]] = {
    "eviction_policy": _eviction_policy,
    "admission_filter": _admission_filter,
    "dense_optimizer": _dense_optimizer,
    "sparse_optimizer": _sparse_optimizer,
    "lr_scheduler": _lr_scheduler,
    "loss": _loss,
    "metric": _metric,
    "stage": _stage,
}

#: The kinds whose components are built and run on a synthetic input.
PROBED_KINDS = frozenset(_PROBES)
