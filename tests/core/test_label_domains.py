"""Labels are checked against what their losses and metrics accept, where they are read; a
derived label is computed from its source column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.labels import DerivedLabel, LabelDomain, strictest
from tzrun.data.loader import RankInput
from tzrun.errors import DataError, PluginError
from tzrun.kernel.registry import collect_registries
from tzrun_plugins.readers.delimited import CsvConfig, CsvReader

DENSE = FeaturesConfig(dense=(DenseFeatureConfig("price"),))
BCE = LabelDomain("binary", "losses[0] (binary_cross_entropy)")
SOFTMAX = LabelDomain("class_index", "losses[0] (softmax_cross_entropy)", 3)
AUC = LabelDomain("binary", "metrics[0] (auc)")


def _pass(tmp_path: Path, text: str, domains, derived=(), skip: bool = False, label: str = "label") -> list:
    (tmp_path / "in.csv").write_text(text)
    source = next((d.source for d in derived), label)
    reader = CsvReader(CsvConfig(column_types={"price": "float32", source: "float32"}))
    builder = BatchBuilder(feature_specs(DENSE), [label], None, on_bad_row="skip" if skip else "error",
                           label_domains={label: domains}, derived_labels=derived)
    columns = ["price", source]
    return list(RankInput(reader, str(tmp_path / "in.csv"), 4, 0, columns, builder, 0, 1).one_pass())


@pytest.mark.parametrize("domain, bad", [(BCE, "2"), (BCE, "-1"), (AUC, "5"), (SOFTMAX, "3"), (SOFTMAX, "1.5"), (SOFTMAX, "-1")])
def test_a_label_outside_its_domain_names_file_line_column_value_and_who_needs_what(tmp_path, domain, bad):
    with pytest.raises(DataError) as caught:
        _pass(tmp_path, f"label,price\n1,0.5\n0,2\n1,1\n{bad},4\n0,1\n", (domain,))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'in.csv'}: line 5: column 'label' has 1 label(s) outside the {domain.domain} domain")
    assert f"(first: {float(bad):g})" in message
    assert domain.describe() in message
    assert 'data.on_bad_row = "skip"' in message
    if domain.domain == "binary":
        assert "[[data.derived_labels]]" in message


def test_labels_inside_their_domain_pass_and_skip_drops_and_counts_the_others(tmp_path):
    assert sum(b.num_rows for b in _pass(tmp_path, "label,price\n1,0.5\n0,2\n2,1\n", (SOFTMAX,))) == 3
    batches = _pass(tmp_path, "label,price\n1,0.5\n5,2\n0,1\n-1,3\n1,1\n", (BCE,), skip=True)
    assert sorted(np.concatenate([b.labels["label"].numpy() for b in batches]).tolist()) == [0, 1, 1]
    skipped = [b.skipped for b in batches if b.skipped]
    assert sum(s.rows for s in skipped) == 2
    assert sum(s.problems["label: outside binary"] for s in skipped) == 2


def test_a_column_is_checked_against_the_strictest_domain_reading_it():
    domains = strictest([LabelDomain("finite", "metrics[0] (mse)"), SOFTMAX, BCE, LabelDomain("non_negative", "x")])
    assert domains == (BCE,)
    assert strictest([LabelDomain("class_index", "a", 5), LabelDomain("class_index", "b", 3)])[0].num_classes == 3


def test_a_derived_label_compares_its_source_and_is_checked_like_a_column(tmp_path):
    clicked = DerivedLabel("clicked", "rating", ">=", 4.0)
    batches = _pass(tmp_path, "rating,price\n1,0.5\n5,2\n4,1\n3,3\n", (BCE,), (clicked,), label="clicked")
    assert np.concatenate([b.labels["clicked"].numpy() for b in batches]).tolist() == [0, 1, 1, 0]
    mapped = DerivedLabel("clicked", "rating", map={"1": 0.0, "5": 1.0})
    with pytest.raises(DataError) as caught:
        _pass(tmp_path, "rating,price\n1,0.5\n5,2\n4,1\n", (BCE,), (mapped,), label="clicked")
    assert f"{tmp_path / 'in.csv'}: line 4: column 'rating' (derived label 'clicked' (from rating))" in str(caught.value)
    assert "the map does not hold (first: 4" in str(caught.value)
    defaulted = DerivedLabel("clicked", "rating", map={"1": 0.0, "5": 1.0}, default=0.0)
    batches = _pass(tmp_path, "rating,price\n1,0.5\n5,2\n4,1\n", (BCE,), (defaulted,), label="clicked")
    assert np.concatenate([b.labels["clicked"].numpy() for b in batches]).tolist() == [0, 1, 0]


def test_a_derived_text_label_is_cast(tmp_path):
    (tmp_path / "in.csv").write_text("kind,price\nbuy,1\nview,2\n")
    reader = CsvReader(CsvConfig(column_types={"price": "float32", "kind": "string"}))
    bought = DerivedLabel("bought", "kind", map={"buy": 1.0, "view": 0.0})
    builder = BatchBuilder(feature_specs(DENSE), ["bought"], None, label_domains={"bought": (BCE,)}, derived_labels=(bought,))
    batch = next(iter(RankInput(reader, str(tmp_path / "in.csv"), 4, 0, ["price", "kind"], builder, 0, 1).one_pass()))
    assert batch.labels["bought"].tolist() == [1.0, 0.0]


def test_an_unknown_labels_option_is_a_plugin_error_naming_the_domains(tzrun_pm):
    import attrs
    import tzrun

    @attrs.frozen
    class Options:
        pass

    class Odd:
        @tzrun.hookimpl
        def tzrun_register_losses(self, register):
            register("odd", config=Options, build=lambda cfg: None, labels="probability")

    tzrun_pm.register(Odd(), name="odd")
    tzrun_pm.strict = True
    with pytest.raises(Exception) as caught:
        collect_registries(tzrun_pm)
    assert "labels='probability'" in str(caught.value) and "'binary'" in str(caught.value)


def test_check_reports_a_derived_label_missing_its_value_and_an_unknown_op():
    from tests.integration.test_labels_e2e import CONFIG
    from tzrun.config.load import load_config, parse_config
    from tzrun.errors import ConfigError
    from tzrun.kernel.plugins import make_plugin_manager

    registries = collect_registries(make_plugin_manager())
    overrides = ['data.derived_labels=[{name = "clicked", source = "rating", op = ">="}, '
                 '{name = "liked", source = "rating", op = "=>", value = 4}]']
    with pytest.raises(ConfigError) as caught:
        load_config(parse_config(CONFIG.format(model_dir="m", train="t.csv"), "run.toml", overrides), registries)
    message = str(caught.value)
    assert "data.derived_labels[0].value: set op and value together" in message
    assert "data.derived_labels[1].op: expected one of" in message
