"""``tzrec-run``: thin argument parsing that calls into config/ and runner/.

Commands: ``train``, ``evaluate``, ``predict``, ``check``, ``plan``, ``plugins``, ``ckpt ls|inspect``, ``plot``,
``env``, ``data synth``, ``convert``, ``install-stack``, ``init``, ``completion``, ``help``, and those plugins
register (``export`` and ``ckpt apply-deltas`` come from the first-party ``tzrun_serving``). Every command exits with one of the codes of
:mod:`tzrun.errors` (``EXIT_*``; ``tzrec-run help exit-codes``). Torch is imported only by the
commands that need it, so ``--help``, ``check``, ``plugins``, ``ckpt`` and ``convert`` start fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, NoReturn, Sequence

from tzrun import __version__
from tzrun.cli.commands import COMMANDS, prepare
from tzrun.errors import EXIT_BROKEN_PIPE, EXIT_CONFIG, EXIT_USAGE, TzrunError, exit_code_of
from tzrun.cli.logs import LOG_LEVEL_ENV, LOG_LEVELS
from tzrun.cli.logs import setup_logging as _setup_logging
from tzrun.io.storage import redact_url
from tzrun.cli.install_commands import add_parsers as add_install_parsers
from tzrun.cli.results import print_evaluation, print_train
from tzrun.runner.launch import with_our_spellings
from tzrun.cli.completion import SHELLS
from tzrun.cli.predict_command import add_predict_parser, cmd_predict
from tzrun.cli.plugin_commands import (add_plugin_commands, command_of as _command_of, names_no_command_of_ours as
                                       _names_no_command_of_ours, plugin_commands, run_plugin_command)

__all__ = ["main", "console_main", "build_parser", "EXIT_CONFIG", "LOG_LEVELS", "LOG_LEVEL_ENV"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors exit with :data:`~tzrun.errors.EXIT_USAGE` (64)
    instead of 2, with the usual usage line and ``tzrec-run: error: ...`` message."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(plugin_commands: Sequence[Any] = ()) -> argparse.ArgumentParser:
    """The argument parser of ``tzrec-run``, with the commands plugins registered
    (:mod:`tzrun.cli.plugin_commands`) after its own."""
    parser = ArgumentParser(
        prog="tzrec-run",
        description="Train recommendation models on TorchRec from one TOML file.",
        epilog="Exit codes: tzrec-run help exit-codes. Help topics: tzrec-run help.",
    )
    parser.add_argument("--version", action="version", version=f"tzrec-run {__version__}")
    log_level_help = (f"how much tzrec-run logs: {', '.join(LOG_LEVELS)} (default: info on rank 0, warning on the "
                      f"others; also {LOG_LEVEL_ENV})")
    parser.add_argument("--log-level", choices=LOG_LEVELS, help=log_level_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", help="the run's TOML file")
        p.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
            help="override a config key with a TOML literal, e.g. train.num_steps=100 or "
                 'data.train_input="x/*.parquet"; KEY+=VALUE appends to an array and KEY-=VALUE removes '
                 'the items that match, e.g. \'train.stages+=[{type = "tensorboard"}]\' (repeatable)',
        )
        p.add_argument("--strict", action="store_true",
                       help="a broken plugin is an error with its traceback, not a warning that disables it "
                            "(as [plugins] strict = true or TZRUN_STRICT_PLUGINS=1)")

    train = sub.add_parser("train", help="train, evaluate and checkpoint as the config says")
    config_args(train)
    train.add_argument("--model-dir", help="write here instead of the config's model_dir")
    existing = train.add_mutually_exclusive_group()
    existing.add_argument(
        "--overwrite", action="store_true",
        help="remove the checkpoints and results of an earlier run in the model dir first "
             "(without --overwrite or --resume, a model dir with checkpoints is refused)",
    )
    existing.add_argument(
        "--resume", action="store_true",
        help="continue from the latest complete checkpoint in the model dir (start afresh if there "
             "is none): the schedules, optimizer states and data position continue exactly",
    )
    train.add_argument(
        "--nproc-per-node", type=int, metavar="N",
        help="launch N processes on this machine through torchrun (same as `torchrun "
             "--nproc-per-node N -m tzrun train ...`; torchrun's spelling --nproc_per_node works too)",
    )
    train.add_argument(
        "--init-from", metavar="CKPT",
        help="fine-tune: start from the model weights of this checkpoint (or model dir's latest); "
             "strict: every model tensor must be found and every checkpoint tensor used",
    )
    train.add_argument("--init-map", metavar="FILE", help="with --init-from: a file of 'NEW_NAME OLD_NAME' lines")
    train.add_argument("--init-optimizer", action="store_true", help="with --init-from: also load the optimizer state")
    train.add_argument("--init-allow-missing", action="append", default=[], metavar="PATTERN",
                       help="with --init-from: model tensors that may be absent from the checkpoint (repeatable)")
    train.add_argument("--init-allow-unexpected", action="append", default=[], metavar="PATTERN",
                       help="with --init-from: checkpoint tensors the model may leave unused (repeatable)")
    train.add_argument("--json", action="store_true",
                       help="print the result as JSON on rank 0 (tzrec-run help json); logs stay on standard error")
    train.add_argument(
        "--max-restarts", type=int, metavar="N",
        help="with --nproc-per-node: let torchrun restart the workers up to N times after a "
             "failure or a signal stop (use with --resume so that they continue)",
    )

    evaluate = sub.add_parser("evaluate", help="evaluate a checkpoint on data.eval_input and record the result")
    config_args(evaluate)
    evaluate.add_argument(
        "--checkpoint", required=True, metavar="latest|best|PATH",
        help="latest: the newest complete checkpoint of the model dir; best: the one best.json names "
             "(eval.best_metric); or a checkpoint directory (step-N alone means model_dir/checkpoints/step-N)",
    )
    evaluate.add_argument("--model-dir", help="the model dir to read and record in instead of the config's model_dir")
    evaluate.add_argument(
        "--nproc-per-node", type=int, metavar="N", help="evaluate with N processes on this machine through torchrun",
    )
    evaluate.add_argument("--json", action="store_true", help="print the result as JSON (tzrec-run help json)")

    add_predict_parser(sub, config_args)

    ckpt = sub.add_parser("ckpt", help="list and inspect checkpoints (does not import torch)")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True, metavar="CKPT_COMMAND")
    ckpt_ls = ckpt_sub.add_parser("ls", help="one line per checkpoint: step, epoch, world size, state, size, best")
    ckpt_ls.add_argument("model_dir", metavar="MODEL_DIR")
    ckpt_ls.add_argument("--json", action="store_true", help="print JSON")
    ckpt_inspect = ckpt_sub.add_parser(
        "inspect", help="step, epoch, world size, sharding, learning rates, data position, plugins, manifest check")
    ckpt_inspect.add_argument("path", metavar="PATH", help="a checkpoint directory (model_dir/checkpoints/step-N)")
    ckpt_inspect.add_argument("--json", action="store_true", help="print JSON")
    ckpt_inspect.add_argument("--no-hashes", action="store_true",
                              help="check file sizes against the manifest, not SHA-256 hashes (faster)")


    check = sub.add_parser(
        "check", help="check a config (both passes) without building a model, and the input files' columns "
                      "from their schemas (Parquet footers, CSV headers; no rows are read)")
    config_args(check)
    check.add_argument(
        "--no-data", action="store_true",
        help="check the config only: do not list the input files or read their schemas",
    )
    check.add_argument(
        "--require-data", action="store_true",
        help="an input path that does not exist is an error (by default it is one only when another "
             "input of the config exists; when none does, a note says the data was not checked)",
    )
    check_output = check.add_mutually_exclusive_group()
    check_output.add_argument("--json", action="store_true",
                              help="print the verdict as JSON (tzrec-run help json)")
    check_output.add_argument(
        "--params", action="store_true",
        help="also build the model on the meta device (imports torch) and print which dense "
             "parameters each dense optimizer part gets, and each table's sparse optimizer",
    )
    check.add_argument(
        "--device", choices=("cpu", "cuda"), default=None,
        help="the device the run will train on, which decides the sparse optimizers FBGEMM can fuse "
             "(--params) and the memory the sharding plan has (default: cuda if this machine has a GPU, else cpu)",
    )
    check.add_argument(
        "--nproc-per-node", type=int, default=1, metavar="N",
        help="plan the tables for a run of N ranks on this machine (default 1, as tzrec-run train): check runs "
             "TorchRec's planner, and on cpu refuses tables this host's available memory cannot hold",
    )
    check.add_argument(
        "--no-plan", action="store_true",
        help="do not plan the tables (a config for another cluster: tzrec-run plan checks it for that one)",
    )

    plan = sub.add_parser(
        "plan", help="run TorchRec's sharding planner for a cluster on the meta device (no data, no GPU): "
                     "memory per rank and the sharding of each table")
    config_args(plan)
    plan.add_argument("--world-size", type=int, required=True, metavar="N", help="ranks in all")
    plan.add_argument("--local-world-size", type=int, metavar="L", help="ranks per host (default: N, one host)")
    plan.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                      help="the ranks' device: kernels and memory the planner assumes (default cuda)")
    plan.add_argument("--hbm-gb", type=float, metavar="G", help="device memory per rank in GiB (default TorchRec's 32)")
    plan.add_argument("--ddr-gb", type=float, metavar="D", help="host memory per rank in GiB (default TorchRec's 128)")
    plan.add_argument("--batch-size", type=int, metavar="B", help="rows per step per rank (default data.batch_size)")
    plan.add_argument("--json", action="store_true", help="print JSON")

    plugins = sub.add_parser("plugins", help="list the installed plugins, their components with options, "
                                             "clashing names, and disabled and failed plugins")
    plugins.add_argument("config", nargs="?", help="a config whose [plugins] section (disable, strict) applies")
    plugins.add_argument("--disable", action="append", default=[], metavar="PLUGIN",
                         help="do not load this plugin (repeatable; like [plugins] disable)")
    plugins.add_argument("--strict", action="store_true", help="a broken plugin is an error with its traceback")
    plugins_output = plugins.add_mutually_exclusive_group()
    plugins_output.add_argument("--json", action="store_true", help="print JSON")
    plugins_output.add_argument(
        "--freeze", action="store_true",
        help="print a pinned requirement line (name==version) for each distribution that provides "
             "a loaded plugin, e.g. to reproduce a run's plugin set with pip install -r",
    )

    new_plugin = sub.add_parser("new-plugin", help="write a plugin distribution (components, entry point, tests "
                                                   "with tzrun.testing's checks) to start from")
    new_plugin.add_argument("name", metavar="NAME", help="the plugin's name, e.g. acme (distribution tzrun-acme)")
    new_plugin.add_argument("--kind", default="dense_optimizer,metric", metavar="KIND[,KIND...]",
                            help="example components to write: dense_optimizer, lr_scheduler, loss, metric, stage "
                                 "(default dense_optimizer,metric)")
    new_plugin.add_argument("--out", default=".", metavar="DIR", help="where to create tzrun-NAME/ (default .)")

    plot = sub.add_parser("plot", help="draw a run's metrics.jsonl (loss, learning rates, eval metrics) as PNG files")
    plot.add_argument("model_dir", metavar="MODEL_DIR")
    plot.add_argument("--out", metavar="DIR", help="where the PNG files go (default MODEL_DIR/plots)")

    convert = sub.add_parser(
        "convert", help="turn a TorchEasyRec pipeline config (protobuf text) into TOML, features and model included; "
                        "what cannot be converted is listed at the top of the output and on standard error")
    convert.add_argument("pipeline_config", metavar="PIPELINE_CONFIG", help="a TorchEasyRec pipeline config")
    convert.add_argument("--out", metavar="FILE", help="write the TOML to FILE (default: standard output)")

    env = sub.add_parser("env", help="the installed versions, and whether torch / fbgemm / torchrec are a known-good triple")
    env.add_argument("--json", action="store_true", help="print JSON")
    add_install_parsers(sub)  # install-stack, init

    data = sub.add_parser("data", help="data utilities")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    synth = data_sub.add_parser("synth", help="generate a synthetic dataset with a known best AUC: criteo, taobao, "
                                              "or shaped like a config's inputs (--like CONFIG OUT_DIR)")
    synth.add_argument("dataset", nargs="?", metavar="DATASET|OUT_DIR",
                       help="which shape of data: criteo or taobao; with --like, the output directory")
    synth.add_argument("--like", metavar="CONFIG", help="draw every input the config reads (features, sequences, "
                       "labels, sample weight, a sampler's item table) and print the --set lines that point it there")
    synth.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="with --like: override a key of CONFIG first, as train --set does (repeatable)")
    synth.add_argument("--rows", type=int, help="training rows (required for criteo and taobao; --like: 10000)")
    synth.add_argument("--eval-rows", type=int, help="evaluation rows (default rows/10, at least 1000)")
    synth.add_argument("--out", help="output directory (with --like, OUT_DIR may be given instead)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--json", action="store_true", help="print what was written as JSON (tzrec-run help json)")
    synth.add_argument("--drift", action="store_true",
                       help="criteo only: cat_2, cat_3, cat_11, cat_15 and cat_20 become open id spaces where new ids "
                            "keep arriving and old ones fade (docs: zch)")
    synth.add_argument("--format", choices=["parquet", "text"], default="parquet",
                       help="criteo only: Parquet files, or the Criteo display-advertising text format "
                            "(tab-separated, no header, hexadecimal ids) as train/day_N.txt and eval/day_N.txt")

    completion = sub.add_parser("completion", help="print a shell completion script (commands, options, examples, "
                                                   'help topics): eval "$(tzrec-run completion bash)" in ~/.bashrc')
    completion.add_argument("shell", choices=SHELLS, help="the shell the script is for")

    help_ = sub.add_parser("help", help="short help pages shipped with tzrec-run (errors name them); "
                                        "without TOPIC, the list of topics")
    help_.add_argument("topic", nargs="?", metavar="TOPIC")
    add_plugin_commands(sub, plugin_commands, list(sub.choices))
    _accept_everywhere(parser, "--log-level", choices=LOG_LEVELS, help=log_level_help)
    return parser


def _accept_everywhere(parser: argparse.ArgumentParser, option: str, **kwargs: Any) -> None:
    """Accept the global ``option`` after every command and subcommand too (``tzrec-run ckpt ls
    DIR --log-level debug``), where it does not replace a value given before the command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if option not in sub._option_string_actions:
                    sub.add_argument(option, default=argparse.SUPPRESS, **kwargs)
                _accept_everywhere(sub, option, **kwargs)


def _launch_torchrun(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Start ``argv``'s command on ``--nproc-per-node`` ranks (:func:`tzrun.runner.launch.launch_torchrun`)."""
    from tzrun.runner.launch import launch_torchrun

    return launch_torchrun(argv, args.nproc_per_node, getattr(args, "max_restarts", None))


def _overrides_with_model_dir(args: argparse.Namespace) -> list[str]:
    """``--set`` overrides, then ``--model-dir`` as ``model_dir = ...``."""
    overrides = list(args.overrides)
    if args.model_dir:
        overrides.append(f"model_dir={json.dumps(args.model_dir)}")
    return overrides


def _cmd_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.nproc_per_node and "LOCAL_RANK" not in os.environ:
        return _launch_torchrun(args, argv)
    session = prepare(args.config, _overrides_with_model_dir(args), args.strict)
    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.trainer import train

    try:
        init = None
        if args.init_from:
            from tzrun.runner.init_from import InitFrom

            init = InitFrom(args.init_from, args.init_map, args.init_optimizer,
                            tuple(args.init_allow_missing), tuple(args.init_allow_unexpected))
        result = train(session, overwrite=args.overwrite, resume=args.resume, init_from=init)
    except BaseException as error:
        _fail_named(error, session.cfg.model_dir, args.config)
        raise
    finally:
        shutdown_distributed()
    print_train(result, session.cfg.model_dir, args.json)
    if result.stopped_by is not None:
        from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL

        return EXIT_STOPPED_BY_SIGNAL
    return 0


def _cmd_evaluate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.nproc_per_node and "LOCAL_RANK" not in os.environ:
        return _launch_torchrun(args, argv)
    session = prepare(args.config, _overrides_with_model_dir(args), args.strict)
    cfg = session.cfg
    from tzrun.runner.checkpoint_eval import evaluate_checkpoint
    from tzrun.runner.distributed import shutdown_distributed

    from tzrun.errors import RecordNotWrittenError

    try:
        done = evaluate_checkpoint(session, args.checkpoint)
    except RecordNotWrittenError as error:  # rank 0 computed the result: show it, then the error
        print_evaluation(error.result, None, args.json)
        raise
    except BaseException as error:
        _fail_named(error, cfg.model_dir, args.config)
        raise
    finally:
        shutdown_distributed()
    if int(os.environ.get("RANK", 0)) == 0:
        print_evaluation(done, os.path.join(cfg.model_dir, "eval_results.jsonl"), args.json)
    return 0


def _fail_named(error: BaseException, model_dir: str, config: str | None = None) -> None:
    """Tell the other ranks (:func:`_fail_collectively`); a failure to write into the model dir
    (full disk, read-only dir) is raised instead as a one-line
    :class:`~tzrun.errors.WriteError` (:mod:`tzrun.io.write_errors`). Rank 0 of a job of several
    ranks prints its own :class:`~tzrun.errors.TzrunError` first: once the others have followed
    it, torchrun may end rank 0 before its error would have reached the command line."""
    from tzrun.io.write_errors import named_write_error

    named = named_write_error(error, model_dir)
    failure = named or error
    if isinstance(failure, TzrunError) and os.environ.get("RANK", "0") == "0" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _print_error(failure, config)
    _fail_collectively(failure)
    if named is not None:
        raise named from None


def _print_error(error: TzrunError, config: str | None) -> None:
    """Print ``error`` as the command's one line (once)."""
    if not error.printed:
        print(f"tzrec-run: {redact_url(str(_named_after_the_config(error, config)))}", file=sys.stderr, flush=True)
        error.printed = True


def console_main() -> None:
    """The ``tzrec-run`` executable (and ``python -m tzrun``): :func:`main`, then exit.

    An error that is not a :class:`~tzrun.errors.TzrunError` prints its traceback and exits
    with :data:`~tzrun.errors.EXIT_INTERNAL` (70), Ctrl-C outside training with 130. When the
    reader of standard output goes away (``tzrec-run plugins --json | head -1``), the command
    ends quietly with :data:`~tzrun.errors.EXIT_BROKEN_PIPE` (141, as a shell reports a command
    killed by SIGPIPE): standard output is pointed at ``/dev/null`` so that the interpreter's
    final flush cannot fail again (as Python's documentation of SIGPIPE recommends).

    After ``train``, ``evaluate`` and ``predict`` (the commands that start torch.distributed, TorchRec and
    FBGEMM), and any command that imported TorchRec (a plugin's: ``export``), the process ends with ``os._exit`` once its output is flushed and the process
    group is destroyed, skipping the interpreter's teardown: native objects that survive to
    it (gloo's worker threads, TorchRec's and FBGEMM's caches) were seen to abort a finished
    evaluation now and then ("terminate called without an active exception", exit -6) after
    everything had been written. Other commands exit normally.
    """
    argv = sys.argv[1:]
    had_torchrec = "torchrec" in sys.modules
    try:
        code = main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("tzrec-run: interrupted", file=sys.stderr)
        code = exit_code_of(KeyboardInterrupt())
    except Exception as error:  # noqa: BLE001 - an internal error: its traceback, then its exit code
        import traceback

        print(redact_url(traceback.format_exc()), end="", file=sys.stderr)
        code = exit_code_of(error)
    from tzrun.runner.launch import record_exit_code

    record_exit_code(code)
    if _command_of(argv) in ("train", "evaluate", "predict") or (not had_torchrec and "torchrec" in sys.modules):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BrokenPipeError:
                code = _quiet_broken_pipe()
        logging.shutdown()
        os._exit(code)
    raise SystemExit(code)


def _quiet_broken_pipe() -> int:
    """Standard output's reader went away: point it at ``/dev/null`` (the interpreter's final
    flush would fail again) and return :data:`~tzrun.errors.EXIT_BROKEN_PIPE`."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tzrec-run`` with ``argv`` (default: the process arguments); returns the exit code."""
    argv = with_our_spellings(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    registered: list[Any] = []
    if _names_no_command_of_ours(parser, argv):
        registered = plugin_commands()
        parser = build_parser(registered)
    args = parser.parse_args(argv)
    level = args.log_level or os.environ.get(LOG_LEVEL_ENV, "").strip().lower() or None
    if level not in (None, *LOG_LEVELS):
        print(f"tzrec-run: {LOG_LEVEL_ENV}={os.environ[LOG_LEVEL_ENV]!r}: expected one of {', '.join(LOG_LEVELS)}",
              file=sys.stderr)
        return EXIT_USAGE
    _setup_logging(level)
    launches = {"train": _cmd_train, "evaluate": _cmd_evaluate, "predict": cmd_predict}  # these may start torchrun
    try:
        if args.command in launches:
            return launches[args.command](args, argv)
        code = run_plugin_command(args)  # a plugin's command (or sub-command of a group of ours)
        if code is not None:
            return code
        return COMMANDS[args.command](args)
    except TzrunError as error:
        if not _announced_by_rank0(error):
            _print_error(error, getattr(args, "config", None))
        return exit_code_of(error)


def _fail_collectively(error: BaseException) -> None:
    """In a job of several ranks: tell the others (:mod:`tzrun.runner.watchdog`), so that they
    stop within seconds and rank 0 prints this error once."""
    from tzrun.runner.watchdog import fail_collectively

    fail_collectively(error)


def _announced_by_rank0(error: BaseException) -> bool:
    """Whether rank 0 prints ``error`` for this rank (see :mod:`tzrun.runner.watchdog`)."""
    from tzrun.runner.watchdog import announced_by_rank0

    return announced_by_rank0(error)


def _named_after_the_config(error: TzrunError, config: str | None) -> TzrunError:
    """A config problem found while the run is built (a model's options, a sparse optimizer
    FBGEMM cannot run here) is labelled with a section (``model``); name the config file
    instead, as the checks before it do. The problems keep their full TOML paths."""
    from tzrun.errors import ConfigError

    if (isinstance(error, ConfigError) and isinstance(config, str) and error.source != config
            and not os.path.isfile(error.source)):
        return ConfigError(config, error.problems)
    return error
