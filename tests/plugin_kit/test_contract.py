"""The typed ``register`` protocols (``tzrun.Register*``, what ``mypy --strict`` checks a
plugin against) and the runtime's table (``tzrun.kernel.registry.KINDS``, what ``register`` accepts
when a run collects the plugins) are one contract: for every kind, the protocol that its
registration hook is annotated with takes exactly the keywords the runtime accepts, with the
same defaults."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import tzrun
from tzrun import hookspecs, interfaces
from tzrun.kernel.registry import KINDS

#: what ``register`` takes for every kind (``name`` is positional)
COMMON = {"config": inspect.Parameter.empty, "build": inspect.Parameter.empty, "description": ""}


def protocol_of(hook: str) -> type:
    """The protocol the hookspec ``hook`` annotates its ``register`` argument with."""
    annotation = getattr(hookspecs, hook).__annotations__["register"]
    return getattr(interfaces, annotation) if isinstance(annotation, str) else annotation


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_typed_protocol_takes_what_the_runtime_accepts(kind):
    spec = KINDS[kind]
    protocol = protocol_of(spec.hook)
    params = dict(inspect.signature(protocol.__call__).parameters)
    assert list(params)[:2] == ["self", "name"], protocol.__name__
    keywords = {p.name: p.default for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == {**COMMON, **spec.extras}, (
        f"{protocol.__name__} (the annotation of {spec.hook}) and KINDS[{kind!r}].extras disagree"
    )
    assert protocol.__name__ in tzrun.__all__, f"{protocol.__name__} is what authors annotate with: make it public"


def test_batch_is_public_with_each_field_documented():
    from tzrun.data.batch import Batch

    assert tzrun.Batch is Batch and "Batch" in tzrun.__all__
    attributes = Batch.__doc__.split("Attributes:")[1]
    fields = [p for p in inspect.signature(Batch.__init__).parameters if p != "self"]
    assert [f for f in fields if f"\n        {f}:" not in attributes] == []


def test_the_row_metric_base_is_public():
    from torchmetrics import Metric

    assert "RowMetric" in tzrun.__all__ and issubclass(tzrun.RowMetric, Metric)


def test_plugin_authors_md_lists_the_public_api_once_and_whole():
    """The table of docs/plugin_authors.md's "What a plugin may import" is ``tzrun.__all__``."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "plugin_authors.md").read_text()
    section = page.split("## What a plugin may import")[1].split("\n## ")[0]
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `tzrun.")]
    listed = [name for row in rows for name in re.findall(r"`tzrun\.(\w+)", row)]
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert sorted(listed) == sorted(tzrun.__all__)
