"""``tzrec-run predict``: its arguments, and the command (see :mod:`tzrun.runner.predict`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Sequence

from tzrun.errors import EXIT_USAGE

__all__ = ["add_predict_parser", "cmd_predict"]


def add_predict_parser(sub: Any, config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``predict`` to the subcommands ``sub``."""
    p = sub.add_parser("predict", help="score unlabelled rows (Parquet or CSV, local or a URL) with a checkpoint or "
                                       "an export, and write the scores as Parquet in input order")
    config_args(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="latest|best|PATH",
                        help="score with this checkpoint's model (as evaluate --checkpoint names it)")
    source.add_argument("--export", metavar="DIR", help="score with this export (tzrec-run export) instead")
    p.add_argument("--input", required=True, metavar="PATH", help="the rows: a file, a directory or a glob, read by data.reader")
    p.add_argument("--output", required=True, metavar="PATH",
                   help="a .parquet file, or a directory of parts (part-NNNNN.parquet, then _SUCCESS)")
    p.add_argument("--keep-columns", default="", metavar="A,B", help="input columns to copy next to the scores")
    p.add_argument("--outputs", default="", metavar="A,B",
                   help="model outputs to write (default: every output with one value per row; vectors become lists)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--model-dir", help="the model dir to find the checkpoint in instead of the config's model_dir")
    p.add_argument("--nproc-per-node", type=int, metavar="N", help="score with N processes on this machine through torchrun")


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def cmd_predict(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``tzrec-run predict``; returns the exit code."""
    from tzrun.cli import main

    if args.nproc_per_node and "LOCAL_RANK" not in os.environ:
        return main._launch_torchrun(args, argv)
    if args.export and args.model_dir:
        print("tzrec-run predict: --model-dir names where checkpoints are; an export needs none", file=sys.stderr)
        return EXIT_USAGE
    session = main.prepare(args.config, main._overrides_with_model_dir(args), args.strict)
    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.predict import PredictRequest, predict_checkpoint

    request = PredictRequest(args.input, args.output, _names(args.keep_columns), _names(args.outputs), args.overwrite)
    try:
        if args.export:
            from tzrun.runner.predict_scored import predict_export

            done = predict_export(session, args.export, request)
        else:
            done = predict_checkpoint(session, args.checkpoint, request)
    except BaseException as error:
        main._fail_named(error, session.cfg.model_dir, args.config)
        raise
    finally:
        shutdown_distributed()
    if int(os.environ.get("RANK", 0)) == 0:
        from tzrun.io.storage import redact_url

        rate = done.rows / done.seconds if done.seconds > 0 else 0.0
        opened = "the export's opening" if args.export else "the checkpoint's restore"
        print(f"predicted {done.rows} rows with {redact_url(done.source)} into {redact_url(done.output)} "
              f"in {done.seconds:.1f} s ({rate:,.0f} rows/s; {opened} took {done.start_seconds:.1f} s before)")
        if done.skipped:
            print(f"left out {done.skipped} bad row(s) (data.on_bad_row = \"skip\"); listed in {redact_url(done.skipped_listing)}")
    return 0
