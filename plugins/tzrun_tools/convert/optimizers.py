"""The sparse and dense optimizers of ``train_config`` and their learning rate schedules."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from tzrun_tools.convert.nodes import Finding, Node

__all__ = ["sparse_optimizer", "dense_optimizer"]

_CLIP = {"gradient_clipping": ("gradient_clipping", "bool"), "max_gradient": ("max_gradient", "float")}
_MOMENTS = {"beta1": ("beta1", "float"), "beta2": ("beta2", "float"), "weight_decay": ("weight_decay", "float"), **_CLIP}
_SPARSE = {
    "sgd_optimizer": ("sgd", _CLIP),
    "adagrad_optimizer": ("adagrad", {**_CLIP, "initial_accumulator_value": ("initial_accumulator_value", "float")}),
    "adam_optimizer": ("adam", _MOMENTS),
    "lars_sgd_optimizer": ("lars_sgd", {"momentum": ("momentum", "float"), "weight_decay": ("weight_decay", "float"), **_CLIP}),
    "lamb_optimizer": ("lamb", _MOMENTS),
    "partial_rowwise_lamb_optimizer": ("partial_rowwise_lamb", _MOMENTS),
    "partial_rowwise_adam_optimizer": ("partial_rowwise_adam", _MOMENTS),
    "rowwise_adagrad_optimizer": ("rowwise_adagrad", _CLIP),  # weight decay: see sparse_optimizer
}
_SPARSE_NONE = {
    "adadelta_optimizer": "no fused Adadelta in torchrec/FBGEMM (TorchEasyRec fails with a RuntimeError too)",
    "rmsprop_optimizer": "no fused RMSprop in torchrec/FBGEMM (TorchEasyRec fails with a RuntimeError too)",
}
_GPU_ONLY = {"adam", "lamb", "lars_sgd", "partial_rowwise_adam", "partial_rowwise_lamb"}
_ROWWISE_DECAY = {"NONE": "none", "L2": "l2", "DECOUPLE": "decoupled"}

_F = "float"
_ADAM = {"beta1": ("beta1", _F), "beta2": ("beta2", _F), "weight_decay": ("weight_decay", _F),
         "eps": ("eps", _F), "amsgrad": ("amsgrad", "bool"), "fused": ("fused", "bool")}
# proto name -> (tzrec-run type, options, TorchEasyRec defaults that differ from tzrec-run's)
_DENSE: dict[str, tuple[str, dict[str, tuple[str, str]], dict[str, float]]] = {
    "sgd_optimizer": ("sgd", {"momentum": ("momentum", _F), "weight_decay": ("weight_decay", _F),
                              "dampening": ("dampening", _F), "nesterov": ("nesterov", "bool"),
                              "fused": ("fused", "bool")}, {"momentum": 0.9}),
    "adagrad_optimizer": ("adagrad", {"weight_decay": ("weight_decay", _F), "eps": ("eps", _F), "fused": ("fused", "bool"),
                                      "initial_accumulator_value": ("initial_accumulator_value", _F)}, {}),
    "adam_optimizer": ("adam", _ADAM, {}),
    "adamw_optimizer": ("adamw", _ADAM, {"weight_decay": 0.0}),
    "adadelta_optimizer": ("adadelta", {"rho": ("rho", _F), "eps": ("eps", _F), "weight_decay": ("weight_decay", _F)}, {"rho": 0.95}),
    "rmsprop_optimizer": ("rmsprop", {"alpha": ("alpha", _F), "eps": ("eps", _F), "weight_decay": ("weight_decay", _F)}, {}),
}

_WARMUP = {"warmup_learning_rate": ("warmup_learning_rate", _F), "warmup_size": ("warmup_size", "int"),
           "min_learning_rate": ("min_learning_rate", _F), "by_epoch": ("by_epoch", "bool")}
_SCHEDULES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "constant_learning_rate": ("constant", {}),
    "exponential_decay_learning_rate": ("exponential_decay", {"decay_size": ("decay_size", "int"),
                                        "decay_factor": ("decay_factor", _F), "staircase": ("staircase", "bool"), **_WARMUP}),
    "manual_step_learning_rate": ("manual_step", {"warmup": ("warmup", "bool"), "by_epoch": ("by_epoch", "bool")}),
    "cosine_annealing_learning_rate": ("cosine_annealing", {"T_max": ("T_max", "int"), **_WARMUP}),
    "cosine_annealing_warm_restarts_learning_rate": ("cosine_annealing_warm_restarts",
                                                     {"T_0": ("T_0", "int"), "T_mult": ("T_mult", "int"), **_WARMUP}),
}


def _lr(node: Node, out: dict[str, Any]) -> None:
    lr = node.value("lr", _F)
    if lr is None:
        lr = 0.002
        node.note("lr", "unset: TorchEasyRec's default 0.002 written out (lr is required in tzrec-run)")
    out["lr"] = lr


def _schedule(node: Node) -> Optional[dict[str, Any]]:
    """The lr_schedule of an optimizer message (None for constant or none)."""
    name = node.which(_SCHEDULES)
    if name is None:
        return None
    kind, spec = _SCHEDULES[name]
    sched = node.child(name)
    if sched is None:
        return None
    out: dict[str, Any] = {"type": kind}
    sched.copy(out, spec)
    if kind == "exponential_decay" and not out.get("decay_size"):
        sched.used.add("decay_size")
        node.findings.not_converted.append(Finding(
            sched.at("decay_size"), "unset or 0, which makes TorchEasyRec fail with ZeroDivisionError; the schedule is "
                                    "left out (constant lr): add lr_schedule with a decay_size of at least 1"))
        sched.rest()
        return None
    if kind == "manual_step":
        sizes, rates = sched.values("schedule_sizes", "int"), sched.values("learning_rates", _F)
        # TorchEasyRec (bisect_left) switches to learning_rates[i] one step after schedule_sizes[i];
        # with warmup the first rate is reached at schedule_sizes[0] exactly, as here
        shifted = [s if i == 0 and out.get("warmup") else s + 1 for i, s in enumerate(sizes)]
        out["schedule_sizes"], out["learning_rates"] = shifted, rates
        if shifted != sizes:
            sched.note("schedule_sizes", f"{sizes} written as {shifted}: TorchEasyRec uses learning_rates[i] from one "
                                         "step after schedule_sizes[i], tzrec-run from schedule_sizes[i] on; the "
                                         "converted run keeps TorchEasyRec's lr at every step")
    sched.rest()
    return None if kind == "constant" else out


def sparse_optimizer(node: Node) -> Optional[dict[str, Any]]:
    """``train.sparse_optimizer`` from ``train_config.sparse_optimizer`` (None when it cannot be
    converted)."""
    name = node.which([*_SPARSE, *_SPARSE_NONE])
    if name is None or name in _SPARSE_NONE:
        if name is not None:
            node.skip(name, _SPARSE_NONE[name])
        else:
            node.findings.not_converted.append(Finding(node.path, "no optimizer set (TorchEasyRec requires one)"))
        node.rest()
        return None
    kind, spec = _SPARSE[name]
    opt = node.child(name)
    out: dict[str, Any] = {"type": kind}
    if opt is not None:
        _lr(opt, out)
        opt.copy(out, spec)
        if kind == "rowwise_adagrad":
            decay = opt.value("weight_decay", _F, 0.0)
            mode = opt.value("weight_decay_mode", "str", "NONE")
            if mode not in _ROWWISE_DECAY:
                opt.skip_value(opt.at("weight_decay_mode"), mode, "NONE, L2 or DECOUPLE")
            elif _ROWWISE_DECAY[mode] == "none" and decay > 0:
                opt.note("weight_decay", f"{decay} left out: with weight_decay_mode NONE (TorchEasyRec's default) "
                                         "FBGEMM applies no weight decay")
            elif _ROWWISE_DECAY[mode] != "none":
                out["weight_decay"], out["weight_decay_mode"] = decay, _ROWWISE_DECAY[mode]
        opt.rest()
        if kind in _GPU_ONLY:
            node.note(name, f"FBGEMM has no CPU kernel for '{kind}': to train on CPU add cpu_policy = \"data_parallel\" "
                            "(tzrec-run help sparse-optimizers-cpu)")
    schedule = _schedule(node)
    if schedule is not None:
        out["lr_schedule"] = schedule
    node.rest()
    return out


def _dense_optimizer_fields(node: Node, optimizers: Iterable[str]) -> Optional[dict[str, Any]]:
    """type, lr, options and lr_schedule of a dense or part optimizer message."""
    name = node.which(optimizers)
    if name is None:
        node.findings.not_converted.append(Finding(node.path, "no optimizer set (TorchEasyRec requires one)"))
        return None
    kind, spec, defaults = _DENSE[name]
    opt = node.child(name)
    out: dict[str, Any] = {"type": kind}
    if opt is not None:
        _lr(opt, out)
        opt.copy(out, spec)
        for key, value in defaults.items():
            if key not in out:
                out[key] = value
                opt.note(key, f"unset: TorchEasyRec's default {value} written out (tzrec-run's '{kind}' uses torch's default)")
        opt.rest()
    return out


def dense_optimizer(node: Node) -> Optional[dict[str, Any]]:
    """``train.dense_optimizer`` from ``train_config.dense_optimizer``, parts and EMA included (None
    when no optimizer is set)."""
    out = _dense_optimizer_fields(node, _DENSE)
    if out is None:
        node.rest()
        return None
    schedule = _schedule(node)
    if schedule is not None:
        out["lr_schedule"] = schedule
    parts = []
    for field_name, lr_wrapper in (("part_optimizers", None), ("param_optimizers", "param_learning_rate")):
        for part_node in node.indexed_children(field_name):
            pattern = part_node.value("regex_pattern", "str")
            part = _dense_optimizer_fields(part_node, _DENSE)
            if part is None or pattern is None:
                part_node.rest()
                continue
            holder = part_node.child(lr_wrapper) if lr_wrapper else part_node
            part_schedule = _schedule(holder) if holder is not None else None
            if holder is not None and holder is not part_node:
                holder.rest()
            parts.append({"pattern": pattern, **part, **({"lr_schedule": part_schedule} if part_schedule else {})})
            part_node.note("regex_pattern", "matched against tzrec-run's parameter names (`tzrec-run check --params` "
                                            "lists them), which differ from TorchEasyRec's; a parameter two patterns "
                                            "match is an error here (TorchEasyRec: the first wins)")
            part_node.rest()
    if parts:
        out["parts"] = parts
    ema = node.child("ema")
    if ema is not None:
        out["ema"] = {"decay": ema.value("decay", _F, 0.999)}
        ema.rest()
    node.rest()
    return out
