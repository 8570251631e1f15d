"""``tzrec-run help [TOPIC]``: pages shipped in the package, copied from the docs; messages name
topics, never a file of the repository."""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tzrun.cli.main import main
from tzrun.errors import EXIT_USAGE
from tzrun.cli.help_topics import topics
from tzrun_tools.help_pages import HELP_DIR, docs_pages, page_topic, render_all

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO_DOCS_PATH = re.compile(r"\bdocs/[\w./-]*\.md")
HELP_TOPIC = re.compile(r"tzrec-run help ([a-z][a-z0-9-]*)")


def test_the_shipped_pages_are_the_docs_sections():
    shipped = {p.name: p.read_text(encoding="utf-8") for p in HELP_DIR.glob("*.md")}
    assert shipped == render_all(REPO / "docs"), "run: python -m tzrun_tools.help_pages"


def test_every_docs_page_is_a_topic_with_its_links_as_topics(capsys):
    pages = docs_pages(REPO / "docs")
    assert "howto/multi_process.md" in pages and "install.md" in pages and len(pages) >= 30
    assert {page_topic(page) for page in pages} <= set(topics())
    assert main(["help", "howto-remote-storage"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# ") and "(`tzrec-run help " in text
    assert not re.findall(r"\]\((?!https?://)[^)]*\)", "".join(p.read_text() for p in HELP_DIR.glob("*.md")))
    assert main(["help", "index"]) == 0  # a link to another page names that page's topic
    assert "Migrating from TorchEasyRec (`tzrec-run help migration`)" in capsys.readouterr().out


def test_no_page_or_message_sends_the_reader_to_a_site_without_an_address():
    texts = [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in [*SOURCES, *HELP_DIR.glob("*.md"),
                                                                                 REPO / "README.md"]]
    found = [where for where, text in texts if re.search(r"the docs site|docs' [a-z]+ guide", text)]
    assert not found, found


def test_the_readme_has_no_link_that_breaks_on_a_package_index_page():
    """The README is the package's long description: a package index shows it without the
    repository, so every link is absolute (docs pages are named with their help topic)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    relative = re.findall(r"\]\((?!https?://)[^)]*\)", readme)
    assert not relative, relative
    assert "`tzrec-run help howto-multi-process`" in readme


def test_the_pages_are_package_data_of_the_wheel():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tzrun"]
    for page in HELP_DIR.glob("*.md"):
        relative = page.relative_to(HELP_DIR.parent).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in package_data), relative


def test_help_lists_the_topics_and_prints_one(capsys):
    assert main(["help"]) == 0
    listing = capsys.readouterr().out
    assert "exit-codes" in listing and "Exit codes of every command" in listing and "shuffling" in listing
    assert main(["help", "shuffling"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("# Shuffling the training rows\n") and "data.shuffle_buffer_rows" in page


def test_an_unknown_topic_is_a_usage_error_listing_the_topics(capsys):
    assert main(["help", "shuffle"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no topic 'shuffle'" in err and "shuffling" in err


def _message_strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (f-string parts too) except bare string statements
    (docstrings, attribute docs)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    documentation = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                     and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in documentation]


SOURCES = sorted([*(REPO / "core").rglob("*.py"), *(REPO / "plugins").rglob("*.py")])


def test_no_message_points_to_a_file_of_the_repositorys_docs():
    found = [f"{path.relative_to(REPO)}:{line}: {text!r}" for path in SOURCES
             for line, text in _message_strings(path) if REPO_DOCS_PATH.search(text)]
    assert not found, "name a help topic (tzrec-run help TOPIC) instead:\n" + "\n".join(found)


def test_every_help_topic_named_anywhere_exists():
    texts = [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in
             [*SOURCES, REPO / "README.md", *(REPO / "docs").rglob("*.md"), *HELP_DIR.glob("*.md")]]
    named = {(where, topic) for where, text in texts for topic in HELP_TOPIC.findall(text)}
    assert {topic for _, topic in named} >= {"exit-codes", "retrieval", "features"}  # the scan sees them
    missing = sorted((where, topic) for where, topic in named if topic not in topics())
    assert not missing, missing


@pytest.mark.parametrize("name", sorted(topics()))
def test_every_page_has_a_title_and_text(name):
    text = (HELP_DIR / f"{name}.md").read_text(encoding="utf-8")
    assert text.startswith("# ") and len(text.splitlines()) >= 5
