#!/usr/bin/env bash
# Sets up the environment (see setup.sh) and runs the whole test suite; arguments go to pytest.
# TZRUN_TEST_WORKERS: pytest-xdist worker processes (default 2; 0 runs the tests in this process).
# Each test file runs on one worker (--dist loadfile), so its module fixtures are built once;
# the heaviest files start first (tests/durations.json, kept in order by --no-loadscope-reorder).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n "${TZRUN_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
