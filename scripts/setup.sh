#!/usr/bin/env bash
# Creates .venv and installs rwcore into it (editable) with its test and bench
# extras. On a machine without an NVIDIA GPU, PyTorch's CPU build is installed
# first: a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
# Safe to run again; it only installs what is missing or changed.
#   RWCORE_VENV=path      where to create the environment (default: .venv)
#   RWCORE_TORCH=spec     torch requirement for CPU machines (default: torch==2.13.0+cpu)
#   RWCORE_EXTRAS=list    extras to install (default: test,bench)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${RWCORE_VENV:-.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] NVIDIA GPU found: installing PyTorch from the default index"
    "${pip[@]}" "torch>=2.4"
  else
    torch_spec="${RWCORE_TORCH:-torch==2.13.0+cpu}"
    echo "[setup] no GPU: installing the CPU build of PyTorch ($torch_spec)"
    if ! "${pip[@]}" "$torch_spec"; then
      echo "[setup] $torch_spec is not on the configured indexes; trying PyTorch's CPU wheel index"
      "${pip[@]}" "$torch_spec" --index-url "${RWCORE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
    fi
  fi
fi

echo "[setup] building and installing rwcore (C++ extension via CMake)"
"${pip[@]}" -e ".[${RWCORE_EXTRAS:-test,bench}]"
"$venv/bin/python" -c "import rwcore, rwcore._evidence; print('[setup] rwcore', rwcore.__version__, 'ready in $venv')"
