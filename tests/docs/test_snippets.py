"""Every TOML snippet in the docs is a config that ``tzrec-run check`` accepts (or rejects, as
its page says).

The convention (docs/contributing.md states it for authors):

* a ```` ```toml ```` block whose ``[model]`` table has a ``type`` is a complete config, checked
  as is;
* any other block is a fragment, deep-merged onto ``examples/deepfm_criteo.toml`` (tables merge
  key by key; an array of tables or any other value in the fragment replaces the base's; a
  fragment that sets ``train.num_steps`` or ``train.num_epochs`` drops the other from the base,
  since a run sets exactly one), and the result is checked;
* an HTML comment on the line right before the fence changes that:
  ``<!-- check: base examples/mmoe_taobao.toml -->`` merges onto another example;
  ``<!-- check: error "text" -->`` means the check must fail with a message containing text;
  ``<!-- check: skip "reason" -->`` marks a block that is not a tzrec-run config.

Each block runs through ``tzrun.cli.main.main(["check", FILE])``, the command itself, in process.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tzrun.cli.main import main as cli_main
from tzrun.config.load import drop_replaced_alternatives
from tzrun.runner.records import emit_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASE = "examples/deepfm_criteo.toml"
PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```toml[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*check:\s*(?P<text>.*?)\s*-->\s*$")


class Snippet:
    """One ```toml block: where it is, its text, and what its directive asks."""

    def __init__(self, page: Path, line: int, body: str, directive: str | None) -> None:
        self.page, self.line, self.body = page, line, body
        self.base, self.error, self.skip = DEFAULT_BASE, None, None
        if directive is None:
            return
        words = shlex.split(directive)
        if len(words) != 2 or words[0] not in ("base", "error", "skip"):
            raise ValueError(f"{self.where}: bad directive <!-- check: {directive} -->: "
                             'use base PATH, error "text" or skip "reason"')
        setattr(self, words[0], words[1])

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _snippets(page: Path) -> list[Snippet]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directive = _DIRECTIVE.search(before)
        indent = match.group("indent")
        body = "\n".join(x[len(indent):] if x.startswith(indent) else x for x in match.group("body").split("\n"))
        found.append(Snippet(page, line, body, directive.group("text") if directive else None))
    return found


SNIPPETS = [s for page in PAGES for s in _snippets(page)]


def _merge(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _paths(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        yield prefix + key
        if isinstance(value, dict):
            yield from _paths(value, f"{prefix}{key}.")


def _config_text(snippet: Snippet) -> str:
    try:
        data = tomllib.loads(snippet.body)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{snippet.where}: the snippet is not valid TOML: {exc}\n{snippet.body}")
    if not (isinstance(data.get("model"), dict) and "type" in data["model"]):
        base = tomllib.loads((REPO / snippet.base).read_text(encoding="utf-8"))
        # as --set does: a fragment setting train.num_steps replaces the example's num_epochs
        merged = _merge(base, data)
        drop_replaced_alternatives(merged, _paths(data))
        data = merged
    lines: list[str] = []
    emit_toml(lines, data, "", "", {})
    return "\n".join(lines) + "\n"


def test_every_toml_fence_is_found() -> None:
    """The fence pattern finds every ```toml line, so no snippet escapes the check."""
    fences = sum(len(re.findall(r"(?m)^[ \t]*```toml", p.read_text(encoding="utf-8"))) for p in PAGES)
    assert fences == len(SNIPPETS) and len(SNIPPETS) >= 20


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_passes_tzrec_run_check(
    snippet: Snippet, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if snippet.skip is not None:
        assert snippet.skip.strip(), f"{snippet.where}: a skipped snippet needs a reason"
        return
    config = tmp_path / "snippet.toml"
    config.write_text(_config_text(snippet), encoding="utf-8")
    monkeypatch.chdir(REPO)  # relative paths in snippets are relative to the repository root
    # --no-plan: a snippet is for any cluster (row-wise sharding, UVM caching on GPUs), not this machine
    code = cli_main(["check", str(config), "--no-plan"])
    out, err = capsys.readouterr()
    if snippet.error is None:
        assert code == 0, f"{snippet.where}: tzrec-run check failed:\n{err}{out}\n--- snippet ---\n{snippet.body}"
    else:
        assert code != 0, f"{snippet.where}: tzrec-run check accepted a snippet marked as an error:\n{snippet.body}"
        assert snippet.error in err + out, f"{snippet.where}: expected {snippet.error!r} in:\n{err}{out}"


def test_a_broken_snippet_is_caught(tmp_path: Path) -> None:
    """The harness itself: a wrong key fails the check, and an error directive is honoured."""
    page = tmp_path / "page.md"
    page.write_text('```toml\n[train]\nnum_step = 3\n```\n\n<!-- check: error "num_step" -->\n```toml\n[train]\nnum_step = 3\n```\n')
    bad, expected = _snippets(page)
    assert bad.error is None and expected.error == "num_step"
    config = tmp_path / "c.toml"
    bad.page = expected.page = REPO / "docs" / "x.md"
    config.write_text(_config_text(bad))
    assert cli_main(["check", str(config)]) != 0
