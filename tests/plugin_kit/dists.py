"""Throwaway distributions and a ``tzrec-run`` that sees them (in this process), or does not see
installed ones (in a child process whose site directories hide them).

A distribution is "installed" the way importlib.metadata finds one, without pip: a directory on
``PYTHONPATH`` holding ``<name>-<version>.dist-info/{METADATA,entry_points.txt}`` next to the
plugin's modules. Hiding an installed distribution mirrors the directory that holds it without
the files its ``RECORD`` lists: what ``pip uninstall`` removes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from tzrun.testing import tiny_config_text

REPO = Path(__file__).resolve().parents[2]


def write_distribution(
    site_dir: Path,
    name: str,
    version: str = "1.0",
    *,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str] = {},
    requires: Sequence[str] = (),
) -> None:
    """Put distribution ``name`` with ``tzrun`` entry points and top-level ``modules`` (name
    -> source) into ``site_dir``."""
    info = site_dir / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    metadata = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(metadata) + "\n")
    lines = "\n".join(f"{ep} = {target}" for ep, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[tzrun]\n{lines}\n")
    for module, source in modules.items():
        (site_dir / f"{module}.py").write_text(textwrap.dedent(source))


def config_file(tmp_path: Path) -> Path:
    """A valid config (``tzrun.testing.TINY_CONFIG``; ``check`` reads no data)."""
    path = tmp_path / "run.toml"
    path.write_text(tiny_config_text(tmp_path / "data", tmp_path / "run"))
    return path


def _python_path(*first: Path | str) -> str:
    return os.pathsep.join([*(str(p) for p in first), *filter(None, [os.environ.get("PYTHONPATH")])])


def tzrun_cli(args: Sequence[str], site_dir: Path | None = None, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess[str]:
    """``tzrec-run ARGS`` with the distributions of ``site_dir`` installed, run in this process
    through the CLI's entry function (``tests.conftest.cli``): entry points are read afresh by
    every command, so a directory put first on ``sys.path`` is an installed distribution, and
    its modules are forgotten afterwards (the next test's distributions may reuse their names)."""
    from tests.conftest import cli

    with _without_plugin_switches():
        return cli(list(args), env={**env, **({"PYTHONPATH": str(site_dir)} if site_dir is not None else {})})


@contextlib.contextmanager
def _without_plugin_switches() -> Iterator[None]:
    """The plugin switches a developer may have exported, unset for the command."""
    saved = {k: os.environ.pop(k) for k in ("TZRUN_STRICT_PLUGINS", "TZRUN_DISABLE_PLUGINS") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _clean_environ() -> dict[str, str]:
    """This environment without the plugin switches a developer may have exported."""
    return {k: v for k, v in os.environ.items() if k not in ("TZRUN_STRICT_PLUGINS", "TZRUN_DISABLE_PLUGINS")}


def _mirror_without(directory: Path, hidden: set[str], dest: Path) -> Path:
    dest.mkdir(parents=True)
    for entry in directory.iterdir():
        if entry.name not in hidden:
            (dest / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return dest


def tzrun_cli_without(distributions: Sequence[str], args: Sequence[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tzrun ARGS`` in this environment as it is after ``pip uninstall`` of
    ``distributions``: each one's files (its ``RECORD``) are hidden from the site and path
    directories that hold them; everything else is as installed."""
    replaced: dict[str, str] = {}
    for i, name in enumerate(distributions):
        dist = importlib.metadata.distribution(name)
        base = Path(dist.locate_file("")).resolve()
        hidden = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        assert hidden, f"{name} has no RECORD to uninstall by"
        replaced[str(base)] = str(_mirror_without(base, hidden, tmp_path / f"without-{i}"))
    site_dirs = [replaced.get(str(Path(d).resolve()), d) for d in site.getsitepackages()]
    python_path = [replaced.get(str(Path(p).resolve()), p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    code = (
        "import runpy, site, sys\n"
        f"for d in {site_dirs!r}: site.addsitedir(d)\n"
        f"sys.argv = ['tzrun', *{list(args)!r}]\n"
        "runpy.run_module('tzrun', run_name='__main__', alter_sys=True)\n"
    )
    env = _clean_environ()
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


#: the kinds the docs' walkthrough generates (docs/howto/write_a_plugin.md)
WALKTHROUGH_KINDS = "dense_optimizer,lr_scheduler,loss,metric,stage"


def generate_plugin(out: Path) -> tuple[Path, Path]:
    """``tzrec-run new-plugin tzrun-walkthrough`` into ``out``, "installed" into ``out/site``
    as ``pip install -e .`` leaves it (its metadata, its entry point, its package); returns
    the distribution's directory and the site directory."""
    proc = tzrun_cli(["new-plugin", "tzrun-walkthrough", "--kind", WALKTHROUGH_KINDS, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    root = out / "tzrun-walkthrough"
    site_dir = out / "site"
    site_dir.mkdir()
    write_distribution(site_dir, "tzrun-walkthrough", "0.1.0", entry_points={"tzrun_walkthrough": "tzrun_walkthrough.hooks"},
                       requires=["tzrec-run>=0.1,<0.2"])
    (site_dir / "tzrun_walkthrough").symlink_to(root / "src" / "tzrun_walkthrough", target_is_directory=True)
    return root, site_dir
