"""`AdaptiveMethod`: RewardWeaver and Arise composed as each paper describes, behind one interface.

The method owns the task sampler, Arise's rubric-skill pool and its evidence window, and
RewardWeaver's capability library, active set and reward history; it routes one step's judge
verdicts (a `JudgedBatch`) to all of them. A trainer - `rw train`, TRL, verl or your own loop -
keeps rollouts, the policy update, processes and checkpoints, and drives the method so:

    method = AdaptiveMethod("combined", tasks, settings, providers)
    if method.stage_due(-1):                                    # RewardWeaver's first diagnosis
        method.adapt(-1, diagnosis=roll_out_and_judge(method.diagnosis_tasks(-1), method.diagnosis_rubrics()))
    for step in range(steps):
        task_ids = method.sample(step)
        prompt = method.system_prompt(base_prompt)              # skills only here, never at evaluation
        trajectories = roll_out(task_ids, prompt)               # G per task, groups contiguous
        reports = judge_groups(trajectories, method.rubrics_to_judge(step, task_ids))
        scored = method.score(trajectories, reports)            # rewards, advantages, the JudgedBatch
        update_policy(trajectories, scored.advantages)
        method.observe(step, task_ids, trajectories, scored.judged)
        diagnosis = ...same as above when method.stage_due(step)...
        method.adapt(step, diagnosis=diagnosis)                 # pool every delta_pool, stages every interval

Rewards and advantages (Arise eq. 15-17, RewardWeaver §2.4), with each rubric counted once:

    R_task = length_regularize(R_o)                 (B.4: on the task outcome only)
    R      = R_task + mean_{d in A} J_d             (RewardWeaver's process term; 0 without it)
    A      = compute_advantages(R, verdicts of P \\ A)

where A is RewardWeaver's rubric set of the step (the active set, the stage's open-vocabulary
dimensions, or the task's instance rubrics) and P Arise's pool. A rubric in both is counted in
the process reward only; `score(...).advantage_rubrics` / `.process_rubrics` say which went where.
The credit settings (`MethodSettings.scale_rewards`, `.aggregation`, `.process_gate`; defaults: the
formulas above) choose how R is scaled and combined and where process credit applies
(docs/method.md "Credit and exploration settings"); a variant refuses one it cannot apply
(`inapplicable_settings`).

Schedules (0-based step k, the iteration that just updated the policy):
- Arise: the pool starts empty; at the end of every step with (k + 1) % delta_pool == 0 it is
  updated from the window's evidence (first pairs at k = delta_pool - 1, i.e. after delta_pool
  optimizer steps). Reflection reads up to `max_records` records of the window, refinement the
  window's failures of that rubric; a reflector that fails is logged and the lifecycle still runs.
- RewardWeaver: a stage boundary before training (k = -1) and at the end of every step with
  (k + 1) % adaptation_interval == 0. Each boundary needs a *fresh on-policy* diagnosis batch of
  the current policy (`diagnosis_tasks`, judged on `diagnosis_rubrics`); the method never
  reuses a training batch for diagnosis.
- Appendix G: `record_diagnostic_scores` takes the reports of the fixed `diagnostic_set`,
  rolled out without skills, at every boundary and at the end of training.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from rwcore.arise.advantages import compute_advantages, length_regularize, process_credit_mask
from rwcore.judged import JudgedBatch
from rwcore.method.records import AdaptReport, Providers, Scored
from rwcore.method.run_views import RunViews
from rwcore.method.settings import CREDIT_SETTINGS, MethodSettings, check_applicable, pin_settings
from rwcore.method.state import MethodState
from rwcore.method.variants import VARIANTS, Variant, get_variant
from rwcore.method.window import ReflectionWindow
from rwcore.types import (
    Attributor,
    CapabilityProposer,
    InstanceRubricWriter,
    JudgeReport,
    RubricReflector,
    RubricSpec,
    Trajectory,
)
from rwcore.validation import check_int, check_trajectories
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.method")

__all__ = ["AdaptiveMethod"]


class _SilentReflector:
    """Stands in for a reflector that failed: no new pairs, skills kept (the lifecycle still runs)."""

    def propose_rubric_skills(self, trajectories, existing, max_new, **_):
        return []

    def refine_skill(self, rubric, skill, failures):
        return skill


class AdaptiveMethod(RunViews, MethodState):
    """One variant of the method over a task set (see the module docstring).

    variant: a name from `AdaptiveMethod.variants()` (or a `Variant`).
    tasks: task id -> task-type tags (the training split).
    settings: `MethodSettings` (defaults when None).
    providers: `Providers` for what the variant calls out to.

    Its checkpoint state (`state_dict`, `load_state_dict`) and what the run folder shows (`run_files`, `metrics`,
    the pool's and RewardWeaver's records) come from its bases `MethodState` (`state`) and `RunViews`
    (`run_views`); this module holds its construction, the per-step routing, the schedules and the adaptation.
    """

    def __init__(
        self,
        variant: str | Variant,
        tasks: Mapping[str, Sequence[str]],
        settings: MethodSettings | None = None,
        providers: Providers | None = None,
    ) -> None:
        self.variant = variant if isinstance(variant, Variant) else get_variant(variant)
        self.settings = settings if settings is not None else MethodSettings()
        if not isinstance(self.settings, MethodSettings):
            raise ValueError(f"settings must be a MethodSettings, got {type(self.settings).__name__}")
        self.providers = providers if providers is not None else Providers()
        if not isinstance(tasks, Mapping) or not tasks:
            raise ValueError("tasks must be a non-empty mapping of task id -> task-type tags")
        self._tasks = {task_id: tuple(tags) for task_id, tags in tasks.items()}
        self._task_ids = list(self._tasks)
        self.settings = pin_settings(
            self.variant, self.settings
        )  # a variant that pins a setting (arise_retire_while_shown)
        check_applicable(self.variant, self.settings)
        self._check_providers()
        s = self.settings
        self.sampler = self._build_sampler()
        self.pool = self._build_pool() if self.variant.arise_rubrics is not None else None
        self.window = ReflectionWindow(s.max_records, seed=s.seed) if self.pool is not None else None
        # RewardWeaver's process reward, from the registry (rwcore.rewardweaver.process_rewards): the stage driver
        # RewardWeaver for library strategies, or the open-vocabulary / instance-specific rubric source
        entry = self._process_entry()
        built = entry.build(s, self.providers) if entry is not None else None
        self.weaver = built if entry is not None and entry.uses_library else None
        self._process = built if entry is not None and not entry.uses_library else None
        self._diagnostic_scores: list[dict] = []  # appendix G points
        self._reflection_errors = 0
        self._stage_errors = 0
        rng = np.random.default_rng([s.seed, 0xD1A6])
        size = min(s.diagnostic_tasks, len(self._task_ids))
        self._diagnostic_set = tuple(
            self._task_ids[i] for i in sorted(rng.choice(len(self._task_ids), size, replace=False))
        )
        self._sync_sampler()

    # ------------------------------------------------------------------ the catalogue

    @classmethod
    def variants(cls) -> dict[str, Variant]:
        """name -> Variant (description, paper_row, parent, components) for every variant."""
        return dict(VARIANTS)

    def set_credit_settings(self, **changes) -> None:
        """Sets `CREDIT_SETTINGS` fields (scale_rewards, aggregation, process_gate) on the built method: how a
        trainer's own keys (TRL's scale_rewards, verl's norm_adv_by_std_in_grpo) reach `score`. The new settings
        are checked like the method's (`MethodSettings`, `inapplicable_settings`); nothing changes on error."""
        unknown = sorted(set(changes) - set(CREDIT_SETTINGS))
        if unknown:
            raise ValueError(f"set_credit_settings takes only {list(CREDIT_SETTINGS)}, got {unknown}")
        settings = dataclasses.replace(self.settings, **changes)
        check_applicable(self.variant, settings)
        self.settings = settings

    def resolved(self) -> dict:
        """The variant and every setting it runs with (what `rw train` writes to method.json)."""
        return {
            "variant": self.variant.to_dict(),
            "settings": self.settings.to_dict(),
            "counting": "a rubric in RewardWeaver's rubric set of the step is counted in the process reward "
            "only; Arise's rubric advantages use the pool's other rubrics",
        }

    # ------------------------------------------------------------------ construction

    def _process_entry(self):
        from rwcore.rewardweaver.process_rewards import get_process_reward

        return get_process_reward(self.variant.process_reward) if self.variant.process_reward is not None else None

    def _check_providers(self) -> None:
        v, p = self.variant, self.providers
        needs: list[tuple[str, object, type | None]] = []
        if v.arise_rubrics is not None:  # generation (evolving) and skill refinement (both)
            needs.append(("reflector", p.reflector, RubricReflector))
        if v.arise_rubrics == "frozen" and not p.frozen_rubrics:
            raise ValueError(
                f"variant {v.name!r} needs providers.frozen_rubrics: the rubric-skill pairs a previous "
                "Arise run produced (rw train: pool.frozen_from=RUN_DIR)"
            )
        entry = self._process_entry()
        protocols = {
            "attributor": Attributor,
            "proposer": CapabilityProposer,
            "instance_writer": InstanceRubricWriter,
            "reflector": RubricReflector,
        }
        for name in entry.needs(self.settings) if entry is not None else ():  # what the registry entry calls
            if name == "library":
                from rwcore.rewardweaver import CapabilityLibrary

                if not isinstance(p.library, CapabilityLibrary) or not p.library.ids():
                    raise ValueError(
                        f"variant {v.name!r} needs providers.library: a CapabilityLibrary with at least "
                        "one admitted capability"
                    )
            else:
                needs.append((name, getattr(p, name), protocols.get(name)))
        for name, value, protocol in needs:
            if value is None or (protocol is not None and not isinstance(value, protocol)):
                kind = f"a rwcore.types.{protocol.__name__}" if protocol is not None else "a provider"
                raise ValueError(f"variant {v.name!r} needs providers.{name} ({kind}), got {type(value).__name__}")

    def _build_sampler(self):
        from rwcore.sampling import build_sampler

        return build_sampler(self.variant.sampler, self._tasks, self.settings)  # the sampler registry

    def _build_pool(self):
        from rwcore.arise.pool import RubricSkillPool

        s, frozen = self.settings, self.variant.arise_rubrics == "frozen"
        return RubricSkillPool(
            self.providers.reflector,
            max_pool=max(s.max_pool, len(self.providers.frozen_rubrics)) if frozen else s.max_pool,
            max_new=s.max_new,
            delta_pool=s.delta_pool,
            eta_high=s.eta_high,
            eta_low=s.eta_low,
            capabilities=s.capabilities,
            proposals=list(self.providers.frozen_rubrics) if frozen else (),
            max_failures=s.max_records,
            frozen=frozen,
            retire_while_shown=s.retire_while_shown,
        )

    # ------------------------------------------------------------------ per step

    def sample(self, step: int) -> list:
        """The step's B task ids (the variant's sampler; policy version = step)."""
        return self.sampler.sample(max(0, int(step)))

    def system_prompt(self, base: str, evaluation: bool = False) -> str:
        """The policy's system prompt: `base` with the active skills appended during training when the
        variant injects skills; `base` itself at evaluation (Arise withholds skills there)."""
        if evaluation or self.pool is None or not self.variant.skills:
            return base
        return self.pool.system_prompt(base)

    @classmethod
    def system_prompt_from_state(cls, state: Mapping, base: str) -> str:
        """The training prompt of the method whose `state_dict()` is `state` (a checkpoint's), without building
        it: `base` with the pool's active skills (`base` itself when the variant has no pool)."""
        pool = state.get("pool") if isinstance(state, Mapping) else None
        if not pool:
            return base
        from rwcore.arise.pool import RubricSkillPool

        return RubricSkillPool.system_prompt_from_state(pool, base)

    def process_rubrics(self, task_id: str | None = None) -> list[RubricSpec]:
        """RewardWeaver's rubric set A of the current stage (for instance-specific rubrics: `task_id`'s)."""
        if self.weaver is not None:
            return self.weaver.active_rubrics()
        return self._process.rubrics(task_id) if self._process is not None else []

    def rubrics_to_judge(self, step: int, task_ids: Sequence[str]) -> list[list[RubricSpec]]:
        """For each task group of the step, the rubrics its trajectories are judged on: the pool's rubrics
        and RewardWeaver's rubric set (each once). Groups usually share one list; instance-specific
        rubrics differ per task."""
        pool = self.pool.active_rubrics() if self.pool is not None else []
        plans = []
        for task_id in task_ids:
            specs = {spec.rubric_id: spec for spec in self.process_rubrics(task_id)}
            for spec in pool:
                specs.setdefault(spec.rubric_id, spec)
            plans.append(list(specs.values()))
        return plans

    def score(
        self,
        trajectories: Sequence[Trajectory],
        reports: Sequence[JudgeReport],
        group_ids: Sequence | np.ndarray | None = None,
    ) -> Scored:
        """Rewards, advantages and the step's JudgedBatch (see the module docstring for the formulas).

        trajectories: the step's N rollouts, groups contiguous (G per task) unless `group_ids` says
            otherwise; reports: their judge reports, in the same order.
        """
        trajectories = check_trajectories(trajectories, finite_outcomes=True)
        n = len(trajectories)
        if len(reports) != n:
            raise ValueError(f"reports holds {len(reports)} reports for {n} trajectories")
        groups = (
            np.repeat(np.arange(n // self.settings.group_size), self.settings.group_size)
            if group_ids is None
            else np.asarray(group_ids)
        )
        if groups.shape != (n,):
            raise ValueError(
                f"group_ids must have shape ({n},); without group_ids N must be a multiple of "
                f"group_size={self.settings.group_size}"
            )
        # every rubric the method reads, plus whatever else the judge returned; one a report lacks is INVALID
        expected = [spec.rubric_id for spec in (self.pool.active_rubrics() if self.pool is not None else [])]
        for task_id in dict.fromkeys(t.task_id for t in trajectories):
            expected += [spec.rubric_id for spec in self.process_rubrics(task_id)]
        judged_ids = list(dict.fromkeys([*expected, *(rid for report in reports for rid in report.judgments)]))
        # A trajectory whose counterpart failed (Trajectory.partner_failure) is never charged to the agent:
        # its verdicts are INVALID (no evidence for the sampler, the pool or reflection) and its advantage 0.
        failed = np.array([bool(t.partner_failure) for t in trajectories], dtype=bool)
        if failed.any():
            reports = [
                JudgeReport(t.trajectory_id, {}) if bad else report
                for t, report, bad in zip(trajectories, reports, failed)
            ]
        judged = JudgedBatch.from_reports(reports, judged_ids, [t.trajectory_id for t in trajectories])
        s = self.settings
        outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
        lengths = np.array([t.generated_length for t in trajectories], dtype=np.float64)
        task_rewards = length_regularize(
            outcomes, lengths, groups, alpha=s.length_alpha, threshold=s.length_threshold, eps=s.eps
        )
        process_terms, process_ids = self._process_terms(trajectories, judged)
        # process credit where advantage.process_gate lets it in (everywhere by default); a partner failure is
        # no success and is left out of its group's count
        successes = (outcomes >= s.low_outcome) & ~failed
        if s.process_gate != "off":
            process_terms = np.where(process_credit_mask(successes, groups, s.process_gate), process_terms, 0.0)
        rewards = task_rewards + process_terms
        advantage_ids = tuple(
            spec.rubric_id
            for spec in (self.pool.active_rubrics() if self.pool is not None else [])
            if spec.rubric_id not in process_ids and spec.rubric_id in judged
        )
        verdicts = judged.columns(advantage_ids).reward_verdict_matrix()  # INVALID scores as a FAIL
        credit = dict(
            lam=s.lam,
            eps=s.eps,
            ddof=s.ddof,
            scale_rewards=s.scale_rewards,
            aggregation=s.aggregation,
            process_gate=s.process_gate,
        )
        if failed.any():  # left out of their groups' normalization; the rest of each group as usual
            keep = ~failed
            advantages = np.zeros(n, dtype=np.float64)
            if keep.any():
                advantages[keep] = compute_advantages(
                    task_rewards[keep],
                    verdicts[keep],
                    groups[keep],
                    process_rewards=process_terms[keep],
                    successes=successes[keep],
                    **credit,
                )
        else:
            advantages = compute_advantages(
                task_rewards, verdicts, groups, process_rewards=process_terms, successes=successes, **credit
            )
        pool_ids = set(self.pool.rubric_ids()) if self.pool is not None else set()
        return Scored(
            rewards,
            np.asarray(advantages, dtype=np.float64),
            task_rewards,
            process_terms,
            judged,
            tuple(process_ids),
            advantage_ids,
            tuple(rid for rid in process_ids if rid in pool_ids),
        )

    def _process_terms(self, trajectories: Sequence[Trajectory], judged: JudgedBatch) -> tuple[np.ndarray, list[str]]:
        """RewardWeaver's 1/|A| sum_d J_d per trajectory (rwcore.rewardweaver.process_terms with
        settings.process_normalization; 0 when nothing is defined). An INVALID judgment counts as a
        FAIL (0.0) under both normalizations (`JudgedBatch.reward_values`): invalidity never pays."""
        from rwcore.rewardweaver import process_terms

        n = len(trajectories)
        normalize = self.settings.process_normalization
        if self.variant.process_reward is None:
            return np.zeros(n), []
        if hasattr(self._process, "terms"):  # per-trajectory rubric sets (instance-specific)
            return self._process.terms(trajectories, judged, normalize)
        ids = [spec.rubric_id for spec in self.process_rubrics()]
        if not ids:
            return np.zeros(n), []
        return process_terms(judged.columns(ids).reward_values(), normalize=normalize)[0], ids

    def observe(
        self,
        step: int,
        task_ids: Sequence[str],
        trajectories: Sequence[Trajectory],
        judged: JudgedBatch,
        policy_versions: Sequence[int] | None = None,
    ) -> None:
        """Evidence of one step: the sampler (per complete group, at the group's policy version), the pool's
        window counts, and Arise's reflection window."""
        step = check_int(step, "step", low=0)
        g = self.settings.group_size
        if len(trajectories) != len(task_ids) * g or len(judged) != len(trajectories):
            raise ValueError(
                f"observe needs {len(task_ids)} groups of {g} trajectories and their JudgedBatch, got "
                f"{len(trajectories)} trajectories and {len(judged)} judged"
            )
        versions = [step] * len(task_ids) if policy_versions is None else [int(v) for v in policy_versions]
        if len(versions) != len(task_ids):
            raise ValueError(f"policy_versions holds {len(versions)} versions for {len(task_ids)} groups")
        sampler_rubrics = list(self.sampler.rubrics)
        missing = [rid for rid in sampler_rubrics if rid not in judged]
        if missing:
            raise ValueError(f"judged lacks the sampler's rubrics {missing[:5]} (judge rubrics_to_judge(...) first)")
        columns = judged.columns(sampler_rubrics) if sampler_rubrics else None
        for i, task_id in enumerate(task_ids):
            rows = slice(i * g, (i + 1) * g)
            verdicts = {rid: [Verdict(int(c)) for c in columns.codes[rows, j]] for j, rid in enumerate(sampler_rubrics)}
            outcomes = [min(1.0, max(0.0, float(t.outcome))) for t in trajectories[rows]]
            failed = [bool(t.partner_failure) for t in trajectories[rows]]
            if any(failed):  # a partner failure is no outcome evidence: it takes its group's mean (0.5 if none)
                kept = [o for o, bad in zip(outcomes, failed) if not bad]
                fill = float(np.mean(kept)) if kept else 0.5
                outcomes = [fill if bad else o for o, bad in zip(outcomes, failed)]
            self.sampler.record_group(task_id, verdicts, versions[i], outcomes=outcomes)
        if self.pool is not None:
            self.pool.record_judged(judged, step)
        if self.window is not None:
            pool_ids = [rid for rid in self.pool.rubric_ids() if rid in judged]
            failed = set()
            if pool_ids:
                codes = judged.columns(pool_ids).codes
                failed = {tid for tid, row in zip(judged.trajectory_ids, codes) if (row == Verdict.FAIL).any()}
            # a partner failure says nothing about the policy: reflection does not read it
            kept = [i for i, t in enumerate(trajectories) if not t.partner_failure]
            self.window.add([trajectories[i] for i in kept], tuple(judged.uncovered[i] for i in kept), failed)

    # ------------------------------------------------------------------ schedules

    def stage_due(self, step: int) -> bool:
        """Whether a RewardWeaver stage boundary falls at the end of `step` (-1: before training)."""
        if not self.variant.has_stages:
            return False
        return step == -1 or (step >= 0 and (step + 1) % self.settings.adaptation_interval == 0)

    def pool_due(self, step: int) -> bool:
        return self.pool is not None and step >= 0 and self.pool.is_update_step(step)

    def diagnosis_tasks(self, step: int) -> list[str]:
        """The tasks of the fresh on-policy diagnosis batch at the boundary after `step` (seeded from the
        run's seed and the step, so a resumed run draws the same ones; G rollouts each)."""
        rng = np.random.default_rng([self.settings.seed, 0xD1A9, step + 1])
        size = min(self.settings.diagnosis_tasks, len(self._task_ids))
        return [self._task_ids[i] for i in rng.choice(len(self._task_ids), size, replace=False)]

    def diagnosis_rubrics(self) -> list[RubricSpec]:
        """What the diagnosis batch is judged on: the whole capability library (retrieval, failure rates,
        expansion triggers) for library strategies; nothing for open-vocabulary dimensions."""
        return self.weaver.library.rubrics() if self.weaver is not None else []

    @property
    def diagnostic_set(self) -> tuple[str, ...]:
        """Appendix G's fixed diagnostic tasks (empty when settings.diagnostic_tasks = 0 or no stages)."""
        return self._diagnostic_set if self.weaver is not None else ()

    def diagnostic_rubrics(self) -> list[RubricSpec]:
        return self.diagnosis_rubrics()

    # ------------------------------------------------------------------ adaptation

    def adapt(
        self, step: int, diagnosis: tuple[Sequence[Trajectory], Sequence[JudgeReport]] | None = None
    ) -> AdaptReport:
        """The scheduled adaptation at the end of `step`: the pool update when due, then the stage boundary
        when due (`diagnosis` = (trajectories, reports) of the fresh on-policy batch; required then)."""
        pool_update = error = None
        if self.pool_due(step):
            pool_update, error = self._update_pool(step)
        stage = None  # stays None when the stage update failed (logged; the active set is kept)
        if self.stage_due(step):
            if diagnosis is None:
                raise ValueError(
                    f"step {step} is a RewardWeaver stage boundary: adapt needs diagnosis=(trajectories, "
                    "reports) of a fresh on-policy batch (diagnosis_tasks / diagnosis_rubrics)"
                )
            stage = self._new_stage(step, *diagnosis)
        self._sync_sampler()
        return AdaptReport(pool_update, stage, error)

    def _update_pool(self, step: int):
        evidence, diagnostics = self.window.evidence() if self.window is not None else ([], None)
        failures = self.window.failures() if self.window is not None else []
        try:
            update = self.pool.maybe_update(step, failures, evidence=evidence, diagnostics=diagnostics)
            error = None
        except Exception as exc:  # an LLM reflector may fail; training must not stop
            error = f"{type(exc).__name__}: {exc}"
            self._reflection_errors += 1
            logger.warning(
                "pool update at step %d: the reflector failed (%s); the lifecycle runs without new "
                "pairs or refinements",
                step,
                error,
            )
            update = self.pool.maybe_update(step, failures, reflector=_SilentReflector())
        if self.window is not None:
            self.window.clear()
        return update, error

    def _new_stage(self, step: int, trajectories: Sequence[Trajectory], reports: Sequence[JudgeReport]) -> int:
        trajectories = check_trajectories(trajectories, "diagnosis trajectories", need_ids=True, finite_outcomes=True)
        if not trajectories:
            raise ValueError("diagnosis trajectories must not be empty")
        if self.weaver is not None:
            judged = JudgedBatch.from_reports(
                reports, self.weaver.library.ids(), [t.trajectory_id for t in trajectories]
            )
            try:
                self.weaver.update(trajectories, judged, step=step + 1)
            except (ValueError, TypeError):
                raise  # bad input or a broken provider contract: the caller's bug, not the model's
            except Exception as exc:  # an LLM attributor or proposer may fail; keep training
                self._stage_errors += 1
                logger.warning(
                    "stage boundary after step %d: RewardWeaver's update failed (%s: %s); the current "
                    "active set stays for another stage",
                    step,
                    type(exc).__name__,
                    exc,
                )
                return None
            return int(self.weaver.stage)
        # open vocabulary: the proposer's dimensions for this stage's failures, used as they come
        errors = self._process.errors
        stage = self._process.new_stage(step, trajectories)
        self._stage_errors += self._process.errors - errors
        return stage

    def set_instance_contexts(self, contexts: Mapping[str, Trajectory]) -> None:
        """rw_instance_specific: writes each task's rubrics from its context (once per task; kept in the
        state). Every training task needs a context."""
        if hasattr(self._process, "set_contexts"):
            self._process.set_contexts(self._task_ids, contexts)

    @property
    def needs_instance_contexts(self) -> bool:
        return hasattr(self._process, "set_contexts") and self._process.missing(self._task_ids)

    def record_diagnostic_scores(self, step: int, reports: Sequence[JudgeReport]) -> dict:
        """Appendix G: S_d at this point = mean normalized score over applicable episodes of the fixed
        diagnostic set (rolled out without skills), for every library capability."""
        ids = list(self.weaver.library.ids()) if self.weaver is not None else []
        judged = JudgedBatch.from_reports(reports, ids)
        values = judged.values
        applicable = np.isfinite(values).sum(axis=0)
        sums = np.where(np.isfinite(values), values, 0.0).sum(axis=0)
        point = {
            "step": int(step),
            "stage": self.weaver.stage if self.weaver is not None else None,
            "episodes": len(judged),
            "scores": {rid: (float(sums[j] / applicable[j]) if applicable[j] else None) for j, rid in enumerate(ids)},
            "applicable": {rid: int(applicable[j]) for j, rid in enumerate(ids)},
        }
        self._diagnostic_scores = [p for p in self._diagnostic_scores if p["step"] != point["step"]] + [point]
        return point

    def _sync_sampler(self) -> None:
        """The capability sampler follows the pool's rubrics (Arise's R_k)."""
        if self.variant.sampler != "capability":
            return
        rubrics = self.pool.rubric_capabilities() if self.pool is not None else {}
        if rubrics != self.sampler.rubrics:
            self.sampler.set_rubrics(rubrics)
