"""verl's advantage estimator and loader sampler driven by one `rwcore.AdaptiveMethod`.

    driver = AdaptiveMethodDriver(method)        # in the trainer process (the V1 task runner)
    driver.register()                            # estimator "rwcore_method" in verl's registry
    sampler = driver.sampler(train_dataset)      # the loader's sampler: method.sample(step) each batch

    algorithm.adv_estimator=rwcore_method

Per step k (one `compute_advantage` call), from the batch verl hands the estimator:

- groups: non_tensor_batch["uid"] (verl's rows may be reordered; groups are gathered, then scattered back);
- each response becomes a `Trajectory`: task id (non_tensor_batch[task_id_key]), outcome R_o = the sum of
  its token_level_rewards (what verl's reward function returned), generated_length = its response tokens,
  the response text when the batch carries it (non_tensor_batch[text_key]: reflection reads it);
- its judge report: the verdicts the reward function returned in its extra info
  (non_tensor_batch[verdicts_key], one {rubric id: verdict} per response, judged on
  `method.rubrics_to_judge(k, ...)`, which `rubrics_to_judge()` exposes for the reward workers);
- advantages = `method.score(trajectories, reports).advantages`, broadcast over the response mask (returns
  the same, as verl's GRPO), and `method.observe(k, ...)`: `MethodLoop.finish`, the step of every trainer;
  verl's `algorithm.norm_adv_by_std_in_grpo=False` is the method's scale_rewards="none" (pass
  `algorithm=config.algorithm` to the driver, which sets it before any checkpoint is loaded; an estimator
  call whose config says False for a method that divides by the std is refused);
- the end of the step (`MethodLoop.end_step`: the pool update, RewardWeaver's stage with `diagnose=`) runs
  *after* verl's actor update: on the V1 trainer ("rwcore_sync") in `on_step_end`, once the rollout
  replicas hold the updated weights; otherwise (the legacy trainer) when the loader draws the next batch.
  So a stage's diagnosis batch always comes from the updated policy, as in `rw train` and TRL. The pending
  end is part of the sampler's state, so a checkpoint written between the update and `on_step_end` resumes
  exactly.

The estimator needs the batch's non_tensor_batch: on the legacy trainer through `install_advantage_forwarding`
(which routes "rwcore_method" here), on the V1 trainer through `verdicts_in_scope` (trainer mode
"rwcore_sync" fetches the fields). The driver lives in verl's estimator registry (`register()`), nowhere
else. The sampler's `state_dict` is the method's, so verl's data.pt
checkpoint holds the whole method (pool, sampler evidence, RewardWeaver state).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

import numpy as np
import torch

from rwcore.validation import check_int

from .advantage import _SCOPED_NON_TENSOR
from .config import TAGS_KEY, TASK_ID_KEY, VERDICTS_KEY
from .verdicts import _parse_verdict

METHOD_ESTIMATOR_NAME = "rwcore_method"
TEXT_KEY = "rwcore_response"


class AdaptiveMethodDriver:
    """An `AdaptiveMethod` behind verl's estimator registry and data loader (see the module docstring)."""

    def __init__(
        self,
        method,
        *,
        diagnose: Callable | None = None,
        task_id_key: str = TASK_ID_KEY,
        verdicts_key: str = VERDICTS_KEY,
        text_key: str = TEXT_KEY,
        keep_steps: int = 16,
        algorithm=None,
    ) -> None:
        from rwcore.method.loop import MethodLoop

        # the method's one loop (rwcore.method.loop), shared with rw train and TRL; checks method / diagnose
        self.loop = MethodLoop(method, diagnose=diagnose)
        self.method = method
        if algorithm is not None:  # before any state is loaded, so a resumed method matches the saved one
            scale = _scale_rewards_of(algorithm, method)
            if scale != method.settings.scale_rewards:
                method.set_credit_settings(scale_rewards=scale)
        self.task_id_key, self.verdicts_key, self.text_key = task_id_key, verdicts_key, text_key
        self.step = 0
        # the last `keep_steps` steps (task ids, trajectories, reports, Scored), for inspection; bounded, since
        # each holds a whole batch's trajectories
        self.scored: deque[dict] = deque(maxlen=check_int(keep_steps, "keep_steps", low=1))

    # -- verl wiring -------------------------------------------------------------------------

    def register(self) -> None:
        """Registers `compute_method_advantage` as verl's estimator "rwcore_method", served by this driver."""
        from .config import _require

        core_algos = _require("verl.trainer.ppo.core_algos")
        estimator = MethodEstimator(self)
        if METHOD_ESTIMATOR_NAME not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(METHOD_ESTIMATOR_NAME)(estimator)
        else:  # another driver (or this one again) was registered before: this one serves from now on
            core_algos.ADV_ESTIMATOR_REGISTRY[METHOD_ESTIMATOR_NAME] = estimator
        self.loop.start()  # RewardWeaver's first stage, before training (a no-op once started)

    def plan(self) -> list:
        """The current step's task ids (a pending end of the previous step runs first)."""
        return self.loop.plan(self.step).task_ids

    def end_step(self) -> None:
        """After verl's actor update (and weight sync): the pool update and RewardWeaver's stage, when due."""
        self.loop.end_step()

    def sampler(self, dataset, task_id_key: str | None = None):
        """A stateful torch Sampler over `dataset`'s rows: each batch is the rows of `method.sample(step)`."""
        return AdaptiveMethodSampler(self, dataset, task_id_key or self.task_id_key)

    def rubrics_to_judge(self, task_ids) -> list:
        """The rubrics the reward function should judge each task's responses on at the current step."""
        return self.method.rubrics_to_judge(self.step, list(task_ids))

    # -- one step ------------------------------------------------------------------------------

    def advantages(
        self, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, non_tensor_batch: Mapping
    ) -> torch.Tensor:
        """The method's advantages [N, T] for verl's batch (float32, zero outside the mask); observes (the step
        ends after the actor update: `end_step`)."""
        from rwcore.types import JudgeReport, RubricJudgment, Trajectory, Turn

        g = self.method.settings.group_size
        n = token_level_rewards.shape[0]
        if index is None or len(index) != n:
            raise ValueError("rwcore_method needs verl's group ids (non_tensor_batch['uid']), one per response")
        for key in (self.task_id_key, self.verdicts_key):
            if key not in non_tensor_batch or len(non_tensor_batch[key]) != n:
                raise ValueError(
                    f"rwcore_method needs non_tensor_batch[{key!r}] with one entry per response "
                    f"(keys present: {sorted(map(str, non_tensor_batch))})"
                )
        members: dict = {}
        for row, uid in enumerate(list(index)):
            members.setdefault(uid, []).append(row)
        if any(len(rows) != g for rows in members.values()):
            raise ValueError(
                f"every uid group must hold group_size={g} responses; sizes "
                f"{sorted({len(r) for r in members.values()})}"
            )
        order = [row for rows in members.values() for row in rows]  # groups contiguous, as score() reads them
        scores = token_level_rewards.detach().sum(-1).double().cpu().numpy()
        lengths = (response_mask != 0).sum(-1).cpu().numpy()
        texts = non_tensor_batch.get(self.text_key)
        tags = non_tensor_batch.get(TAGS_KEY)
        trajectories, reports, task_ids = [], [], []
        for position, row in enumerate(order):
            task_id = non_tensor_batch[self.task_id_key][row]
            task_id = str(task_id.item() if isinstance(task_id, np.generic) else task_id)
            if position % g == 0:
                task_ids.append(task_id)
            trajectory_id = f"s{self.step}-{row}"
            turns = [Turn("assistant", str(texts[row]), generated=True)] if texts is not None else []
            trajectories.append(
                Trajectory(
                    task_id=task_id,
                    turns=turns,
                    outcome=float(scores[row]),
                    tags=tuple(tags[row]) if tags is not None else (),
                    group_id=f"s{self.step}-{order[position - position % g]}",
                    policy_version=self.step,
                    generated_length=int(lengths[row]),
                    trajectory_id=trajectory_id,
                )
            )
            verdicts = non_tensor_batch[self.verdicts_key][row] or {}
            judgments = {
                str(rid): RubricJudgment(str(rid), _parse_verdict(v, f"{self.verdicts_key}[{row}][{rid!r}]"))
                for rid, v in dict(verdicts).items()
            }
            reports.append(JudgeReport(trajectory_id, judgments))
        scored = self.loop.finish(self.step, task_ids, trajectories, reports).scored
        self.scored.append(
            {
                "step": self.step,
                "task_ids": task_ids,
                "trajectories": trajectories,
                "reports": reports,
                "scored": scored,
                "order": order,
            }
        )
        self.step += 1
        per_response = np.empty(n)
        per_response[order] = scored.advantages
        return (
            torch.as_tensor(per_response, dtype=torch.float32, device=response_mask.device).unsqueeze(-1)
            * response_mask
        )


class MethodEstimator:
    """What `AdaptiveMethodDriver.register()` puts in verl's estimator registry as "rwcore_method": an estimator
    with verl's signature, bound to its driver (`.driver`)."""

    def __init__(self, driver: AdaptiveMethodDriver) -> None:
        self.driver = driver
        self.__name__ = self.__qualname__ = "compute_method_advantage"

    def __call__(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index=None,
        config=None,
        non_tensor_batch: dict | None = None,
        **kwargs,
    ):
        return compute_method_advantage(
            token_level_rewards,
            response_mask,
            index,
            config,
            non_tensor_batch,
            driver=self.driver,
            norm_adv_by_std_in_grpo=kwargs.get("norm_adv_by_std_in_grpo", True),
        )


def registered_driver() -> AdaptiveMethodDriver | None:
    """The driver serving "rwcore_method" in verl's estimator registry (None when none is registered)."""
    from .config import _require

    estimator = _require("verl.trainer.ppo.core_algos").ADV_ESTIMATOR_REGISTRY.get(METHOD_ESTIMATOR_NAME)
    return getattr(estimator, "driver", None)


def compute_method_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index=None,
    config=None,
    non_tensor_batch: dict | None = None,
    *,
    driver: AdaptiveMethodDriver | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs,
):
    """verl advantage estimator "rwcore_method": `driver`'s advantages (and returns); default the registered one.
    verl's norm_adv_by_std_in_grpo (in `config`, verl's algorithm section, or the argument) False needs the method's
    scale_rewards="none" (`AdaptiveMethodDriver(method, algorithm=...)` sets it)."""
    driver = driver if driver is not None else registered_driver()
    if driver is None:
        raise ValueError(
            "rwcore_method has no AdaptiveMethodDriver: call AdaptiveMethodDriver(method).register() "
            "in the trainer process"
        )
    scoped = _SCOPED_NON_TENSOR.get()
    if non_tensor_batch is None or driver.verdicts_key not in non_tensor_batch:
        non_tensor_batch = {**(non_tensor_batch or {}), **(scoped or {})}
    if not non_tensor_batch:
        raise ValueError(
            "rwcore_method got no non_tensor_batch: on the V1 trainer set trainer.v1.trainer_mode="
            "rwcore_sync; on the legacy trainer call rwcore.integrations.verl.install_advantage_forwarding()"
        )
    flags = config if norm_adv_by_std_in_grpo else {"norm_adv_by_std_in_grpo": False}
    scale = _scale_rewards_of(flags, driver.method)
    if scale != driver.method.settings.scale_rewards:
        raise ValueError(
            f"algorithm.norm_adv_by_std_in_grpo=False asks for advantages not divided by the group std, but the "
            f"method's scale_rewards is {driver.method.settings.scale_rewards!r}: build the driver with "
            "AdaptiveMethodDriver(method, algorithm=config.algorithm) (or MethodSettings(scale_rewards='none'))"
        )
    advantages = driver.advantages(token_level_rewards, response_mask, index, non_tensor_batch)
    return advantages, advantages


def _scale_rewards_of(algorithm, method) -> str:
    """The method's scale_rewards under verl's `algorithm` config: norm_adv_by_std_in_grpo=False is "none"
    (ValueError when the method's own setting says otherwise and is not the default); True keeps the method's."""
    from rwcore.method.settings import MethodSettings

    from .config import _get

    mine = method.settings.scale_rewards
    if bool(_get(algorithm, "norm_adv_by_std_in_grpo", True)) or mine == "none":
        return mine
    if mine != MethodSettings().scale_rewards:
        raise ValueError(
            f"algorithm.norm_adv_by_std_in_grpo=False and the method's MethodSettings.scale_rewards={mine!r} "
            "disagree: False is scale_rewards='none'"
        )
    return "none"


class AdaptiveMethodSampler(torch.utils.data.Sampler):
    """verl loader sampler: batch k is the dataset rows of `method.sample(driver.step)`, drawn when the loader asks.

    `state_dict` / `load_state_dict` carry the whole method (torchdata's StatefulDataLoader saves them in
    verl's data.pt) and the driver's step.
    """

    def __init__(self, driver: AdaptiveMethodDriver, dataset, task_id_key: str) -> None:
        from .sampler import _dataset_tasks

        super().__init__()
        self.driver = driver
        ids, _ = _dataset_tasks(dataset, task_id_key, "rwcore_tags")
        self.rows: dict = {}
        for i, task_id in enumerate(ids):
            self.rows.setdefault(str(task_id), i)
        missing = [t for t in driver.method.task_ids if str(t) not in self.rows]
        if missing:
            raise ValueError(f"the method's tasks {missing[:5]} have no dataset row (column {task_id_key!r})")
        self.batch_size = driver.method.settings.batch_size
        self.num_batches = max(1, len(self.rows) // self.batch_size)

    def __iter__(self):
        for _ in range(self.num_batches):
            for task_id in self.driver.plan():
                yield self.rows[str(task_id)]

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    def state_dict(self) -> dict:
        return {
            "kind": "AdaptiveMethodSampler",
            "step": self.driver.step,
            "method": self.driver.method.state_dict(),
            "loop": self.driver.loop.state_dict(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("kind") != "AdaptiveMethodSampler":
            raise ValueError("state_dict is not an AdaptiveMethodSampler state")
        self.driver.method.load_state_dict(state["method"])
        self.driver.step = int(state["step"])
        if "loop" in state:  # written before the loop's state was saved: nothing pending, started
            self.driver.loop.load_state_dict(state["loop"])
        else:
            self.driver.loop.started, self.driver.loop.pending_end_step = True, None
