"""The ``tzrec-run`` commands that inspect, check, plan and convert (everything but training and
evaluation, which :mod:`tzrun.cli.main` starts): each takes the parsed arguments and returns the exit
code. Heavy modules are imported by the command that needs them."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from tzrun.errors import EXIT_CANT_WRITE, EXIT_CHECKPOINT, EXIT_CONFIG, EXIT_USAGE
from tzrun.cli.install_commands import COMMANDS as INSTALL_COMMANDS

__all__ = ["prepare", "COMMANDS"]


def prepare(config: str, overrides: Sequence[str], strict: bool = False) -> Any:
    """The :class:`~tzrun.runner.session.Session` of ``config`` (not started), after checking
    that torch, FBGEMM and TorchRec are installed."""
    from tzrun.stack import require_stack

    require_stack()  # one line naming what is missing of torch / FBGEMM / TorchRec, and the fix
    from tzrun.runner.session import Session

    return Session.from_config(config, overrides, strict=strict)


def cmd_check(args: argparse.Namespace) -> int:
    if args.nproc_per_node < 1:
        print(f"tzrec-run check: --nproc-per-node must be positive, got {args.nproc_per_node}", file=sys.stderr)
        return EXIT_USAGE
    session = prepare(args.config, args.overrides, args.strict)
    cfg = session.cfg
    session.check()
    peak = [] if args.no_plan else check_plan(session, args.config, args.nproc_per_node, args.device)
    report = None if args.no_data else session.check_data(require=args.require_data)
    if report is not None and report.problems:
        from tzrun.errors import DataCheckError

        raise DataCheckError(args.config, report.problems)
    notes = [*peak, *(report.notes if report is not None else ()), *builtin_name_notes(session)]
    if args.json:
        from tzrun.cli.results import print_json

        print_json(check_json(args, cfg, notes))
        return 0
    run = "steps" if cfg.train.num_steps is not None else "epochs"
    print(
        f"{args.config}: ok (model {cfg.model.type}; {len(cfg.features.dense)} dense and "
        f"{len(cfg.features.sparse)} id features{_sequences(cfg)}; sparse {cfg.train.sparse_optimizer.type}, "
        f"dense {cfg.train.dense_optimizer.type}; {cfg.train.num_steps or cfg.train.num_epochs} {run})"
    )
    for note in notes:
        print(note)
    if args.params:
        print_parameters(session, args.device)
    return 0


def check_json(args: argparse.Namespace, cfg: Any, notes: list[str]) -> dict[str, Any]:
    """The ``check --json`` object of a config that passed (docs/cli.md)."""
    return {
        "config": args.config, "ok": True, "model": cfg.model.type,
        "dense_features": len(cfg.features.dense), "sparse_features": len(cfg.features.sparse),
        "sparse_optimizer": cfg.train.sparse_optimizer.type, "dense_optimizer": cfg.train.dense_optimizer.type,
        "num_steps": cfg.train.num_steps, "num_epochs": cfg.train.num_epochs,
        "sequence_groups": len(cfg.features.sequence),
        "data_checked": not args.no_data, "plan_checked": not args.no_plan, "notes": notes,
    }


def _sequences(cfg: Any) -> str:
    """``", 1 sequence group (2 sequences)"`` for check's summary line; ``""`` without any."""
    groups = cfg.features.sequence
    if not groups:
        return ""
    n = sum(len(g.features) for g in groups)
    return f", {len(groups)} sequence group{'s' * (len(groups) != 1)} ({n} sequence{'s' * (n != 1)})"


def builtin_name_notes(session: Any) -> list[str]:
    """One line per built-in name the config names bare that an installed plugin registers too
    (the bare name is the built-in; the line says how to pick the other)."""
    from tzrun.kernel.conformance import config_components
    from tzrun.kernel.registry import shadow_notes

    components = ((path, kind, c.type) for path, kind, c in config_components(session.cfg))
    return shadow_notes(components, session.registries)


def check_plan(session: Any, source: str, nproc: int, device: str | None) -> list[str]:
    """Plan the tables as ``tzrec-run train`` on this machine would (``nproc`` ranks, on
    ``device``; default: cuda if there is a GPU), with TorchRec's planner on the meta device;
    returns the line naming the run's peak host memory (checkpoints included) against what
    this host has available.

    Raises:
        PlanError: when no plan fits (one line: the table that breaks it, what would help), or
            the run's peak host memory (on CPU, the tables alone) is more than this host has
            available.
    """
    import torch

    from tzrun.errors import PlanError
    from tzrun.runner.host_memory import host_memory
    from tzrun.runner.plan import PlanRequest, failure_line, format_gib, format_peak, peak_problem, plan_config

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    here = device == "cpu" or torch.cuda.is_available()  # a plan for this host (not GPUs it does not have)
    memory = host_memory() if here else None
    try:
        report = plan_config(session.facts, PlanRequest(nproc, nproc, device), host=memory if device == "cpu" else None)
    except PlanError as error:  # this host's memory cannot hold the tables
        raise PlanError(f"{source}: {error}") from None
    if not report.fits:
        raise PlanError(failure_line(report, source))
    if report.peak is None or memory is None:
        return [] if report.peak is None else [format_peak(report.peak) + " (not compared with this host's memory: "
                                                                           "the plan is for GPUs it does not have)"]
    problem = peak_problem(report.peak, memory, source)
    if problem is not None:
        raise PlanError(problem)
    return [f"{format_peak(report.peak)}; this host has {format_gib(memory.available)} available"]


def print_parameters(session: Any, device: str | None = None) -> None:
    """The dense parameters of each dense optimizer key, and each table's sparse optimizer."""
    import torch

    from tzrun.runner.dense_parts import assign_parts
    from tzrun.runner.model import build_model, dense_parameter_names, embedding_modules, embedding_tables
    from tzrun.runner.sharding import plan_table_updates

    cfg, registries = session.cfg, session.registries
    model = build_model(session.facts, torch.device("meta"))
    parts = cfg.train.dense_optimizer.fields.parts
    shapes = {n: tuple(p.shape) for n, p in model.model.named_parameters()}
    for key, names in assign_parts(dense_parameter_names(model.model), parts).items():
        if key == "dense":
            title = f"dense ({cfg.train.dense_optimizer.type})"
        else:
            i = int(key[len("dense.parts["):-1])
            title = f"dense.parts[{i}] ({parts[i].type}, pattern '{parts[i].fields.pattern}')"
        print(f"{title}: {len(names)} parameter(s)")
        for name in names:
            print(f"  {name} {list(shapes[name])}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    updates = plan_table_updates(cfg, registries, embedding_modules(model), torch.device(device))
    print(f"embedding tables: {len(updates)}")
    for module in embedding_modules(model):
        for table, weight in embedding_tables(module):
            u = updates[table.name]
            how = "frozen" if u.frozen else f"{u.spec.fbgemm_type} from {u.path}" + (" (data-parallel, torch)" if u.data_parallel else "")
            print(f"  {table.name} {list(weight.shape)}: {how}")


def cmd_plan(args: argparse.Namespace) -> int:
    local = args.local_world_size or args.world_size
    wrong = [f"{flag} must be positive" for flag, value in (("--world-size", args.world_size), ("--local-world-size", local),
             ("--hbm-gb", args.hbm_gb), ("--ddr-gb", args.ddr_gb), ("--batch-size", args.batch_size))
             if value is not None and value <= 0]
    if not wrong and args.world_size % local:
        wrong.append(f"--local-world-size {local} must divide --world-size {args.world_size}")
    if wrong:
        print(f"tzrec-run plan: {'; '.join(wrong)}", file=sys.stderr)
        return EXIT_USAGE
    session = prepare(args.config, args.overrides, args.strict)
    from tzrun.runner.plan import GIB, PlanRequest, format_failure, format_plan, plan_config

    session.check()
    request = PlanRequest(
        world_size=args.world_size, local_world_size=local, device=args.device, batch_size=args.batch_size,
        hbm_cap=None if args.hbm_gb is None else int(args.hbm_gb * GIB),
        ddr_cap=None if args.ddr_gb is None else int(args.ddr_gb * GIB),
    )
    report = plan_config(session.facts, request)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    elif report.fits:
        print(format_plan(report, args.config))
    else:
        print(f"tzrec-run: {format_failure(report, args.config)}", file=sys.stderr)
    return 0 if report.fits else EXIT_CONFIG


def cmd_plugins(args: argparse.Namespace) -> int:
    from tzrun.config.load import disabled_plugins, read_config, strict_plugins
    from tzrun.kernel.plugin_report import format_plugins_report, plugins_report
    from tzrun.kernel.plugins import make_plugin_manager, pinned_requirements
    from tzrun.kernel.registry import collect_registries

    raw = read_config(args.config, []) if args.config else None
    disable = [*args.disable, *(disabled_plugins(raw) if raw else ())]
    strict = True if args.strict or (raw is not None and strict_plugins(raw)) else None
    pm = make_plugin_manager(disable=disable, strict=strict)
    if args.freeze:
        for line in pinned_requirements(pm):
            print(line)
        for failure in pm.load_failures:  # comments: the output stays a valid requirements file
            print(f"# not loaded: {failure}")
        return 0
    registries = collect_registries(pm)
    report = plugins_report(pm, registries)
    print(json.dumps(report, indent=2) if args.json else format_plugins_report(report, registries))
    return 0


def cmd_new_plugin(args: argparse.Namespace) -> int:
    from tzrun_tools.scaffold import new_plugin

    for path in new_plugin(args.name, [k.strip() for k in args.kind.split(",") if k.strip()], args.out):
        print(path)
    return 0


#: The data sets ``data synth DATASET`` writes (``--like CONFIG OUT_DIR`` takes a directory in their place).
SYNTH_DATASETS = ("criteo", "taobao")


def _synth_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with ``data synth``'s arguments, or None."""
    if args.drift and (args.like is not None or args.dataset != "criteo"):
        return "--drift is for criteo only"
    if args.like is not None:
        if args.out is not None and args.dataset is not None:
            return "--like takes OUT_DIR or --out, not both"
        if (args.out or args.dataset) is None:
            return "--like CONFIG needs an output directory: data synth --like CONFIG OUT_DIR"
        return "--format text is for criteo only" if args.format != "parquet" else None
    if args.dataset not in SYNTH_DATASETS:
        return f"DATASET must be criteo or taobao (or use --like CONFIG OUT_DIR), got {args.dataset!r}"
    if args.overrides:
        return "--set is for --like CONFIG"
    missing = [flag for flag, value in (("--rows", args.rows), ("--out", args.out)) if value is None]
    return f"{' and '.join(missing)} required for {args.dataset}" if missing else None


def cmd_synth_like(args: argparse.Namespace) -> int:
    """``data synth --like CONFIG OUT_DIR``: data shaped like a checked config's inputs."""
    from tzrun_tools.synth_like import synth_like

    session = prepare(args.like, args.overrides, False)
    session.check()
    out = args.out or args.dataset
    report = synth_like(session.facts, args.like, out, rows=10_000 if args.rows is None else args.rows,
                        eval_rows=args.eval_rows, seed=args.seed)
    if args.json:
        return _print_synth_json(args, {**report.to_json(), "dataset": "like"})
    aucs = ", ".join(f"{label} {value:.4f}" for label, value in report.bayes_auc.items())
    means = ", ".join(f"{label} {value:.3f}" for label, value in report.label_means.items())
    print(f"wrote {report.train_rows} train and {report.eval_rows} eval rows shaped like {args.like} to {out} "
          f"(label means: {means}){f'; Bayes-optimal eval AUC {aucs}' if aucs else ''}")
    print("train on it with:")
    print(" ".join(f"--set '{line}'" for line in report.overrides))
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    problem = _synth_usage(args)
    if problem is not None:
        print(f"tzrec-run data synth: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.like is not None:
        return cmd_synth_like(args)
    if args.dataset == "taobao" and args.format != "parquet":
        print("tzrec-run data synth: --format text is for criteo only", file=sys.stderr)
        return EXIT_USAGE
    if args.dataset == "taobao":
        from tzrun_tools.synth_taobao import synth_taobao

        taobao = synth_taobao(args.out, rows=args.rows, eval_rows=args.eval_rows, seed=args.seed)
        if args.json:
            return _print_synth_json(args, taobao.to_json())
        print(
            f"wrote {taobao.train_rows} train and {taobao.eval_rows} eval rows to {taobao.out_dir} "
            f"(click rate {taobao.click_rate:.3f}, buy rate {taobao.buy_rate:.3f}); Bayes-optimal eval AUC "
            + ", ".join(f"{label} {auc:.4f}" for label, auc in taobao.bayes_auc.items())
        )
        return 0
    from tzrun_tools.synth import synth_criteo

    if args.format == "text":
        import shutil
        from pathlib import Path

        from tzrun_tools.criteo_text import parquet_to_criteo_text

        out = Path(args.out)
        staging = out / ".parquet"
        report = synth_criteo(staging, rows=args.rows, eval_rows=args.eval_rows, seed=args.seed, drift=args.drift)
        for split in ("train", "eval"):
            shutil.rmtree(out / split, ignore_errors=True)
            parquet_to_criteo_text(staging / split, out / split)
        os.replace(staging / "synth.json", out / "synth.json")
        shutil.rmtree(staging)
        if args.json:
            return _print_synth_json(args, {**report.to_json(), "out_dir": str(out)})
        print(f"wrote {report.train_rows} train and {report.eval_rows} eval rows as Criteo text to {out} "
              f"(positive rate {report.positive_rate:.3f}); Bayes-optimal eval AUC {report.bayes_auc:.4f}")
        return 0
    report = synth_criteo(args.out, rows=args.rows, eval_rows=args.eval_rows, seed=args.seed, drift=args.drift)
    if args.json:
        return _print_synth_json(args, report.to_json())
    print(
        f"wrote {report.train_rows} train and {report.eval_rows} eval rows to {report.out_dir} "
        f"(positive rate {report.positive_rate:.3f}); Bayes-optimal eval AUC {report.bayes_auc:.4f}"
        + (f"; drifting ids in {', '.join(report.drift_columns)}" if report.drift_columns else "")
    )
    return 0


def _print_synth_json(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Print the ``data synth --json`` object: the dataset, the format, and the report that
    ``synth.json`` holds (docs/cli.md)."""
    from tzrun.cli.results import print_json

    print_json({"dataset": args.dataset, "format": args.format, **report})
    return 0


def cmd_ckpt(args: argparse.Namespace) -> int:
    from tzrun.runner.inspect import describe_checkpoint, format_description, format_listing, list_checkpoint_dirs

    if args.ckpt_command == "ls":
        rows = list_checkpoint_dirs(args.model_dir)
        if args.json:
            print(json.dumps([r.to_json() for r in rows], indent=2))
        elif rows:
            print(format_listing(rows))
        else:
            print(f"{args.model_dir}: no checkpoints", file=sys.stderr)
        return 0
    described = describe_checkpoint(args.path, hashes=not args.no_hashes)
    print(json.dumps(described, indent=2) if args.json else format_description(described))
    return 0 if described["manifest"]["state"] == "ok" else EXIT_CHECKPOINT


def cmd_plot(args: argparse.Namespace) -> int:
    from tzrun_tools.plot import plot_run

    for path in plot_run(args.model_dir, args.out):
        print(path)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from tzrun_tools.convert import convert_file, summary_lines

    conversion = convert_file(args.pipeline_config)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as out:
                out.write(conversion.toml)
        except OSError as error:
            print(f"tzrec-run convert: cannot write {args.out}: {error.strerror or error}", file=sys.stderr)
            return EXIT_CANT_WRITE
        print(f"tzrec-run convert: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(conversion.toml)
    for line in summary_lines(conversion):
        print(line, file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from tzrun.cli.install_commands import env_advice, print_env_advice
    from tzrun.stack import check_stack, stack_versions

    versions = stack_versions()
    problems = check_stack(versions)
    advice = env_advice(versions, problems)
    if args.json:
        print(json.dumps({"versions": versions, "problems": problems, **advice}, indent=2))
    else:
        width = max(len(k) for k in versions)
        for name, version in versions.items():
            print(f"{name:<{width}}  {version or 'not installed'}")
        print_env_advice(advice, problems)
    return EXIT_CONFIG if problems else 0


def cmd_help(args: argparse.Namespace) -> int:
    from tzrun.cli.help_topics import format_topics, read_topic

    if args.topic is None:
        print(format_topics())
        return 0
    text = read_topic(args.topic)
    if text is None:
        print(f"tzrec-run help: no topic '{args.topic}'\n{format_topics()}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(text)
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from tzrun.cli.completion import completion_script
    from tzrun.cli.help_topics import topics
    from tzrun.cli.main import build_parser

    from tzrun.cli.plugin_commands import plugin_commands

    parser = build_parser(plugin_commands())
    dynamic = {"topic": lambda: list(topics()), "dataset": lambda: list(SYNTH_DATASETS)}
    sys.stdout.write(completion_script(args.shell, parser, dynamic))
    return 0


#: The commands by name (``tzrec-run data`` is the synthetic-data command; install-stack and init
#: are in :mod:`tzrun.cli.install_commands`).
COMMANDS = {**INSTALL_COMMANDS, "ckpt": cmd_ckpt, "check": cmd_check, "plan": cmd_plan, "plugins": cmd_plugins,
            "new-plugin": cmd_new_plugin, "data": cmd_synth, "plot": cmd_plot, "env": cmd_env, "convert": cmd_convert,
            "completion": cmd_completion, "help": cmd_help}
