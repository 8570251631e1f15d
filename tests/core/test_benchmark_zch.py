"""benchmarks/zch_vs_hash.py's two configs: the DeepFM example with the drifting features' ids
through ``zch`` or ``hash_bucket_size`` of the same rows, each accepted by ``check``, and
differing in nothing else."""

from __future__ import annotations

import difflib
import sys

from tests.conftest import REPO, cli

sys.path.insert(0, str(REPO / "benchmarks"))
from zch_vs_hash import id_source, write_config  # noqa: E402

from tzrun_tools.synth import SPARSE_COLUMNS  # noqa: E402
from tzrun_tools.synth_drift import DRIFT_COLUMNS  # noqa: E402


def test_the_two_variants_differ_only_in_the_drifting_features_id_source(tmp_path):
    columns = [SPARSE_COLUMNS[c] for c in DRIFT_COLUMNS]
    zch = write_config(tmp_path / "zch.toml", columns, id_source("zch", 2048, "distance_lfu"))
    hashed = write_config(tmp_path / "hash.toml", columns, id_source("hash", 2048, "distance_lfu"))
    changed = [line for line in difflib.ndiff(zch.read_text().splitlines(), hashed.read_text().splitlines())
               if line[:2] in ("- ", "+ ")]
    assert sorted(changed) == sorted([f"- {id_source('zch', 2048, 'distance_lfu')}"] * 5 + ["+ hash_bucket_size = 2048"] * 5)
    for config in (zch, hashed):
        done = cli(["check", str(config)])
        assert done.returncode == 0, done.stderr
