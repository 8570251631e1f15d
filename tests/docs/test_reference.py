"""The docs site builds under ``mkdocs build --strict``, and its generated reference pages
cover the code: every core key, every registered component and option, every hook."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator, Optional

import attrs
import pytest

from tzrun.config import schema
from tzrun.config.schema import (
    Component,
    DenseOptimizerFields,
    LossFields,
    MetricFields,
    PartFields,
    RunConfig,
    SparseOptimizerFields,
    TrainMetricFields,
)
from tzrun.kernel.plugins import make_plugin_manager
from tzrun_tools.reference import docstring_markdown, docstring_problems, parse_attributes
from tzrun.kernel.registry import Registries, collect_registries

REPO = Path(__file__).resolve().parents[2]

#: The keys tzrec-run reads itself at each component place (what tzrun.config.load resolves),
#: listed here independently of tzrun_tools.reference.COMPONENT_SLOTS; values are (class, omitted keys).
CORE_KEYS_AT = {
    "train.sparse_optimizer": (SparseOptimizerFields, ()),
    "train.dense_optimizer": (DenseOptimizerFields, ()),
    "train.dense_optimizer.parts[]": (PartFields, ()),
    "features.sparse[].sparse_optimizer": (SparseOptimizerFields, ("lr_schedule",)),
    "losses[]": (LossFields, ()),
    "metrics[]": (MetricFields, ()),
    "train_metrics[]": (TrainMetricFields, ()),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for the module by ``mkdocs build --strict``."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def registries() -> Registries:
    return collect_registries(make_plugin_manager())


class _Page(HTMLParser):
    """The main content of a built page, per heading id: its text, and the ``<code>`` of the
    first cell of each table row (the key or option the row documents)."""

    def __init__(self, levels: tuple[str, ...]) -> None:
        super().__init__(convert_charrefs=True)
        self.levels, self.current = levels, ""
        self.text: dict[str, list[str]] = {"": []}
        self.keys: dict[str, list[str]] = {"": []}
        self._code: list[str] | None = None
        self._cell = -1

    def handle_starttag(self, tag: str, attrs_: list[tuple[str, str | None]]) -> None:
        anchor = dict(attrs_).get("id")
        if tag in self.levels and anchor:
            self.current = anchor
            self.text.setdefault(anchor, [])
            self.keys.setdefault(anchor, [])
        if tag == "tr":
            self._cell = -1
        elif tag in ("td", "th"):
            self._cell += 1
        elif tag == "code" and self._cell == 0:
            self._code = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "code" and self._code is not None:
            self.keys[self.current].append("".join(self._code))
            self._code = None

    def handle_data(self, data: str) -> None:
        self.text[self.current].append(data)
        if self._code is not None:
            self._code.append(data)

    def section_text(self, anchor: str) -> str:
        return " ".join("".join(self.text[anchor]).split())


def _page(site: Path, page: str, levels: tuple[str, ...] = ("h2",)) -> _Page:
    text = (site / page / "index.html").read_text(encoding="utf-8")
    main = text[text.index('role="main"'):text.index("<footer")]
    parsed = _Page(levels)
    parsed.feed(main[main.index(">") + 1:])
    return parsed


def _unwrap(hint: object) -> tuple[object, bool]:
    """(the type without Optional, whether it is an array of it)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union or type(hint).__name__ == "UnionType":
        hint = args[0]
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (Ellipsis,):
        return typing.get_args(hint)[0], True
    return hint, False


def _keys(cls: type, prefix: str = "", omit: tuple[str, ...] = ()) -> Iterator[str]:
    """Every TOML key under ``cls``, as ``a.b[].c`` paths."""
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        if field.name in omit:
            continue
        path = prefix + field.name
        yield path
        target, array = _unwrap(hints[field.name])
        inner = path + ("[]" if array else "")
        if target is Component:
            yield inner + ".type"
            fields, skipped = CORE_KEYS_AT.get(inner, (None, ()))
            if fields is not None:
                yield from _keys(fields, inner + ".", skipped)
        elif isinstance(target, type) and attrs.has(target):
            yield from _keys(target, inner + ".")


def _plain_first_line(doc: str) -> str:
    line = doc.strip().splitlines()[0]
    return " ".join(re.sub(r":\w+:`~?([^`]+)`", r"\1", line).replace("`", "").split())


def test_the_site_builds_in_strict_mode_with_every_reference_page(site: Path, registries: Registries) -> None:
    for page in ["reference", "reference/config", "reference/hooks", *(f"reference/{r.kind}" for r in registries.all())]:
        assert (site / page / "index.html").is_file(), page


def test_every_core_schema_key_is_on_the_config_page(site: Path) -> None:
    page = _page(site, "reference/config")
    shown = {key for keys in page.keys.values() for key in keys}
    expected = list(_keys(RunConfig))
    assert len(expected) > 100
    assert [key for key in expected if key not in shown] == []
    # a Literal's choices: the pipe between them is escaped in the Markdown table, shown in the HTML
    assert 'data.on_bad_row one of "error" | "skip" "error"' in page.section_text("data")


def test_every_component_and_option_is_on_its_kind_page(site: Path, registries: Registries) -> None:
    missing = []
    for registry in registries.all():
        page = _page(site, f"reference/{registry.kind}")
        for entry in registry.entries():
            anchor = entry.name.replace(" ", "-")  # a command of a group: "ckpt apply_deltas"
            if anchor not in page.keys:
                missing.append(f"{registry.kind}: {entry.name}")
                continue
            text = page.section_text(anchor)
            assert entry.plugin in text and (entry.distribution or "") in text, entry.name
            party = "first-party" if entry.distribution == "tzrec-run" else "third-party"
            assert party in text, (entry.name, text)
            missing += [f"{registry.kind}: {entry.name}.{key}" for key in _keys(entry.config)
                        if key not in page.keys[anchor]]
    assert missing == []


def test_a_loss_page_shows_its_registered_prediction(site: Path, registries: Registries) -> None:
    page = _page(site, "reference/loss")
    for entry in registries["loss"].entries():
        assert f"Reads the model output {entry.extras['prediction']} unless" in page.section_text(entry.name)


def test_every_hookspec_is_on_the_hooks_page_with_its_first_line(site: Path) -> None:
    pm = make_plugin_manager(load_entry_points=False)
    specs = {name: caller.spec for name, caller in vars(pm.hook).items() if getattr(caller, "spec", None)}
    assert len(specs) >= 18
    page = _page(site, "reference/hooks", levels=("h2", "h3"))
    for name, spec in specs.items():
        assert name in page.text, name
        assert _plain_first_line(spec.function.__doc__) in page.section_text(name), name
    assert "tzrun_after_train_step(run, step_info)" in page.section_text("overview")  # the loop, as code


def test_the_attributes_parser_reads_continuations_paragraphs_and_shared_entries() -> None:
    @attrs.frozen
    class Sample:
        """A sample.

        Attributes:
            alpha: the first line
                and its continuation, with ``a | b``.

                A second paragraph.
            beta, gamma: shared by two.
            delta (int): with its type.

        Returns:
            not an attribute: this section ends the one above.
        """

        alpha: int
        beta: int
        gamma: int
        delta: int
        epsilon: Optional[int] = None

    assert parse_attributes(Sample.__doc__) == {
        "alpha": "the first line and its continuation, with ``a | b``. \nA second paragraph.",
        "beta": "shared by two.",
        "gamma": "shared by two.",
        "delta": "with its type.",
    }
    assert docstring_problems(Sample) == [f"{Sample.__module__}.{Sample.__qualname__}.epsilon: no doc in the Attributes: section"]

    @attrs.frozen
    class Child(Sample):
        """More.

        Attributes:
            epsilon: now documented.
            delta: documented again.
            delta: and twice.
            zeta: not a field.
        """

    assert [p.rsplit(".", 1)[1] for p in docstring_problems(Child)] == [
        "delta: documented twice", "zeta: documented but not a field",
    ]


def test_docstrings_become_markdown_with_literal_blocks_and_inline_code() -> None:
    text = docstring_markdown("""Summary.

    The rule::

        w -= lr * g

    Uses ``a|b`` and :class:`tzrun.TrainLog`.

    Attributes:
        x: dropped.
    """)
    assert text == "Summary.\n\nThe rule:\n\n```text\nw -= lr * g\n```\n\nUses `a|b` and `tzrun.TrainLog`."


def test_core_schema_and_first_party_options_are_documented(registries: Registries) -> None:
    classes = [getattr(schema, name) for name in schema.__all__]
    classes = [c for c in classes if attrs.has(c) and c is not Component]
    pending = [e.config for r in registries.all() for e in r.entries() if e.distribution == "tzrec-run"]
    seen: set[type] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        classes.append(cls)
        for hint in typing.get_type_hints(cls).values():
            target, _ = _unwrap(hint)
            if isinstance(target, type) and attrs.has(target):
                pending.append(target)
    problems = sorted({p for cls in classes for p in docstring_problems(cls)})
    assert problems == [], "add these to the classes' Attributes: sections:\n" + "\n".join(problems)
