"""Every hook of tzrec-run, docstrings only.

There are two kinds of hooks.

**Registration hooks** (``tzrun_register_<kind>``) are called once per run, on every rank,
while the registries are collected, before the config's component sections are checked. Each
hookimpl is called on its own and receives a ``register`` callback bound to its plugin, so every
component knows which plugin (and distribution) made it::

    register(name, *, config=<attrs class of the TOML options>, build=<callable>,
             description="one line", **kind_specific)

**Lifecycle hooks** are the stages of the training loop. Plugins loaded from entry points may
implement them, and so may the stage objects that a config names (``[[train.stages]]``): those
are registered on the run's own plugin manager for that run only. The loop, with every hook::

    pm = make_plugin_manager(); registries = collect_registries(pm)      # tzrun_register_*
    config = load_config(path, registries)                               # two passes
    init process group; build model (meta device), planner, DMP, optimizers, schedules
    stages = build [[train.stages]]; register each on pm
    tzrun_before_train(run)                                              # every rank
    try:
        for step in 1..num_steps (or until num_epochs passes end):
            batch -> pipeline.progress(): forward, losses, backward (fused sparse update),
                     dense optimizer step
            schedules step
            tzrun_after_train_step(run, step)                            # every rank, every step
            if step % save_checkpoints_steps == 0 (or last step):
                tzrun_before_checkpoint_save(run, step, state)           # every rank
                save checkpoint (torch.distributed.checkpoint), marker written last
                tzrun_before_eval(run, step)
                evaluate -> metrics over all ranks
                tzrun_after_eval(run, step, results)                     # every rank, same results
        tzrun_after_train(run, step)                                     # every rank
    except BaseException as error:
        tzrun_on_train_error(run, error); raise

Rules for lifecycle hooks: a per-step hook (``tzrun_after_train_step``) runs on the hot path; it
must never force a device sync or a collective by itself: a stage that wants the loss as a number
asks for it at its own interval (``StepInfo.loss.item()`` every N steps). Hooks that run on every
rank must not issue collectives unless every rank's implementation issues the same ones. Work
that only rank 0 should do checks ``run.is_rank0``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from tzrun.interfaces import EvalResult, Register, RunContext, StepInfo

__all__ = ["hookspec", "PROJECT_NAME"]

PROJECT_NAME = "tzrun"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)


# ----------------------------------------------------------------------------------------------
# registration hooks


@hookspec
def tzrun_register_sparse_optimizers(register: Register) -> None:
    """Register embedding (sparse) optimizers by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)`` once per optimizer; ``build(cfg)`` returns a
    :class:`tzrun.SparseOptimizerSpec`: a declarative description (a torchrec optimizer class
    and its keyword arguments) that the core applies to the embedding tables at sharding time,
    so FBGEMM fuses the update into the backward pass. ``build`` must not touch tensors.
    """


@hookspec
def tzrun_register_dense_optimizers(register: Register) -> None:
    """Register dense optimizers by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)`` once per optimizer; ``build(cfg, params)``
    returns a ``torch.optim.Optimizer`` over ``params`` (a list of parameters, or of param
    group dicts). Every float option of ``cfg`` named ``lr`` is the base learning rate that
    schedules start from.
    """


@hookspec
def tzrun_register_lr_schedulers(register: Register) -> None:
    """Register learning-rate schedules by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg, optimizer)`` returns a
    ``torch.optim.lr_scheduler.LRScheduler`` over ``optimizer`` (every param group of it;
    a group whose base lr is 0 is frozen and should stay at 0). If the scheduler has a true
    ``by_epoch`` attribute the runner calls its ``step()`` after the last batch of every epoch,
    otherwise after every training batch; batch n of a run therefore trains with the lr of
    position n - 1 (resp. epoch e with position e). Its ``state_dict()`` is saved in every
    checkpoint and ``load_state_dict()`` must restore the position, including the lr of the
    optimizer's param groups, so that a resumed run continues the schedule.
    """


@hookspec
def tzrun_register_losses(register: Register) -> None:
    """Register losses by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=..., prediction="logits")``; ``build(cfg)`` returns
    an ``nn.Module`` whose ``forward(prediction, label, weight)`` returns a scalar loss.
    ``prediction`` names the model output it consumes by default (``"logits"`` or
    ``"probs"``); ``weight`` is the per-row sample weight (0 for padding rows, which must
    contribute nothing). ``group="none"`` (default), ``"optional"`` or ``"required"`` says
    whether the loss takes a group key: with one, ``forward`` also receives ``group=`` an int64
    key per row, read from the loss table's ``group_by`` column (a session, a user, a query).
    The loss is computed in float32 (outside autocast's reduced precision).
    """


@hookspec
def tzrun_register_metrics(register: Register) -> None:
    """Register evaluation metrics by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=..., prediction="probs")``; ``build(cfg)`` returns a
    ``torchmetrics.Metric`` whose ``update(prediction, label, weight)`` accumulates a batch and
    whose ``compute()`` returns the value over all ranks' rows. Rows of weight 0 are padding
    and must not change the result. With ``group="required"`` (or ``"optional"``) the metric
    also receives ``group=`` an int64 key per row, read from the table's ``group_by`` column.
    A config class may define a ``default_name`` property: the result name when the table sets
    no ``name`` (e.g. ``auc_binned200``), otherwise the type is used.
    """


@hookspec
def tzrun_register_train_pipelines(register: Register) -> None:
    """Register TorchRec train pipelines by name (``[train] pipeline = {type = ...}``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg, model, optimizer, device)``
    returns a ``torchrec.distributed.train_pipeline.TrainPipeline`` whose ``progress(it)`` runs
    one step (forward, backward and optimizer step when the model is in training mode) and
    returns the model's output for that step, raising ``StopIteration`` when ``it`` is done.
    """


@hookspec
def tzrun_register_stages(register: Register) -> None:
    """Register loop stages by name (``[[train.stages]] type = ...``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg)`` returns an object with
    lifecycle hookimpls (``@tzrun.hookimpl def tzrun_after_train_step(self, run, step)``), which
    the runner registers on the run's plugin manager for that run only.
    """


@hookspec
def tzrun_register_models(register: Register) -> None:
    """Register model architectures by name (``[model] type = ...``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg, ctx)`` receives a
    :class:`tzrun.ModelContext` (the features, their embedding tables, the device for embedding
    collections, which is ``meta`` so that TorchRec shards them) and returns an ``nn.Module``
    whose ``forward(batch)`` returns a dict of named output tensors (``"logits"``, ``"probs"``).
    """


@hookspec
def tzrun_register_readers(register: Register) -> None:
    """Register data readers by name (``[data.reader] type = ...``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg)`` returns a
    :class:`tzrun.Reader`: it lists the row groups of an input path with their row counts and
    reads a row range of one of them as ``pyarrow.RecordBatch``es. The core splits rows across
    ranks and DataLoader workers and turns columns into batches.
    """


# ----------------------------------------------------------------------------------------------
# lifecycle hooks


@hookspec
def tzrun_before_train(run: RunContext) -> None:
    """Called once, on every rank, after the model, optimizers and stages are built and before
    the first training step. May read ``run.config`` and ``run.model_dir`` and open files (on
    rank 0 for shared outputs). Must not issue collectives."""


@hookspec
def tzrun_after_train_step(run: RunContext, step: StepInfo) -> None:
    """Called after every training step, on every rank, on the hot path.

    ``step.loss`` is the step's total loss as a tensor that has NOT been synchronized: calling
    ``.item()`` on it forces a device sync, so do it only at your own interval. Must never
    issue a collective. May set ``run.stop_requested = True`` on any rank to ask the loop to
    stop: at the next checkpoint boundary the ranks agree (any rank asking stops all), the
    checkpoint and evaluation of that boundary are written, and training ends.
    """


@hookspec
def tzrun_before_eval(run: RunContext, step: int) -> None:
    """Called on every rank right before an evaluation pass at global step ``step``."""


@hookspec
def tzrun_after_eval(run: RunContext, step: int, result: EvalResult) -> None:
    """Called on every rank after an evaluation pass; ``result.metrics`` holds the values over
    all ranks' rows (identical on every rank). May set ``run.stop_requested``."""


@hookspec
def tzrun_before_checkpoint_save(run: RunContext, step: int, state: dict[str, Any]) -> None:
    """Called on every rank before a checkpoint at ``step`` is written. A stage that keeps state
    puts it in ``state[<its stage name>]`` (JSON-serializable); it is saved with the checkpoint."""


@hookspec
def tzrun_after_checkpoint_load(run: RunContext, step: int, state: dict[str, Any]) -> None:
    """Called on every rank after a checkpoint at ``step`` is loaded; ``state`` is what the
    stages saved in :func:`tzrun_before_checkpoint_save`."""


@hookspec
def tzrun_after_train(run: RunContext, step: int) -> None:
    """Called once on every rank after the last training step, the final checkpoint and the
    final evaluation. Close files and writers here."""


@hookspec
def tzrun_on_train_error(run: RunContext, error: BaseException) -> None:
    """Called on every rank where training raised, before the error propagates. Must not
    raise and must not issue collectives (other ranks may be gone)."""
