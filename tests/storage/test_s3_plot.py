"""``tzrec-run plot`` on a model dir in object storage (a real moto S3 server on loopback): it
reads ``metrics.jsonl`` there and writes the PNG files there, as every other command does."""

from __future__ import annotations

import json

import tzrun
from tzrun.cli.main import main

RECORDS = [
    {"kind": "train", "step": step, "epoch": 0, "steps": 2, "loss": 0.7 - step / 100, "losses": {"bce": 0.7 - step / 100},
     "learning_rates": {"sparse/deep_ebc": 0.05, "sparse/wide_ebc": 0.05, "dense": 0.001}, "metrics": {},
     "samples_per_s": 1000.0, "data_wait_fraction": 0.01}
    for step in (2, 4, 6)
] + [{"kind": "eval", "step": 6, "rows": 100, "metrics": {"auc": 0.71, "loss/bce": 0.65}}]


def test_plot_reads_and_writes_an_s3_model_dir(s3_bucket: str, capsys) -> None:
    model_dir = f"{s3_bucket}/run"
    tzrun.write_atomic(f"{model_dir}/metrics.jsonl", "".join(json.dumps(r) + "\n" for r in RECORDS).encode())
    assert main(["plot", model_dir]) == 0
    printed = capsys.readouterr().out.split()
    names = ["loss.png", "learning_rates.png", "eval.png", "throughput.png"]
    assert printed == [f"{model_dir}/plots/{n}" for n in names]
    for name in names:
        assert tzrun.as_path(f"{model_dir}/plots/{name}").read_bytes().startswith(b"\x89PNG\r\n")
    assert main(["plot", model_dir, "--out", f"{s3_bucket}/elsewhere"]) == 0
    assert tzrun.as_path(f"{s3_bucket}/elsewhere/eval.png").read_bytes().startswith(b"\x89PNG\r\n")
