"""The author's kit, ``tzrun.testing``, used as a plugin's CI uses it: a short training run with
a component from an object in this process, and with an installed example plugin."""

from __future__ import annotations

import os

import attrs
import pyarrow.parquet as pq
import pytest

import tzrun
from tests.plugin_kit.dists import REPO, write_distribution
from tzrun.kernel.plugins import make_plugin_manager, pinned_requirements, plugin_infos
from tzrun.testing import run_tiny_training

pytestmark = pytest.mark.slow


@attrs.frozen
class RowCountConfig:
    """``row_count`` has no options."""


def test_in_process_run_with_a_plugin_object(tmp_path):
    import torchmetrics

    class RowCount(torchmetrics.SumMetric):
        """The weight of the rows it saw: every eval row once, padding (weight 0) not at all."""

        def update(self, prediction, label, weight):
            super().update(weight.sum())

    class Counting:
        @tzrun.hookimpl
        def tzrun_register_metrics(self, register):
            register("row_count", config=RowCountConfig, build=lambda cfg: RowCount())

    run = run_tiny_training(tmp_path, overrides=['metrics=[{type="row_count"}]'], plugins=[("counting", Counting())], in_process=True)
    assert run.steps == 4 and run.metrics["row_count"] == 2048.0
    assert run.model is not None
    assert run.plugin("counting")["distribution"] is None  # registered in code, and recorded as such
    assert run.plugin("tzrun_plugins.optim")["distribution"] == "tzrec-run"


def test_plugin_objects_need_an_in_process_run(tmp_path):
    with pytest.raises(ValueError, match="in_process=True"):
        run_tiny_training(tmp_path, plugins=[object()])


def test_the_example_plugin_of_the_guide_trains_in_a_fresh_process(tmp_path):
    """examples/third_party_plugin as if pip-installed: its dist-info on PYTHONPATH, next to its source."""
    site_dir = tmp_path / "site"
    write_distribution(site_dir, "tzrun-example-plugin", "0.1.0", entry_points={"tzrun_example_plugin": "tzrun_example_plugin.hooks"},
                       requires=["tzrec-run>=0.1,<0.2", "attrs>=23.1"])
    python_path = os.pathsep.join([str(site_dir), str(REPO / "examples" / "third_party_plugin" / "src"), os.environ.get("PYTHONPATH", "")])
    run = run_tiny_training(
        tmp_path,
        overrides=['train.dense_optimizer={type="sign_sgd", lr=0.001}', 'metrics=[{type="label_mean"}]'],
        env={"PYTHONPATH": python_path},
    )
    labels = pq.read_table(tmp_path / "tiny_data" / "eval", columns=["label"]).column("label").to_numpy()
    assert run.metrics["label_mean"] == pytest.approx(labels.mean(), rel=1e-12)  # every eval row, padding excluded
    assert run.plugin("tzrun_example_plugin")["components"] == {"dense_optimizer": ["sign_sgd"], "metric": ["label_mean"]}


def test_only_the_built_ins_and_their_pin():
    pm = make_plugin_manager(distributions=["tzrec-run"])  # whatever else is installed
    assert {info.distribution for info in plugin_infos(pm)} == {"tzrec-run"}
    assert pinned_requirements(pm) == [f"tzrec-run=={tzrun.__version__}"]
