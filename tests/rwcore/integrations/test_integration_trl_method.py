"""TRL's GRPOTrainer driven by rwcore.AdaptiveMethod (rwcore.integrations.trl.method), on the CPU.

Shown here: the rewards TRL logs and the advantages its loss receives are the method's own on the same
trajectories. The run is examples/trl_adaptive_method.py; the reference is a FRESH AdaptiveMethod (same
variant, settings and providers) replayed step by step on the trajectories the run produced: sample,
judge (`judge_groups` on its own `rubrics_to_judge`), score, observe, adapt -- the method's documented
loop, with no TRL in it.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from _util import ROOT

from rwcore.integrations.trl import AdaptiveGRPOTrainer
from rwcore.method import judge_groups

EXAMPLE = ROOT / "examples" / "trl_adaptive_method.py"
_spec = importlib.util.spec_from_file_location("trl_adaptive_method", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


class AdvantageProbe(AdaptiveGRPOTrainer):
    """Records the advantages of every batch TRL's Trainer hands the loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.__dict__.setdefault("loss_advantages", []).append(inputs["advantages"].detach().cpu().clone())
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return example.main(str(tmp_path_factory.mktemp("trl-method")), steps=3, trainer_class=AdvantageProbe)


def test_trl_rewards_and_advantages_are_the_methods_own(run):
    reference = example.make_method(example.make_rows())
    judge = example.make_judge()
    logged = [row["rewards/rwcore_method/mean"] for row in run.state.log_history if "rewards/rwcore_method/mean" in row]
    assert [record["step"] for record in run.rw_scored] == [0, 1, 2]
    assert len(logged) == len(run.loss_advantages) == 3
    g = reference.settings.group_size
    rubric_term_seen = False
    for record, trl_reward, loss_advantages in zip(run.rw_scored, logged, run.loss_advantages):
        step, trajectories = record["step"], record["trajectories"]
        task_ids = reference.sample(step)
        assert task_ids == record["task_ids"]
        assert [t.task_id for t in trajectories] == [t for t in task_ids for _ in range(g)]  # TRL's group order
        reports = judge_groups(judge, trajectories, reference.rubrics_to_judge(step, task_ids), g)
        scored = reference.score(trajectories, reports)
        # rewards: what TRL logged for its reward function is the mean of the method's rewards
        assert trl_reward == pytest.approx(float(np.mean(scored.rewards)), abs=1e-6)
        np.testing.assert_allclose(record["scored"].rewards, scored.rewards, rtol=0, atol=0)
        # advantages: the tensor TRL's loss received (TRL may shuffle rows within the batch)
        expected = torch.tensor(scored.advantages, dtype=loss_advantages.dtype)
        torch.testing.assert_close(record["advantages_used"], expected, rtol=0, atol=0)
        torch.testing.assert_close(
            torch.sort(loss_advantages.flatten()).values, torch.sort(expected).values, rtol=0, atol=0
        )
        rubric_term_seen |= bool(scored.advantage_rubrics) and not np.allclose(
            scored.advantages, reference.score(trajectories, [type(r)(r.trajectory_id, {}) for r in reports]).advantages
        )
        reference.observe(step, task_ids, trajectories, scored.judged)
        reference.adapt(step)
    assert rubric_term_seen  # the pool's rubric term really entered TRL's advantages
    assert reference.state_dict()["sampler"] == run.rw_method.state_dict()["sampler"]


def test_the_pool_and_skills_reach_trls_prompts(run):
    assert {row["rubric_id"] for row in run.rw_method.pool_rubrics()} == {"short", "says-refund"}
    first, later = run.rw_scored[0]["trajectories"][0], run.rw_scored[-1]["trajectories"][0]
    system = [turn.content for turn in later.turns if turn.role == "system"]
    assert system and system[0].startswith("you are a support agent")
    skills = ("answer in four words or fewer", "name the refund in a refund task")
    assert any(skill in system[0] for skill in skills)  # the pool's skills, after the first pool update
    assert [turn.content for turn in first.turns if turn.role == "system"] == ["you are a support agent"]


def test_refuses_a_setup_the_method_cannot_drive(tmp_path):
    from datasets import Dataset

    rows = example.make_rows()
    model = example.make_tiny_model(str(tmp_path / "m"))
    common = dict(judge=example.make_judge(), train_dataset=Dataset.from_list(rows))
    with pytest.raises(ValueError, match="generation_batch_size"):
        AdaptiveGRPOTrainer(
            model,
            method=example.make_method(rows),
            args=example.grpo_args(str(tmp_path), 1, generation_batch_size=8, per_device_train_batch_size=8),
            **common,
        )
    with pytest.raises(ValueError, match="reward_funcs"):
        AdaptiveGRPOTrainer(
            model,
            method=example.make_method(rows),
            args=example.grpo_args(str(tmp_path), 1),
            reward_funcs=[lambda **_: [0.0]],
            **common,
        )
    from rwcore.method import AdaptiveMethod, MethodSettings, Providers

    class NoProposals:
        def propose_capabilities(self, failures, library, max_new):
            return []

    staged = AdaptiveMethod(
        "rw_open_vocabulary",
        {r["task_id"]: r["tags"] for r in rows},
        MethodSettings(batch_size=2, group_size=2),
        Providers(proposer=NoProposals()),
    )
    assert staged.variant.has_stages
    with pytest.raises(ValueError, match="diagnose="):
        AdaptiveGRPOTrainer(model, method=staged, args=example.grpo_args(str(tmp_path), 1), **common)


def test_trls_scale_rewards_and_aggregation_keys_set_the_methods(tmp_path):
    """GRPOConfig.scale_rewards (False = "none", as TRL maps it) reaches the method: the advantages TRL's loss
    receives are a fresh method's own with scale_rewards="none" (centred, not divided by the group std)."""
    from datasets import Dataset

    rows = example.make_rows()
    model = example.make_tiny_model(str(tmp_path / "m"))
    method = example.make_method(rows)
    trainer = AdvantageProbe(
        model,
        method=method,
        judge=example.make_judge(),
        outcome_fn=example.outcome,
        base_system_prompt="you are a support agent",
        args=example.grpo_args(str(tmp_path), 2, scale_rewards=False),
        train_dataset=Dataset.from_list(rows),
    )
    assert method.settings.scale_rewards == "none" and method.settings.aggregation == "sum_then_normalize"
    trainer.train()
    assert len(trainer.rw_scored) == 2 and any(np.any(r["scored"].advantages != 0) for r in trainer.rw_scored)
    reference = example.make_method(rows)
    reference.set_credit_settings(scale_rewards="none")
    judge, g = example.make_judge(), reference.settings.group_size
    for record, loss_advantages in zip(trainer.rw_scored, trainer.loss_advantages):
        step, trajectories = record["step"], record["trajectories"]
        task_ids = reference.sample(step)
        reports = judge_groups(judge, trajectories, reference.rubrics_to_judge(step, task_ids), g)
        scored = reference.score(trajectories, reports)
        expected = torch.tensor(scored.advantages, dtype=loss_advantages.dtype)
        torch.testing.assert_close(record["advantages_used"], expected, rtol=0, atol=0)
        torch.testing.assert_close(
            torch.sort(loss_advantages.flatten()).values, torch.sort(expected).values, rtol=0, atol=0
        )
        # centred only: each group's advantages are its rewards minus the group mean
        rewards = np.asarray(scored.rewards).reshape(-1, g)
        if not scored.advantage_rubrics:
            np.testing.assert_allclose(scored.advantages.reshape(-1, g), rewards - rewards.mean(1, keepdims=True))
        reference.observe(step, task_ids, trajectories, scored.judged)
        reference.adapt(step)


def test_trls_keys_that_the_method_cannot_apply_or_that_disagree_are_refused(tmp_path):
    from datasets import Dataset

    rows = example.make_rows()
    model = example.make_tiny_model(str(tmp_path / "m"))
    common = dict(judge=example.make_judge(), train_dataset=Dataset.from_list(rows))
    with pytest.raises(
        ValueError, match="GRPOConfig.multi_objective_aggregation='normalize_then_sum'.*advantage.aggregation"
    ):
        AdaptiveGRPOTrainer(  # arise has no RewardWeaver process reward to normalize separately
            model,
            method=example.make_method(rows),
            args=example.grpo_args(str(tmp_path), 1, multi_objective_aggregation="normalize_then_sum"),
            **common,
        )
    batch = example.make_method(rows)
    batch.set_credit_settings(scale_rewards="batch")
    with pytest.raises(
        ValueError, match="GRPOConfig.scale_rewards='group' and the method's MethodSettings.scale_rewards='batch'"
    ):
        AdaptiveGRPOTrainer(model, method=batch, args=example.grpo_args(str(tmp_path), 1), **common)
    AdaptiveGRPOTrainer(model, method=batch, args=example.grpo_args(str(tmp_path), 1, scale_rewards="batch"), **common)
    assert batch.settings.scale_rewards == "batch"
