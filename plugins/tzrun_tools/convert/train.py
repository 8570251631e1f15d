"""``train_config``: steps, checkpoints, optimizers, precision, clipping, and the stages it implies."""

from __future__ import annotations

from typing import Any, Optional

from tzrun_tools.convert.nodes import Finding, Node
from tzrun_tools.convert.optimizers import dense_optimizer, sparse_optimizer

__all__ = ["convert_train", "constraints"]

_F = "float"

_SUMMARIES_ALWAYS = {"loss", "learning_rate", "global_gradient_norm"}
_SHARDING = ("table_wise", "row_wise", "table_row_wise", "column_wise", "table_column_wise")
_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching")


def constraints(node: Node) -> Optional[dict[str, Any]]:
    """The ``ParameterConstraints`` message ``node`` as an ``embedding_constraints`` table (``None``: empty)."""
    out: dict[str, Any] = {}
    for name, allowed in (("sharding_types", _SHARDING), ("compute_kernels", _KERNELS)):
        given = node.values(name, "str")
        kept = [v for v in given if v in allowed]
        for v in given:
            if v not in allowed:
                node.findings.not_converted.append(Finding(node.at(name), f"'{v}' is not offered here (choose from "
                                                           f"{', '.join(allowed)}; tzrec-run help plan-constraints)"))
        if kept:
            out[name] = kept
    node.rest()
    return out or None


def convert_train(node: Node, train: dict[str, Any]) -> None:
    """Convert ``train_config`` into the ``[train]`` table ``train``."""
    for name in ("num_steps", "num_epochs"):
        value = node.value(name, "int")
        if value:
            train[name] = value
    if "num_steps" not in train and "num_epochs" not in train:
        node.findings.not_converted.append(Finding(node.at("num_steps"), "neither num_steps nor num_epochs is set "
                                                   "(TorchEasyRec refuses this); set one in [train]"))
    epochs = node.value("save_checkpoints_epochs", "int")
    if epochs:
        train["save_checkpoints_epochs"] = epochs
        node.skip("save_checkpoints_steps", "TorchEasyRec ignores it when save_checkpoints_epochs is set")
    else:
        steps = node.value("save_checkpoints_steps", "int")
        if steps is None:
            steps = 1000
            node.note("save_checkpoints_steps", "unset: TorchEasyRec's default 1000 written out (tzrec-run's default "
                                                "0 checkpoints and evaluates only at the end)")
        if steps:
            train["save_checkpoints_steps"] = steps
    keep = node.value("keep_checkpoint_max", "int")
    if keep:
        train["keep_checkpoint_max"] = keep
    log_every = node.value("log_step_count_steps", "int")
    if log_every is not None:
        train["log_every_n_steps"] = log_every
    for name in ("cudnn_allow_tf32", "cuda_matmul_allow_tf32"):
        flag = node.value(name, "bool")
        if flag is not None:
            train[name] = flag
    for name, convert in (("sparse_optimizer", sparse_optimizer), ("dense_optimizer", dense_optimizer)):
        child = node.child(name)
        converted = convert(child) if child is not None else None
        if converted is not None:
            train[name] = converted
        elif child is None:
            node.findings.not_converted.append(Finding(node.at(name), f"missing (TorchEasyRec requires it); set train.{name}"))
    precision = node.value("mixed_precision", "str", "")
    if precision.upper() in ("BF16", "FP16"):
        train["mixed_precision"] = precision.lower()
    elif precision:
        node.findings.not_converted.append(Finding(node.at("mixed_precision"), f"'{precision}' is neither BF16 nor FP16"))
    scaler = node.child("grad_scaler")
    if scaler is not None:
        if train.get("mixed_precision") == "fp16":
            out: dict[str, Any] = {}
            scaler.copy(out, {"init_scale": ("init_scale", _F), "growth_factor": ("growth_factor", _F),
                              "backoff_factor": ("backoff_factor", _F), "growth_interval": ("growth_interval", "int")})
            train["grad_scaler"] = out
            scaler.rest()
        else:
            node.skip("grad_scaler", "tzrec-run scales the loss only with mixed_precision FP16 (bf16 and float32 "
                                     "gradients do not underflow)")
    accumulation = node.value("gradient_accumulation_steps", "int")
    if accumulation and accumulation > 1:
        train["gradient_accumulation_steps"] = accumulation
        node.note("gradient_accumulation_steps", "embeddings get each batch's unscaled gradient here, not the "
                                                 "1/N-scaled one (tzrec-run help gradient-accumulation)")
    clipping = node.child("grad_clipping")
    if clipping is not None:
        by = clipping.value("clipping_type", "str", "none").lower()
        if by in ("norm", "value"):
            out = {"by": by}
            clipping.copy(out, {"max_gradient": ("max_gradient", _F), "norm_type": ("norm_type", _F)})
            train["grad_clipping"] = out
            if clipping.value("enable_global_grad_clip", "bool") is not None:
                clipping.note("enable_global_grad_clip", "dense gradients are averaged over the ranks before "
                                                         "clipping here, so the norm is always the global one")
        elif by != "none":
            clipping.skip_value(clipping.at("clipping_type"), by, "'norm', 'value' or 'none'")
        clipping.rest()
    limits = node.child("global_embedding_constraints")
    if limits is not None:
        converted = constraints(limits)
        if converted:
            train["global_embedding_constraints"] = converted
    _stages(node, train)
    node.skip("fine_tune_checkpoint", "a start point is a command-line option here: `tzrec-run train --init-from "
                                      "CKPT` with a tzrec-run checkpoint (tzrec-run help fine-tuning)")
    node.skip("fine_tune_ckpt_param_map", "use `tzrec-run train --init-from CKPT --init-map FILE` (the same "
                                          "'NEW_NAME OLD_NAME' lines)")
    for name in ("save_checkpoints_timestamp_interval", "save_checkpoints_timestamps", "save_checkpoints_timestamp_quorum"):
        node.skip(name, "event-time (Kafka) checkpoints have no equivalent: tzrec-run checkpoints by steps or epochs")
    node.skip("delta_embedding_dump_config", "dumping changed embedding rows (CUDA, FeatureStore) has no equivalent")
    node.rest()


def _stages(node: Node, train: dict[str, Any]) -> None:
    stages: list[dict[str, Any]] = [{"type": "progress"}, {"type": "metrics_log"}]
    summaries = node.values("tensorboard_summaries", "str")
    tensorboard = node.value("use_tensorboard", "bool")
    if tensorboard is None:
        tensorboard = True
        node.note("use_tensorboard", "unset: TorchEasyRec writes TensorBoard events by default, so the "
                                     "'tensorboard' stage is added")
    if tensorboard:
        stage: dict[str, Any] = {"type": "tensorboard"}
        for value in summaries:
            if value in ("parameter", "gradient"):
                stage["histograms_every_n_steps"] = train.get("log_every_n_steps", 100)
            elif value == "gradient_norm":
                node.findings.not_converted.append(Finding(node.at("tensorboard_summaries"), "'gradient_norm': "
                                                           "per-parameter gradient norms are not logged (grad/global_norm is)"))
            elif value not in _SUMMARIES_ALWAYS:
                node.findings.not_converted.append(Finding(node.at("tensorboard_summaries"), f"unknown summary '{value}'"))
        stages.append(stage)
    elif summaries:
        node.skip("tensorboard_summaries", "use_tensorboard is false (TorchEasyRec ignores it too)")
    if node.value("is_profiling", "bool"):
        stages.append({"type": "profiler", "wait": 1, "warmup": 1, "active": 10, "repeat": 1,
                       "record_shapes": True, "profile_memory": True, "with_stack": True})
    if len(stages) > 2:
        train["stages"] = stages
