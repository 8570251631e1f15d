"""One fact, one place: what ``check`` (preflight) hands the reader is what the run reads, for
every shipped example, and a Session is made from a config path."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

import tzrun
from tzrun.runner.session import Session

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.toml"))


@attrs.frozen
class SpyReaderConfig:
    """No options: the spy only records what preflight hands a reader's ``check``."""


class ColumnsSpy:
    """A reader plugin whose ``check`` records the input columns it is given."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    @tzrun.hookimpl
    def tzrun_register_readers(self, register):
        register("columns_spy", config=SpyReaderConfig, build=lambda cfg: None, check=self.check,
                 description="records the columns preflight hands it")

    def check(self, cfg, columns):
        self.seen.append(list(columns))
        return []


def _session(example: str, tmp_path: Path, *extra: str, plugins=()) -> Session:
    overrides = [f'data.train_input="{tmp_path / "train"}"', f'data.eval_input="{tmp_path / "eval"}"',
                 f'model_dir="{tmp_path / "run"}"', *extra]
    return Session.from_config(REPO / "examples" / example, overrides, plugins=plugins)


@pytest.mark.parametrize("example", EXAMPLES)
def test_check_and_the_run_read_the_same_input_columns(example, tmp_path):
    assert EXAMPLES, "no examples/*.toml found"
    spy = ColumnsSpy()
    session = _session(example, tmp_path, 'data.reader={type="columns_spy"}', plugins=[("columns_spy", spy)])
    session.check()  # preflight: the reader's check gets the input columns
    assert spy.seen == [session.columns]
    assert session.columns == session.facts.input_columns and session.columns


def test_a_derived_label_is_read_from_its_source_column_by_check_and_the_run(tmp_path):
    # the headerless CSV example with a documented derived label: check once read the label's
    # name ('clicked'), which column_names does not name, and refused the run
    spy = ColumnsSpy()
    derived = ('data.labels=["clicked"]', 'data.derived_labels=[{name = "clicked", source = "label", op = ">", value = 0.5}]')
    session = _session("deepfm_criteo_text.toml", tmp_path, *derived)
    session.check()  # the csv reader's own check of column_names passes
    assert "label" in session.columns and "clicked" not in session.columns
    spied = _session("deepfm_criteo_text.toml", tmp_path, *derived, 'data.reader={type="columns_spy"}',
                     plugins=[("columns_spy", spy)])
    spied.check()
    assert spy.seen == [session.columns]


def test_a_session_from_a_config_path_takes_overrides_and_plugins(tmp_path):
    spy = ColumnsSpy()
    session = _session("deepfm_criteo.toml", tmp_path, "data.batch_size=7", plugins=[("columns_spy", spy)])
    assert session.cfg.data.batch_size == 7 and session.raw.source.endswith("deepfm_criteo.toml")
    assert "columns_spy" in session.registries["reader"].names()
    assert session.pm.get_plugin("columns_spy") is spy
    with pytest.raises(RuntimeError, match="no process group"):
        session.info  # not started: nothing collective has run
