"""What a run records about itself in its model dir, and which run a model dir belongs to.

* ``resolved_config.toml``: every key of the run's config with the value used, defaults
  included, each default marked ``# default`` and each command-line value ``# --set``; a valid
  TOML file that trains the same run (``tzrec-run train model_dir/resolved_config.toml``).
* ``resolved_config.json``: the same values, and ``sources``: for every key, ``"file"``,
  ``"default"`` or ``"--set"``.
* ``env.json``: Python, torch, fbgemm, torchrec and other versions, whether the triple is the
  known-good pairing, the world size, the seed, the plugin set with versions, the host, the
  command, and the git revision of the config's repository when there is one.

A model dir whose ``resolved_config.json`` has another ``[model]`` or ``[[features]]`` is
another run's: training into it is refused unless ``--overwrite``.
"""

from __future__ import annotations

import enum
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from tzrun.config.toml_text import toml_key, toml_literal
from tzrun.config.load import RawConfig
from tzrun.config.schema import Component, RunConfig
from tzrun.io.files import write_atomic
from tzrun.stack import check_stack, stack_versions
from tzrun.io.storage import as_path, redact_url

__all__ = [
    "RESOLVED_TOML", "RESOLVED_JSON", "ENV_FILE", "resolved_tree", "config_sources", "resolved_toml", "emit_toml", "toml_literal",
    "environment", "stack_versions", "check_stack", "write_run_records", "owner_differences",
    "COMPARED_SECTIONS", "config_differences",
]

RESOLVED_TOML = "resolved_config.toml"
RESOLVED_JSON = "resolved_config.json"
ENV_FILE = "env.json"



# ----------------------------------------------------------------------------------------------
# the resolved config


def _plain(value: Any) -> Any:
    if isinstance(value, Component):
        out: dict[str, Any] = {"type": value.type}
        for part in (value.fields, value.config):
            if part is not None and attrs.has(type(part)):
                out.update(_plain_attrs(part))
        return out
    if attrs.has(type(value)):
        return _plain_attrs(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _plain_attrs(obj: Any) -> dict[str, Any]:
    out = {}
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if value is None or not field.init:
            continue
        out[getattr(field, "alias", None) or field.name] = _plain(value)
    return out


def resolved_tree(cfg: RunConfig) -> dict[str, Any]:
    """The config as TOML-shaped data with every default filled in (unset optional keys are
    left out: TOML has no null)."""
    return _plain(cfg)


def _leaves(node: Any, path: str) -> list[str]:
    if isinstance(node, dict):
        out = []
        for key, value in node.items():
            out.extend(_leaves(value, f"{path}.{key}" if path else key))
        return out or [path]
    if isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, f"{path}[{i}]")]
    return [path]


def _present(data: Any, path: str) -> bool:
    node = data
    for part in path.split("."):
        name, _, index = part.partition("[")
        if not isinstance(node, Mapping) or name not in node:
            return False
        node = node[name]
        if index:
            i = int(index.rstrip("]"))
            if not isinstance(node, list) or i >= len(node):
                return False
            node = node[i]
    return True


def config_sources(tree: Mapping[str, Any], raw: RawConfig) -> dict[str, str]:
    """For every key of ``tree`` (its TOML path), where its value came from: ``"--set"``
    (a command-line override of it or of a table above it), ``"file"`` or ``"default"`` (a
    key no one wrote, also inside a table that ``--set`` gave)."""
    out = {}
    for leaf in _leaves(dict(tree), ""):
        present = _present(raw.data, leaf)
        if present and any(leaf == k or leaf.startswith((k + ".", k + "[")) for k in raw.overridden):
            out[leaf] = "--set"
        elif present:
            out[leaf] = "file"
        else:
            out[leaf] = "default"
    return out


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def emit_toml(lines: list[str], node: Mapping[str, Any], header: str, path: str, sources: Mapping[str, str]) -> None:
    """Append ``node`` to ``lines`` as TOML: its plain keys, then its tables and arrays of tables.

    Args:
        lines: the TOML lines written so far; appended to.
        node: TOML-shaped data (dicts, lists, str, int, float, bool).
        header: the TOML name of ``node``'s table (``""`` for the top level), prefixed to nested headers.
        path: the dotted key path of ``node`` (``"train.stages[0]"``), looked up in ``sources``.
        sources: key path -> ``"file"``, ``"default"`` or ``"--set"``; a key whose source is not
            ``"file"`` gets it as a comment (``# default``). ``{}`` writes no comments.

    Raises:
        TypeError: a value that TOML cannot hold (None, say).
    """

    def mark(full: str) -> str:
        source = sources.get(full, "file")
        return "" if source == "file" else f"  # {source}"

    for key, value in node.items():
        if _is_table(value) or _is_table_array(value):
            continue
        full = f"{path}.{key}" if path else key
        lines.append(f"{toml_key(key)} = {toml_literal(value)}{mark(full)}")
    for key, value in node.items():
        full = f"{path}.{key}" if path else key
        name = f"{header}.{toml_key(key)}" if header else toml_key(key)
        if _is_table(value):
            lines.extend(["", f"[{name}]"])
            emit_toml(lines, value, name, full, sources)
        elif _is_table_array(value):
            for i, item in enumerate(value):
                lines.extend(["", f"[[{name}]]"])
                emit_toml(lines, item, name, f"{full}[{i}]", sources)


def resolved_toml(tree: Mapping[str, Any], sources: Mapping[str, str], source: str) -> str:
    """The resolved config as TOML text, each default marked ``# default`` and each override
    ``# --set`` (unmarked values came from ``source``)."""
    lines = [
        f"# The resolved config of this run: every key and the value it used. Unmarked values come from {source};",
        "# '# default' marks a default, '# --set' a command-line override. Train the same run with this file.",
        "",
    ]
    emit_toml(lines, tree, "", "", sources)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# the environment (the installed stack: tzrun.stack)


def _git_revision(where: Path) -> dict[str, Any] | None:
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"revision": head.stdout.strip(), "dirty": bool(status.stdout.strip()), "repository": str(where)}


def environment(*, world_size: int | None = None, seed: int | None = None, plugins: Sequence[Any] = (),
                config_source: str | None = None) -> dict[str, Any]:
    """What ``env.json`` holds (see the module doc)."""
    versions = stack_versions()
    where = Path(config_source).resolve().parent if config_source and Path(config_source).exists() else Path.cwd()
    return {
        "versions": versions,
        "stack_problems": check_stack(versions),
        "world_size": world_size,
        "seed": seed,
        "plugins": list(plugins),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": list(sys.argv),
        "git": _git_revision(where),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ----------------------------------------------------------------------------------------------
# the model dir


def write_run_records(model_dir: Path, cfg: RunConfig, raw: RawConfig, *, world_size: int,
                      plugins: Sequence[Any]) -> dict[str, Any]:
    """Write ``resolved_config.toml``, ``resolved_config.json`` and ``env.json`` (rank 0, at
    every start of a run, resumes included); returns what ``env.json`` holds."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tree = resolved_tree(cfg)
    sources = config_sources(tree, raw)
    _write(model_dir / RESOLVED_TOML, resolved_toml(tree, sources, raw.source))
    _write(model_dir / RESOLVED_JSON, json.dumps({"source": raw.source, "config": tree, "sources": sources}, indent=1))
    env = environment(world_size=world_size, seed=cfg.train.seed, plugins=plugins, config_source=raw.source)
    _write(model_dir / ENV_FILE, json.dumps(env, indent=1))
    return env


def _write(path: Path, text: str) -> None:
    """Write a record, every URL's password redacted (the config's paths, the command line)."""
    write_atomic(path, redact_url(text).encode("utf-8"))


#: The config sections a checkpoint (or a model dir) must share with the config that uses it.
COMPARED_SECTIONS = ("model", "features")


def _normalised(value: Any) -> Any:
    """``value`` as its JSON record holds it (URLs' passwords redacted, as :func:`_write` writes them)."""
    return json.loads(redact_url(json.dumps(value, default=str)))


def _diff(saved: Any, now: Any, where: str, out: list[str], saved_as: str) -> None:
    if isinstance(saved, Mapping) and isinstance(now, Mapping):
        for key in sorted(set(saved) | set(now)):
            _diff(saved.get(key), now.get(key), f"{where}.{key}", out, saved_as)
    elif isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        for i, (a, b) in enumerate(zip(saved, now)):
            _diff(a, b, f"{where}[{i}]", out, saved_as)
    elif saved != now:
        def show(v: Any) -> str:
            return "unset" if v is None else json.dumps(v)

        out.append(f"{where}: {show(saved)} {saved_as}, {show(now)} now")


def config_differences(saved: Mapping[str, Any], now: Mapping[str, Any], saved_as: str = "in the checkpoint") -> list[str]:
    """The differences in :data:`COMPARED_SECTIONS` between a saved config (a checkpoint's
    ``meta.json["config"]``, say) and a config, one line each with its TOML path:
    ``<path>: <saved> <saved_as>, <now> now``."""
    out: list[str] = []
    saved, now = _normalised(dict(saved)), _normalised(dict(now))
    for section in COMPARED_SECTIONS:
        _diff(saved.get(section), now.get(section), section, out, saved_as)
    return out


def owner_differences(model_dir: Path, cfg: RunConfig) -> list[str]:
    """How the run recorded in ``model_dir`` differs from ``cfg`` in ``[model]`` and
    ``[[features]]`` (one line each); empty when it is the same run or nothing is recorded."""
    path = as_path(model_dir) / RESOLVED_JSON
    if not path.is_file():
        return []
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{path} is unreadable"]
    return config_differences(saved, resolved_tree(cfg), saved_as="in the model dir's run")
