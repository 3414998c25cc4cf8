"""The negotiation environment's labelled cases: trajectories of the reference policies on tasks of their own,
each labelled for one rule by the independent annotator, for RewardWeaver's admission test of that rule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rwcore.trainer.envs.base import Environment, Task
from rwcore.trainer.envs.negotiation.annotator import annotate
from rwcore.trainer.envs.negotiation.reference_policies import _bad_policies
from rwcore.trainer.envs.negotiation.rubrics import RULES_BY_ID
from rwcore.trainer.envs.negotiation.tasks import KINDS, make_task_data
from rwcore.trainer.envs.negotiation.trajectories import run_episode
from rwcore.types import Trajectory
from rwcore.verdict import Verdict

__all__ = ["cases_for", "labelled_cases", "labelled_cases_by_rule"]


def _source_trajectories(env: Environment, source: int, tasks_per_kind: int) -> list[Trajectory]:
    rng = random.Random(f"negotiation-labelled-v2-{env.seed}-{source}")
    tasks = []
    if callable(getattr(env, "case_tasks", None)):  # the hard tier: multi-item tasks
        tasks = env.case_tasks(rng, tasks_per_kind, source)
    for kind in sorted(KINDS) if not tasks else ():
        for j in range(tasks_per_kind):
            tasks.append(Task(f"neg-case-{source}-{kind}-{j}", KINDS[kind], make_task_data(rng, kind)))
    out = []
    for name, policy in _bad_policies().items():
        for task in tasks:
            prng = random.Random(f"{task.task_id}-{name}")
            trajectory = run_episode(
                env,
                task,
                lambda obs, p=policy, r=prng: p(obs, r),
                seed=source,
                trajectory_id=f"{task.task_id}/{name}",
                group_id=name,
            )
            trajectory.metadata["policy"] = name
            out.append(trajectory)
    return out


def labelled_cases_by_rule(
    env: Environment,
    rule_ids: Sequence[str],
    *,
    num_sources: int = 10,
    per_label: int = 3,
    per_na: int = 1,
    tasks_per_kind: int = 4,
) -> dict[str, list]:
    """rule id -> LabelledCases for admitting that rule.

    Sources are "gen0".."gen<num_sources-1>": each draws its own tasks (every kind, `tasks_per_kind`
    each, not the train/eval tasks) and runs the scripted, random and deliberately bad policies
    on them; from each source up to `per_label` PASS, `per_label` FAIL and `per_na` NA cases are kept
    per rule. The label is the reference annotator's (`annotator.annotate`: the
    transcript and the scenario sheet, never the rule's own check or the episode's private
    state), so admission tests the rule against an independent reading. Any half of the sources
    then holds both labels and >= 10 applicable cases.
    """
    from rwcore.rewardweaver import LabelledCase

    unknown = [r for r in rule_ids if r not in RULES_BY_ID]
    if unknown:
        raise ValueError(f"rule_ids: unknown negotiation rule(s) {unknown}; known: {sorted(RULES_BY_ID)}")
    out: dict[str, list] = {r: [] for r in rule_ids}
    for source in range(num_sources):
        trajectories = _source_trajectories(env, source, tasks_per_kind)
        order = list(range(len(trajectories)))
        random.Random(f"negotiation-labelled-order-{env.seed}-{source}").shuffle(order)
        for rule_id in rule_ids:
            rule = RULES_BY_ID[rule_id]
            quota = {Verdict.PASS: per_label, Verdict.FAIL: per_label, Verdict.NA: per_na}
            for i in order:
                trajectory = trajectories[i]
                label = annotate(rule.rule_id, trajectory)
                if quota[label] <= 0:
                    continue
                quota[label] -= 1
                case_trajectory = Trajectory.from_dict(trajectory.to_dict())
                case_trajectory.trajectory_id = f"case/{rule_id}/gen{source}/{trajectory.trajectory_id}"
                case_trajectory.metadata["labelled_rule"] = rule_id
                out[rule_id].append(LabelledCase(case_trajectory, label, f"gen{source}"))
                if not any(quota.values()):
                    break
    return out


def labelled_cases(env: Environment, rule_ids: Sequence[str], **options) -> list:
    """All rules' cases in one list, rule by rule; each case's trajectory.metadata["labelled_rule"]
    names the rule its label is for (filter with `cases_for` before admitting a rule)."""
    by_rule = labelled_cases_by_rule(env, rule_ids, **options)
    return [case for rule_id in rule_ids for case in by_rule[rule_id]]


def cases_for(cases: Sequence, rule_id: str) -> list:
    """The cases of `labelled_cases` labelled for `rule_id`."""
    return [c for c in cases if c.trajectory.metadata.get("labelled_rule") == rule_id]
