"""A third-party distribution adds a ``tzrec-run`` subcommand through its entry point
(``tzrun_register_commands``): its options come from an attrs class, it runs, its errors are
one line with their exit code, it is listed, and it cannot take a built-in command's name."""

from __future__ import annotations

from tests.plugin_kit.dists import tzrun_cli, write_distribution

HELLO = '''
from __future__ import annotations

import attrs

import tzrun
from tzrun.errors import WriteError


@attrs.frozen
class HelloOptions:
    name: str = attrs.field(metadata={"positional": True, "help": "who to greet"})
    times: int = attrs.field(default=1, metadata={"help": "how often"})
    shout: bool = False
    tag: tuple[str, ...] = ()


def hello(options: HelloOptions) -> int:
    if options.name == "nobody":
        raise WriteError("hello: nobody to greet; name someone")
    text = f"hello {options.name}" + "".join(f" #{t}" for t in options.tag)
    for _ in range(options.times):
        print(text.upper() if options.shout else text)
    return 0


@attrs.frozen
class NoOptions:
    pass


@tzrun.hookimpl
def tzrun_register_commands(register):
    register("hello_report", config=HelloOptions, build=hello, description="greets")
    register("train", config=NoOptions, build=lambda options: 3, description="a clash with a built-in command")
'''


def _install(tmp_path):
    site = tmp_path / "site"
    write_distribution(site, "tzrun-hello", entry_points={"hello": "tzrun_hello"}, modules={"tzrun_hello": HELLO})
    return site


def test_a_distribution_adds_a_subcommand_with_its_options(tmp_path):
    site = _install(tmp_path)
    done = tzrun_cli(["hello-report", "world", "--times", "2", "--shout", "--tag", "a", "--tag", "b"], site)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["HELLO WORLD #A #B"] * 2
    assert tzrun_cli(["hello-report", "you"], site).stdout == "hello you\n"  # the defaults


def test_its_error_is_one_line_with_its_exit_code(tmp_path):
    done = tzrun_cli(["hello-report", "nobody"], _install(tmp_path))
    assert done.returncode == 73
    errors = [line for line in done.stderr.splitlines() if "left out" not in line]  # the clash's warning aside
    assert errors == ["tzrec-run: hello: nobody to greet; name someone"]


def test_it_is_listed_and_cannot_replace_a_built_in_command(tmp_path):
    site = _install(tmp_path)
    helped = tzrun_cli(["--help"], site)
    assert "hello-report" in helped.stdout and "[plugin hello]" in helped.stdout
    assert "'train'" in helped.stderr and "left out" in helped.stderr
    listed = tzrun_cli(["plugins"], site)
    assert "hello_report" in listed.stdout
    usage = tzrun_cli(["hello-report"], site)  # a missing positional: argparse's usage error
    assert usage.returncode == 64 and "name" in usage.stderr


def test_without_the_distribution_the_command_is_unknown(tmp_path):
    done = tzrun_cli(["hello-report", "world"], None)
    assert done.returncode == 64 and "invalid choice: 'hello-report'" in done.stderr


def test_a_command_of_two_words_is_a_sub_command_of_that_group(capsys):
    """``register("ckpt my_report", ...)`` is ``tzrec-run ckpt my-report`` (as the serving
    plugin's ``ckpt apply-deltas``); a group tzrec-run does not have leaves it out."""
    import attrs

    import tzrun
    from tzrun.cli.main import build_parser
    from tzrun.cli.plugin_commands import names_no_command_of_ours, run_plugin_command
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    @attrs.frozen
    class Options:
        path: str = attrs.field(metadata={"positional": True, "metavar": "CHECKPOINT"})
        overrides: tuple[str, ...] = attrs.field(default=(), metadata={"flag": "--set"})

    class Reports:
        @tzrun.hookimpl
        def tzrun_register_commands(self, register):
            register("ckpt my_report", config=Options, build=lambda o: print(o.path, *o.overrides) or 5)
            register("nogroup my_report", config=Options, build=lambda o: 0)

    pm = make_plugin_manager(load_entry_points=False, plugins=[("reports", Reports())], strict=True)
    ours = build_parser()  # what tzrec-run parses with before it loads the plugins' commands
    assert names_no_command_of_ours(ours, ["ckpt", "my-report", "x"])
    assert not names_no_command_of_ours(ours, ["ckpt", "ls", "x"])
    parser = build_parser(list(collect_registries(pm)["command"].entries()))
    assert run_plugin_command(parser.parse_args(["ckpt", "my-report", "step-2", "--set", "a=1"])) == 5
    assert capsys.readouterr().out == "step-2 a=1\n"
    assert run_plugin_command(parser.parse_args(["ckpt", "ls", "dir"])) is None  # the group's own sub-commands stay
