#!/usr/bin/env bash
# The GPU smoke test: on a fresh machine with NVIDIA GPUs, set up the CUDA stack and check the
# CUDA path end to end, unattended, in under 10 minutes (README.md, "GPU smoke test").
#
#   bash scripts/gpu_smoke.sh              # set up .venv-cuda, run everything, print a summary
#   bash scripts/gpu_smoke.sh --dry-run    # print every command, in order; install and run nothing
#
# Steps: (1) the CUDA stack from requirements/cuda.txt into .venv-cuda (scripts/setup.sh);
# (2) nvidia-smi and torch see the GPUs; (3) the tests/gpu suite (fused sparse optimizers against
# torch, bf16/fp16 with the scaler, exact resume, every example on one GPU); (4) every example
# on all GPUs through torchrun with NCCL; (5) the throughput line of DeepFM on all GPUs.
# Exits 0 when every step passed, 1 when one failed (the summary names it), 64 on bad usage.
#   TZRUN_VENV=DIR         the CUDA environment (default .venv-cuda)
#   TZRUN_SMOKE_DIR=DIR    data, model dirs and logs (default: a new directory under /tmp)
#   PYTHON=python3.X       the interpreter setup.sh builds the environment from
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_smoke.sh: unknown argument '$arg' (usage: bash scripts/gpu_smoke.sh [--dry-run])" >&2; exit 64 ;;
  esac
done

venv="${TZRUN_VENV:-.venv-cuda}"
py="$venv/bin/python"
if [ "$dry_run" = 1 ]; then
  work="${TZRUN_SMOKE_DIR:-/tmp/tzrun_gpu_smoke.XXXXXX}"
  ngpu='$(nvidia-smi -L | wc -l)'
  args_py="${PYTHON:-python3}"  # example_runs.py args uses the standard library only
else
  work="${TZRUN_SMOKE_DIR:-$(mktemp -d /tmp/tzrun_gpu_smoke.XXXXXX)}"
  mkdir -p "$work/logs"
  args_py="$py"
fi
bench_rows=250000  # per GPU: about 30 steps of 8192 rows on each rank
results=()
failed=0

# show CMD...: the command as one line a shell can run (an argument with anything but plain
# characters in double quotes, so a dry run's "$(nvidia-smi -L | wc -l)" is evaluated when pasted)
show() {
  local arg line="+"
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then
      line+=" $arg"
    else
      arg="${arg//\\/\\\\}"
      line+=" \"${arg//\"/\\\"}\""
    fi
  done
  printf '%s\n' "$line"
}

# run NAME TIMEOUT_S CMD...: print the command; unless a dry run, run it (output to the
# terminal and to $work/logs/NAME.log) and record PASS or FAIL with its duration
run() {
  local name="$1" limit="$2"
  shift 2
  show "$@"
  [ "$dry_run" = 1 ] && return 0
  local start=$SECONDS status
  timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$work/logs/$name.log"
  status=${PIPESTATUS[0]}
  if [ "$status" = 0 ]; then
    results+=("PASS  $name ($((SECONDS - start)) s)")
  else
    results+=("FAIL  $name (exit $status after $((SECONDS - start)) s; log: $work/logs/$name.log)")
    failed=1
  fi
  return "$status"
}

summary() {
  echo
  echo "GPU smoke summary ($work):"
  printf '  %s\n' "${results[@]}"
  [ -n "${throughput:-}" ] && echo "  throughput, DeepFM on $ngpu GPU(s): $throughput"
  if [ "$failed" = 0 ]; then echo "GPU smoke: all steps passed"; else echo "GPU smoke: FAILED"; fi
}

[ "$dry_run" = 1 ] && echo "gpu_smoke.sh --dry-run: the commands a run would execute, in order (nothing is installed or run)"

# 1-2: the CUDA stack, and GPUs that torch sees; nothing else can run without them
echo "the CUDA stack: requirements/cuda.txt ($(grep -hE '^[A-Za-z]' requirements/cuda.txt | tr '\n' ' ' | sed 's/ $//')) and torchrec==$(sed -n 's/^TORCHREC_VERSION = "\(.*\)"$/\1/p' plugins/tzrun_tools/torchrec_wheel.py) (plugins/tzrun_tools/torchrec_wheel.py)"
if ! run setup 1200 env TZRUN_STACK=cuda TZRUN_VENV="$venv" bash scripts/setup.sh \
  || ! run nvidia_smi 60 nvidia-smi -L \
  || ! run torch_sees_cuda 120 "$py" -c 'import sys, torch; n = torch.cuda.device_count(); print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", n); sys.exit(0 if n else "torch sees no GPU: check the driver and the CUDA build of torch (requirements/cuda.txt)")' \
  || ! run env 120 "$py" -m tzrun env; then
  summary
  exit 1
fi
[ "$dry_run" = 1 ] || ngpu="$(nvidia-smi -L | wc -l)"

# 3: the tests/gpu suite (its examples on one GPU)
run gpu_tests 420 "$py" -m pytest tests/gpu -m gpu -q -rs -p no:cacheprovider

# 4: every example on every GPU, through torchrun and NCCL (on a one-GPU machine step 3 did that)
if [ "$ngpu" = 1 ]; then
  echo "one GPU: the examples ran on it in step 3; no torchrun runs"
else
run example_data 300 "$py" tests/gpu/example_runs.py data "$work/data"
for config in examples/*.toml; do
  example="$(basename "$config" .toml)"
  mapfile -t sets < <("$args_py" tests/gpu/example_runs.py args "$example" "$work/data" "$work/runs/$example-all-gpus")
  run "example_${example}_all_gpus" 300 "$venv/bin/torchrun" --nproc-per-node "$ngpu" -m tzrun train "$config" "${sets[@]}"
done
fi

# 5: the throughput line (`trained N steps in S s (X samples/s)`, the line benchmarks/compare_deepfm.py reads)
bench="$work/bench_criteo"
if [ "$dry_run" = 1 ]; then rows="\$(($bench_rows * $ngpu))"; else rows=$((bench_rows * ngpu)); fi
run throughput_data 300 "$py" -m tzrun data synth criteo --rows "$rows" --eval-rows 8192 --out "$bench"
if run throughput 300 "$venv/bin/torchrun" --nproc-per-node "$ngpu" -m tzrun train examples/deepfm_criteo.toml \
  --model-dir "$work/runs/throughput" --overwrite --set "data.train_input=\"$bench/train\"" \
  --set "data.eval_input=\"$bench/eval\"" --set data.batch_size=8192 --set train.num_epochs=1 \
  && [ "$dry_run" = 0 ]; then
  throughput="$(grep -E '^trained [0-9]+ steps in ' "$work/logs/throughput.log" | tail -1)"
fi

if [ "$dry_run" = 1 ]; then
  echo "gpu_smoke.sh --dry-run: done (exit 0; a real run prints a PASS/FAIL summary and exits 1 on any failure)"
  exit 0
fi
summary
exit "$failed"
