#!/usr/bin/env bash
# The quick start: set up, generate the synthetic Criteo-like data if it is not there, train
# examples/deepfm_criteo.toml on it, and compare the eval AUC with the best achievable one.
# Extra arguments go to `tzrec-run train` (e.g. --nproc-per-node 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
data=data/criteo_synth
if [ ! -f "$data/synth.json" ]; then
  .venv/bin/tzrec-run data synth criteo --rows 400000 --out "$data"
fi
.venv/bin/tzrec-run train examples/deepfm_criteo.toml --overwrite "$@"
.venv/bin/python - "$data" <<'PY'
import json, sys
from pathlib import Path
bayes = json.loads(Path(sys.argv[1], "synth.json").read_text())["bayes_auc"]
last = Path("runs/deepfm_criteo/eval_results.jsonl").read_text().splitlines()[-1]
auc = json.loads(last)["auc"]
print(f"eval AUC {auc:.4f} vs Bayes-optimal {bayes:.4f} (gap {bayes - auc:.4f})")
PY
