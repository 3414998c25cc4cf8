"""Asynchronous training (rollout.max_lag) and behavior log-probs from the rollout engine.

The rollouts of step t come from policy version max(0, t - K) (a fixed schedule), the importance
ratios then see real staleness, lagged groups enter the sampler's evidence at their own version,
an interrupted run resumes to exactly the uninterrupted run's metrics, and a rollout process that
dies ends the run with an error naming the resume command instead of hanging it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from _util import SMALL_RUN, metrics_rows, overrides_with, train_in_process, train_steps, without_timing

from rwcore.trainer import cli
from rwcore.trainer.async_rollout import RolloutProcessDied
from rwcore.trainer.config import load_config
from rwcore.trainer.rollout import run_episodes, score_behavior
from rwcore.trainer.trainer import Trainer

SMALL = overrides_with(
    SMALL_RUN,
    "rollout.tasks_per_step=3",
    "rewardweaver.diagnosis_tasks=3",
    "rewardweaver.diagnostic_tasks=3",
    "optim.lr=3e-3",  # large steps, so a one-version lag moves the ratios visibly
)


def run(folder: Path, *overrides: str) -> list[dict]:
    train_in_process(folder, [*SMALL, *overrides])
    return metrics_rows(folder, "train")


@pytest.mark.parametrize("lag", [1, 2])
def test_rollouts_come_from_the_scheduled_version_and_the_ratios_see_it(tmp_path, lag):
    threads = torch.get_num_threads()
    metrics = run(tmp_path / "run", "train.method=arise", "train.steps=5", f"rollout.max_lag={lag}")
    assert torch.get_num_threads() == threads  # cleanup gives the training process its threads back
    # step index k (row k + 1) trains on rollouts of version max(0, k - lag)
    assert [row["rollout/version_lag"] for row in metrics] == [min(k, lag) for k in range(5)]
    assert [row["evidence/late_groups"] for row in metrics] == [3 * (k >= 1) for k in range(5)]
    lagged = [row for row in metrics if row["rollout/version_lag"] > 0]
    assert any(abs(row["mean_ratio"] - 1.0) > 1e-3 for row in lagged)


def test_the_first_lagged_step_equals_the_synchronous_one(tmp_path):
    # step 0 of both runs samples from version 0 with the same seeds
    sync = run(tmp_path / "sync", "train.method=outcome_only", "train.steps=1")
    lagged = run(tmp_path / "lagged", "train.method=outcome_only", "train.steps=1", "rollout.max_lag=1")
    for name in ("loss", "reward_mean", "success_rate", "generated_tokens_mean", "mean_ratio"):
        assert lagged[0][name] == pytest.approx(sync[0][name], rel=1e-6, abs=1e-7), name


def test_synchronous_engine_logprobs_match_the_training_model(tmp_path):
    metrics = run(tmp_path / "run", "train.method=outcome_only", "train.steps=3")
    # behavior log-probs from HF generate's scores, current ones from the training model: the same numbers
    # up to kernel differences, so every ratio is 1 to float precision and nothing is filtered
    assert all(abs(row["mean_ratio"] - 1.0) < 1e-4 and row["kept_fraction"] == 1.0 for row in metrics)


@pytest.mark.parametrize("temperature,max_new_tokens,words", [(0.7, 1, "on"), (1.3, 3, "off")])
def test_engine_logprobs_are_the_log_softmax_the_token_was_sampled_from(tmp_path, temperature, max_new_tokens, words):
    trainer = Trainer(
        load_config(
            None,
            [
                *SMALL,
                "train.method=outcome_only",
                f"rollout.temperature={temperature}",
                f"rollout.max_new_tokens={max_new_tokens}",
                f"rollout.action_words={words}",
            ],
        ),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    tasks = [trainer.train_tasks[t] for t in trainer.method.sample(0)]
    rollouts = run_episodes(
        trainer.env,
        trainer.policy,
        [(task, 5 + i, "g") for i, task in enumerate(tasks)],
        trainer.env.system_prompt,
        temperature,
        max_new_tokens,
    )
    allowed = trainer.policy.allowed if words == "on" else torch.arange(len(trainer.policy.codec))
    checked = 0
    for rollout in rollouts:
        assert rollout.behavior_version == 0 and len(rollout.behavior_logprobs) == len(rollout.token_ids)
        for position, flag in enumerate(rollout.generated):
            if not flag:
                assert float(rollout.behavior_logprobs[position]) == 0.0
                continue
            with torch.no_grad():
                logits = trainer.policy.model(input_ids=torch.tensor([rollout.token_ids[:position]])).logits[0, -1]
            restricted = torch.log_softmax(logits.double()[allowed] / temperature, -1)  # what was sampled from
            index = allowed.tolist().index(rollout.token_ids[position])
            assert float(rollout.behavior_logprobs[position]) == pytest.approx(float(restricted[index]), abs=1e-5)
            checked += 1
    assert checked >= len(rollouts) * (2 if max_new_tokens > 1 else 1)
    trainer.cleanup()


def test_trainer_scored_behavior_logprobs_keep_every_synchronous_ratio_at_one(tmp_path):
    metrics = run(tmp_path / "run", "train.method=outcome_only", "train.steps=2", "rollout.behavior_logprobs=trainer")
    assert all(row["mean_ratio"] == pytest.approx(1.0, abs=1e-6) for row in metrics)


class _Killed(Exception):
    pass


def test_an_interrupted_lagged_run_resumes_to_the_uninterrupted_metrics(tmp_path, monkeypatch):
    overrides = ["train.method=combined", "train.steps=6", "rollout.max_lag=1"]
    straight = run(tmp_path / "straight", *overrides)
    report = Trainer._report_progress

    def killed_after_step_five(self, progress, row):
        report(self, progress, row)
        if self.step == 5:  # logged, but its checkpoint (due at 6) never happens
            raise _Killed

    monkeypatch.setattr(Trainer, "_report_progress", killed_after_step_five)
    cut = Trainer(load_config(None, [*SMALL, *overrides]), tmp_path / "cut", quiet=True)
    cut.setup()
    with pytest.raises(_Killed):
        cut.train()
    cut.cleanup()
    monkeypatch.setattr(Trainer, "_report_progress", report)
    resumed = Trainer.resume(tmp_path / "cut", quiet=True)
    resumed.setup()
    # the checkpoint at step 4 holds the rollouts of step index 4, requested from version 3
    assert resumed.step == 4 and resumed.rollouts_ahead.pending() == [4]
    resumed.train()
    resumed.cleanup()
    assert without_timing(metrics_rows(tmp_path / "cut", "train")) == without_timing(straight)
    assert without_timing(metrics_rows(tmp_path / "cut", "eval")) == without_timing(
        metrics_rows(tmp_path / "straight", "eval")
    )


def test_a_dead_rollout_process_ends_the_run_with_the_resume_command(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    original = Trainer.train_step

    def kill_after_two(self):
        if self.step == 2:
            os.kill(self.rollouts_ahead._process.pid, signal.SIGKILL)
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", kill_after_two)
    code = cli.main(["train", "--out", str(out), "--quiet", *SMALL, "train.steps=6", "rollout.max_lag=1"])
    assert code != 0
    err = capsys.readouterr().err
    assert "rollout process" in err and "died" in err and f"rw train --resume {out}" in err
    assert (out / "checkpoints" / "latest").read_text() == "step_000002"  # the run resumes from there
    monkeypatch.setattr(Trainer, "train_step", original)
    assert cli.main(["train", "--resume", str(out), "--quiet"]) == 0
    assert train_steps(out) == [1, 2, 3, 4, 5, 6]


def test_a_failing_rollout_process_reports_its_traceback(tmp_path):
    trainer = Trainer(load_config(None, [*SMALL, "train.steps=2", "rollout.max_lag=1"]), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.rollouts_ahead.submit(0, ["no-such-task"], [("not a task", 1, "g")], "prompt", 1)
    with pytest.raises(RolloutProcessDied, match=r"(?s)failed:.*Traceback.*has no attribute .data."):
        trainer.rollouts_ahead.take(0)
    trainer.cleanup()


def test_lag_settings_that_cannot_work_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="rollout.max_lag.*rollout.behavior_logprobs.*engine"):
        load_config(None, ["rollout.max_lag=1", "rollout.behavior_logprobs=trainer"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    trainer = Trainer(
        load_config(None, [*SMALL, "rollout.max_lag=1", "train.engine=deepspeed"]), tmp_path / "run", quiet=True
    )
    with pytest.raises(ValueError, match=r"rollout.max_lag=1.*2 data-parallel processes"):
        trainer.setup()
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="rollout.max_lag"):
        load_config(None, ["rollout.max_lag=-1"])


def test_trainer_scoring_without_full_logits_equals_the_engine_logprobs(tmp_path):
    # rollout.behavior_logprobs=trainer: hidden states -> chunked fused-linear log-probs over the action words
    trainer = Trainer(
        load_config(None, [*SMALL, "train.method=outcome_only", "rollout.temperature=1.3"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    tasks = [trainer.train_tasks[t] for t in trainer.method.sample(0)]
    rollouts = run_episodes(
        trainer.env,
        trainer.policy,
        [(task, 11 + i, "g") for i, task in enumerate(tasks)],
        trainer.env.system_prompt,
        1.3,
        1,
    )
    engine = [r.behavior_logprobs.clone() for r in rollouts]
    score_behavior(trainer.policy, rollouts, 1.3, "torch")
    for rollout, expected in zip(rollouts, engine):
        assert rollout.behavior_logprobs.shape == expected.shape
        assert torch.allclose(rollout.behavior_logprobs, expected, atol=1e-5)
        assert (rollout.behavior_logprobs[torch.tensor(rollout.generated)] < 0).all()
    trainer.cleanup()


def test_the_rollout_process_dies_with_a_trainer_killed_with_minus_nine(tmp_path):
    """daemon=True covers a trainer that exits; after a kill -9 the kernel's parent-death signal must end the
    rollout process too. An idle one waits on its request queue, whose writing end it holds itself, so
    without the signal it lived on as an orphan, holding its memory, for good."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import os, sys, time, torch\n"
        "from rwcore.trainer.async_rollout import RolloutProcess\n"
        "from rwcore.trainer.config import load_config\n"
        "from rwcore.trainer.envs import make\n"
        "from rwcore.trainer.policy import build_policy\n"
        f"config = load_config(None, {[*SMALL, 'rollout.max_lag=1', 'train.method=outcome_only']!r})\n"
        "env = make(config.env.name, **dict(config.env.options))\n"
        "policy = build_policy(config, env, torch.device('cpu'))\n"
        "worker = RolloutProcess(config, 1, policy.model.state_dict(), 0)\n"  # returns once the worker is ready
        "print(worker._process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    trainer = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        worker = int(trainer.stdout.readline())
        time.sleep(1)  # the worker is idle, waiting for a request
        assert _alive(worker)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    alive = _alive(worker)
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert not alive, "the rollout process outlived its trainer"


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent (now init) has to reap it
