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
are registered on the run's own plugin manager for that run only. The loop, with every hook
(``[R]``: how often; ``[ranks]``: where; ``sync``: whether the hook may synchronize)::

    session = Session.from_config(path)      # make_plugin_manager; tzrun_register_*; two passes
    session.start()                          # init process group; the run's parts, built once:
                                             # model (meta device), planner, DMP, optimizers, schedules
    trainer = Trainer(session)               # the loop below, method by method
    stages = build [[train.stages]] (then each top-level table named after a stage, e.g. [export]);
             register each on pm (called in config order)
    if resuming:
        one dcp.load of trainer.state(); stage.load_state_dict(saved[stage name])
        tzrun_after_checkpoint_load(run, step, state)          # once    [every rank] sync ok
    tzrun_before_train(run)                                    # once    [every rank] sync ok
    try:
        if resumed from a boundary's checkpoint (its evaluation followed it) and there is an
           eval input: that step's evaluation, best checkpoint and stop agreement, as below
        for each segment (it ends at a checkpoint boundary: every save_checkpoints_steps,
                          every save_checkpoints_epochs epochs, and the last step):
            for each step of the segment:
                wait for the batch (timed: the data-wait fraction)
                pipeline.progress(): forward, losses, backward (fused sparse update),
                                     dense optimizer step
                schedules step
                tzrun_after_train_step(run, step_info)         # every step [every rank] NO sync (a
                                                       # collective only at steps step.step picks)
                every train.log_every_n_steps steps:
                    make the TrainLog (one device sync for the loss, no collective)
                    tzrun_after_train_log(run, train_log)      # per interval [every rank] no collective
            ranks agree on signals (SIGTERM/SIGUSR1); on one: save the checkpoint and stop
            tzrun_before_checkpoint_save(run, step, state)     # per boundary [every rank] sync ok
            save checkpoint (one torch.distributed.checkpoint save of trainer.state(), stage
                             states included, "evaluate_on_resume"), marker last
            if there is an eval input:
                tzrun_before_eval(run, step)                   # per boundary [every rank] sync ok
                evaluate -> metrics over all ranks; append to eval_results.jsonl
                tzrun_after_eval(run, step, result)            # per boundary [every rank] sync ok
            record the best checkpoint (eval.best_metric)
                tzrun_after_checkpoint_complete(run, step, path, best, final=False, facts)
                                                       # per evaluation [every rank] sync ok
            prune old checkpoints
            ranks agree on run.stop_requested (any rank asking stops all)
        wait for the last save; unless a signal stopped the run:
            tzrun_after_checkpoint_complete(run, step, path, best=False, final=True, facts)
                                                               # once    [every rank] sync ok
        tzrun_after_train(run, step)                           # once    [every rank] sync ok
    except BaseException as error:
        tzrun_on_train_error(run, error); raise                # once    [failing ranks] no sync

Rules for lifecycle hooks: the per-step hook (``tzrun_after_train_step``) runs on the hot path;
it must never force a device sync or a collective on every step: a stage that wants the loss as
a number implements ``tzrun_after_train_log``, which receives it already synchronized, once per
interval, the same record for every stage. The one exception is a collective at steps that the
step number alone picks (see :func:`tzrun_after_train_step`). "sync ok" hooks run where every rank is at the same
point, so a hook may issue a collective there, but only if every rank's implementation issues
the same ones. Work that only rank 0 should do checks ``run.is_rank0``.

**Stages** (``[[train.stages]] type = "..."``) are objects with lifecycle hookimpls. They are
called in the order the config lists them (they are registered in reverse, since pluggy calls
the last registered first); a hookimpl marked ``tryfirst``/``trylast`` goes before/after every
other. A stage that keeps state across a resume implements ``state_dict() -> dict`` (tensors,
numbers, strings, bytes, bools, None, and lists, tuples and dicts of those: a checkpoint is
data) and ``load_state_dict(state)``: the runner saves it in every checkpoint under the
stage's name (its ``type``, or ``type.i`` when the config lists a type more than once) and
restores it before ``tzrun_after_checkpoint_load``. A stage ends training early by setting
``run.stop_requested = True`` (and ``run.stop_reason``) in any hook: at the next checkpoint
boundary, after its checkpoint and evaluation, the ranks agree and the run ends normally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from tzrun.interfaces import (
        EvalResult, Register, RegisterLosses, RegisterLossWeightings, RegisterMetrics, RegisterModels,
        RegisterReaders, RegisterSamplers, RegisterStages, RunContext, StepInfo, TrainLog,
    )

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
def tzrun_register_losses(register: RegisterLosses) -> None:
    """Register losses by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=..., prediction="logits")``; ``build(cfg)`` returns
    an ``nn.Module`` whose ``forward(prediction, label, weight)`` returns a scalar loss.
    ``prediction`` names the model output it consumes by default (``"logits"`` or
    ``"probs"``); ``weight`` is the per-row sample weight (0 for padding rows, which must
    contribute nothing). ``group="none"`` (default), ``"optional"`` or ``"required"`` says
    whether the loss takes a group key: with one, ``forward`` also receives ``group=`` an int64
    key per row, read from the loss table's ``group_by`` column (a session, a user, a query).
    ``labels=`` declares the labels the loss accepts: ``"binary"`` (0 or 1), ``"class_index"``
    (a whole number >= 0, below the options' ``num_classes`` when they have one),
    ``"non_negative"`` or ``"finite"``; the batch builder checks every batch's label column
    against the strictest domain its losses and metrics declare, and reports a row outside it
    (file, line, column) like any bad value. Unset, labels are only checked to be finite.
    ``reads=`` names the kind of output the loss needs, as the head of the output's name (the
    part before ``/``): ``reads="class_logits"`` for a loss of two-class logits ``[B, 2]``, which
    a model declares as ``class_logits`` or ``class_logits/<task>``. When the model declares its
    outputs, ``tzrec-run check`` refuses a ``prediction`` of another kind (``logits/<task>``,
    one logit per row) instead of the first step failing on its shape.
    The loss is computed in float32 (outside autocast's reduced precision).
    """


@hookspec
def tzrun_register_loss_weightings(register: RegisterLossWeightings) -> None:
    """Register loss weightings by name (``[train.loss_weighting] type = ...``): how the
    ``[[losses]]`` make the training loss.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg, names)`` gets the loss names in
    config order and returns an ``nn.Module`` whose ``forward(losses, params)`` gets each loss
    (a scalar tensor, its ``weight`` applied) by name and the parameters that backward gives a
    ``.grad`` (the dense ones: FBGEMM updates embedding tables inside backward), and returns
    ``(total, weights)``: the loss to train on and, by loss name, the weights it used as
    detached scalar tensors (``{}`` for none); the train log shows their mean over its window.
    It runs at every training step on the hot path: no host sync (no ``.item()``), no
    collective. Evaluation sums the losses instead. ``register(..., check=fn)`` adds a check
    run by ``tzrec-run check`` and before training: ``fn(cfg, names)`` returns ``(key,
    message)`` pairs, ``key`` relative to ``[train.loss_weighting]``.
    """


@hookspec
def tzrun_register_metrics(register: RegisterMetrics) -> None:
    """Register evaluation metrics by name.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=..., prediction="probs")``; ``build(cfg)`` returns a
    ``torchmetrics.Metric`` whose ``update(prediction, label, weight)`` accumulates a batch and
    whose ``compute()`` returns the value over all ranks' rows. Rows of weight 0 are padding
    and must not change the result. With ``group="required"`` (or ``"optional"``) the metric
    also receives ``group=`` an int64 key per row, read from the table's ``group_by`` column.
    ``labels=`` declares the labels the metric accepts, as for losses (``"binary"`` for AUC).
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
def tzrun_register_stages(register: RegisterStages) -> None:
    """Register loop stages by name (``[[train.stages]] type = ...``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg)`` returns an object with
    lifecycle hookimpls (``@tzrun.hookimpl def tzrun_after_train_step(self, run, step)``), which
    the runner registers on the run's plugin manager for that run only, and optionally
    ``state_dict()``/``load_state_dict(state)`` (saved in checkpoints under the stage's name).
    ``register(..., check=fn)`` adds a check that needs the whole config, run by ``tzrec-run
    check`` and before training: ``fn(cfg, run_config, eval_keys)`` gets the stage's options,
    the run config and the keys an evaluation reports, and returns ``(key, message)`` pairs
    for problems with keys of the stage's table (an empty list when all is well).
    ``register(..., outputs=fn)`` declares what the stage writes into the model dir:
    ``fn(cfg)`` gets the stage's options and returns paths relative to the model dir (``["tensorboard"]``);
    ``tzrec-run train --overwrite`` removes them with the rest of the earlier run's outputs.
    """


@hookspec
def tzrun_register_models(register: RegisterModels) -> None:
    """Register model architectures by name (``[model] type = ...``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg, ctx)`` receives a
    :class:`tzrun.ModelContext` (the features, their embedding tables, the device for embedding
    collections, which is ``meta`` so that TorchRec shards them) and returns an ``nn.Module``
    whose ``forward(batch)`` returns a dict of named output tensors (``"logits"``, ``"probs"``).
    ``register(..., outputs=fn)`` declares them: ``fn(cfg)`` returns the output names, and
    ``tzrec-run check`` then refuses a loss or metric that reads an output the model lacks.
    """


@hookspec
def tzrun_register_readers(register: RegisterReaders) -> None:
    """Register data readers by name (``[data.reader] type = ...``).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg)`` returns a
    :class:`tzrun.Reader`: it lists the row groups of an input path with their row counts and
    reads a row range of one of them as ``pyarrow.RecordBatch``es. The core splits rows across
    ranks and DataLoader workers and turns columns into batches.

    ``register(..., check=fn)`` adds a check that ``tzrec-run check`` and every training run make
    before reading: ``fn(reader_cfg, columns)`` gets the reader's options and the input columns
    the run reads (features, labels, sample weight, group keys), and returns ``(key, message)``
    pairs, ``key`` relative to ``[data.reader]`` (``""`` for the table itself). A reader whose
    options fix the columns (a headerless CSV's ``column_names``) can refuse a run that reads
    another one before any file is opened.
    """


@hookspec
def tzrun_register_samplers(register: RegisterSamplers) -> None:
    """Register samplers by name (``[data.sampler] type = ...``): where a model's sampled
    training rows come from.

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)`` for a sampler whose ``build(cfg)`` returns a
    :class:`tzrun.ItemSampler`: the item table (one row per item, its columns named like the
    input's) and, per batch, the rows to take as negatives; the core looks up the sampled
    items' features in that table and appends them to the batch, whose labels stay ``[B]``
    (a two-tower model's shared negatives). Call ``register(name, ..., expands_rows=True)``
    for one whose ``build(cfg)`` returns a :class:`tzrun.RowSampler`: per batch, it turns the
    input rows into the rows that are trained on, as many as it likes, labels set (TDM's
    ancestors and per-level negatives, the user's columns repeated); the core then encodes
    those rows as it would have encoded the input's. Either way the core hands the sampler the
    batch's ``numpy.random.Generator`` (seeded from the run's seed, the rank, the pass and the
    step: the same draws on resume) and a sampler never sees the model (see
    :mod:`tzrun.data.sampling`).

    ``register(..., check=fn)`` adds a check that ``tzrec-run check`` and every training run make
    before reading: ``fn(sampler_cfg)`` returns ``(key, message)`` pairs, ``key`` relative to
    ``[data.sampler]``; it may read the sampler's own files (TDM's tree against
    ``layer_num_sample``) and leaves a file it cannot read to ``build``, which names it.
    """


@hookspec
def tzrun_register_eviction_policies(register: Register) -> None:
    """Register the eviction policies of collision-free ids by name (``zch.eviction_policy =
    { type = ... }`` on an id feature, see docs/zch.md).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg, admission)`` returns a TorchRec
    ``torchrec.modules.mc_modules.MCHEvictionPolicy`` (the score that decides which ids keep
    their rows at an eviction), passing ``admission`` (None, or what an admission filter's
    ``build`` returned) as its ``threshold_filtering_func``. Built once per table, on every
    rank; the policy's state lives in TorchRec's managed-collision module, so it is in every
    checkpoint.
    """


@hookspec
def tzrun_register_admission_filters(register: Register) -> None:
    """Register the admission filters of collision-free ids by name (``zch.admission = { type =
    ... }`` on an id feature, see docs/zch.md).

    Called once per run, on every rank, before the config's component sections are checked.
    Call ``register(name, config=..., build=...)``; ``build(cfg)`` returns a callable that
    TorchRec's eviction policies call at each eviction with the counts of the distinct new ids
    seen since the last one (a 1-d int64 tensor) and that returns ``(mask, threshold)``: a
    boolean mask of the ids that may enter the table, and the threshold it applied (a number
    or a tensor). It must be a pure function of the counts (every rank and every resume
    decides alike); an id it refuses keeps reading the miss row.
    """


@hookspec(firstresult=True)
def tzrun_open_export(path: str, on_bad_row: str) -> Any:
    """Open the export at ``path`` for ``tzrec-run predict --export`` (a complete export, or a
    directory of versions with a ``latest`` pointer), or return None to leave it to another
    plugin; the first plugin that returns a scorer wins (the first-party ``tzrun_serving``
    returns its ``Predictor``). Called once per command, on every rank, before the process
    group is joined. The scorer has ``path`` (shown in messages), ``columns()`` (the raw
    columns it reads), ``per_row_outputs()`` (its outputs with one value per row),
    ``encode(table, source) -> (inputs, kept_rows, skipped)`` (``on_bad_row``: ``"error"``
    or ``"skip"``, ``data.on_bad_row``) and ``run(inputs) -> {output: numpy array}``.
    """


@hookspec
def tzrun_register_commands(register: Register) -> None:
    """Register ``tzrec-run`` subcommands by name (as llm's ``register_commands``): a command
    that is not a run (a report, a converter, a tool for the way out of a run).

    Called once per ``tzrec-run`` invocation that names a command tzrec-run does not ship (and
    for ``tzrec-run --help`` and ``tzrec-run plugins``), before its arguments are parsed, on the
    process that parses them; never during a run. Call ``register(name, config=..., build=...,
    description=...)``: ``name`` is lower_snake and is typed with hyphens
    (``my_report`` is ``tzrec-run my-report``; a name of two words adds a sub-command to the
    command group the first names: ``"ckpt apply_deltas"`` is ``tzrec-run ckpt apply-deltas``);
    each field of the attrs class ``config`` is an
    option of the command (``--field-name``: required without a default, a flag for a ``bool``
    defaulting to false, repeatable for a ``tuple``; ``metadata={"help": ...}`` for its help,
    ``metadata={"positional": True}`` for a positional argument, ``"flag"`` for another
    spelling of the option, ``"metavar"`` for the name its help shows); ``build(options)`` runs the
    command with the options parsed into ``config`` and returns its exit code (``None`` is 0).
    A :class:`~tzrun.errors.TzrunError` it raises is printed as one line with its exit code. A
    name that tzrec-run's own commands use is refused with a warning naming the plugin.
    """


# ----------------------------------------------------------------------------------------------
# lifecycle hooks


@hookspec
def tzrun_before_train(run: RunContext) -> None:
    """Called once, on every rank, after the model, optimizers and stages are built (and, when
    resuming, after the checkpoint is loaded) and before the first training step. May read
    ``run.config`` and ``run.model_dir`` and open files (on rank 0 for shared outputs). Every
    rank is here together, so a collective is allowed if every rank issues it."""


@hookspec
def tzrun_after_train_step(run: RunContext, step: StepInfo) -> None:
    """Called after every training step, on every rank, on the hot path.

    ``step.loss`` is the step's total loss as a tensor that has NOT been synchronized: calling
    ``.item()`` on it forces a device sync, so never do it here (implement
    :func:`tzrun_after_train_log` for numbers).

    Collectives: none on most steps. A hook may issue collectives at steps chosen by
    ``step.step`` (and its options) alone, such as ``step.step % n == 0`` (the
    ``embedding_deltas`` stage's dumps), because every rank calls this hook once for every
    global step, with the same ``step.step``: a rank whose data ran out feeds padding batches
    (weight 0), so no rank skips a step or its hook. Never on a condition a rank decides alone
    (its loss, its rows, the time, its own state): the ranks would then issue different
    collectives, a hang. Such a step pays a sync, so keep them rare. The dense
    parameters' ``.grad`` still hold this step's gradients. May set ``run.stop_requested =
    True`` on any rank to ask the loop to stop: at the next checkpoint boundary the ranks agree
    (any rank asking stops all), the checkpoint and evaluation of that boundary are written,
    and training ends.
    """


@hookspec
def tzrun_after_train_log(run: RunContext, log: TrainLog) -> None:
    """Called every ``train.log_every_n_steps`` steps, on every rank, with the window's
    :class:`tzrun.TrainLog` (mean loss, learning rates, samples/s, data-wait fraction, the
    dense gradient norm). The loss was synchronized once to make the record, whatever the
    number of stages. Must not issue a collective (ranks make their records independently).
    Progress bars, TensorBoard scalars and ``metrics.jsonl`` lines come from here, so they
    show the same numbers.
    """


@hookspec
def tzrun_before_eval(run: RunContext, step: int) -> None:
    """Called on every rank right before an evaluation pass at global step ``step``, at each
    checkpoint boundary when there is an eval input, after that boundary's checkpoint is
    written; and once more for the step a run resumes at, when its checkpoint was written at a
    boundary, before training on (to the plugins :func:`tzrun_after_eval` tells of it again;
    all ranks together: sync ok)."""


@hookspec
def tzrun_after_eval(run: RunContext, step: int, result: EvalResult) -> None:
    """Called on every rank after an evaluation pass, at each checkpoint boundary when there is
    an eval input; ``result.metrics`` holds the values over all ranks' rows (identical on every
    rank, so every rank's stage decides alike). May set ``run.stop_requested`` (and
    ``run.stop_reason``): the run then ends after this boundary. The boundary's checkpoint is
    already written, with the stages' state from before this call: a run resumed from it
    evaluates ``step`` again, so that the stages reach the same state. Each plugin hears each
    step's evaluation once all the same: the evaluation run again goes to the plugins whose
    state the checkpoint restored, and not to those that keep none and heard it before the
    interruption. All ranks together: sync ok."""


@hookspec
def tzrun_before_checkpoint_save(run: RunContext, step: int, state: dict[str, Any]) -> None:
    """Called on every rank before a checkpoint at ``step`` is written, at each checkpoint
    boundary, before that boundary's evaluation (:func:`tzrun_before_eval`), and at a stop by
    a signal (all ranks together: sync ok). A plugin that keeps state puts it in
    ``state[<its name>]`` (tensors, numbers, strings, bools, None, and lists, tuples and dicts
    of those; anything else stops the save with an error naming it); it is saved with the checkpoint (rank 0's copy). A
    stage object can instead implement ``state_dict()``/``load_state_dict()``, which the
    runner calls for it."""


@hookspec
def tzrun_after_checkpoint_complete(run: RunContext, step: int, path: Any, best: bool, final: bool, facts: Any) -> None:
    """Called on every rank once the checkpoint of ``step`` at ``path`` is complete on storage
    (its marker written) and it is known what it is: after each boundary's evaluation that
    records the best checkpoint (when ``eval.best_metric`` is set; ``best``: that evaluation
    made it the best; ``final`` False), and once more at the end of a run that no signal stopped, for its last
    checkpoint (``final`` True, ``best`` False), before :func:`tzrun_after_train`. ``facts`` is
    what follows from the run's config, read-only (``cfg``, ``specs``: the feature specs,
    ``registries``, the resolved loss and metric slots): what rebuilding the model outside
    the run needs, as an export does. Work that one process does (an export written by rank
    0) needs no collective: the other ranks wait at the next one. Sync ok."""


@hookspec
def tzrun_after_checkpoint_load(run: RunContext, step: int, state: dict[str, Any]) -> None:
    """Called once on every rank when a run resumes, after the checkpoint at ``step`` is
    loaded (and the stages' ``load_state_dict`` ran), before :func:`tzrun_before_train`;
    ``state`` is what was saved in :func:`tzrun_before_checkpoint_save`. Sync ok."""


@hookspec
def tzrun_after_train(run: RunContext, step: int) -> None:
    """Called once on every rank after the last training step, the final checkpoint and the
    final evaluation (also when a signal or a stage stopped the run early). Close files and
    writers here. Sync ok."""


@hookspec
def tzrun_on_train_error(run: RunContext, error: BaseException) -> None:
    """Called on every rank where training raised, before the error propagates. Must not
    raise and must not issue collectives (other ranks may be gone). Each plugin's
    implementation is called on its own, like every lifecycle hook: one that raises is logged
    and disabled, the others still run, and the original error is the one that propagates."""
