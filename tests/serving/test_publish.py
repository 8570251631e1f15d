"""Exports written during training (``[export]``): versions with a marker and a ``latest``
pointer written last, ``keep`` of them; a kill while one is written leaves nothing that looks
complete; the same on an object store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.serving.conftest import EMA

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def trained(tiny_run):
    return tiny_run, tiny_run.model_dir.parent


def _session(run):
    from tzrun.runner.session import Session

    return Session.from_config(run.model_dir.parent / "tiny.toml", [f'model_dir="{run.model_dir}"', EMA])


def _rows(root: Path) -> pa.Table:
    return pq.read_table(sorted((root / "tiny_data" / "eval").glob("*.parquet"))[0]).slice(0, 300)


def test_training_exports_the_best_and_the_final_checkpoint(trained):
    from tzrun_serving import Predictor
    from tzrun_serving.publish import latest_version, versions

    run, root = trained
    exports = run.model_dir / "exports"
    best = json.loads((run.model_dir / "best.json").read_text())["step"]
    kept = [(step, complete) for step, _, complete in versions(exports)]
    assert kept == [(s, True) for s in sorted({best, 4})][-2:]  # the best one(s) and the final one, keep = 2
    assert latest_version(exports).name == "step-4"  # at_end comes last
    manifest = json.loads((exports / "step-4" / "manifest.json").read_text())
    assert manifest["checkpoint"]["step"] == 4
    probs = Predictor(exports).predict(_rows(root))["probs"]  # follows `latest`
    assert probs.shape == (300,) and np.all((probs > 0) & (probs < 1))


def test_a_kill_while_publishing_leaves_latest_on_the_previous_export(trained, tmp_path):
    from tzrun.errors import CheckpointError
    from tzrun_serving import Predictor
    from tzrun_serving.publish import latest_version, publish_export, versions

    run, root = trained
    exports = tmp_path / "exports"
    shutil.copytree(run.model_dir / "exports" / "step-4", exports / "step-4")
    (exports / "latest").write_text("step-4\n")
    checkpoint = run.model_dir / "checkpoints" / "step-2"
    script = textwrap.dedent(f"""
        import os, torch
        from tzrun.runner.session import Session
        from tzrun_serving.publish import publish_export

        session = Session.from_config({str(run.model_dir.parent / "tiny.toml")!r}, ['model_dir="{run.model_dir}"', {EMA!r}])

        def killed(program, target, **kwargs):  # half a program written, then the process dies
            with open(target, "wb") as f:
                f.write(b"PK half")
            os._exit(9)

        torch.export.save = killed
        publish_export(session.facts, {str(checkpoint)!r}, {str(exports)!r}, keep=3, run_id={_run_id(run)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert [(s, c) for s, _, c in versions(exports)] == [(2, False), (4, True)]
    assert latest_version(exports).name == "step-4"
    with pytest.raises(CheckpointError, match="not a complete export"):
        Predictor(exports / "step-2")
    rows = _rows(root)
    before = Predictor(exports).predict(rows)["probs"]
    np.testing.assert_array_equal(before, Predictor(run.model_dir / "exports" / "step-4").predict(rows)["probs"])

    publish_export(_session(run).facts, checkpoint, exports, keep=3, run_id=_run_id(run))  # the next publication cleans up
    assert [(s, c) for s, _, c in versions(exports)] == [(2, True), (4, True)]
    assert latest_version(exports).name == "step-2"


def test_publishing_to_an_object_store(trained, s3_bucket):
    from tzrun_serving import Predictor
    from tzrun_serving.publish import latest_version, publish_export

    run, root = trained
    facts = _session(run).facts
    url = f"{s3_bucket}/exports"
    publish_export(facts, run.model_dir / "checkpoints" / "step-2", url, keep=1, run_id=_run_id(run))
    publish_export(facts, run.model_dir / "checkpoints" / "step-4", url, keep=1, run_id=_run_id(run))
    assert latest_version(url).name == "step-4"
    from tzrun.io.storage import as_path

    assert sorted(p.name for p in as_path(url).iterdir()) == ["latest", "step-4"]
    rows = _rows(root)
    np.testing.assert_array_equal(Predictor(url).predict(rows)["probs"],
                                  Predictor(run.model_dir / "exports" / "step-4").predict(rows)["probs"])


@pytest.mark.multiproc
def test_rank_0_exports_while_the_other_rank_waits(two_rank_run, trained):
    """On 2 ranks the export is made by rank 0 alone (no collective of its own: the other rank
    waits at the next one), from the checkpoint of 2 ranks."""
    from tzrun_serving import Predictor
    from tzrun_serving.publish import latest_version, versions

    run, root = trained
    exports = two_rank_run / "exports"
    assert latest_version(exports).name == "step-4"
    assert all(complete for _, _, complete in versions(exports))
    manifest = json.loads((exports / "step-4" / "manifest.json").read_text())
    assert manifest["checkpoint"]["world_size"] == 2
    probs = Predictor(exports).predict(_rows(root))["probs"]
    assert probs.shape == (300,) and np.all((probs > 0) & (probs < 1))


def _run_id(run) -> str:
    """The run id of ``run`` (its model dir's marker), which its exports record."""
    return json.loads((run.model_dir / ".tzrec-run").read_text())["run_id"]
