"""Who owns a model dir: a new run, the run it continues (``--resume``), or a run that replaces
an earlier one (``--overwrite``), and what an earlier run's outputs are.

Only a directory marked as a run's (:mod:`tzrun.runner.run_marker`) is written to or cleaned:
a non-empty directory without the marker is refused before anything is written there, and
``--overwrite`` removes only :func:`run_outputs`, leaving any other file alone."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from tzrun.config.schema import RunConfig
from tzrun.errors import TzrunError
from tzrun.io.files import EVAL_RESULTS
from tzrun.runner.log_file import LOG_DIR
from tzrun.kernel.registry import Registries
from tzrun.runner.checkpoint import latest_checkpoint, remove_incomplete_checkpoints
from tzrun.runner.records import ENV_FILE, RESOLVED_JSON, RESOLVED_TOML, owner_differences
from tzrun.runner.retention import BEST_FILE
from tzrun.runner.run_marker import RUN_MARKER, NotARunDirError, check_run_dir, write_run_marker
from tzrun.io.storage import is_remote, remove_tree
from tzrun.runner.distributed import refusal_of_rank0

__all__ = ["CORE_OUTPUTS", "run_outputs", "refuse_foreign_model_dir", "claim_model_dir"]

log = logging.getLogger(__name__)

#: What the core itself writes into a model dir (stages declare their own: ``register(..., outputs=fn)``).
CORE_OUTPUTS = ("checkpoints", "predictions", "plots", EVAL_RESULTS, BEST_FILE, RESOLVED_TOML, RESOLVED_JSON, ENV_FILE,
                "init_report.json", LOG_DIR)


def run_outputs(cfg: RunConfig, registries: Registries) -> list[str]:
    """The paths (relative to the model dir) an earlier run may have written: the core's, and
    what each stage declares, both with this config's options and with each stage's defaults
    (an earlier run may have used a stage this config does not)."""
    outputs = list(CORE_OUTPUTS)
    registry = registries["stage"]
    for entry in registry.entries():
        declare = entry.extras.get("outputs")
        if declare is None:
            continue
        options: list[Any] = [c.config for c in cfg.train.stages if c.type == entry.name]
        try:
            options.append(entry.config())
        except TypeError:  # a stage whose options have required fields has no defaults
            pass
        outputs += [str(p) for cfg_ in options for p in declare(cfg_)]
    return [p for p in dict.fromkeys(outputs) if not Path(p).is_absolute() and ".." not in Path(p).parts]


def _remove(model_dir: Path, relative: list[str]) -> None:
    for name in relative:
        path = model_dir / name
        if is_remote(path):  # an object store: a prefix, or one object
            remove_tree(path)
            path.unlink(missing_ok=True)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _replaces_a_run_that_saved_nothing(model_dir: Path, cfg: RunConfig, rank: int) -> bool:
    """Whether the run recorded in ``model_dir`` is replaced without ``--overwrite``: it
    differs from ``cfg`` only in ``[[features]]`` and saved no checkpoint (a retry after
    fixing a feature). Anything else that differs is refused.

    Raises:
        TzrunError: naming the differences, when the model dir holds another run.
    """
    differences = owner_differences(model_dir, cfg)
    if not differences:
        return False
    saved_nothing = latest_checkpoint(model_dir) is None
    if saved_nothing and all(d.startswith("features") for d in differences):
        if rank == 0:
            log.warning("%s: replacing the records of an earlier run that saved no checkpoint and had other [[features]]:\n%s",
                        model_dir, "\n".join(f"  {d}" for d in differences))
        return True
    why = " (it saved no checkpoint, but its [model] differs)" if saved_nothing else ""
    raise TzrunError(
        f"{model_dir} holds another run{why} ({RESOLVED_JSON} differs in [model] or [[features]]):\n"
        + "\n".join(f"  {d}" for d in differences)
        + "\npass --overwrite to replace that run, or --model-dir to train elsewhere"
    )


def refuse_foreign_model_dir(model_dir: Path, *, overwrite: bool, rank: int, world_size: int) -> None:
    """Refuse, on every rank, a model dir that is not empty and not a run's (rank 0 reads it
    and tells the others: a collective with several ranks). Reads only: call it before the
    run lock is taken, so that nothing is written into such a directory.

    Raises:
        NotARunDirError: naming the directory, what it holds and the fix; or why it could not
            be read (a store's credentials, permissions).
    """
    refusal = None
    if rank == 0:
        try:
            check_run_dir(model_dir, overwrite=overwrite)
        except NotARunDirError as error:
            refusal = str(error)
        except (TzrunError, OSError) as error:  # refused on every rank, not a hang
            refusal = f"{model_dir}: cannot tell whether it is a tzrec-run model dir ({type(error).__name__}: {error})"
    refusal = refusal_of_rank0(refusal, world_size)
    if refusal is not None:
        raise NotARunDirError(refusal)


def _mark(model_dir: Path, state: str, *, replace: bool) -> None:
    """Write the marker of a run that starts here: new (a new or empty directory, or one it
    replaces) or adopted (a run written before markers)."""
    if state == "legacy":
        log.warning("%s: a model dir written before tzrec-run marked its model dirs; adopting it (writing %s)",
                    model_dir, RUN_MARKER)
    if replace or state != "run":
        write_run_marker(model_dir)


def claim_model_dir(model_dir: Path, cfg: RunConfig, registries: Registries, *, overwrite: bool, resume: bool,
                    rank: int) -> Path | None:
    """Apply the policy for a model dir that already has checkpoints, or records of another run
    (another ``[model]`` or ``[[features]]``; a run that saved no checkpoint and differs only
    in ``[[features]]`` is replaced as with ``overwrite``); returns the checkpoint to resume
    from, if any.
    Rank 0 writes the run's marker first, then removes what an interrupted save left behind,
    or with ``overwrite`` the earlier run's outputs. Every rank calls it; the caller makes the
    ranks meet before anyone writes.

    Raises:
        NotARunDirError: for a directory that is not empty and not a run's (nothing is changed).
        TzrunError: for another run's model dir, or checkpoints without ``resume``/``overwrite``.
    """
    # rank 0 alone reads the dir again (under the lock now): the other ranks had its verdict
    # from refuse_foreign_model_dir, and use no state
    state = check_run_dir(model_dir, overwrite=overwrite) if rank == 0 else "run"
    replace = overwrite or _replaces_a_run_that_saved_nothing(model_dir, cfg, rank)
    existing = latest_checkpoint(model_dir)
    if existing is not None and not (overwrite or resume):
        raise TzrunError(
            f"{model_dir} already has checkpoints (latest: {existing.name}); pass --resume to continue "
            "from it, --overwrite to start over in it, or --model-dir to train elsewhere"
        )
    if rank == 0:
        _mark(model_dir, state, replace=replace)  # before anything is removed: a cut-short clean-up leaves a run's dir
        if replace:
            _remove(model_dir, run_outputs(cfg, registries))
        else:
            remove_incomplete_checkpoints(model_dir)
    return existing if resume and not overwrite else None
