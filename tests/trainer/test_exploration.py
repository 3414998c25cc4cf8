"""How much outcome signal a policy's rollouts give (rwcore.trainer.exploration): the step-0 exploration row of
`rw train`, the per-step group shares and `rw probe --pass-k`, on tiny runs of the hard tier."""

import json

import numpy as np
import pytest
import torch
from _util import metrics_rows

from rwcore.trainer import envs
from rwcore.trainer.cli import main
from rwcore.trainer.config import load_config
from rwcore.trainer.exploration import sample_groups
from rwcore.trainer.policy import build_policy
from rwcore.trainer.trainer import Trainer

SMALL = [
    "model.init=random",  # the loop, not the reading prior
    "env.options.difficulty=hard",
    "env.options.num_train=24",
    "env.options.num_eval=6",
    "rollout.tasks_per_step=4",
    "rollout.group_size=4",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.steps=2",
    "train.start_pass_k=3",
    "train.probe_at_eval=off",
]


def test_blocks_of_tasks_sample_what_the_whole_list_does():
    # what the trainer's processes do with offset = their first task: the same episodes as one process
    config = load_config(None, SMALL)
    env = envs.make("negotiation", **dict(config.env.options))
    policy = build_policy(config, env, torch.device("cpu"))
    tasks = env.tasks("eval")[:4]
    whole = sample_groups(env, policy, tasks, 3)
    first = sample_groups(env, policy, tasks[:2], 3)
    second = sample_groups(env, policy, tasks[2:], 3, offset=2)
    for i in range(2):  # outcomes, successes
        np.testing.assert_array_equal(whole[i], np.concatenate([first[i], second[i]]))
    state = torch.get_rng_state()
    sample_groups(env, policy, tasks[:1], 2)
    assert torch.equal(state, torch.get_rng_state())  # the global generator is left as it was
    with pytest.raises(ValueError, match="k must be"):
        sample_groups(env, policy, tasks, 0)


def test_the_run_logs_the_starting_policy_and_every_steps_group_shares(tmp_path):
    trainer = Trainer(load_config(None, [*SMALL, "train.method=outcome_only"]), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    rows = metrics_rows(tmp_path / "run")
    assert [(r["step"], r["kind"]) for r in rows[:2]] == [(0, "eval"), (0, "exploration")]
    explored = rows[1]
    assert {"exploration/pass@1", "exploration/pass@3", "exploration/zero_variance_groups"} <= set(explored)
    assert 0.0 <= explored["exploration/pass@1"] <= explored["exploration/pass@3"] <= 1.0
    tags = {tag for task in trainer.eval_tasks for tag in task.tags}
    assert {key.split("/")[-1] for key in explored if key.startswith("exploration/pass@3/")} == tags
    assert rows[0]["eval/ceiling"] == pytest.approx(trainer.env.ceiling())
    for row in (r for r in rows if r["kind"] == "train"):
        assert 0.0 <= row["groups/all_failed"] <= row["groups/zero_variance"] <= 1.0
        # outcome-only GRPO: every group with equal outcomes has zero advantages, and only those
        assert (row["advantage_std"] == 0.0) == (row["groups/zero_variance"] == 1.0)


def test_rw_probe_prints_pass_at_k_of_a_checkpoint(tmp_path, capsys):
    assert main(["train", "--quiet", "--out", str(tmp_path / "run"), *SMALL]) == 0
    capsys.readouterr()
    assert main(["probe", str(tmp_path / "run"), "--pass-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "pass@1" in out and "pass@2" in out and "zero-variance groups" in out
    assert main(["probe", str(tmp_path / "run"), "--pass-k", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 0.0 <= report["exploration"]["pass@2"] <= 1.0
    assert main(["probe", str(tmp_path / "run"), "--pass-k", "-1"]) == 2
    assert "--pass-k must be a non-negative integer" in capsys.readouterr().err
