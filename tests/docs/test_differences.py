"""``docs/differences.md`` is the complete table of deliberate differences from TorchEasyRec, and
stays in step with the code and the pages that document each difference.

The table's rows are written by hand; these tests make each kind of drift fail:

* **links**: every row links (last column) to sections that exist, and at least one of them
  mentions TorchEasyRec, so a row points at where the difference is explained;
* **options**: every code span ``name: key = value`` (a component's option) or
  ``section.key = value`` (a key of the config) in the "TorchEasyRec's behaviour" column is an
  option the code accepts with that value;
* **sections**: every section of the other pages whose heading talks of differing is linked
  from the table, or links to it;
* **mentions**: every section of the other pages that names TorchEasyRec is linked from the
  table, links to it, or is in :data:`SAME_AS_TORCHEASYREC` with the reason it states no
  difference; so a page cannot state a new difference in a new section the table does not know;
* **compatibility options**: every option of a first-party component that its documentation
  ties to TorchEasyRec is named in the table (or in :data:`NOT_DIFFERENCES`, with the reason);
* **convert**: every option ``tzrec-run convert`` writes to keep TorchEasyRec's behaviour (a
  default written out, a compatibility rule) is named in the table.
"""

from __future__ import annotations

import re
import sys
import typing
import unicodedata
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

import attrs
import pytest

from tzrun.config.schema import RunConfig
from tzrun_tools.convert import convert_pipeline_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun_tools.reference.docstrings import attribute_docs
from tzrun_tools.reference.fields import field_hints, unwrap_optional
from tzrun.kernel.registry import Entry, collect_registries

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = "differences.md"

#: Options whose documentation names TorchEasyRec but that are no difference, with the reason.
NOT_DIFFERENCES: Mapping[tuple[str, str], str] = {
    ("tdm_tree", "item_id"): "TorchEasyRec's --item_id_field, the same column named by another flag",
    ("relative_l1", "eps"): "the same default as TorchEasyRec's epsilon",
    ("exponential_decay", "decay_size"): "in the table as 'schedule checks' (no option gives the crash)",
    ("pareto", "min_weights"): "TorchEasyRec's pareto_min_loss_weight, with the same meaning",
    ("negative", "item_id"): "TorchEasyRec's item_id_field, with the same meaning",
    ("tdm", "tree"): "TorchEasyRec's node and edge tables in one file: the 'tdm training on the tree' row",
    ("tdm_retrieve", "top_k"): "TorchEasyRec's --recall_num, with the same meaning",
    ("tdm_retrieve", "beam"): "the same default as TorchEasyRec's 2 * recall_num: the 'tdm retrieval' row",
    ("tdm_retrieve", "keep_column"): "TorchEasyRec's --reserved_columns, with the same meaning",
}

#: Sections (``page#anchor``) that name TorchEasyRec without stating a difference, with the reason.
SAME_AS_TORCHEASYREC: Mapping[str, str] = {
    "data.md#cost-aware-batches": "TorchEasyRec's batch_cost_size with sample_cost_field, the same rule",
    "data.md#data-shaped-like-a-config-like": "TorchEasyRec's example configs as synth --like's inputs; value_dim > 1 "
                                              "is migration.md's not-converted row",
    "migration.md#before-the-real-data-end-to-end-on-synthetic-data": "TorchEasyRec's example configs run end to end "
                                                                      "on synthetic data, as inputs",
    "howto/criteo_text.md#point-it-at-the-real-files": "TorchEasyRec's table sizes, as data",
    "howto/fine_tuning.md#fine-tune-from-another-run": "TorchEasyRec's fine_tune_ckpt_param_map format, the same",
    "howto/sparse_optimizers_cpu_gpu.md#on-gpu": "TorchEasyRec's Criteo tables, as data",
    "plan.md#torcheasyrecs-criteo-at-full-size-on-8-gpus": "TorchEasyRec's Criteo config at its real scale",
    "models.md#din-against-a-pooled-model": "TorchEasyRec's Criteo table sizes, as data",
    "models.md#quality-on-the-synthetic-data": "TorchEasyRec's example widths, as data",
    "install.md#extras": "what convert writes for TorchEasyRec's TensorBoard default (its row links migration.md)",
    "losses.md#jrc-joint-ranking-and-calibration": "TorchEasyRec's jrc_loss, the same value with less memory",
    "metrics.md#metrics": "TorchEasyRec's name for the similarity output",
    "metrics.md#grouped_auc": "TorchEasyRec's GroupedAUC, the same mean",
    "metrics.md#relative_l1-and-unique_ratio": "TorchEasyRec's RelativeL1 and UniqueRatio, the same definitions",
    "models.md#models": "examples modelled on TorchEasyRec's",
    "models.md#deepfm": "TorchEasyRec's deepfm, the same network",
    "models.md#dlrm": "TorchEasyRec's dlrm, the same network",
    "models.md#wide_and_deep": "TorchEasyRec's wide_and_deep, the same network",
    "models.md#dcn_v2": "the option table against TorchEasyRec's fields (differences: the dcn rows)",
    "models.md#dcn_v1": "the option table and TorchEasyRec's initialization, the same (differences: the dcn rows)",
    "models.md#mmoe": "TorchEasyRec's mmoe, the same network",
    "models.md#multi_tower": "TorchEasyRec's multi_tower, the same network and groups",
    "models.md#din": "TorchEasyRec's multi_tower_din with its softmax default, the same network",
    "retrieval.md#retrieval-with-sampled-negatives": "TorchEasyRec's negative_sampler, the same draws",
    "retrieval.md#negative": "TorchEasyRec's item_id_field, batch exclusion and no logQ: the same",
    "retrieval.md#in-batch-or-sampled-recall-on-the-synthetic-data": "TorchEasyRec's batch exclusion, the same",
    "schedules.md#manual_step": "points to its own 'Differences from TorchEasyRec' section, which the table links",
    "migration.md#migrating-from-torcheasyrec": "the page's introduction",
    "migration.md#convert-a-torcheasyrec-config": "how to run convert",
    "migration.md#command-line": "the commands side by side",
    "migration.md#losses": "the loss mapping; its differences are in the loss and Pareto rows",
    "migration.md#multi-task-towers": "the tower mapping, the same towers",
    "migration.md#eval_config-and-export_config": "the evaluation mapping, the same behaviour",
    "migration.md#a-worked-example": "a conversion, shown",
    "migration.md#a-worked-example-din-over-a-click-sequence": "a conversion, shown",
}

_OPTION = re.compile(
    r"^(?:(?P<name>[a-z][a-z0-9_]*): |(?P<path>[a-z][a-z0-9_.]*)\.)(?P<key>[A-Za-z_][A-Za-z0-9_]*) = (?P<value>.+)$"
)
_LINK = re.compile(r"\]\(([^)\s]*)\)")


@attrs.frozen
class Row:
    line: int
    cells: dict[str, str]

    @property
    def where(self) -> str:
        return f"docs/{PAGE}:{self.line} ({self.cells['topic']})"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _rows() -> list[Row]:
    """The rows of the page's tables (header ``topic | ... | details``)."""
    rows, header = [], None
    for n, line in enumerate((DOCS / PAGE).read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
        elif not set("".join(cells)) <= set("-: "):
            rows.append(Row(n, dict(zip(header, cells))))
    return rows


def _slug(text: str) -> str:
    """Python-Markdown's ``toc`` anchor of a heading."""
    text = re.sub(r"<[^>]+>|`", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _sections(page: Path) -> dict[str, tuple[str, str]]:
    """``anchor -> (heading, text of the section up to the next heading)`` (fences skipped)."""
    sections: dict[str, tuple[str, str]] = {}
    anchor, heading, text, fence = "", "", [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if fence:
            fence = None if stripped.startswith(fence) else fence
        elif stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif re.match(r"#{1,6} ", stripped):
            sections[anchor] = (heading, "\n".join(text))
            heading = stripped.lstrip("#").strip()
            explicit = re.search(r"\{#([^}]*)\}$", heading)
            anchor = explicit.group(1) if explicit else _slug(heading)
            text = []
            continue
        text.append(line)
    sections[anchor] = (heading, "\n".join(text))
    return sections


def _pages() -> Iterator[Path]:
    for page in sorted(DOCS.rglob("*.md")):
        if page.name != PAGE and "_hooks" not in page.parts:
            yield page


def _links(row: Row) -> list[tuple[str, str]]:
    """The ``(page, anchor)`` of every link of the row's details cell."""
    out = []
    for target in _LINK.findall(row.cells["details"]):
        page, _, anchor = target.partition("#")
        out.append((page or PAGE, anchor))
    return out


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _options() -> dict[tuple[str, str], list[tuple[Any, Row]]]:
    """Every option named in the table: ``(component or section, key) -> [(value, row)]``."""
    found: dict[tuple[str, str], list[tuple[Any, Row]]] = {}
    for row in _rows():
        for span in _spans(row.cells["torcheasyrec's behaviour"]):
            match = _OPTION.match(span)
            if match:
                value = tomllib.loads(f"v = {match['value']}")["v"]
                found.setdefault((match["name"] or match["path"], match["key"]), []).append((value, row))
    return found


# ---------------------------------------------------------------------------- the code


_REGISTRIES = collect_registries(make_plugin_manager())


def _entries(name: str) -> list[Entry]:
    return [e for registry in _REGISTRIES.all() for e in registry.entries() if e.name == name]


def _accepts(cls: type, key: str, value: Any) -> bool:
    """Whether the attrs class ``cls`` has the field ``key`` and would take ``value`` for it."""
    field = attrs.fields_dict(cls).get(key)
    if field is None:
        return False
    hint, _ = unwrap_optional(field_hints(cls)[key])
    if typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
        return False
    if hint in (int, str, bool) and type(value) is not hint:
        return False
    if hint is float and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return False
    if field.validator is not None:
        try:
            field.validator(None, field, value)
        except (ValueError, TypeError):
            return False
    return True


def _schema_class(path: str) -> type | None:
    """The attrs class of the config section ``path`` (``train``, ``data``, ``eval``)."""
    cls: Any = RunConfig
    for part in path.split("."):
        if not attrs.has(cls) or part not in attrs.fields_dict(cls):
            return None
        cls, _ = unwrap_optional(field_hints(cls)[part])
        if typing.get_origin(cls) is tuple:  # an array of tables ([[features.sequence]]): its element
            cls = typing.get_args(cls)[0]
    return cls if attrs.has(cls) else None


def _option_is_accepted(owner: str, key: str, value: Any) -> bool:
    classes = [e.config for e in _entries(owner)] if "." not in owner and _entries(owner) else []
    schema = _schema_class(owner)
    if schema is not None:
        classes.append(schema)
    return any(_accepts(cls, key, value) for cls in classes)


# ---------------------------------------------------------------------------- the tests


def test_the_table_has_rows_with_every_column() -> None:
    rows = _rows()
    assert len(rows) >= 30, "the table lost its rows (or its header changed)"
    for row in rows:
        assert set(row.cells) == {"topic", "torcheasyrec", "tzrec-run", "torcheasyrec's behaviour", "details"}, row.where
        assert all(row.cells.values()), f"{row.where}: a cell is empty"


def test_every_row_links_to_where_it_is_documented() -> None:
    problems = []
    for row in _rows():
        links = _links(row)
        if not links:
            problems.append(f"{row.where}: the details cell links nowhere")
        mentions = False
        for page, anchor in links:
            path = DOCS / page
            sections = _sections(path) if path.is_file() else {}
            if anchor not in sections:
                problems.append(f"{row.where}: no section {page}#{anchor}")
            else:
                mentions = mentions or "TorchEasyRec" in sections[anchor][1]
        if links and not mentions:
            problems.append(f"{row.where}: none of its linked sections ({links}) mentions TorchEasyRec")
    assert not problems, "\n".join(problems)


def test_every_named_option_is_accepted_by_the_code() -> None:
    options = _options()
    assert options, "no option is named in the table"
    for (owner, key), uses in options.items():
        for value, row in uses:
            assert _option_is_accepted(owner, key, value), (
                f"{row.where}: '{owner}: {key} = {value!r}' is no option of tzrec-run (or not that value)"
            )
    for row in _rows():
        cell = row.cells["torcheasyrec's behaviour"]
        assert cell.startswith("none") or any(_OPTION.match(s) for s in _spans(cell)), (
            f"{row.where}: the behaviour cell must name an option (`name: key = value`) or start with 'none'"
        )


def test_every_section_about_differences_is_in_the_table() -> None:
    linked = {(page, anchor) for row in _rows() for page, anchor in _links(row)}
    for page in _pages():
        rel = page.relative_to(DOCS).as_posix()
        for anchor, (heading, text) in _sections(page).items():
            if re.search(r"\bdiffer", heading, re.I) and (rel, anchor) not in linked:
                assert "differences.md" in text, (
                    f"docs/{rel}: the section '{heading}' is about differences but is not linked from "
                    f"docs/{PAGE}, and does not link to it: add a row, or point the section to the table"
                )


def test_every_section_naming_torcheasyrec_is_in_the_table_or_says_why_not() -> None:
    linked = {(page, anchor) for row in _rows() for page, anchor in _links(row)}
    seen = set()
    for page in _pages():
        rel = page.relative_to(DOCS).as_posix()
        for anchor, (heading, text) in _sections(page).items():
            where = f"{rel}#{anchor}"
            if "TorchEasyRec" not in text or (rel, anchor) in linked or "differences.md" in text:
                continue
            seen.add(where)
            assert where in SAME_AS_TORCHEASYREC, (
                f"docs/{where} ('{heading}') names TorchEasyRec but is not linked from docs/{PAGE}: add a row for "
                "the difference it states, or, if it states none, an entry of SAME_AS_TORCHEASYREC with the reason"
            )
    stale = set(SAME_AS_TORCHEASYREC) - seen
    assert not stale, f"SAME_AS_TORCHEASYREC names sections that are linked, gone or silent on TorchEasyRec: {stale}"


def test_every_compatibility_option_is_in_the_table() -> None:
    named = set(_options())
    for registry in _REGISTRIES.all():
        for entry in registry.entries():
            if entry.distribution != "tzrec-run":
                continue
            for key, doc in attribute_docs(entry.config).items():
                if "TorchEasyRec" in doc and (entry.name, key) not in NOT_DIFFERENCES:
                    assert (entry.name, key) in named, (
                        f"{registry.kind} '{entry.name}' option '{key}' is documented as TorchEasyRec's behaviour "
                        f"but docs/{PAGE} names no '{entry.name}: {key} = ...'; add a row (or an entry of "
                        "NOT_DIFFERENCES with the reason)"
                    )


_PIPELINE = """
    model_dir: "runs/x"
    train_config {{
        sparse_optimizer {{ rowwise_adagrad_optimizer {{ lr: 0.1 }} }}
        dense_optimizer {{ {dense} {{ {lr} }} }}
        num_epochs: 1
    }}
    data_config {{ dataset_type: ParquetDataset label_fields: "label" }}
    model_config {{ deepfm {{}} {metrics} }}
"""

_DENSE = ("sgd_optimizer", "adagrad_optimizer", "adam_optimizer", "adamw_optimizer", "adadelta_optimizer",
          "rmsprop_optimizer")
_METRICS = 'metrics { xauc {} } metrics { xauc { in_batch: true } } metrics { grouped_xauc { grouping_key: "u" } } ' \
           "metrics { accuracy {} }"


@pytest.mark.parametrize("dense", _DENSE)
def test_what_convert_writes_for_torcheasyrec_is_in_the_table(dense: str) -> None:
    """Each value convert adds that the TorchEasyRec config did not spell out is a row's option."""
    lr = "" if dense == "sgd_optimizer" else "lr: 0.01"
    conversion = convert_pipeline_config(_PIPELINE.format(dense=dense, lr=lr, metrics=_METRICS), "x.config")
    tree = conversion.tree
    named = {(owner, key, repr(value)) for (owner, key), uses in _options().items() for value, _ in uses}
    written = []
    optimizer = tree["train"]["dense_optimizer"]
    written += [(optimizer["type"], k, v) for k, v in optimizer.items() if k not in ("type", "lr_schedule")
                and not (k == "lr" and lr)]
    sparse = tree["train"]["sparse_optimizer"]
    written += [(sparse["type"], k, v) for k, v in sparse.items() if k not in ("type", "lr")]
    written += [("train", k, v) for k, v in tree["train"].items() if k == "save_checkpoints_steps"]
    for metric in tree["metrics"]:
        written += [(metric["type"], k, v) for k, v in metric.items() if k in ("ties", "averaging", "compare")]
    assert any(owner == "xauc" for owner, _, _ in written), "convert wrote no XAUC rule: the test is stale"
    for owner, key, value in written:
        assert (owner, key, repr(value)) in named, (
            f"tzrec-run convert writes '{owner}: {key} = {value!r}' for TorchEasyRec's behaviour, but docs/{PAGE} "
            "names no such option: add it to the row of that difference"
        )
