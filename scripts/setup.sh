#!/usr/bin/env bash
# Sets up the project-local virtual environment (.venv): the pinned torch / FBGEMM / TorchRec
# stack, then tzrec-run itself in editable mode with its test extras. Idempotent: a second run
# with unchanged requirement files installs nothing.
#   TZRUN_STACK=cpu|cuda   which requirements/<stack>.txt to install (default cpu)
#   TZRUN_VENV=DIR         where the environment lives (default .venv)
#   TZRUN_SETUP_UV=0       install tzrec-run's own dependencies with pip instead of uv
# torch, FBGEMM and TorchRec come through pip (its configuration may point at a local torch
# wheel or a mirror); the rest (tzrec-run, its test tools and the contrib distributions, about a
# hundred packages) through uv, installed by pip first, which fetches and installs them in a
# fraction of pip's time; where uv fails (say, it cannot reach PyPI but pip's mirror can), pip
# installs them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
stack="${TZRUN_STACK:-cpu}"
venv="${TZRUN_VENV:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  "$python" -m venv "$venv"
fi
stamp="$venv/.tzrun-setup"
shopt -s nullglob
inputs=(requirements/*.txt pyproject.toml contrib_*/pyproject.toml plugins/tzrun_tools/torchrec_wheel.py)
# (the bytecode step below is part of what a stamp vouches for: an older stamp sets up again)
want="$stack bytecode $(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $venv is up to date"
  exit 0
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
case "$stack" in
  cpu) torch_index=https://download.pytorch.org/whl/cpu ;;
  cuda) torch_index=https://download.pytorch.org/whl/cu128 ;;
  *) echo "setup: TZRUN_STACK must be cpu or cuda, not '$stack'" >&2; exit 2 ;;
esac
echo "setup: installing the $stack stack (torch, fbgemm, torchrec)"
# torch alone (--no-deps) from PyTorch's index for the stack; the CPU build first from the
# configured indexes, when they hold it (a local wheel cache or mirror: no retries of an
# unreachable PyTorch index)
torch_req="$(grep -m1 '^torch==' "requirements/$stack.txt")"
if ! { [ "$stack" = cpu ] && "${pip[@]}" --no-deps -c requirements/constraints.txt "$torch_req" 2>/dev/null; }; then
  if ! "${pip[@]}" --no-deps --extra-index-url "$torch_index" -c requirements/constraints.txt "$torch_req"; then
    # one line with the next step and EXIT_INSTALL (68), as tzrec-run install-stack says it
    echo "setup: cannot install $torch_req from $torch_index (pip's message is above): PyTorch publishes it for" \
      "CPython 3.10 to 3.14 on Linux; let this machine reach that index or give pip a mirror that holds it" \
      "(PIP_EXTRA_INDEX_URL or PIP_FIND_LINKS), or use another Python (PYTHON=python3.11), then run it again" >&2
    exit 68
  fi
fi
"${pip[@]}" -c requirements/constraints.txt -r "requirements/$stack.txt" "$(grep -m1 '^uv==' requirements/constraints.txt)"
# TorchRec with its FBGEMM and torchmetrics requirements corrected, so that pip check passes (a
# script of the standard library: tzrec-run itself is not installed yet)
"$venv/bin/python" plugins/tzrun_tools/torchrec_wheel.py --stack "$stack" -- -c requirements/constraints.txt
echo "setup: installing tzrec-run (editable) and its test tools"
contribs=()
for contrib in contrib_*/; do
  if [ -f "$contrib/pyproject.toml" ]; then
    contribs+=(-e "$contrib[test]")
  fi
done
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI
# images often set it) no import writes one either, so every process compiled pandas, SciPy,
# pyarrow and the rest from source again: about 4.5 s of CPU in each tzrec-run process that
# reports a metric (a train, evaluate or predict), more than its own work in a small run. With
# it, uv compiles the whole environment (what pip installed compiles at install already).
uv=("$venv/bin/uv" pip install --python "$venv/bin/python" -q --compile-bytecode -c requirements/constraints.txt)
if [ "${TZRUN_SETUP_UV:-1}" != 0 ] && "${uv[@]}" -e ".[test]" && \
   { [ ${#contribs[@]} = 0 ] || "${uv[@]}" --config-settings editable_mode=compat "${contribs[@]}"; }; then
  :
else
  [ "${TZRUN_SETUP_UV:-1}" = 0 ] || echo "setup: uv could not install them (above); pip installs them instead"
  "${pip[@]}" -c requirements/constraints.txt -e ".[test]"
  if [ ${#contribs[@]} != 0 ]; then
    "${pip[@]}" -c requirements/constraints.txt --config-settings editable_mode=compat "${contribs[@]}"
  fi
fi
# the editable install imports tzrun through a finder hook that type checkers cannot follow; a
# path entry lets mypy see tzrun (and its py.typed) from plugins under development
"$venv/bin/python" -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "tzrec_run_typing.pth").write_text("\n".join(str(pathlib.Path(p).resolve()) for p in ("core", "plugins")) + "\n")'
"$venv/bin/python" -c "import torch, torchrec, fbgemm_gpu, tzrun; print('setup: torch', torch.__version__, '| torchrec', torchrec.__version__ if hasattr(torchrec, '__version__') else '?', '| tzrec-run', tzrun.__version__)"
echo "$want" > "$stamp"
