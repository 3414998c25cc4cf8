"""How `rw train` builds an `rwcore.AdaptiveMethod` from its config and environment.

- `method_settings(cfg)`: the config's numbers as `MethodSettings`.
- `build_judge(cfg, env)`: the judge that scores training - the environment's rules
  (`judge.kind=rule`) or an OpenAI-compatible model (`judge.kind=openai`).
- `build_providers(cfg, env, judge)`: what the variant calls out to. With `judge.kind=openai` one
  `OpenAIReflector` on the same server is Arise's reflection model and RewardWeaver's
  attributor, capability proposer, evaluator reviser and instance-rubric writer; otherwise the
  environment's programmatic ones. RewardWeaver's library is admitted here with `judge` itself,
  so the evaluator that passed admission is the one that scores training.
- `frozen_rubrics(run_dir)`: the pool of `arise_frozen_rubrics`, read from a previous Arise run.
- `task_contexts(env, tasks)`: each task as the policy first sees it (instance-specific rubrics).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rwcore.method import MethodSettings, Providers
from rwcore.types import CapabilityProposer, InstanceRubricWriter, RubricSkillProposal, RubricSpec, Trajectory, Turn

__all__ = ["admit_library", "build_judge", "build_providers", "frozen_rubrics", "method_settings", "task_contexts"]


def method_settings(cfg) -> MethodSettings:
    rw, pool, adv, sampler = cfg.rewardweaver, cfg.pool, cfg.advantage, cfg.sampler
    return MethodSettings(
        batch_size=cfg.rollout.tasks_per_step, group_size=cfg.rollout.group_size, seed=cfg.train.seed,
        rho_min=sampler.rho_min, quota_fraction=sampler.quota_fraction, gamma_obs=sampler.gamma_obs,
        gamma_unobs=sampler.gamma_unobs, lam=adv.lam, eps=adv.eps, ddof=adv.ddof, length_alpha=adv.length_alpha,
        length_threshold=adv.length_threshold, delta_pool=pool.delta_pool, eta_high=pool.eta_high,
        eta_low=pool.eta_low, max_pool=pool.max_pool, max_new=pool.max_new, max_records=pool.max_records,
        adaptation_interval=rw.adaptation_interval, budget=rw.budget, low_outcome=rw.low_outcome,
        min_confidence=rw.min_confidence, min_support=rw.min_support, max_candidates=rw.max_candidates,
        diagnosis_tasks=rw.diagnosis_tasks, diagnostic_tasks=rw.diagnostic_tasks, success_sample=rw.success_sample,
        expansion=rw.expansion == "on", max_new_capabilities=rw.max_new, max_revisions=rw.max_revisions,
        process_normalization=rw.process_normalization,
    )


def build_judge(cfg, env):
    j = cfg.judge
    if j.kind == "openai":
        from rwcore.judges import OpenAIJudge

        return OpenAIJudge(j.model, base_url=j.base_url or None, api_key_env=j.api_key_env,
                           max_concurrency=j.max_concurrency, timeout=j.timeout, cache_dir=j.cache_dir or None,
                           structured_outputs=j.structured_outputs)
    from rwcore.judges import RuleJudge

    return RuleJudge({rule.spec.rubric_id: rule.check for rule in env.rules()})


def _llm_reflector(cfg):
    from rwcore.judges import OpenAIReflector

    j = cfg.judge
    return OpenAIReflector(j.model, base_url=j.base_url or None, api_key_env=j.api_key_env,
                           max_concurrency=j.max_concurrency)


def admit_library(env, judge, rule_ids: Sequence[str], reviser=None, max_revisions: int = 1):
    """The capability library: each of the environment's rules in `rule_ids` as a candidate, admitted by
    the source-disjoint acceptance test with `judge` (revised on its development partition by
    `reviser` when rejected). Raises when nothing passes."""
    from rwcore.rewardweaver import Capability, CapabilityLibrary

    rules = {rule.spec.rubric_id: rule for rule in env.rules()}
    cases = _cases_by_rule(env, list(rule_ids))
    library = CapabilityLibrary()
    for rubric_id in rule_ids:
        rule = rules[rubric_id]
        candidate = Capability(capability_id=rubric_id, definition=rule.spec.criterion, family=rule.family,
                               applicability=rule.spec.applicability, evaluator_prompt=rule.spec.evaluator_prompt,
                               scored=False)
        library.admit(candidate, judge, cases[rubric_id], reviser=reviser, max_revisions=max_revisions)
    if not library.ids():
        raise ValueError(f"env.name {getattr(env, 'name', '?')!r}: no capability passed admission with the "
                         f"training judge ({type(judge).__name__})")
    return library


def _cases_by_rule(env, rule_ids: list[str]) -> dict[str, list]:
    if hasattr(env, "labelled_cases_by_rule"):
        return env.labelled_cases_by_rule(rule_ids)
    cases = env.labelled_cases(rule_ids)
    return {rid: [c for c in cases if c.trajectory.metadata.get("labelled_rule", rid) == rid] for rid in rule_ids}


def build_providers(cfg, env, judge, variant, admit: bool = True) -> Providers:
    """Everything `variant` needs, built from `cfg` and `env` (see the module docstring).

    admit: run the library's admission tests (False on the ranks that receive rank 0's library: an
    empty library is built and replaced by the broadcast state)."""
    llm = cfg.judge.kind == "openai"
    reflector = _llm_reflector(cfg) if llm else env.reflector()
    rules = {rule.spec.rubric_id: rule for rule in env.rules()}
    providers = Providers(evaluator=judge)
    if variant.arise_rubrics is not None:
        providers.reflector = reflector
    if variant.arise_rubrics == "frozen":
        providers.frozen_rubrics = frozen_rubrics(cfg.pool.frozen_from)
    if variant.uses_library:
        reviser = reflector if llm else None  # a rule cannot be re-instructed; an LLM evaluator can
        initial = list(env.initial_library()) if hasattr(env, "initial_library") else list(rules)
        if admit:
            providers.library = admit_library(env, judge, initial, reviser, cfg.rewardweaver.max_revisions)
        else:
            from rwcore.rewardweaver import CapabilityLibrary

            providers.library = CapabilityLibrary()
        providers.attributor = reflector if llm else env.attributor()
        providers.reviser = reviser
        if cfg.rewardweaver.expansion == "on" and isinstance(reflector, CapabilityProposer):
            providers.proposer = reflector
            known = sorted(set(rules) - set(initial))
            cases = _cases_by_rule(env, known) if known else {}
            # New capabilities need labelled cases to be admitted: the environment's rules have them;
            # a capability an LLM invents has none and is rejected (recorded in the reward history).
            providers.acceptance_cases = lambda candidate: cases.get(candidate.capability_id, [])
    if variant.process_reward == "open_vocabulary":
        if not isinstance(reflector, CapabilityProposer):
            raise ValueError("train.method=rw_open_vocabulary needs a capability proposer (judge.kind=openai, or an "
                             "environment reflector with propose_capabilities)")
        providers.proposer = reflector
    if variant.process_reward == "instance_specific":
        if not isinstance(reflector, InstanceRubricWriter):
            raise ValueError("train.method=rw_instance_specific needs an instance-rubric writer (judge.kind=openai, or "
                             "an environment reflector with instance_rubrics)")
        providers.instance_writer = reflector
    return providers


def frozen_rubrics(run_dir: str) -> list[RubricSkillProposal]:
    """Every rubric a previous Arise run's pool held (retired ones included), with its last skill, from
    RUN_DIR/pool_rubrics.json. ValueError naming pool.frozen_from when the folder cannot give them."""
    path = Path(run_dir) / "pool_rubrics.json"
    if not path.is_file():
        raise ValueError(f"config key 'pool.frozen_from': {str(run_dir)!r} has no pool_rubrics.json (it must be the "
                         "run folder of an Arise variant)")
    try:
        entries = json.loads(path.read_text())
        proposals = [RubricSkillProposal(RubricSpec(e["rubric_id"], e["criterion"], e.get("applicability", ""),
                                                    e["capability"], e.get("evaluator_prompt", ""),
                                                    bool(e.get("scored", False))), e["skill"])
                     for e in entries]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"config key 'pool.frozen_from': {str(path)!r} is not a rubric list ({error})") from None
    if not proposals:
        raise ValueError(f"config key 'pool.frozen_from': the run in {str(run_dir)!r} produced no rubric to freeze")
    return proposals


def task_contexts(env, tasks) -> dict[str, Trajectory]:
    """Each task's first view (system prompt and the counterpart's first message), with its scenario sheet
    in metadata["task"]: what an instance-rubric writer reads."""
    out = {}
    for task in tasks:
        episode = env.reset(task, 0)
        out[task.task_id] = Trajectory(task_id=task.task_id, turns=[Turn("system", env.system_prompt),
                                                                   Turn("partner", episode.observation)],
                                       outcome=0.0, tags=tuple(task.tags), trajectory_id=f"{task.task_id}/context",
                                       metadata={"task": dict(task.data), "task_id": task.task_id})
    return out
