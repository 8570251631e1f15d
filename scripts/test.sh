#!/usr/bin/env bash
# Sets up the environment (see setup.sh) and runs the whole test suite; arguments go to pytest.
# TZRUN_TEST_WORKERS: pytest-xdist worker processes (default 2; 0 runs the tests in this process).
# OMP_NUM_THREADS: torch's threads in each worker (default: the CPUs split across the workers).
# Each test file runs on one worker (--dist loadfile), so its module fixtures are built once;
# the heaviest files start first (tests/durations.json, kept in order by --no-loadscope-reorder).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers="${TZRUN_TEST_WORKERS:-2}"
# each worker's torch gets its share of the cores (as tzrec-run's launcher gives each rank):
# two workers with a thread pool of every core each oversubscribe the machine, and the pools'
# threads spin while they wait (measured on 2 cores: test_resume.py and test_train.py took 89 s
# of CPU with 2 threads a worker, 63 s with 1); a subprocess inherits it, so a 1-process run of a
# test uses one thread too (the launcher keeps a value that is set)
if [[ "$workers" =~ ^[1-9][0-9]*$ ]] && [ -z "${OMP_NUM_THREADS:-}" ]; then
  OMP_NUM_THREADS="$(.venv/bin/python -c "import os; print(max(1, len(os.sched_getaffinity(0)) // $workers))")"
  export OMP_NUM_THREADS
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
