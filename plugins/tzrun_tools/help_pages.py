"""Write the help pages ``tzrec-run help TOPIC`` prints (``core/tzrun/help/*.md``) from
``docs/``: ``python -m tzrun_tools.help_pages [DOCS_DIR]`` (from a clone of the repository).

Every page of the docs is a topic (:func:`page_topic` names it: ``howto/multi_process.md`` is
``howto-multi-process``), and so is each section of :data:`TOPICS` that error messages name.
Links between docs pages become the topic to read (``tzrec-run help plan``). The pages are
committed, so that they ship in the wheel as package data; a test fails when a page differs from
what this module renders from the docs, and says to run it again.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import tzrun

__all__ = ["TOPICS", "HELP_DIR", "page_topic", "docs_pages", "render_topic", "render_page", "render_all",
           "write_all"]

#: Where the pages go (the ``tzrun`` package's ``help/`` directory).
HELP_DIR = Path(tzrun.__file__).resolve().parent / "help"

#: Each section topic: its title, then the ``(docs page, heading)`` sections it is made of, in
#: order; a heading of None is the page's introduction (everything before its first ``##``
#: heading). Whole pages are topics of their own (:func:`docs_pages`).
TOPICS: Mapping[str, tuple[str, Sequence[tuple[str, str | None]]]] = {
    "exit-codes": ("Exit codes of every command", [("cli.md", "Exit codes")]),
    "log-level": ("--log-level and TZRUN_LOG_LEVEL", [("cli.md", "Log level")]),
    "json": ("--json output of check, train, evaluate and data synth", [("cli.md", "Output for scripts: `--json`")]),
    "log-file": ("The run's log file in the model dir", [("cli.md", "Log file")]),
    "bad-rows": ("Bad rows in the input data", [("data.md", "Bad rows")]),
    "shuffling": ("Shuffling the training rows", [("data.md", "Shuffling")]),
    "features": ("Dense and id features, from columns to a batch",
                 [("data.md", "From columns to a batch"), ("data.md", "Where this differs from TorchEasyRec")]),
    "sparse-optimizers-cpu": ("Sparse optimizers on CPU", [("sparse_optimizers.md", "CPU policy")]),
    "gradient-accumulation": ("Gradient accumulation", [("optimizers.md", "Gradient accumulation")]),
    "loss-weighting": ("Weighting the losses of several tasks", [("losses.md", "Loss weighting")]),
    "plan-constraints": ("Sharding constraints", [("plan.md", "Constraints")]),
    "fine-tuning": ("Fine-tuning from another run", [("checkpoints.md", "Fine-tuning from another run")]),
    "checkpoint-trust": ("What a checkpoint may hold, and what loading trusts", [("checkpoints.md", "Trust")]),
    "rank-failure": ("When a rank fails", [("howto/multi_process.md", "When a rank fails")]),
}

_HEADING = re.compile(r"^(#{1,6}) (.*?)\s*$")
#: A relative link; its text may hold brackets two deep (``[`[[losses]]`](reference/config.md)``).
_LINK = re.compile(r"\[((?:[^\[\]]|\[(?:[^\[\]]|\[[^\[\]]*\])*\])+)\]\((?!https?:)([^)#\s]*)(#[^)]*)?\)")
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
        raise ValueError(f"{where}: no section '{heading}' (a help topic in tzrun_tools.help_pages.TOPICS)")
    return out


def page_topic(page: str) -> str:
    """The topic of docs page ``page`` (relative to the docs directory), e.g. ``howto-multi-process``."""
    return page.removesuffix(".md").replace("/", "-").replace("_", "-")


def docs_pages(docs_dir: Path) -> list[str]:
    """Every page of the docs (``*.md`` below ``docs_dir``, not in ``_``-folders), relative, sorted."""
    pages = (p.relative_to(docs_dir).as_posix() for p in docs_dir.rglob("*.md"))
    return sorted(p for p in pages if not any(part.startswith("_") for part in p.split("/")))


def _links(text: str, page: str, pages: set[str]) -> str:
    """``text`` with its links to other docs pages as the topic to read, others as their text."""
    def one(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if not target:
            return text
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
        if resolved in pages:
            return f"{text} (`tzrec-run help {page_topic(resolved)}`)"
        return text

    return _ATTRS.sub("", _LINK.sub(one, text))


def _finish(title: str, body: list[str], footer: str) -> str:
    """A help page: the title, the body without runs of blank lines, the footer."""
    text = re.sub(r"\n{3,}", "\n\n", "\n".join([f"# {title}", *body]).rstrip())
    return f"{text}\n\n{footer}\n"


def render_topic(docs_dir: Path, name: str) -> str:
    """The help page of section topic ``name`` (of :data:`TOPICS`) from the docs in ``docs_dir``."""
    title, sections = TOPICS[name]
    pages = set(docs_pages(docs_dir))
    body: list[str] = []
    for page, heading in sections:
        lines = _section((docs_dir / page).read_text(encoding="utf-8"), heading, page)
        body += ["", _links("\n".join(lines), page, pages)]
    whole = sorted({f"`tzrec-run help {page_topic(page)}`" for page, _ in sections})
    return _finish(title, body, f"(From the tzrec-run documentation; {', '.join(whole)} prints the whole page.)")


def render_page(docs_dir: Path, page: str) -> str:
    """The help page of docs page ``page``: its title, then all of it, links as topics."""
    pages = set(docs_pages(docs_dir))
    lines = (docs_dir / page).read_text(encoding="utf-8").splitlines()
    titles = [title for _, depth, title in _lines_with_levels("\n".join(lines)) if depth == 1]
    if not titles:
        raise ValueError(f"{page}: no '# ' title (every docs page is a help topic and needs one)")
    first = next(i for i, line in enumerate(lines) if line.startswith("# "))
    body = [_links("\n".join(lines[first + 1:]), page, pages)]
    return _finish(_ATTRS.sub("", titles[0]), body, "(A page of the tzrec-run documentation; `tzrec-run help` lists them all.)")


def render_all(docs_dir: Path) -> dict[str, str]:
    """Every topic's page, by file name: each docs page's, then each section topic's."""
    out = {f"{page_topic(page)}.md": render_page(docs_dir, page) for page in docs_pages(docs_dir)}
    for name in TOPICS:
        if f"{name}.md" in out:
            raise ValueError(f"help topic '{name}' is both a docs page and a section of TOPICS: rename the section")
        out[f"{name}.md"] = render_topic(docs_dir, name)
    return out


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
    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "docs"
    for path in write_all(docs):
        print(path)
