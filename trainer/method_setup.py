"""How `rw train` builds an `rwcore.AdaptiveMethod` from its config and environment.

- `method_settings(cfg)`: the config's method keys as `MethodSettings` (declared once, in MethodSettings).
- `build_judge(cfg, env)`: the judge that scores training - the environment's rules
  (`judge.kind=rule`) or an OpenAI-compatible model (`judge.kind=openai`).
- `build_providers(cfg, env, judge)`: what the variant calls out to. With `judge.kind=openai` one
  `OpenAIReflector` on the same server is Arise's reflection model and RewardWeaver's
  attributor, capability proposer, evaluator reviser and instance-rubric writer; otherwise the
  environment's programmatic ones (optional providers: an environment without the one a variant
  needs is refused at start, naming env.name and what is missing). RewardWeaver's library is
  admitted here with `judge` itself, so the evaluator that passed admission is the one that scores
  training. An environment without labelled cases gets a library admitted WITHOUT the acceptance
  test (`admit_unvalidated`: its capability_candidates(), its rules, or the LLM proposer's
  capabilities from the training tasks' first views), logged and recorded in each admission report.
  Partner failures are attributed to the partner by rwcore.rewardweaver.attribute itself.
- `frozen_rubrics(run_dir)`: the pool of `arise_frozen_rubrics`, read from a previous Arise run.
- `task_contexts(env, tasks)`: each task as the policy first sees it (instance-specific rubrics).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rwcore.method import MethodSettings, Providers
from rwcore.trainer.config import declared_settings
from rwcore.trainer.envs.base import provided
from rwcore.types import CapabilityProposer, InstanceRubricWriter, RubricSkillProposal, RubricSpec, Trajectory, Turn

__all__ = [
    "admit_library",
    "admit_unvalidated",
    "build_judge",
    "build_providers",
    "frozen_rubrics",
    "method_settings",
    "task_contexts",
]


def method_settings(cfg) -> MethodSettings:
    """The config's method keys as `MethodSettings`: each field read from the key its `setting(...)` names
    (rwcore.method.setting; the config sections are generated from the same fields)."""
    return declared_settings(MethodSettings, cfg)


def _env_name(env) -> str:
    return repr(getattr(env, "name", type(env).__name__))


def build_judge(cfg, env):
    j = cfg.judge
    if j.kind == "openai":
        from rwcore.judges import OpenAIJudge

        return OpenAIJudge(
            j.model,
            base_url=j.base_url or None,
            api_key_env=j.api_key_env,
            max_concurrency=j.max_concurrency,
            timeout=j.timeout,
            cache_dir=j.cache_dir or None,
            cache_max_bytes=j.cache_max_bytes,
            structured_outputs=j.structured_outputs,
            max_field_chars=j.max_field_chars,
            temperature=j.temperature,
            **({"max_tokens": j.max_tokens} if j.max_tokens else {}),
        )
    from rwcore.judges import RuleJudge

    # an environment without rules gets an empty RuleJudge: fine for outcome-only variants; build_providers
    # refuses a variant that judges rubrics with it
    return RuleJudge({rule.spec.rubric_id: rule.check for rule in provided(env, "rules") or []})


def _llm_reflector(cfg):
    from rwcore.judges import OpenAIReflector

    j = cfg.judge
    return OpenAIReflector(
        j.model,
        base_url=j.base_url or None,
        api_key_env=j.api_key_env,
        max_concurrency=j.max_concurrency,
        temperature=j.temperature,
        structured_outputs=j.structured_outputs,
        max_field_chars=j.max_field_chars,
        **({"max_tokens": j.max_tokens} if j.max_tokens else {}),
    )


def admit_library(env, judge, rule_ids: Sequence[str], reviser=None, max_revisions: int = 1):
    """The capability library: each of the environment's rules in `rule_ids` as a candidate, admitted by
    the source-disjoint acceptance test with `judge` (revised on its development partition by
    `reviser` when rejected). Raises when nothing passes."""
    from rwcore.rewardweaver import Capability, CapabilityLibrary

    rules = {rule.spec.rubric_id: rule for rule in provided(env, "rules") or []}
    cases = _cases_by_rule(env, list(rule_ids))
    library = CapabilityLibrary()
    for rubric_id in rule_ids:
        rule = rules[rubric_id]
        candidate = Capability(
            capability_id=rubric_id,
            definition=rule.spec.criterion,
            family=rule.family,
            applicability=rule.spec.applicability,
            evaluator_prompt=rule.spec.evaluator_prompt,
            scored=False,
        )
        library.admit(candidate, judge, cases[rubric_id], reviser=reviser, max_revisions=max_revisions)
    if not library.ids():
        raise ValueError(
            f"env.name {_env_name(env)}: no capability passed admission with the "
            f"training judge ({type(judge).__name__})"
        )
    return library


UNVALIDATED = (
    "unvalidated: the environment brings no labelled cases, so the capability was admitted without "
    "the source-disjoint acceptance test"
)
UNVALIDATED_BY_CHOICE = (
    "unvalidated: rewardweaver.admission=unvalidated, so the capability was admitted without the source-disjoint "
    "acceptance test"
)


def admit_unvalidated(
    env, judge, specs: Sequence[RubricSpec], reason: str = UNVALIDATED, why: str = "no labelled cases"
):
    """A library of `specs` admitted WITHOUT the acceptance test (an environment with no labelled cases, or
    rewardweaver.admission=unvalidated): each entry's admission report carries `reason`; a warning names `why`."""
    import logging

    from rwcore.rewardweaver import Capability, CapabilityLibrary
    from rwcore.rewardweaver.capability import AdmissionReport, AdmittedCapability

    library = CapabilityLibrary()
    evaluator = str(getattr(judge, "model", "") or type(judge).__name__)
    entries, seen = [], set()
    for spec in specs:
        if spec.rubric_id in seen:
            continue
        seen.add(spec.rubric_id)
        capability = Capability.from_rubric(spec)
        report = AdmissionReport(capability_id=spec.rubric_id, admitted=True, reasons=(reason,), evaluator=evaluator)
        entries.append(
            AdmittedCapability(
                capability, evaluator, report, AdmittedCapability.compute_hash(capability, evaluator, report)
            )
        )
    if not entries:
        raise ValueError(f"env.name {_env_name(env)}: no capability candidate to build RewardWeaver's library from")
    library.add_admitted(entries)
    logging.getLogger(__name__).warning(
        "env.name %s: RewardWeaver's library holds %d capabilities admitted WITHOUT the acceptance test (%s): %s",
        _env_name(env),
        len(entries),
        why,
        ", ".join(e.capability.capability_id for e in entries),
    )
    return library


def _cases_by_rule(env, rule_ids: list[str]) -> dict[str, list]:
    by_rule = provided(env, "labelled_cases_by_rule", rule_ids)
    if by_rule is not None:
        return by_rule
    cases = provided(env, "labelled_cases", rule_ids) or []
    return {rid: [c for c in cases if c.trajectory.metadata.get("labelled_rule", rid) == rid] for rid in rule_ids}


def _has_cases(env) -> bool:
    return callable(getattr(env, "labelled_cases_by_rule", None)) or callable(getattr(env, "labelled_cases", None))


def _candidate_specs(cfg, env, proposer, budget: int) -> list[RubricSpec]:
    """Capability candidates for an environment without labelled cases: its capability_candidates(), its
    rules' specs, or (with an LLM) the proposer's capabilities read from the training tasks' first views."""
    specs = provided(env, "capability_candidates")
    if specs:
        return list(specs)
    rules = provided(env, "rules")
    if rules:
        return [rule.spec for rule in rules]
    if proposer is None:
        return []
    contexts = list(task_contexts(env, env.tasks("train")[: max(4, 2 * budget)]).values())
    return list(proposer.propose_capabilities(contexts, [], max(2, 2 * budget)))


def build_providers(cfg, env, judge, variant, admit: bool = True) -> Providers:
    """Everything `variant` needs, built from `cfg` and `env` (see the module docstring).

    admit: run the library's admission tests (False on the ranks that receive rank 0's library: an
    empty library is built and replaced by the broadcast state)."""
    llm = cfg.judge.kind == "openai"
    name = _env_name(env)

    def missing(what: str, needed_by: str) -> ValueError:
        return ValueError(
            f"env.name {name} brings no {what}, which train.method={cfg.train.method} needs for "
            f"{needed_by}; set judge.kind=openai (an OpenAI-compatible model fills it in) or use an "
            "environment that provides it"
        )

    rules = {rule.spec.rubric_id: rule for rule in provided(env, "rules") or []}
    judges_rubrics = variant.arise_rubrics is not None or variant.uses_library or variant.process_reward is not None
    if not llm and judges_rubrics and not rules:
        raise ValueError(
            f"env.name {name} brings no rules (no programmatic rubric library), so judge.kind=rule "
            f"cannot judge train.method={cfg.train.method}'s rubrics: set judge.kind=openai with "
            "judge.model / judge.base_url (an OpenAI-compatible judge fills in the rubrics, reflector and "
            "attributor), or train.method=outcome_only"
        )
    reflector = _llm_reflector(cfg) if llm else provided(env, "reflector")
    providers = Providers(evaluator=judge)
    if variant.arise_rubrics is not None:
        if reflector is None:
            raise missing("reflector", "Arise's rubric-skill pool")
        providers.reflector = reflector
    if variant.arise_rubrics == "frozen":
        providers.frozen_rubrics = frozen_rubrics(cfg.pool.frozen_from)
    if variant.uses_library:
        reviser = reflector if llm else None  # a rule cannot be re-instructed; an LLM evaluator can
        attributor = reflector if llm else provided(env, "attributor")
        if attributor is None:
            raise missing("attributor", "RewardWeaver's failure attribution")
        validated = bool(rules) and _has_cases(env)
        initial = list(provided(env, "initial_library") or rules)
        from rwcore.rewardweaver import CapabilityLibrary

        if not admit:
            providers.library = CapabilityLibrary()
        elif cfg.rewardweaver.admission == "unvalidated" and rules:  # asked for: no acceptance test
            providers.library = admit_unvalidated(
                env,
                judge,
                [rules[rid].spec for rid in initial if rid in rules],
                reason=UNVALIDATED_BY_CHOICE,
                why="rewardweaver.admission=unvalidated",
            )
        elif validated:
            providers.library = admit_library(env, judge, initial, reviser, cfg.rewardweaver.max_revisions)
        else:
            proposer = reflector if isinstance(reflector, CapabilityProposer) else None
            specs = _candidate_specs(cfg, env, proposer, cfg.rewardweaver.budget)
            if not specs:
                raise missing("rules, labelled cases or capability candidates", "RewardWeaver's capability library")
            providers.library = admit_unvalidated(env, judge, specs)
        providers.attributor = attributor
        providers.reviser = reviser
        if cfg.rewardweaver.expansion and isinstance(reflector, CapabilityProposer):
            providers.proposer = reflector
            known = sorted(set(rules) - set(initial))
            cases = _cases_by_rule(env, known) if known else {}
            # New capabilities need labelled cases to be admitted: the environment's rules have them;
            # a capability an LLM invents has none and is rejected (recorded in the reward history).
            providers.acceptance_cases = lambda candidate: cases.get(candidate.capability_id, [])
    # what the variant's registered process reward calls besides the library (rwcore.rewardweaver.process_rewards)
    from rwcore.rewardweaver.process_rewards import get_process_reward

    needs = (
        get_process_reward(variant.process_reward).needs(method_settings(cfg))
        if variant.process_reward is not None and not variant.uses_library
        else ()
    )
    if "proposer" in needs:
        if not isinstance(reflector, CapabilityProposer):
            raise ValueError(
                f"train.method={cfg.train.method} needs a capability proposer (judge.kind=openai, or an "
                "environment reflector with propose_capabilities)"
            )
        providers.proposer = reflector
    if "instance_writer" in needs:
        if not isinstance(reflector, InstanceRubricWriter):
            raise ValueError(
                f"train.method={cfg.train.method} needs an instance-rubric writer (judge.kind=openai, or "
                "an environment reflector with instance_rubrics)"
            )
        providers.instance_writer = reflector
    return providers


def frozen_rubrics(run_dir: str) -> list[RubricSkillProposal]:
    """Every rubric a previous Arise run's pool held (retired ones included), with its last skill, from
    RUN_DIR/pool_rubrics.json. ValueError naming pool.frozen_from when the folder cannot give them."""
    path = Path(run_dir) / "pool_rubrics.json"
    if not path.is_file():
        raise ValueError(
            f"config key 'pool.frozen_from': {str(run_dir)!r} has no pool_rubrics.json (it must be the "
            "run folder of an Arise variant)"
        )
    try:
        entries = json.loads(path.read_text())
        proposals = [
            RubricSkillProposal(
                RubricSpec(
                    e["rubric_id"],
                    e["criterion"],
                    e.get("applicability", ""),
                    e["capability"],
                    e.get("evaluator_prompt", ""),
                    bool(e.get("scored", False)),
                ),
                e["skill"],
            )
            for e in entries
        ]
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
        out[task.task_id] = Trajectory(
            task_id=task.task_id,
            turns=[Turn("system", env.system_prompt), Turn("partner", episode.observation)],
            outcome=0.0,
            tags=tuple(task.tags),
            trajectory_id=f"{task.task_id}/context",
            metadata={"task": dict(task.data), "task_id": task.task_id},
        )
    return out
