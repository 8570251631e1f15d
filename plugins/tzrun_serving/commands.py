"""``tzrec-run export`` and ``tzrec-run ckpt apply-deltas``: the serving plugin's commands
(registered through ``tzrun_register_commands``)."""

from __future__ import annotations

import json
from typing import Optional

import attrs

import tzrun
from tzrun.errors import WriteError

__all__ = ["ExportOptions", "ApplyDeltasOptions", "export", "apply_deltas"]


@attrs.frozen(kw_only=True)
class ExportOptions:
    """The options of ``tzrec-run export``.

    Attributes:
        config: the run's TOML file.
        overrides: ``--set KEY=VALUE`` overrides, in order.
        strict: a broken plugin is an error.
        checkpoint: ``latest``, ``best``, a checkpoint directory, or ``step-N``.
        out: the export directory to write (local or a URL).
        model_dir: the model dir to read instead of the config's ``model_dir``.
    """

    config: str = attrs.field(metadata={"positional": True, "help": "the run's TOML file"})
    overrides: tuple[str, ...] = attrs.field(default=(), metadata={
        "flag": "--set", "metavar": "KEY=VALUE",
        "help": "override a config key with a TOML literal, e.g. train.num_steps=100 (repeatable; as for train)"})
    strict: bool = attrs.field(default=False, metadata={
        "help": "a broken plugin is an error with its traceback, not a warning that disables it "
                "(as [plugins] strict = true or TZRUN_STRICT_PLUGINS=1)"})
    checkpoint: str = attrs.field(default="latest", metadata={
        "metavar": "latest|best|PATH",
        "help": "latest (default), best (eval.best_metric), a checkpoint directory, or step-N"})
    out: str = attrs.field(metadata={"metavar": "DIR", "help": "the export directory to write (local or a URL)"})
    model_dir: Optional[str] = attrs.field(default=None, metadata={
        "help": "the model dir to read instead of the config's model_dir"})


def export(options: ExportOptions) -> int:
    """``tzrec-run export``: a checkpoint as a torch.export program and a manifest of its inputs."""
    from tzrun_serving.export import export_command

    overrides = list(options.overrides)
    if options.model_dir:
        overrides.append(f"model_dir={json.dumps(options.model_dir)}")
    session = tzrun.Session.from_config(options.config, overrides, strict=options.strict)
    done = export_command(session, options.checkpoint, options.out)
    programs = ", ".join(p.name for p in done.programs)
    print(f"exported {tzrun.redact_url(str(done.checkpoint))} (step {done.step}) to "
          f"{tzrun.redact_url(str(done.path))}: {programs}")
    return 0


@attrs.frozen(kw_only=True)
class ApplyDeltasOptions:
    """The options of ``tzrec-run ckpt apply-deltas``.

    Attributes:
        path: the base, a complete checkpoint directory.
        deltas: the ``embedding_deltas`` stage's dumps, written by the checkpoint's run.
        out: the file the tables are written to.
        upto: apply the dumps up to this step only (default: all of them).
    """

    path: str = attrs.field(metadata={"positional": True, "metavar": "CHECKPOINT",
                                      "help": "the base: a complete checkpoint directory"})
    deltas: str = attrs.field(metadata={"positional": True, "metavar": "DELTAS_DIR",
                                        "help": "the stage's dumps (model_dir/embedding_deltas), written by the "
                                                "checkpoint's run"})
    out: str = attrs.field(metadata={"metavar": "FILE", "help": "where to write the tables"})
    upto: Optional[int] = attrs.field(default=None, metadata={"metavar": "STEP",
                                                              "help": "apply the dumps up to this step only"})


def apply_deltas(options: ApplyDeltasOptions) -> int:
    """``tzrec-run ckpt apply-deltas``: see :func:`tzrun_serving.deltas.apply_deltas` (the dumps
    of the checkpoint's own run only, each checked before any is applied; nothing is written
    otherwise).

    Raises:
        WriteError: when ``--out`` is a directory or its directory does not exist (before
            anything is read), or the file cannot be written.
        CheckpointError: when the checkpoint or a dump cannot be used, DELTAS_DIR holds no dump,
            or a dump is another run's.
    """
    import io

    import torch

    from tzrun_serving import deltas

    _check_out(options.out)
    deltas.check_deltas_dir(options.deltas)
    base, step = deltas.checkpoint_tables(options.path)
    tables, at = deltas.apply_deltas(base, options.deltas, step, options.upto,
                                     run_id=deltas.checkpoint_run_id(options.path))
    buffer = io.BytesIO()
    torch.save(tables, buffer)
    try:
        tzrun.write_atomic(options.out, buffer.getvalue())
    except OSError as error:
        raise WriteError(f"{options.out}: cannot write the tables ({error.strerror or error})") from None
    print(f"{options.out}: {len(tables)} table(s) at step {at} ({options.path} at step {step} plus the dumps of "
          f"{options.deltas})")
    return 0


def _check_out(out: str) -> None:
    """Refuse an ``--out`` that cannot be a file: a directory, or under a missing one."""
    from pathlib import Path

    if tzrun.is_remote(out):
        return
    path = Path(out)
    if path.is_dir():
        raise WriteError(f"{out}: is a directory: --out names the file to write the tables to (e.g. {path / 'tables.pt'})")
    if not path.parent.is_dir():
        raise WriteError(f"{out}: its directory {path.parent} does not exist: create it, or pass another --out")
