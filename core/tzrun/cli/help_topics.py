"""``tzrec-run help [TOPIC]``: short help pages that ship inside the package (``tzrun/help/*.md``).

Each page is a section of the documentation, copied by :mod:`tzrun_tools.help_pages` (a test
keeps the copies equal to the docs). Error messages name a topic (``tzrec-run help shuffling``)
instead of a file of the repository, so they hold for an installed wheel too.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["topics", "read_topic", "format_topics"]


def _pages():  # noqa: ANN202 - a Traversable
    return resources.files("tzrun").joinpath("help")


def topics() -> dict[str, str]:
    """Every help topic with its title (the first line of its page), sorted by name."""
    found = {}
    for page in _pages().iterdir():
        if page.name.endswith(".md"):
            first = page.read_text(encoding="utf-8").split("\n", 1)[0]
            found[page.name[: -len(".md")]] = first.lstrip("# ").strip()
    return dict(sorted(found.items()))


def read_topic(name: str) -> str | None:
    """The text of topic ``name``, or None when there is no such topic."""
    if name not in topics():
        return None
    return _pages().joinpath(f"{name}.md").read_text(encoding="utf-8")


def format_topics() -> str:
    """The list ``tzrec-run help`` prints: one topic per line with its title."""
    names = topics()
    width = max(map(len, names), default=0)
    lines = [f"  {name:<{width}}  {title}" for name, title in names.items()]
    return "\n".join(["help topics (tzrec-run help TOPIC):", *lines])
