"""Write the help pages ``tzrec-run help TOPIC`` prints (``core/tzrun/help/*.md``) from sections
of ``docs/``: ``python -m tzrun.tools.help_pages [DOCS_DIR]`` (from a clone of the repository).

The pages are committed, so that they ship in the wheel as package data; a test fails when a
page differs from what this module renders from the docs, and says to run it again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = ["TOPICS", "HELP_DIR", "render_topic", "render_all", "write_all"]

#: Where the pages go (the ``tzrun`` package's ``help/`` directory).
HELP_DIR = Path(__file__).resolve().parents[1] / "help"

#: Each topic: its title, then the ``(docs page, heading)`` sections it is made of, in order; a
#: heading of None is the page's introduction (everything before its first ``##`` heading).
TOPICS: Mapping[str, tuple[str, Sequence[tuple[str, str | None]]]] = {
    "exit-codes": ("Exit codes of every command", [("cli.md", "Exit codes")]),
    "log-level": ("--log-level and TZRUN_LOG_LEVEL", [("cli.md", "Log level")]),
    "bad-rows": ("Bad rows in the input data", [("data.md", "Bad rows")]),
    "shuffling": ("Shuffling the training rows", [("data.md", "Shuffling")]),
    "features": ("Dense and id features, from columns to a batch",
                 [("data.md", "From columns to a batch"), ("data.md", "Where this differs from TorchEasyRec")]),
    "retrieval": ("Retrieval with sampled negatives", [("retrieval.md", None), ("retrieval.md", "Set it up")]),
    "sparse-optimizers-cpu": ("Sparse optimizers on CPU", [("sparse_optimizers.md", "CPU policy")]),
    "gradient-accumulation": ("Gradient accumulation", [("optimizers.md", "Gradient accumulation")]),
    "loss-weighting": ("Weighting the losses of several tasks", [("losses.md", "Loss weighting")]),
    "models": ("The built-in models", [("models.md", None)]),
    "plan-constraints": ("Sharding constraints", [("plan.md", "Constraints")]),
    "fine-tuning": ("Fine-tuning from another run", [("checkpoints.md", "Fine-tuning from another run")]),
    "checkpoint-trust": ("What a checkpoint may hold, and what loading trusts", [("checkpoints.md", "Trust")]),
    "rank-failure": ("When a rank fails", [("howto/multi_process.md", "When a rank fails")]),
    "serving": ("Exports for serving, the manifest and the predictor",
                [("serving.md", None), ("serving.md", "Export"), ("serving.md", "What a serving system must implement itself")]),
    "migration": ("Migrating from TorchEasyRec",
                  [("migration.md", None), ("migration.md", "Convert a TorchEasyRec config")]),
}

_HEADING = re.compile(r"^(#{1,6}) (.*?)\s*$")
_LINK = re.compile(r"\[([^\]]+)\]\((?!https?:)[^)]*\)")
_ATTRS = re.compile(r"\s*\{#[^}]*\}|<!--.*?-->")


def _lines_with_levels(text: str) -> Iterator[tuple[str, int, str]]:
    """Each line, with its heading level and text (0 and "" outside headings and in code)."""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        yield line, (len(match.group(1)) if match else 0), (match.group(2) if match else "")


def _section(text: str, heading: str | None, where: str) -> list[str]:
    """The lines of section ``heading`` (with its subsections), or of the introduction."""
    out: list[str] = []
    level = 1 if heading is None else 0
    for line, depth, title in _lines_with_levels(text):
        if level == 0:
            if depth and title == heading:
                level = depth
                out.append(line)
            continue
        if depth and (depth <= level if heading is not None else depth >= 2):
            break
        if heading is None and depth == 1:
            continue  # the page's title: the topic has its own
        out.append(line)
    if not out:
        raise ValueError(f"{where}: no section '{heading}' (a help topic in tzrun.tools.help_pages.TOPICS)")
    return out


def render_topic(docs_dir: Path, name: str) -> str:
    """The help page of topic ``name`` from the docs in ``docs_dir``."""
    title, sections = TOPICS[name]
    body: list[str] = []
    for page, heading in sections:
        lines = _section((docs_dir / page).read_text(encoding="utf-8"), heading, page)
        body += ["", *(_ATTRS.sub("", _LINK.sub(r"\1", line)) for line in lines)]
    text = "\n".join([f"# {title}", *body]).rstrip()
    text = re.sub(r"\n{3,}", "\n\n", text)
    return f"{text}\n\n(From the tzrec-run documentation; the docs site has the whole page.)\n"


def render_all(docs_dir: Path) -> dict[str, str]:
    """Every topic's page, by file name."""
    return {f"{name}.md": render_topic(docs_dir, name) for name in TOPICS}


def write_all(docs_dir: Path, out: Path = HELP_DIR) -> list[Path]:
    """Write every page into ``out`` and remove pages of topics that are gone."""
    out.mkdir(parents=True, exist_ok=True)
    pages = render_all(docs_dir)
    for stale in out.glob("*.md"):
        if stale.name not in pages:
            stale.unlink()
    written = []
    for file_name, text in pages.items():
        (out / file_name).write_text(text, encoding="utf-8")
        written.append(out / file_name)
    return written


if __name__ == "__main__":
    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "docs"
    for path in write_all(docs):
        print(path)
