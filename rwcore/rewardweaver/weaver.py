"""`RewardWeaver`: the stage-wise outer loop (RewardWeaver §2.3-2.5, Algorithm 2).

Every stage (30 optimizer steps in the paper) the trainer rolls the current
policy out, judges the trajectories and calls `update`:

    cohort F = {tau : q_o(R_o(tau), x) = 1}
    -> attribution records on F, screened           (attribution.attribute)
    -> G = Aggregate(records)                       (attribution.aggregate)
    -> A_{k+1} = Select(G, D_k)                     (selection strategies)
    -> controlled expansion of D (optional)         (expansion.*)
    -> close stage k with y (this batch's summary), open stage k+1 with A_{k+1}.

Between updates `reward` gives R(tau) = R_o(tau) + mean of the defined active
judgments (see `reward` for NA/INVALID). Capabilities admitted by expansion
become candidates from the next update on (they have no attribution yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rwcore.judged import reward_view
from rwcore.rewardweaver._util import check_metrics, make_rng, rng_state
from rwcore.rewardweaver.attribution import (
    RANK_BY,
    AggregatedFailures,
    AttributionResult,
    LowOutcomeRule,
    Retriever,
    aggregate,
    attribute,
    low_outcome_mask,
    verdict_retriever,
)
from rwcore.rewardweaver.expansion import CaseProvider, ExpansionResult, expand_library, find_expansion_triggers
from rwcore.rewardweaver.history import RewardHistory, StageRecord
from rwcore.rewardweaver.history import _parse as _parse_history
from rwcore.rewardweaver.judgments import judge_failure_rates, judgment_matrix, within_group_variation
from rwcore.rewardweaver.library import CapabilityLibrary
from rwcore.rewardweaver.library import _parse_state as _parse_library
from rwcore.rewardweaver.reward import NORMALIZATIONS, process_reward, process_terms
from rwcore.rewardweaver.selection import (
    DEFAULT_BUDGET,
    RELEASING_STRATEGIES,
    Selection,
    SelectionInput,
    SelectionStrategy,
    make_strategy,
)
from rwcore.types import Attributor, CapabilityProposer, EvaluatorReviser, Judge, JudgeReport, RubricSpec, Trajectory
from rwcore.validation import check_int, check_trajectories, check_unit

_FORMAT = "rwcore.reward_weaver"
_VERSION = 1


@dataclass(frozen=True)
class StageUpdate:
    """What one `update` did (nothing of it is stored beyond the history record).

    stage: the new stage k+1; active / previous: A_{k+1} / A_k.
    selection: the strategy's decision. low_outcome: ids of the low-outcome cohort.
    attribution / failures: attribution and its aggregate on the diagnosis cohort (None when not run).
    success_attribution / successes: the same on the success trajectories (contrast strategy).
    judge_fail_rates: capability -> judge FAIL rate among low-outcome trajectories (when reports were given).
    expansion: controlled expansion's result (None when not configured).
    closed: the record of the stage this update closed (None on the first update); opened: the new one.
    """

    stage: int
    active: tuple[str, ...]
    previous: tuple[str, ...]
    selection: Selection
    low_outcome: tuple[str, ...]
    attribution: AttributionResult | None
    failures: AggregatedFailures | None
    success_attribution: AttributionResult | None
    successes: AggregatedFailures | None
    judge_fail_rates: Mapping[str, float] | None
    expansion: ExpansionResult | None
    closed: StageRecord | None
    opened: StageRecord


class RewardWeaver:
    """Holds the capability library, the active set and the reward history; runs the outer loop.

    Args:
        library: the validated capability space D (grows only through admission).
        attributor: an `rwcore.types.Attributor`; required by strategies that attribute.
        strategy: a name from `selection.STRATEGIES` or a strategy object ["attribution"].
        release_uninformative: for a strategy given by name that attributes ("attribution",
            "random_trajectory"): pass over failure modes whose judgment varies within no rollout group of
            the update's batch, releasing their slots (`selection.AttributionSelect`) [False, the paper's
            Select as written]. Needs reports at every update.
        budget: B, the most capabilities active at once [6].
        low_outcome: q_o, a threshold (low when R_o < threshold) or a callable
            (outcome, trajectory) -> bool [0.5].
        min_confidence: attribution records below it are rejected [0.5].
        min_support: a failure mode is recurrent on >= this many distinct trajectories [3].
        rank_by: how recurrent failure modes are ranked for selection: "rate" (deficit rate among the
            trajectories a capability was a candidate for, then support) or "support" (trajectories
            blamed) ["rate"]; see `rwcore.rewardweaver.attribution`.
        retrieve: candidate retrieval per failed trajectory: "verdicts" (default) takes the
            capabilities the judge found applicable to it in the update's reports (FAIL, then
            INVALID, then PASS, library order within each, at most `max_candidates`); "all" gives
            every capability to every trajectory; or a callable (trajectory, rubrics) -> ids.
            Without reports "verdicts" falls back to "all".
        max_candidates: the most candidates "verdicts" retrieval hands the attributor [8].
        analyze_cohorts: at every update also attribute the low-outcome cohort (when the strategy
            would not) and up to `max_success_attributions` success trajectories, and record both
            cohorts' deficit rates (appendix E's F_fail and F_succ; analysis only - selection never
            reads the success side unless the strategy is the success-failure contrast).
        initial_active: when given, stage 0 opens at step 0 with this active set;
            otherwise stage 0 opens at the first `update` (outcome-only reward until then).
        max_success_attributions: cap on success trajectories attributed for the contrast
            strategy (drawn with the seeded generator); None attributes all of them.
        proposer, evaluator, acceptance_cases: controlled expansion; all three or none.
            acceptance_cases(candidate) gives the labelled cases for its admission test.
        max_new: candidates asked of the proposer per update [2].
        min_recurrence: an uncovered failure recurs on >= this many trajectories [min_support].
        reviser, max_revisions: evaluator revision on a rejected candidate's development partition
            before it is re-tested on the held-out partition (`acceptance_test`).
        empty_value: process term of a trajectory with no defined active judgment [0.0].
        normalize: the process term's normalization, "active_set" (1/|A|, NA / INVALID count 0) or
            "applicable" (mean over defined judgments); see rewardweaver.reward ["active_set"].
        seed: seeds the generator used by "random", "random_trajectory" and success sampling.
    """

    def __init__(
        self,
        library: CapabilityLibrary,
        attributor: Attributor | None = None,
        *,
        strategy: str | SelectionStrategy = "attribution",
        release_uninformative: bool = False,
        budget: int = DEFAULT_BUDGET,
        low_outcome: LowOutcomeRule = 0.5,
        min_confidence: float = 0.5,
        min_support: int = 3,
        rank_by: str = "rate",
        retrieve: str | Retriever = "verdicts",
        max_candidates: int = 8,
        analyze_cohorts: bool = False,
        initial_active: Sequence[str] | None = None,
        max_success_attributions: int | None = None,
        proposer: CapabilityProposer | None = None,
        evaluator: Judge | None = None,
        acceptance_cases: CaseProvider | None = None,
        max_new: int = 2,
        min_recurrence: int | None = None,
        reviser: EvaluatorReviser | None = None,
        max_revisions: int = 1,
        empty_value: float = 0.0,
        normalize: str = "active_set",
        seed: int = 0,
    ) -> None:
        if not isinstance(library, CapabilityLibrary):
            raise ValueError(f"library must be a CapabilityLibrary, got {type(library).__name__}")
        if attributor is not None and not isinstance(attributor, Attributor):
            raise ValueError("attributor must implement rwcore.types.Attributor (an attribute method)")
        if not isinstance(release_uninformative, bool):
            raise ValueError(f"release_uninformative must be True or False, got {release_uninformative!r}")
        if release_uninformative and not (isinstance(strategy, str) and strategy in RELEASING_STRATEGIES):
            raise ValueError(
                f"release_uninformative=True applies to the strategies {RELEASING_STRATEGIES} given by name, "
                f"got {strategy if isinstance(strategy, str) else type(strategy).__name__!r}"
            )
        options = {"release_uninformative": True} if release_uninformative else {}
        self._strategy = make_strategy(strategy, **options) if isinstance(strategy, str) else strategy
        if not all(hasattr(self._strategy, name) for name in ("select", "requires", "diagnosis_mask", "state_dict")):
            raise ValueError("strategy must be a strategy name or an object with the selection interface")
        if callable(low_outcome):
            q_o_config = "callable"
        else:
            low_outcome_mask([], low_outcome)  # validates the threshold
            q_o_config = float(low_outcome)
        expansion_parts = (proposer, evaluator, acceptance_cases)
        if any(part is not None for part in expansion_parts) and not all(part is not None for part in expansion_parts):
            raise ValueError("proposer, evaluator and acceptance_cases must be given together (controlled expansion)")
        if proposer is not None and not isinstance(proposer, CapabilityProposer):
            raise ValueError("proposer must implement rwcore.types.CapabilityProposer")
        if evaluator is not None and not isinstance(evaluator, Judge):
            raise ValueError("evaluator must implement rwcore.types.Judge")
        if reviser is not None and not isinstance(reviser, EvaluatorReviser):
            raise ValueError("reviser must implement rwcore.types.EvaluatorReviser (revise_evaluator)")
        self._reviser = reviser
        if retrieve is None:
            retrieve = "all"
        if not callable(retrieve) and retrieve not in ("verdicts", "all"):
            raise ValueError(
                f"retrieve must be 'verdicts', 'all' or a callable (trajectory, rubrics) -> capability "
                f"ids, got {retrieve!r}"
            )
        self._library = library
        self._attributor = attributor
        self._low_outcome = low_outcome
        self._retrieve = retrieve
        self._proposer, self._evaluator, self._acceptance_cases = expansion_parts
        min_support = check_int(min_support, "min_support", low=1)
        self._config = {
            "strategy": self._strategy.name,
            "release_uninformative": release_uninformative,
            "budget": check_int(budget, "budget", low=1),
            "low_outcome": q_o_config,
            "min_confidence": check_unit(min_confidence, "min_confidence"),
            "min_support": min_support,
            "rank_by": rank_by,
            "max_success_attributions": None
            if max_success_attributions is None
            else check_int(max_success_attributions, "max_success_attributions", low=0),
            "expansion": proposer is not None,
            "retrieve": retrieve if isinstance(retrieve, str) else "callable",
            "max_candidates": check_int(max_candidates, "max_candidates", low=1),
            "analyze_cohorts": bool(analyze_cohorts),
            "max_new": check_int(max_new, "max_new", low=0),
            "min_recurrence": min_support
            if min_recurrence is None
            else check_int(min_recurrence, "min_recurrence", low=1),
            "max_revisions": check_int(max_revisions, "max_revisions", low=0),
            "empty_value": float(empty_value),
            "normalize": normalize,
            "seed": check_int(seed, "seed", low=0),
        }
        if rank_by not in RANK_BY:
            raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        if not np.isfinite(self._config["empty_value"]):
            raise ValueError(f"empty_value must be finite, got {empty_value!r}")
        self._rng = np.random.default_rng(self._config["seed"])
        self._history = RewardHistory()
        if initial_active is not None:
            active = library.check_ids(initial_active, "initial_active")
            if len(active) > self._config["budget"]:
                raise ValueError(f"initial_active has {len(active)} capabilities, more than budget {budget}")
            self._history.open_stage(
                StageRecord(
                    stage=0,
                    active=active,
                    active_hashes={cid: library[cid].content_hash for cid in active},
                    strategy="initial",
                    reason="initial active set (given)",
                    start_step=0,
                )
            )

    # -- reading -------------------------------------------------------------------

    @property
    def library(self) -> CapabilityLibrary:
        return self._library

    @property
    def history(self) -> RewardHistory:
        return self._history

    @property
    def strategy(self) -> SelectionStrategy:
        return self._strategy

    @property
    def config(self) -> dict:
        return dict(self._config)

    @property
    def active(self) -> tuple[str, ...]:
        """A_k, the current active set (empty before the first stage opens)."""
        current = self._history.current
        return current.active if current is not None else ()

    @property
    def stage(self) -> int | None:
        current = self._history.current
        return current.stage if current is not None else None

    def active_rubrics(self) -> list[RubricSpec]:
        """The RubricSpecs a Judge must evaluate for this stage's process reward."""
        return self._library.rubrics(self.active) if self.active else []

    def reward(self, trajectories: Sequence[Trajectory], reports: Sequence[JudgeReport]) -> np.ndarray:
        """R(tau) for each trajectory under the current active set (float64 [N]).

        reports[i] must be trajectories[i]'s JudgeReport. An INVALID (or missing) active judgment
        counts as a FAIL (0) under both normalizations - invalidity never pays; NA counts 0 under
        normalize="active_set" and is left out of the mean under "applicable"; a trajectory without
        any applicable active judgment gets `empty_value` as its process term (see rewardweaver.reward).
        """
        trajectories = check_trajectories(trajectories, need_ids=True, finite_outcomes=True)
        values, codes = judgment_matrix(reports, self.active, trajectory_ids=[t.trajectory_id for t in trajectories])
        outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
        return process_reward(
            outcomes,
            reward_view(values, codes),
            normalize=self._config["normalize"],
            empty_value=self._config["empty_value"],
        )

    # -- the outer-loop update ------------------------------------------------------

    def update(
        self,
        trajectories: Sequence[Trajectory],
        reports: Sequence[JudgeReport] | None = None,
        *,
        step: int,
        performance: Mapping[str, float] | None = None,
    ) -> StageUpdate:
        """One outer-loop update from a batch of on-policy trajectories (all or nothing).

        trajectories: the batch (distinct non-empty trajectory ids, finite outcomes).
        reports: optional judge reports (reports[i] for trajectories[i]) or a `rwcore.JudgedBatch`
            over the whole library; required by "dynamic_topk" (judgments of library capabilities
            on the low-outcome trajectories). Used for candidate retrieval, the performance
            summary and uncovered-behaviour expansion triggers.
        step: the optimizer step; the open stage ends and the new one starts here.
        performance: extra finite numbers for y_k (must not reuse the built-in keys).
        """
        trajectories = check_trajectories(trajectories, need_ids=True, finite_outcomes=True)
        if not trajectories:
            raise ValueError("trajectories must not be empty")
        step = check_int(step, "step", low=0)
        current = self._history.current
        if current is not None and step < current.start_step:
            raise ValueError(f"step {step} is before the current stage's start_step {current.start_step}")
        extra = check_metrics(performance, "performance")
        needs = self._strategy.requires()
        if needs & {"attribution", "success_attribution"} and self._attributor is None:
            raise ValueError(f"attributor is required by the {self._strategy.name!r} strategy")
        ids = [t.trajectory_id for t in trajectories]
        library_ids = self._library.ids()
        values = codes = None
        if reports is not None:
            values, codes = judgment_matrix(reports, library_ids, trajectory_ids=ids)
        elif "judgments" in needs:
            raise ValueError(f"reports are required by the {self._strategy.name!r} strategy")

        low = low_outcome_mask(trajectories, self._low_outcome)
        rng = make_rng(rng_state(self._rng))
        retrieve = self._retriever(ids, library_ids, codes)
        attribution = failures = success_attribution = successes = None
        if "attribution" in needs or self._config["analyze_cohorts"]:
            if self._attributor is None:
                raise ValueError("attributor is required to analyze the low-outcome cohort (analyze_cohorts)")
            diagnose = np.asarray(self._strategy.diagnosis_mask(low, rng), dtype=bool)
            if diagnose.shape != low.shape:
                raise ValueError("strategy.diagnosis_mask returned a mask of the wrong shape")
            attribution, failures = self._attribute([t for t, m in zip(trajectories, diagnose) if m], retrieve)
        if "success_attribution" in needs or self._config["analyze_cohorts"]:
            if self._attributor is None:
                raise ValueError("attributor is required to analyze success trajectories (analyze_cohorts)")
            success = np.flatnonzero(~low)
            cap = self._config["max_success_attributions"]
            if cap is not None and success.size > cap:
                success = np.sort(rng.choice(success, size=cap, replace=False))
            success_attribution, successes = self._attribute([trajectories[i] for i in success], retrieve)
        fail_rates = variation = None
        if codes is not None:
            rates, _ = judge_failure_rates(codes, low)
            fail_rates = {cid: float(rate) for cid, rate in zip(library_ids, rates)}
            shares = within_group_variation(reward_view(values, codes), [t.group_id or t.task_id for t in trajectories])
            variation = {cid: float(share) for cid, share in zip(library_ids, shares)}

        previous = self.active
        strategy_state = self._strategy.state_dict()
        try:
            selection = self._strategy.select(
                SelectionInput(
                    library_ids=library_ids,
                    budget=self._config["budget"],
                    previous=tuple(cid for cid in previous if cid in set(library_ids)),
                    failures=failures if "attribution" in needs else None,
                    successes=successes if "success_attribution" in needs else None,
                    judge_fail_rates=fail_rates,
                    within_group_variation=variation,
                    rng=rng,
                )
            )
            active = self._library.check_ids(selection.active, "selection.active")
            if len(active) > self._config["budget"]:
                raise ValueError(
                    f"strategy selected {len(active)} capabilities, more than budget {self._config['budget']}"
                )
            expansion = None
            if self._proposer is not None:
                cohort = [t for t, m in zip(trajectories, low) if m]
                cohort_attribution = attribution if self._strategy.name not in ("random_trajectory",) else None
                triggers = find_expansion_triggers(
                    cohort,
                    attribution=cohort_attribution,
                    reports=reports,
                    min_recurrence=self._config["min_recurrence"],
                )
                expansion = expand_library(
                    self._library,
                    self._proposer,
                    triggers,
                    cohort,
                    self._evaluator,
                    self._acceptance_cases,
                    max_new=self._config["max_new"],
                    commit=False,
                    reviser=self._reviser,
                    max_revisions=self._config["max_revisions"],
                )
            summary = self._performance(trajectories, low, reports, extra)
            diagnosis = self._diagnosis(
                len(trajectories), low, attribution, failures, success_attribution, successes, fail_rates, variation
            )
            if expansion is not None:
                diagnosis["expansion"] = expansion.summary()
        except BaseException:
            self._strategy.load_state_dict(strategy_state)
            raise

        # Commit: nothing below can fail on valid state.
        if expansion is not None and expansion.entries:
            self._library.add_admitted(expansion.entries)
        closed = self._history.close_stage(step, summary) if current is not None else None
        opened = StageRecord(
            stage=len(self._history),
            active=active,
            active_hashes={cid: self._library[cid].content_hash for cid in active},
            strategy=selection.strategy,
            reason=selection.reason,
            start_step=step,
            failure_modes=tuple(m.summary() for m in failures.modes) if failures is not None else (),
            diagnosis=diagnosis,
            admitted=expansion.admitted if expansion is not None else (),
        )
        self._history.open_stage(opened)
        self._rng = rng
        return StageUpdate(
            stage=opened.stage,
            active=active,
            previous=previous,
            selection=selection,
            low_outcome=tuple(i for i, m in zip(ids, low) if m),
            attribution=attribution,
            failures=failures,
            success_attribution=success_attribution,
            successes=successes,
            judge_fail_rates=fail_rates,
            expansion=expansion,
            closed=closed,
            opened=opened,
        )

    def _retriever(
        self, trajectory_ids: Sequence[str], library_ids: Sequence[str], codes: np.ndarray | None
    ) -> Retriever | None:
        """The update's candidate retrieval (None: every capability is a candidate)."""
        if callable(self._retrieve):
            return self._retrieve
        if self._retrieve == "all" or codes is None:
            return None
        return verdict_retriever(trajectory_ids, library_ids, codes, self._config["max_candidates"])

    def _attribute(
        self, cohort: list[Trajectory], retrieve: Retriever | None
    ) -> tuple[AttributionResult, AggregatedFailures]:
        result = attribute(
            cohort, self._library, self._attributor, retrieve=retrieve, min_confidence=self._config["min_confidence"]
        )
        return result, aggregate(result, min_support=self._config["min_support"], rank_by=self._config["rank_by"])

    def _performance(self, trajectories, low, reports, extra) -> dict:
        outcomes = np.array([t.outcome for t in trajectories], dtype=np.float64)
        summary = {
            "trajectories": len(trajectories),
            "mean_outcome": float(outcomes.mean()),
            "low_outcome_rate": float(low.mean()),
        }
        if reports is not None and self.active:
            active_values, active_codes = judgment_matrix(reports, self.active)
            term, count = process_terms(reward_view(active_values, active_codes), normalize=self._config["normalize"])
            defined = count > 0
            summary["mean_process_term"] = float(term[defined].mean()) if defined.any() else None
        clash = set(extra) & set(summary)
        if clash:
            raise ValueError(f"performance must not reuse the built-in keys {sorted(clash)}")
        summary.update(extra)
        return summary

    def _diagnosis(self, n, low, attribution, failures, success_attribution, successes, fail_rates, variation) -> dict:
        library_ids = self._library.ids()
        diagnosis: dict = {"trajectories": n, "low_outcome": int(low.sum())}
        if attribution is not None:
            frequencies = failures.frequencies()
            diagnosis.update(
                diagnosed=attribution.n_diagnosed,
                failure_rates={cid: frequencies.get(cid, 0.0) for cid in library_ids}
                if attribution.n_diagnosed
                else {},
                rejections=attribution.rejection_counts(),
                unattributed=len(attribution.unattributed),
                external=len(attribution.external),
            )
        if success_attribution is not None:
            frequencies = successes.frequencies()
            diagnosis.update(
                success_diagnosed=success_attribution.n_diagnosed,
                success_rates={cid: frequencies.get(cid, 0.0) for cid in library_ids}
                if success_attribution.n_diagnosed
                else {},
            )
        if fail_rates is not None:
            diagnosis["judge_fail_rates"] = {cid: r for cid, r in fail_rates.items() if np.isfinite(r)}
        if variation is not None:
            diagnosis["within_group_variation"] = {cid: r for cid, r in variation.items() if np.isfinite(r)}
        return diagnosis

    # -- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-serializable: config, library (entries with hashes), history, strategy state, generator."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "config": dict(self._config),
            "library": self._library.state_dict(),
            "history": self._history.state_dict(),
            "strategy": self._strategy.state_dict(),
            "rng": rng_state(self._rng),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restores a `state_dict` exactly; everything is checked before anything changes.

        The weaver must have been built with the same configuration (a differing key is a
        ValueError naming it); every library hash is verified, and every stage's active
        hashes must match the library.
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT or state.get("version") != _VERSION:
            raise ValueError(f"state must be a {_FORMAT!r} version {_VERSION} mapping")
        config = state.get("config")
        if not isinstance(config, Mapping):
            raise ValueError("state config must be a mapping")
        # a state saved before rank_by existed ranked by support
        config = {"rank_by": "support", **config}
        # a state saved before release_uninformative existed selected by the paper's rule
        config = {"release_uninformative": False, **config}
        for key in sorted(set(config) | set(self._config)):
            if config.get(key) != self._config.get(key):
                raise ValueError(
                    f"state config {key!r} is {config.get(key)!r} but this weaver has {self._config.get(key)!r}"
                )
        _, entries, _ = _parse_library(state.get("library"))
        stages = _parse_history(state.get("history"))
        hashes = {entry.capability_id: entry.content_hash for entry in entries}
        for record in stages:
            for cid in record.active:
                if hashes.get(cid) != record.active_hashes.get(cid):
                    raise ValueError(
                        f"state history stage {record.stage}: capability {cid!r} does not match the library entry"
                    )
        rng = make_rng(state.get("rng"))
        self._strategy.load_state_dict(state.get("strategy"))
        # Both were parsed above, so neither can fail now.
        self._library.load_state_dict(state["library"])
        self._history.load_state_dict(state["history"])
        self._rng = rng
