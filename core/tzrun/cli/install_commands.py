"""The ``tzrec-run`` commands that set a machine up: ``install-stack`` (torch, FBGEMM, TorchRec)
and ``init`` (a starter config from the examples shipped in the package), and the install
advice ``env`` prints. Nothing here imports torch."""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from tzrun.errors import EXIT_CONFIG
from tzrun.stack import join_and

__all__ = ["add_parsers", "COMMANDS", "EXAMPLES", "example_text", "synth_command", "env_advice", "print_env_advice"]

#: The examples ``tzrec-run init --example`` writes (package data of tzrun_tools.templates).
EXAMPLES = ("deepfm_criteo", "deepfm_criteo_text", "dlrm_criteo", "wide_and_deep_criteo", "dssm_taobao",
            "dssm_taobao_sampled", "mmoe_taobao", "ple_taobao", "dbmtl_taobao", "din_taobao", "multi_tower_taobao", "dcn_v2_criteo", "dcn_v1_criteo",
            "mask_net_criteo",
            "wukong_criteo", "pepnet_taobao", "dssm_v2_taobao", "rocket_launching_criteo", "mind_taobao", "tdm_taobao")
_SYNTH_LINE = re.compile(r"^#\s+(tzrec-run data synth [^#\n]*?)\s*(#.*)?$", re.M)


def add_parsers(sub: Any) -> None:
    """Add ``install-stack`` and ``init`` to ``tzrec-run``'s subparsers."""
    stack = sub.add_parser(
        "install-stack", help="install what is missing of torch 2.13, FBGEMM 1.8 and TorchRec 1.8 into this "
                              "Python's environment with pip (TorchRec with its metadata corrected: pip check passes)")
    stack.add_argument("--cuda", action="store_true",
                       help="the CUDA stack (fbgemm-gpu, torch from PyTorch's cu128 index) instead of the CPU one "
                            "(default: cuda when fbgemm-gpu is installed)")
    stack.add_argument("--cpu", action="store_true", help="the CPU stack (fbgemm-gpu-cpu, torch's CPU build)")
    stack.add_argument("--dry-run", action="store_true", help="print the pip commands without running them")
    stack.add_argument("--index-url", metavar="URL",
                       help="the index (or mirror) torch comes from (default: PyTorch's index for the stack, "
                            "https://download.pytorch.org/whl/cpu or .../cu128)")
    init = sub.add_parser("init", help="write a starter config (one of the shipped examples) and print the "
                                       "commands that make data for it and train it")
    init.add_argument("dir", nargs="?", default=".", metavar="DIR", help="where the config goes (default .)")
    init.add_argument("--example", choices=EXAMPLES, default="deepfm_criteo", help="which example (default deepfm_criteo)")
    init.add_argument("--force", action="store_true", help="overwrite the config if it exists")


def example_text(name: str) -> str:
    """The shipped example config ``name`` (one of :data:`EXAMPLES`)."""
    return resources.files("tzrun_tools").joinpath("templates", "examples", f"{name}.toml").read_text("utf-8")


def synth_command(text: str) -> str:
    """The ``tzrec-run data synth ...`` command an example's header names for its data.

    Raises:
        ValueError: if the header names none.
    """
    match = _SYNTH_LINE.search(text)
    if match is None:
        raise ValueError("the example names no `tzrec-run data synth` command in its header")
    return match.group(1)


def cmd_init(args: argparse.Namespace) -> int:
    """``tzrec-run init``: write the example config into ``args.dir`` (not over an existing file
    unless ``--force``) and print the commands that make its data and train it."""
    target = Path(args.dir) / f"{args.example}.toml"
    # the header's commands name the file where it is written, not where the repository keeps it
    text = example_text(args.example).replace(f"examples/{target.name}", target.name)
    if target.exists() and not args.force:
        print(f"tzrec-run init: {target} exists; pass --force to overwrite it", file=sys.stderr)
        return EXIT_CONFIG
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        print(f"tzrec-run init: cannot write {target}: {error.strerror or error}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"wrote {target}")
    print("make its data and train it (relative paths in the config are taken from the working directory):")
    if Path(args.dir).resolve() != Path.cwd().resolve():
        print(f"  cd {args.dir}")
    print(f"  {synth_command(text)}")
    print(f"  tzrec-run train {target.name}")
    return 0


def cmd_install_stack(args: argparse.Namespace) -> int:
    """``tzrec-run install-stack``: :func:`tzrun_tools.install_stack.install_stack` for the stack
    asked for, or the installed FBGEMM's; exits with :data:`~tzrun.errors.EXIT_INSTALL` and one
    line when a package cannot be installed."""
    from tzrun.stack import detect_stack
    from tzrun_tools.install_stack import install_stack

    if args.cuda and args.cpu:
        print("tzrec-run install-stack: pass --cuda or --cpu, not both", file=sys.stderr)
        return EXIT_CONFIG
    stack = "cuda" if args.cuda else "cpu" if args.cpu else detect_stack()
    return install_stack(stack, dry_run=args.dry_run, index_url=args.index_url)


def env_advice(versions: Mapping[str, str | None], problems: Sequence[str]) -> dict[str, Any]:
    """What ``tzrec-run env`` adds to the versions and the stack's ``problems``: the extras
    installed, what is missing of the stack, the one command that installs it (or the right
    releases, when ``problems`` name a mismatch), and a note when TorchRec is the published wheel."""
    from tzrun.stack import EXTRAS, install_stack_command, missing_extras, torchrec_needs_correction

    missing = set(missing_extras())
    gaps = [name for name in ("torch", "fbgemm_gpu", "torchrec") if not versions.get(name)]
    note = None
    if torchrec_needs_correction(versions.get("torchrec")):
        note = (f"torchrec {versions['torchrec']} is the published wheel, whose metadata asks for fbgemm-gpu "
                f"(CUDA) and torchmetrics==1.0.3, so pip check fails; `{install_stack_command()}` replaces it "
                "with the corrected wheel")
    return {
        "extras": {extra: extra not in missing for extra in EXTRAS},
        "missing": gaps,
        "install": install_stack_command() if problems or note else None,
        "note": note,
    }


def print_env_advice(advice: Mapping[str, Any], problems: Sequence[str]) -> None:
    """The text form of :func:`env_advice` and the stack's ``problems`` (``tzrec-run env``
    without ``--json``): the extras, then whether the triple is good, then the one command."""
    have = [e for e, ok in advice["extras"].items() if ok]
    lack = [e for e, ok in advice["extras"].items() if not ok]
    parts = ([f"installed: {', '.join(have)}"] if have else []) + (
        [f"not installed: {', '.join(lack)} (pip install 'tzrec-run[NAME]')"] if lack else [])
    print(f"extras: {'; '.join(parts)}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if not problems:
        print("torch / fbgemm_gpu / torchrec: a known-good triple (FBGEMM 1.X with torch 2.(X+5) and torchrec 1.X)")
    if advice["note"]:
        print(f"note: {advice['note']}", file=sys.stderr)
    if advice["install"]:
        what = (join_and(advice["missing"]) if advice["missing"]
                else "the matching releases" if problems else "the corrected torchrec")
        print(f"to install {what}, run: {advice['install']}", file=sys.stderr)


#: The commands by name.
COMMANDS = {"install-stack": cmd_install_stack, "init": cmd_init}
