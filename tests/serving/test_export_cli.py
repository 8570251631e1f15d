"""`tzrec-run export` from checkpoints of 1 and 2 ranks, on one process without a process
group, checked against `tzrec-run evaluate`'s saved predictions (the sharded model's own
forward through FBGEMM); and the export loaded in a fresh virtual environment that has only
torch, numpy and pyarrow (no TorchRec, no tzrec-run).

Bound: max |exported - evaluated| <= 1e-5 on probabilities (float32; FBGEMM sums an embedding
bag in another order than torch's ``embedding_bag``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import cli
from tests.serving.conftest import EMA

pytestmark = pytest.mark.slow

BOUND = 1e-5


def _export(config: Path, model_dir: Path, out: Path, *sets: str) -> None:
    proc = cli(["export", str(config), "--model-dir", str(model_dir), "--checkpoint", "latest", "--out", str(out),
                    *[a for s in sets for a in ("--set", s)]])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "exported" in proc.stdout and "(step 4)" in proc.stdout


def _saved_probs(model_dir: Path) -> np.ndarray:
    """The probabilities the evaluation of step 4 saved on one process, in eval-input order."""
    return pq.read_table(model_dir / "predictions" / "step-4" / "rank-0.parquet")["probs"].to_numpy()


def _eval_rows(data: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted((data / "eval").glob("*.parquet"))])


@pytest.mark.multiproc
def test_exports_of_one_and_two_rank_checkpoints_equal_evaluate(tiny_run, two_rank_run, tmp_path):
    """One rank (evaluated with the EMA averages, which the export must hold too) and two
    ranks (evaluated again on one process, so that the saved rows are in input order)."""
    from tzrun_serving import Predictor

    root = tiny_run.model_dir.parent
    config, rows = root / "tiny.toml", _eval_rows(root / "tiny_data")
    _export(config, tiny_run.model_dir, tmp_path / "export1", EMA)
    two = two_rank_run
    proc = cli(["evaluate", str(config), "--model-dir", str(two), "--checkpoint", "latest",
                "--set", "eval.save_predictions=true"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    _export(config, two, tmp_path / "export2")
    for ranks, model_dir in ((1, tiny_run.model_dir), (2, two)):
        manifest = json.loads((tmp_path / f"export{ranks}" / "manifest.json").read_text())
        assert manifest["checkpoint"]["world_size"] == ranks and manifest["checkpoint"]["step"] == 4
        assert [o["kind"] for o in manifest["programs"]["model"]["outputs"]] == ["logit", "probability"]
        got = Predictor(tmp_path / f"export{ranks}").predict(rows)["probs"]
        evaluated = _saved_probs(model_dir)
        assert got.shape == evaluated.shape == (rows.num_rows,)
        np.testing.assert_allclose(got, evaluated, rtol=0, atol=BOUND)
    _fresh_venv_runs_the_export(tmp_path / "export2", rows, tmp_path)


def _runtime_packages() -> list[Path]:
    """The installed top-level packages (and their .libs directories) that loading and running
    an export imports, found by a probe in this environment."""
    probe = textwrap.dedent("""
        import json, sys, io, torch, numpy, pyarrow, pyarrow.parquet
        ep = torch.export.load(sys.argv[1])
        ep.module()
        roots = {m.split(".")[0] for m in list(sys.modules)}
        files = {r: getattr(sys.modules[r], "__file__", None) for r in roots if r in sys.modules}
        print(json.dumps({r: f for r, f in files.items() if f and "site-packages" in f}))
    """)
    return probe


def _fresh_venv_runs_the_export(export: Path, rows: pa.Table, tmp_path: Path) -> None:
    """A venv made with ``python -m venv`` whose only packages are links to the ones torch,
    numpy and pyarrow import: the export loads and gives the Predictor's outputs there, and
    ``import torchrec`` and ``import tzrun`` fail."""
    import torch

    from tzrun_serving import Predictor

    predictor = Predictor(export)
    inputs, _, _ = predictor.encode(rows)
    torch.save(inputs, tmp_path / "inputs.pt")
    want = predictor.run(inputs)["probs"]

    program = export / "model.pt2"
    found = subprocess.run([sys.executable, "-c", _runtime_packages(), str(program)], capture_output=True, text=True,
                           timeout=300)
    assert found.returncode == 0, found.stderr[-3000:]
    modules = json.loads(found.stdout.strip().splitlines()[-1])
    assert not {"torchrec", "tzrun", "fbgemm_gpu"} & set(modules), sorted(modules)
    links = tmp_path / "links"
    links.mkdir()
    for name, file in modules.items():
        source = Path(file).parent if Path(file).name == "__init__.py" else Path(file)
        os.symlink(source, links / source.name)
        for extra in source.parent.glob(f"{name}.libs"):  # numpy's and pyarrow's bundled libraries
            if not (links / extra.name).exists():
                os.symlink(extra, links / extra.name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = venv.glob("lib/python*/site-packages")
    (site / "runtime.pth").write_text(f"{links}\n", encoding="utf-8")
    script = textwrap.dedent("""
        import importlib.util, sys, torch
        for name in ("torchrec", "tzrun", "fbgemm_gpu"):
            assert importlib.util.find_spec(name) is None, name
        ep = torch.export.load(sys.argv[1])
        inputs = torch.load(sys.argv[2], weights_only=True)
        with torch.no_grad():
            out = ep.module()(inputs)
        torch.save({k: v for k, v in out.items()}, sys.argv[3])
        print("ok", sorted(out))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", script, str(program), str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)["probs"].numpy()
    np.testing.assert_array_equal(got, want)
