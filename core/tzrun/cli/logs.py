"""How tzrec-run logs: the format (with the date and the rank), which ranks log what, ``--log-level`` and
``TZRUN_LOG_LEVEL``, the library warnings no user can act on, and no URL's password in a line."""

from __future__ import annotations

import logging
import os
import warnings

from tzrun.runner.log_file import DATE_FORMAT, log_format, redact_record

__all__ = ["LOG_LEVELS", "LOG_LEVEL_ENV", "setup_logging"]

#: The levels ``--log-level`` and ``TZRUN_LOG_LEVEL`` take.
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The environment variable that sets the log level when ``--log-level`` is not given.
LOG_LEVEL_ENV = "TZRUN_LOG_LEVEL"


def setup_logging(level: str | None = None) -> None:
    """INFO from tzrec-run on rank 0 only, warnings from every rank with the rank in the line;
    libraries (FBGEMM logs through the root logger) at WARNING.

    Args:
        level: ``--log-level`` (or ``TZRUN_LOG_LEVEL``): tzrec-run's loggers (``tzrun.*``) log
            from this level on every rank, except that ``info`` stays rank 0's (the other
            ranks log warnings, as by default); ``error`` also quiets libraries' warnings.
    """
    rank = int(os.environ.get("RANK", 0))
    chosen = getattr(logging, level.upper()) if level else None
    logging.basicConfig(
        level=max(logging.WARNING, chosen or logging.WARNING),
        format=log_format(rank),
        datefmt=DATE_FORMAT,
    )
    for handler in logging.getLogger().handlers:
        if redact_record not in handler.filters:
            handler.addFilter(redact_record)
    if chosen is None or (chosen == logging.INFO and rank != 0):
        chosen = logging.INFO if rank == 0 else logging.WARNING
    logging.getLogger("tzrun").setLevel(chosen)
    # deprecation notices raised inside torchrec / FBGEMM / torch that a user cannot act on
    for category, module in ((DeprecationWarning, r"(torchrec|fbgemm_gpu|torch\.jit)(\.|$)"),
                             (FutureWarning, r"(torchrec|torch\.distributed\.checkpoint)(\.|$)")):
        warnings.filterwarnings("ignore", category=category, module=module)
    # FBGEMM's CPU dense embedding op (data-parallel tables) has no registered autograd kernel;
    # torch's fallback computes the right gradient (tested) and warns about the fallback itself
    warnings.filterwarnings("ignore", message="fbgemm::dense_embedding_codegen_lookup_function", category=UserWarning)
    warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)
    # torchrec's planner and pipelines warn about every table on every rank at set-up
    for name in ("torchrec.distributed.planner", "torchrec.distributed.train_pipeline",
                 "torchrec.distributed.utils", "torchrec.distributed.model_parallel"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # torch warns once per process that is_fx_tracing also answers for torch.export, when
    # TorchRec's pipeline traces the model: an internal API note no user can act on
    logging.getLogger("torch.fx._symbolic_trace").addFilter(
        lambda record: "is_fx_tracing will return true" not in record.getMessage())
