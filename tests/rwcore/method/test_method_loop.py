"""`rwcore.method.loop.MethodLoop`, the one loop behind `rw train`, TRL's `AdaptiveGRPOTrainer` and verl's
`AdaptiveMethodDriver`.

- The same trajectories and verdicts driven through the TRL adapter (a real GRPOTrainer run), the verl
  driver (verl's real compute_advantage and a StatefulDataLoader) and the loop in `rw train`'s order give
  identical rewards, advantages and method state.
- In verl, a RewardWeaver stage's diagnosis batch comes from the policy *after* the actor update and the
  weight sync (the V1 trainer's `on_step_end`, or the next draw of the loader), never from the policy
  that produced the step's batch.
- The loop's own contract: the end of a step is pending until `end_step`, survives a checkpoint, and
  runs before the next plan.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from _util import ROOT
from torchdata.stateful_dataloader import StatefulDataLoader

from rwcore.method import AdaptiveMethod, MethodSettings, Providers, judge_groups
from rwcore.method.loop import MethodLoop
from rwcore.types import JudgeReport, Trajectory, Turn
from rwcore.verdict import Verdict

EXAMPLE = ROOT / "examples" / "trl_adaptive_method.py"
_spec = importlib.util.spec_from_file_location("trl_adaptive_method", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

HAS_V1 = importlib.util.find_spec("verl.trainer.ppo.v1") is not None


# ---- the three adapters on the same trajectories -----------------------------------------------------


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    return example.main(str(tmp_path_factory.mktemp("loop-trl")), steps=3)


def _verl_rows(trajectories, reports, step):
    """verl's batch after the reward step for these trajectories: one row per response, groups by uid."""
    g = 2
    code = {Verdict.PASS: True, Verdict.FAIL: False, Verdict.NA: None}
    rows = []
    for i, (trajectory, report) in enumerate(zip(trajectories, reports)):
        rows.append(
            dict(
                uid=f"uid-{step}-{i // g}",
                task_id=trajectory.task_id,
                outcome=trajectory.outcome,
                length=max(1, min(5, trajectory.generated_length)),
                verdicts={rid: code[j.verdict] for rid, j in report.judgments.items()},
            )
        )
    return rows


def _verl_data(rows):
    from verl import DataProto

    n, width = len(rows), 5
    mask = torch.zeros(n, width, dtype=torch.long)
    rewards = torch.zeros(n, width)
    for i, row in enumerate(rows):
        mask[i, : row["length"]] = 1
        rewards[i, row["length"] - 1] = row["outcome"]
    non_tensor = {
        "uid": np.array([r["uid"] for r in rows], dtype=object),
        "rwcore_task_id": np.array([r["task_id"] for r in rows], dtype=object),
        "rwcore_verdicts": np.array([r["verdicts"] for r in rows], dtype=object),
    }
    return DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors=non_tensor)


def _without_window(state):
    """A method state without Arise's reflection window (it holds the trajectories' text and ids, which each
    trainer writes in its own form: TRL the whole chat, verl the response)."""
    return {key: value for key, value in state.items() if key != "window"}


def test_trl_verl_and_rw_train_order_give_identical_rewards_advantages_and_state(trl_run):
    import verl.trainer.ppo.ray_trainer as ray_trainer
    from omegaconf import OmegaConf

    import rwcore.integrations.verl as rv
    from rwcore.integrations.verl.method import METHOD_ESTIMATOR_NAME, AdaptiveMethodDriver

    rows = example.make_rows()
    loop = MethodLoop(example.make_method(rows), judge=example.make_judge())  # rw train's order
    loop.start()
    driver = AdaptiveMethodDriver(example.make_method(rows))
    driver.register()
    rv.install_advantage_forwarding()
    loader = iter(
        StatefulDataLoader(
            list(range(len(rows))),
            batch_size=2,
            collate_fn=list,
            num_workers=0,
            drop_last=True,
            sampler=driver.sampler([{"rwcore_task_id": r["task_id"], "rwcore_tags": r["tags"]} for r in rows]),
        )
    )
    config = OmegaConf.create({"adv_estimator": METHOD_ESTIMATOR_NAME})
    pool_seen = False
    for record in trl_run.rw_scored:
        step, trajectories, reports = record["step"], record["trajectories"], record["reports"]
        # rw train: plan -> roll out -> finish -> update -> end_step
        plan = loop.plan(step, "you are a support agent")
        assert plan.task_ids == record["task_ids"]
        result = loop.finish(step, plan.task_ids, trajectories)
        # verl: the loader's batch, verl's compute_advantage, then the end of the step after the update
        assert [rows[i]["task_id"] for i in next(loader)] == record["task_ids"]
        verl_rows = _verl_rows(trajectories, reports, step)
        data = ray_trainer.compute_advantage(_verl_data(verl_rows), METHOD_ESTIMATOR_NAME, num_repeat=2, config=config)
        verl_scored = driver.scored[-1]["scored"]

        np.testing.assert_array_equal(result.scored.rewards, record["scored"].rewards)
        np.testing.assert_array_equal(verl_scored.rewards, record["scored"].rewards)
        np.testing.assert_array_equal(result.scored.advantages, record["scored"].advantages)
        np.testing.assert_array_equal(verl_scored.advantages, record["scored"].advantages)
        torch.testing.assert_close(
            data.batch["advantages"][:, 0],
            torch.tensor(record["scored"].advantages, dtype=torch.float32),
            rtol=0,
            atol=0,
        )
        assert [r.judgments.keys() for r in result.reports] == [r.judgments.keys() for r in reports]
        pool_seen |= bool(record["scored"].advantage_rubrics)
        loop.end_step(step)
        driver.end_step()
    trl_state, loop_state, verl_state = (
        trl_run.rw_method.state_dict(),
        loop.method.state_dict(),
        driver.method.state_dict(),
    )
    assert pool_seen  # the pool's rubrics entered the advantages in all three
    assert loop_state == trl_state
    assert _without_window(verl_state) == _without_window(trl_state)
    assert loop.method.pool_rubrics() == trl_run.rw_method.pool_rubrics() == driver.method.pool_rubrics()


# ---- verl: the diagnosis rolls out the updated policy ---------------------------------------------------


class _Proposer:
    """Open-vocabulary dimensions: one fixed dimension per stage."""

    def propose_capabilities(self, failures, library, max_new):
        from rwcore.types import RubricSpec

        return [RubricSpec("short", "the reply has at most four words", capability="Efficiency")]


class _Policy:
    """What verl's pieces would hold: the actor's weights version and the version the rollout replicas serve."""

    def __init__(self) -> None:
        self.actor = 0  # incremented by the actor update
        self.served = 0  # what the rollout replicas generate with (set by the weight sync)
        self.diagnosed: list[int] = []

    def diagnose(self, task_ids, rubrics):
        self.diagnosed.append(self.served)
        trajectories = [
            Trajectory(
                task_id=t,
                turns=[Turn("assistant", "ok", generated=True)],
                outcome=0.0,
                trajectory_id=f"d{len(self.diagnosed)}-{t}-{k}",
            )
            for t in task_ids
            for k in range(2)
        ]
        return trajectories, [JudgeReport(t.trajectory_id, {}) for t in trajectories]


def _staged_driver(policy):
    from rwcore.integrations.verl.method import AdaptiveMethodDriver

    rows = example.make_rows()
    method = AdaptiveMethod(
        "rw_open_vocabulary",
        {r["task_id"]: r["tags"] for r in rows},
        MethodSettings(
            batch_size=2, group_size=2, adaptation_interval=1, diagnosis_tasks=2, diagnostic_tasks=0, success_sample=0
        ),
        Providers(proposer=_Proposer()),
    )
    driver = AdaptiveMethodDriver(method, diagnose=policy.diagnose)
    return rows, driver


def _verl_step(driver, rows, loader, step):
    import verl.trainer.ppo.ray_trainer as ray_trainer
    from omegaconf import OmegaConf

    from rwcore.integrations.verl.method import METHOD_ESTIMATOR_NAME

    task_ids = [rows[i]["task_id"] for i in next(loader)]
    batch = [
        dict(
            uid=f"u{step}-{j // 2}",
            task_id=task_ids[j // 2],
            outcome=float(j % 2),
            length=3,
            verdicts={"short": bool(j % 2)},
        )
        for j in range(2 * len(task_ids))
    ]
    ray_trainer.compute_advantage(
        _verl_data(batch),
        METHOD_ESTIMATOR_NAME,
        num_repeat=2,
        config=OmegaConf.create({"adv_estimator": METHOD_ESTIMATOR_NAME}),
    )
    return task_ids


def _loader(driver, rows):
    return iter(
        StatefulDataLoader(
            list(range(len(rows))),
            batch_size=2,
            collate_fn=list,
            num_workers=0,
            drop_last=True,
            sampler=driver.sampler([{"rwcore_task_id": r["task_id"], "rwcore_tags": r["tags"]} for r in rows]),
        )
    )


@pytest.mark.skipif(not HAS_V1, reason="verl's V1 trainer exists from verl 0.9 (tested there by this file)")
def test_verl_v1_diagnosis_rolls_out_the_updated_policy():
    from omegaconf import OmegaConf

    import rwcore.integrations.verl as rv
    from rwcore.integrations.verl.trainer_v1 import trainer_class

    policy = _Policy()
    rows, driver = _staged_driver(policy)
    driver.register()
    rv.install_advantage_forwarding()
    assert policy.diagnosed == [0]  # the first stage, before training, from the initial policy

    class WeightSync:  # verl's checkpoint manager: on_step_end pushes the actor's weights to the replicas
        def update_weights(self, global_steps):
            policy.served = policy.actor

    trainer = object.__new__(trainer_class())  # verl's real "rwcore_sync" class; only its on_step_end runs here
    trainer.config = OmegaConf.create({"algorithm": {"adv_estimator": "rwcore_method"}})
    trainer.checkpoint_manager, trainer.timing_raw, trainer.global_steps = WeightSync(), {}, 1
    loader = _loader(driver, rows)
    for step in range(3):
        _verl_step(driver, rows, loader, step)  # step(): rollout, reward, the estimator ...
        assert policy.diagnosed == [0] + list(range(1, step + 1))  # ... which diagnoses nothing itself
        policy.actor += 1  # ... then _update_actor
        trainer.on_step_end()  # the weight sync, then the method's end of step
        assert policy.diagnosed[-1] == step + 1 == policy.actor  # the updated policy, as served
    assert driver.method.reward_stages()[-1]["start_step"] == 3


def test_verl_legacy_diagnosis_waits_for_the_next_draw_and_a_checkpoint_keeps_it_pending():
    import rwcore.integrations.verl as rv

    policy = _Policy()
    rows, driver = _staged_driver(policy)
    driver.register()
    rv.install_advantage_forwarding()
    loader = _loader(driver, rows)
    _verl_step(driver, rows, loader, 0)
    assert policy.diagnosed == [0] and driver.loop.pending_end_step == 0
    state = driver.sampler(
        [{"rwcore_task_id": r["task_id"], "rwcore_tags": r["tags"]} for r in rows]
    ).state_dict()  # verl's data.pt, written between the update and the next step
    policy.actor = policy.served = 1  # the legacy trainer's update (its hybrid engine serves it)
    drawn = _verl_step(driver, rows, loader, 1)  # the next draw ends step 0 first: diagnosis of version 1
    assert policy.diagnosed == [0, 1]

    resumed_policy = _Policy()
    resumed_policy.actor = resumed_policy.served = 1
    _, resumed = _staged_driver(resumed_policy)
    resumed.sampler([{"rwcore_task_id": r["task_id"], "rwcore_tags": r["tags"]} for r in rows]).load_state_dict(state)
    assert resumed.loop.pending_end_step == 0
    assert resumed.plan() == drawn  # the pending end ran first, from the restored policy, then the same draw
    assert resumed_policy.diagnosed == [1]
    assert resumed.method.reward_stages() == driver.method.reward_stages()


# ---- the loop's contract --------------------------------------------------------------------------------


def _arise_loop():
    return MethodLoop(example.make_method(example.make_rows()), judge=example.make_judge())


def _trajectories(task_ids, step):
    return [
        Trajectory(
            task_id=t,
            turns=[Turn("assistant", "a refund now" if k else "no", generated=True)],
            outcome=float(k),
            tags=("refund",) if int(t[1:]) % 2 else ("search",),
            trajectory_id=f"s{step}-{t}-{k}",
        )
        for t in task_ids
        for k in range(2)
    ]


def test_the_end_of_a_step_is_pending_until_end_step_or_the_next_plan():
    loop, reference = _arise_loop(), example.make_method(example.make_rows())
    for step in range(3):
        plan = loop.plan(step)  # runs the previous step's pending end first
        assert plan.task_ids == reference.sample(step)
        trajectories = _trajectories(plan.task_ids, step)
        loop.finish(step, plan.task_ids, trajectories)
        assert loop.pending_end_step == step
        reports = judge_groups(example.make_judge(), trajectories, reference.rubrics_to_judge(step, plan.task_ids), 2)
        scored = reference.score(trajectories, reports)
        reference.observe(step, plan.task_ids, trajectories, scored.judged)
        reference.adapt(step)
    loop.end_step()
    assert loop.pending_end_step is None and loop.end_step() is None
    assert loop.method.state_dict() == reference.state_dict()


def test_bad_calls_are_refused_naming_what_is_wrong():
    loop = _arise_loop()
    plan = loop.plan(0)
    loop.finish(0, plan.task_ids, _trajectories(plan.task_ids, 0))
    with pytest.raises(ValueError, match="step 0 is the one pending"):
        loop.end_step(1)
    with pytest.raises(ValueError, match="finish needs reports, or a judge"):
        MethodLoop(example.make_method(example.make_rows())).finish(0, plan.task_ids, _trajectories(plan.task_ids, 0))
    with pytest.raises(ValueError, match="diagnose="):
        MethodLoop(
            AdaptiveMethod(
                "rw_open_vocabulary",
                {"t0": ["a"]},
                MethodSettings(batch_size=1, group_size=2),
                Providers(proposer=_Proposer()),
            )
        )
    with pytest.raises(ValueError, match="rwcore.AdaptiveMethod"):
        MethodLoop(object())
    with pytest.raises(ValueError, match="step"):
        loop.plan(-1)
    with pytest.raises(ValueError, match="rwcore.method_loop"):
        loop.load_state_dict({"pending_end_step": 3})


def test_the_loop_state_round_trips():
    loop = _arise_loop()
    plan = loop.plan(0)
    loop.finish(0, plan.task_ids, _trajectories(plan.task_ids, 0))
    other = _arise_loop()
    other.load_state_dict(loop.state_dict())
    assert other.pending_end_step == 0 and other.state_dict() == loop.state_dict()
