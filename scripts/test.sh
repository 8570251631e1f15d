#!/usr/bin/env bash
# Sets up the environment (see setup.sh) and runs the whole test suite; arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
