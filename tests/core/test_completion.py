"""``tzrec-run completion bash|zsh``: the scripts load in their shell and complete commands,
subcommands, options, example names and help topics, all generated from the parser."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli
from tzrun.cli.completion import command_nodes
from tzrun.cli.help_topics import topics
from tzrun.cli.install_commands import EXAMPLES
from tzrun.cli.main import build_parser


def _script(shell: str) -> str:
    proc = cli(["completion", shell])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("completion") / "tzrec-run.bash"
    path.write_text(_script("bash"))
    return str(path)


def complete_in_bash(script: str, line: str) -> list[str]:
    """What bash completes for ``line`` (the word after its last space), through the
    function the loaded script registered for tzrec-run."""
    program = f"""
source {script} || exit 3
spec="$(complete -p tzrec-run)" || exit 4
function="${{spec##*-F }}"; function="${{function%% *}}"
read -ra COMP_WORDS <<< {line!r}
[[ {line!r} == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
"$function" || exit 5
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    proc = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and not proc.stderr, (proc.returncode, proc.stderr)
    return [word for word in proc.stdout.splitlines() if word]


@pytest.mark.parametrize(("line", "expected"), [
    ("tzrec-run ch", ["check"]),
    ("tzrec-run c", ["ckpt", "check", "convert", "completion"]),
    ("tzrec-run ckpt ", ["ls", "inspect", "apply-deltas"]),
    ("tzrec-run --log-level debug data ", ["synth"]),
    ("tzrec-run data synth ", ["criteo", "taobao"]),
    ("tzrec-run train run.toml --nproc", ["--nproc-per-node"]),
    ("tzrec-run train run.toml --log-level w", ["warning"]),
    ("tzrec-run init --example ", list(EXAMPLES)),
    ("tzrec-run completion ", ["bash", "zsh"]),
])
def test_the_bash_script_loads_and_completes(bash_script, line, expected):
    assert complete_in_bash(bash_script, line) == expected


def test_bash_completes_help_topics_and_file_names(bash_script, tmp_path, monkeypatch):
    assert complete_in_bash(bash_script, "tzrec-run help ") == list(topics())
    assert len(topics()) > 5
    (tmp_path / "run.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert complete_in_bash(bash_script, "tzrec-run train ru") == ["run.toml"]
    assert complete_in_bash(bash_script, "tzrec-run train run.toml --model-dir ru") == ["run.toml"]


def test_every_command_and_option_of_the_parser_is_in_the_scripts():
    """A command added to the parser (export, predict...) is completed without another edit."""
    nodes = dict(command_nodes(build_parser(), {"topic": lambda: list(topics())}))
    assert set(nodes[""].subcommands) >= {"train", "evaluate", "check", "data", "help", "completion"}
    assert "ckpt ls" in nodes and "--json" in nodes["check"].options
    scripts = _script("bash") + _script("zsh")
    for path, node in nodes.items():
        for word in (*node.subcommands, *node.options):
            assert word in scripts, (path, word)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_the_zsh_script_loads_in_zsh(tmp_path):
    path = tmp_path / "_tzrec-run"
    path.write_text(_script("zsh"))
    program = (f"autoload -Uz compinit && compinit -u -d {tmp_path}/zcompdump && source {path} && "
               "print -r -- $_comps[tzrec-run] && _tzrec_run_subcommands ckpt && _tzrec_run_positional 'data synth'")
    proc = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == ["_tzrec_run", "ls inspect apply-deltas", "criteo taobao"]
