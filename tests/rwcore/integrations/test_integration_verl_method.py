"""verl's estimator + loader sampler driven by rwcore.AdaptiveMethod (rwcore.integrations.verl.method),
through verl 0.9.1's real compute_advantage paths (legacy with the forwarder, V1's
compute_advantage_for_multi_trajectories with the trainer's scope) and torchdata's StatefulDataLoader;
on verl 0.8.0 (tests/rwcore/integrations/test_integration_versions.py) through its legacy compute_advantage only.

The reference is a FRESH AdaptiveMethod (same variant, settings, providers) replayed on the same raw
responses with the method's own loop: sample, score, observe, adapt.
"""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest
import torch
import verl.trainer.ppo.ray_trainer as ray_trainer
from _util import ROOT
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto

import rwcore.integrations.verl as rv
from rwcore.integrations.verl.advantage import verdicts_in_scope
from rwcore.integrations.verl.method import METHOD_ESTIMATOR_NAME, AdaptiveMethodDriver
from rwcore.types import JudgeReport, RubricJudgment, Trajectory
from rwcore.verdict import Verdict

# verl 0.8.0 (run by tests/rwcore/integrations/test_integration_versions.py) has only the legacy compute_advantage
HAS_V1 = importlib.util.find_spec("verl.trainer.ppo.v1") is not None
if HAS_V1:
    import verl.trainer.ppo.v1.utils as v1_utils

EXAMPLE = ROOT / "examples" / "trl_adaptive_method.py"
_spec = importlib.util.spec_from_file_location("trl_adaptive_method", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)  # make_rows / make_method (arise + scripted reflector): no TRL at import

ROWS = [{"rwcore_task_id": row["task_id"], "rwcore_tags": row["tags"]} for row in example.make_rows()]
G, T = 2, 5


def _verdict(task_id, step, k, rubric_id):
    """A reward function's deterministic verdict for response k of task_id at step."""
    u = np.random.default_rng([int(task_id[1:]), step, k, len(rubric_id)]).random()
    return None if u < 0.15 else bool(u < 0.6)


def _responses(task_ids, step, rubrics):
    """What verl's batch holds after the reward step: G rows per task, reordered (balance_batch)."""
    rng = np.random.default_rng(step)
    rows = []
    for j, task_id in enumerate(task_ids):
        for k in range(G):
            length = int(rng.integers(1, T + 1))
            rows.append(
                dict(
                    uid=f"uid-{step}-{j}",
                    task_id=task_id,
                    length=length,
                    outcome=float(rng.random() < 0.5),
                    verdicts={spec.rubric_id: _verdict(task_id, step, k, spec.rubric_id) for spec in rubrics[j]},
                )
            )
    return [rows[i] for i in rng.permutation(len(rows))]


def _data(rows, only_uid=False):
    n = len(rows)
    mask = torch.zeros(n, T, dtype=torch.long)
    rewards = torch.zeros(n, T)
    for i, row in enumerate(rows):
        mask[i, : row["length"]] = 1
        rewards[i, row["length"] - 1] = row["outcome"]  # verl puts the score on the last response token
    non_tensor = {"uid": np.array([r["uid"] for r in rows], dtype=object)}
    extra = {
        "rwcore_task_id": np.array([r["task_id"] for r in rows], dtype=object),
        "rwcore_verdicts": np.array([r["verdicts"] for r in rows], dtype=object),
    }
    if not only_uid:
        non_tensor.update(extra)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors=non_tensor
    ), extra


def _reference_advantages(method, step, rows):
    """The method's own advantages for these responses, in the rows' order (groups by uid, first appearance)."""
    groups: dict = {}
    for i, row in enumerate(rows):
        groups.setdefault(row["uid"], []).append(i)
    order = [i for members in groups.values() for i in members]
    trajectories = [
        Trajectory(
            task_id=rows[i]["task_id"],
            turns=[],
            outcome=rows[i]["outcome"],
            generated_length=rows[i]["length"],
            trajectory_id=f"r{i}",
        )
        for i in order
    ]
    verdict = {True: Verdict.PASS, False: Verdict.FAIL, None: Verdict.NA}
    reports = [
        JudgeReport(f"r{i}", {rid: RubricJudgment(rid, verdict[v]) for rid, v in rows[i]["verdicts"].items()})
        for i in order
    ]
    scored = method.score(trajectories, reports)
    method.observe(step, [rows[members[0]]["task_id"] for members in groups.values()], trajectories, scored.judged)
    method.adapt(step)
    out = np.empty(len(rows))
    out[order] = scored.advantages
    return out, scored


def _loader(driver):
    return StatefulDataLoader(
        list(range(len(ROWS))),
        batch_size=driver.method.settings.batch_size,
        sampler=driver.sampler(ROWS),
        num_workers=0,
        drop_last=True,
        collate_fn=list,
    )


def test_verl_driven_by_adaptive_method_equals_the_methods_own():
    driver = AdaptiveMethodDriver(example.make_method(example.make_rows()), keep_steps=2)
    driver.register()
    rv.install_advantage_forwarding()
    reference = example.make_method(example.make_rows())
    config = OmegaConf.create({"adv_estimator": METHOD_ESTIMATOR_NAME})
    it = iter(_loader(driver))
    rubric_term_seen = False
    for step in range(3):  # one pass: 6 tasks, 2 per batch
        task_ids = [ROWS[i]["rwcore_task_id"] for i in next(it)]
        assert task_ids == reference.sample(step)  # the loader's batch is the method's draw
        rows = _responses(task_ids, step, driver.rubrics_to_judge(task_ids))
        if step % 2 == 0 or not HAS_V1:  # the legacy trainer's compute_advantage (forwarder installed)
            data, _ = _data(rows)
            data = ray_trainer.compute_advantage(data, METHOD_ESTIMATOR_NAME, num_repeat=G, config=config)
        else:  # the V1 trainer's: only uid in the batch, the rest fetched into the scope by rwcore_sync
            data, extra = _data(rows, only_uid=True)
            keys = [f"{r['uid']}_0_{i}" for i, r in enumerate(rows)]
            with verdicts_in_scope(extra):
                data = v1_utils.compute_advantage_for_multi_trajectories(
                    data, keys, METHOD_ESTIMATOR_NAME, num_repeat=G, config=config
                )
        expected, scored = _reference_advantages(reference, step, rows)
        mask = data.batch["response_mask"].float()
        torch.testing.assert_close(
            data.batch["advantages"], torch.tensor(expected, dtype=torch.float32).unsqueeze(-1) * mask, rtol=0, atol=0
        )
        rubric_term_seen |= bool(scored.advantage_rubrics)
        if step % 2 == 1 and HAS_V1:  # the V1 trainer ends the step in on_step_end; the legacy one at the next draw
            driver.end_step()
    driver.end_step()  # the last step's end (on_step_end)
    assert rubric_term_seen  # the pool (proposed after step 0) entered the advantages
    assert [record["step"] for record in driver.scored] == [1, 2]  # only the last keep_steps=2 steps are held
    assert {r["rubric_id"] for r in driver.method.pool_rubrics()} == {"short", "says-refund"}
    assert driver.method.state_dict()["sampler"] == reference.state_dict()["sampler"]


def test_the_method_is_checkpointed_with_verls_loader_state():
    driver = AdaptiveMethodDriver(example.make_method(example.make_rows()))
    driver.register()
    loader = _loader(driver)
    it = iter(loader)
    for step in range(2):
        task_ids = [ROWS[i]["rwcore_task_id"] for i in next(it)]
        rows = _responses(task_ids, step, driver.rubrics_to_judge(task_ids))
        data, _ = _data(rows)
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn

        get_adv_estimator_fn(METHOD_ESTIMATOR_NAME)(
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            non_tensor_batch=data.non_tensor_batch,
        )
    saved = pickle.loads(pickle.dumps(loader.state_dict()))  # verl: torch.save(train_dataloader.state_dict())
    following = [ROWS[i]["rwcore_task_id"] for i in next(it)]

    resumed = AdaptiveMethodDriver(example.make_method(example.make_rows()))  # a new process: fresh method
    resumed.register()
    loader_b = _loader(resumed)
    loader_b.load_state_dict(saved)
    it_b = iter(loader_b)  # torchdata restores the sampler's state here
    assert resumed.step == 2
    assert [ROWS[i]["rwcore_task_id"] for i in next(it_b)] == following
    assert {r["rubric_id"] for r in resumed.method.pool_rubrics()} == {"short", "says-refund"}


def test_bad_batches_and_setups_are_refused():
    driver = AdaptiveMethodDriver(example.make_method(example.make_rows()))
    driver.register()
    rows = _responses(["t0", "t1"], 0, driver.rubrics_to_judge(["t0", "t1"]))
    data, _ = _data(rows[:-1])  # a group with one response
    with pytest.raises(ValueError, match="group_size=2"):
        from rwcore.integrations.verl.method import compute_method_advantage

        compute_method_advantage(
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            non_tensor_batch=data.non_tensor_batch,
        )
    with pytest.raises(ValueError, match="rwcore_task_id"):
        compute_method_advantage(
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            non_tensor_batch={"uid": data.non_tensor_batch["uid"]},
        )
    with pytest.raises(ValueError, match="no dataset row"):
        driver.sampler(ROWS[:3])
    with pytest.raises(ValueError, match="keep_steps"):
        AdaptiveMethodDriver(example.make_method(example.make_rows()), keep_steps=0)


def test_norm_adv_by_std_in_grpo_false_reaches_the_method_before_any_state():
    """verl's algorithm.norm_adv_by_std_in_grpo=False is the method's scale_rewards="none": the driver built with
    verl's algorithm config sets it (before a checkpoint is loaded); verl's compute_advantage then gives a fresh
    method's own advantages with that setting. A driver built without it is refused at the estimator call."""
    algorithm = OmegaConf.create({"adv_estimator": METHOD_ESTIMATOR_NAME, "norm_adv_by_std_in_grpo": False})
    driver = AdaptiveMethodDriver(example.make_method(example.make_rows()), algorithm=algorithm)
    assert driver.method.settings.scale_rewards == "none"
    driver.register()
    rv.install_advantage_forwarding()
    reference = example.make_method(example.make_rows())
    reference.set_credit_settings(scale_rewards="none")
    it = iter(_loader(driver))
    for step in range(2):
        task_ids = [ROWS[i]["rwcore_task_id"] for i in next(it)]
        rows = _responses(task_ids, step, driver.rubrics_to_judge(task_ids))
        data, _ = _data(rows)
        data = ray_trainer.compute_advantage(data, METHOD_ESTIMATOR_NAME, num_repeat=G, config=algorithm)
        expected, scored = _reference_advantages(reference, step, rows)
        mask = data.batch["response_mask"].float()
        torch.testing.assert_close(
            data.batch["advantages"], torch.tensor(expected, dtype=torch.float32).unsqueeze(-1) * mask, rtol=0, atol=0
        )
        if not scored.advantage_rubrics:  # centred on the group mean, not divided by its std
            rewards = scored.rewards.reshape(-1, G)
            np.testing.assert_allclose(scored.advantages.reshape(-1, G), rewards - rewards.mean(1, keepdims=True))
    # a resumed driver, built the same way, loads the saved state (the settings match)
    resumed = AdaptiveMethodDriver(example.make_method(example.make_rows()), algorithm=algorithm)
    resumed.method.load_state_dict(driver.method.state_dict())
    # without algorithm=, verl's False is refused rather than ignored
    plain = AdaptiveMethodDriver(example.make_method(example.make_rows()))
    plain.register()
    data, _ = _data(_responses(["t0", "t1"], 0, plain.rubrics_to_judge(["t0", "t1"])))
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo=False.*algorithm=config.algorithm"):
        ray_trainer.compute_advantage(data, METHOD_ESTIMATOR_NAME, num_repeat=G, config=algorithm)
