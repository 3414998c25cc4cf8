"""`Select`: the budgeted active set A_{k+1} = Select(G_{k+1}, D_k) (RewardWeaver §2.4, §3.2).

Every strategy is a small class with the same interface:

- `name`: the strategy's id (one of STRATEGIES).
- `requires()`: which evidence `select` reads, a subset of
  {"attribution", "success_attribution", "judgments"}; a driver gathers only that.
- `diagnosis_mask(low_mask, rng)`: which trajectories attribution runs on
  (the low-outcome cohort, except for "random_trajectory").
- `select(inputs: SelectionInput) -> Selection`.
- `state_dict()` / `load_state_dict(state)`: JSON-safe (only "static_topk" has state).

Strategies (the paper's method, baselines and ablations):

- "attribution" (default): recurrent attributed failure modes in the order
  `aggregate` ranked them (deficit rate, then support, by default; see
  `rwcore.rewardweaver.attribution`); the top `budget`. With
  `release_uninformative=True` a mode whose judgment did not vary within any
  rollout group of the stage's batch (the policy fails - or passes - it in every
  trajectory of every group) holds no slot: it carries no group-normalized credit,
  so its capacity is released to the next informative failure mode (section 2.4,
  "capacity is released for newly dominant failures"). When no recurrent mode
  varies, the paper's choice is kept.
- "static_topk": a fixed top-K from an initial ranking (given, or frozen from
  the first call's attribution ranking); the same set at every stage.
- "random": `budget` capabilities drawn uniformly without replacement from the
  library with the driver's seeded generator, every stage.
- "dynamic_topk": top `budget` by judge FAIL rate among the low-outcome
  trajectories (no attribution, no evidence localization); rates of 0 or
  undefined are not selected.
- "random_trajectory": attribution ranking as "attribution", but attribution
  runs on trajectories drawn at random (as many as the low-outcome cohort, or
  `sample_size`) instead of the low-outcome cohort.
- "success_failure_contrast": attribution also runs on the success
  trajectories; recurrent failure modes are ranked by F_fail - F_succ (each
  the attributed frequency in its cohort), keeping positive contrasts.

When a strategy finds nothing to select, the previous active set is kept
(`keep_previous_when_empty=True`, the default; the reason says so) — no
recurrent evidence is not evidence that the current bottlenecks receded.
With `keep_previous_when_empty=False` the active set becomes empty and the
reward is outcome-only for that stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rwcore.rewardweaver.attribution import AggregatedFailures
from rwcore.validation import check_ids, check_int

STRATEGIES: tuple[str, ...] = (
    "attribution",
    "static_topk",
    "random",
    "dynamic_topk",
    "random_trajectory",
    "success_failure_contrast",
)
DEFAULT_BUDGET = 6
RELEASING_STRATEGIES: tuple[str, ...] = ("attribution", "random_trajectory")
"""The strategies that rank attributed failure modes, and so can release the uninformative ones."""


@dataclass(frozen=True)
class SelectionInput:
    """Everything a strategy may read.

    library_ids: D_k, the selectable capability ids (library order).
    budget: B, the most capabilities active at once [6].
    previous: the current active set (kept when nothing is found, see module doc).
    failures: aggregated attribution on the diagnosis cohort (low-outcome
        trajectories; random ones for "random_trajectory").
    successes: aggregated attribution on the success trajectories ("success_failure_contrast").
    judge_fail_rates: capability -> judge FAIL rate among low-outcome trajectories
        (NaN when it never applied) ("dynamic_topk").
    within_group_variation: capability -> share of the batch's rollout groups in which its
        judgment varies (NaN when it never had two defined judgments in a group)
        ("attribution" with release_uninformative).
    rng: the driver's generator ("random").
    """

    library_ids: tuple[str, ...]
    budget: int = DEFAULT_BUDGET
    previous: tuple[str, ...] = ()
    failures: AggregatedFailures | None = None
    successes: AggregatedFailures | None = None
    judge_fail_rates: Mapping[str, float] | None = None
    within_group_variation: Mapping[str, float] | None = None
    rng: np.random.Generator | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        ids = check_ids(self.library_ids, "library_ids")
        object.__setattr__(self, "library_ids", ids)
        check_int(self.budget, "budget", low=1)
        object.__setattr__(self, "previous", check_ids(self.previous, "previous"))
        known = set(ids)
        for name in ("failures", "successes"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, AggregatedFailures):
                raise ValueError(f"{name} must be AggregatedFailures, got {type(value).__name__}")
            for mode in value.modes + value.below_support:
                if mode.capability_id not in known:
                    raise ValueError(f"{name} names capability {mode.capability_id!r}, which is not in library_ids")
        for name in ("judge_fail_rates", "within_group_variation"):
            rates = getattr(self, name)
            if rates is None:
                continue
            if not isinstance(rates, Mapping):
                raise ValueError(f"{name} must be a mapping of capability id -> rate")
            for cid, rate in rates.items():
                if cid not in known:
                    raise ValueError(f"{name} names capability {cid!r}, which is not in library_ids")
                rate = float(rate)
                if not (math.isnan(rate) or 0.0 <= rate <= 1.0):
                    raise ValueError(f"{name}[{cid!r}] = {rate!r} is outside [0, 1]")
        if self.rng is not None and not isinstance(self.rng, np.random.Generator):
            raise ValueError("rng must be a numpy.random.Generator")


@dataclass(frozen=True)
class Selection:
    """A chosen active set: ids (in priority order), the strategy, why, and the scores it ranked by."""

    active: tuple[str, ...]
    strategy: str
    reason: str
    scores: Mapping[str, float] = field(default_factory=dict)


def _need(inputs: SelectionInput, name: str, strategy: str):
    value = getattr(inputs, name)
    if value is None:
        raise ValueError(f"inputs.{name} is required by the {strategy!r} strategy")
    return value


def _finish(
    strategy: str,
    ranked: Sequence[str],
    scores: Mapping[str, float],
    inputs: SelectionInput,
    what: str,
    keep_previous: bool,
) -> Selection:
    active = tuple(ranked[: inputs.budget])
    if active:
        shown = ", ".join(f"{cid} ({scores[cid]:.3g})" for cid in active)
        return Selection(active, strategy, f"{what}: {shown}", dict(scores))
    if keep_previous:
        kept = tuple(cid for cid in inputs.previous if cid in set(inputs.library_ids))
        return Selection(kept, strategy, f"no {what}; previous active set kept", dict(scores))
    return Selection((), strategy, f"no {what}; active set emptied (outcome-only reward)", dict(scores))


class _Stateless:
    name = ""

    def requires(self) -> frozenset[str]:
        return frozenset()

    def diagnosis_mask(self, low_mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(low_mask, dtype=bool).copy()

    def state_dict(self) -> dict:
        return {"name": self.name}

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("name") != self.name:
            raise ValueError(f"strategy state is not a {self.name!r} state")


class AttributionSelect(_Stateless):
    """RewardWeaver: the top `budget` recurrent attributed failure modes.

    release_uninformative: False (the paper's Select as written): the top `budget` modes whatever their
        judgments. True: modes whose judgment varied within no rollout group of the batch
        (`SelectionInput.within_group_variation` = 0, or NaN: never two defined judgments in a group) are
        passed over, so their slots go to the next informative modes; when none varies the paper's choice
        stands. A deterministic policy that fails a rubric in every trajectory gets no credit from it: such a
        set leaves every group without variance and training without a gradient.
    """

    name = "attribution"

    def __init__(self, keep_previous_when_empty: bool = True, release_uninformative: bool = False) -> None:
        if not isinstance(release_uninformative, bool):
            raise ValueError(f"release_uninformative must be True or False, got {release_uninformative!r}")
        self.keep_previous_when_empty = bool(keep_previous_when_empty)
        self.release_uninformative = release_uninformative

    def requires(self) -> frozenset[str]:
        return frozenset({"attribution", "judgments"}) if self.release_uninformative else frozenset({"attribution"})

    def select(self, inputs: SelectionInput) -> Selection:
        failures: AggregatedFailures = _need(inputs, "failures", self.name)
        by_rate = failures.rank_by == "rate"
        scores = {m.capability_id: float(m.rate if by_rate else m.support) for m in failures.modes}
        ranked = failures.ranking()
        what = (
            f"recurrent attributed failure modes (support >= {failures.min_support} "
            f"of {failures.cohort_size}, ranked by {'deficit rate' if by_rate else 'support'})"
        )
        if self.release_uninformative:
            variation = _need(inputs, "within_group_variation", self.name)
            informative = [cid for cid in ranked if float(variation.get(cid, math.nan)) > 0.0]
            released = [cid for cid in ranked[: inputs.budget] if cid not in informative]
            if informative and released:
                ranked = informative
                what += f" (released, judged alike within every group: {', '.join(released)})"
            elif released:
                what += " (none is judged differently within a group: none released)"
        return _finish(self.name, ranked, scores, inputs, what, self.keep_previous_when_empty)


class RandomTrajectoryAttribution(AttributionSelect):
    """Ablation: attribution on randomly chosen trajectories instead of the low-outcome cohort.

    sample_size: trajectories drawn (without replacement, all trajectories
        eligible); None draws as many as the low-outcome cohort holds.
    """

    name = "random_trajectory"

    def __init__(
        self, sample_size: int | None = None, keep_previous_when_empty: bool = True, release_uninformative: bool = False
    ) -> None:
        super().__init__(keep_previous_when_empty, release_uninformative)
        self.sample_size = None if sample_size is None else check_int(sample_size, "sample_size", low=0)

    def diagnosis_mask(self, low_mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        low_mask = np.asarray(low_mask, dtype=bool)
        n = low_mask.shape[0]
        size = int(low_mask.sum()) if self.sample_size is None else min(self.sample_size, n)
        mask = np.zeros(n, dtype=bool)
        mask[rng.choice(n, size=size, replace=False)] = True
        return mask

    def select(self, inputs: SelectionInput) -> Selection:
        selection = super().select(inputs)
        return Selection(
            selection.active,
            self.name,
            selection.reason.replace(
                "recurrent attributed failure modes", "recurrent attributed modes on random trajectories", 1
            ),
            selection.scores,
        )


class StaticTopK:
    """Baseline: a fixed top-K (K = budget) that never changes.

    ranking: the initial capability ranking; None freezes the first call's
        attribution ranking (recurrent modes, then the ones below the support
        threshold) and then needs no more evidence.
    """

    name = "static_topk"

    def __init__(self, ranking: Sequence[str] | None = None) -> None:
        self._ranking = None if ranking is None else check_ids(ranking, "ranking")
        if self._ranking is not None and not self._ranking:
            raise ValueError("ranking must not be empty")

    @property
    def ranking(self) -> tuple[str, ...] | None:
        return self._ranking

    def requires(self) -> frozenset[str]:
        return frozenset({"attribution"}) if self._ranking is None else frozenset()

    def diagnosis_mask(self, low_mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(low_mask, dtype=bool).copy()

    def select(self, inputs: SelectionInput) -> Selection:
        ranking = self._ranking
        if ranking is None:
            failures: AggregatedFailures = _need(inputs, "failures", self.name)
            ranking = failures.ranking() + tuple(m.capability_id for m in failures.below_support)
            if not ranking:
                # Nothing to freeze yet: keep what is active and try again next stage.
                return Selection(
                    inputs.previous,
                    self.name,
                    "no attributed failure modes to freeze a ranking from; previous active set kept",
                    {},
                )
        known = set(inputs.library_ids)
        for cid in ranking:
            if cid not in known:
                raise ValueError(f"static ranking names capability {cid!r}, which is not in library_ids")
        self._ranking = ranking
        active = ranking[: inputs.budget]
        scores = {cid: float(len(ranking) - r) for r, cid in enumerate(ranking)}
        return Selection(
            active, self.name, f"static top-{inputs.budget} of a fixed ranking: {', '.join(active)}", scores
        )

    def state_dict(self) -> dict:
        return {"name": self.name, "ranking": None if self._ranking is None else list(self._ranking)}

    def load_state_dict(self, state: Mapping) -> None:
        if not isinstance(state, Mapping) or state.get("name") != self.name:
            raise ValueError(f"strategy state is not a {self.name!r} state")
        ranking = state.get("ranking")
        self._ranking = None if ranking is None else check_ids(ranking, "strategy state ranking")


class RandomActiveSet(_Stateless):
    """Baseline: `budget` capabilities drawn uniformly (seeded) at every stage."""

    name = "random"

    def select(self, inputs: SelectionInput) -> Selection:
        rng = _need(inputs, "rng", self.name)
        ids = inputs.library_ids
        size = min(inputs.budget, len(ids))
        picks = rng.choice(len(ids), size=size, replace=False) if size else np.zeros(0, dtype=int)
        active = tuple(ids[int(j)] for j in picks)
        return Selection(
            active,
            self.name,
            f"random active set: {', '.join(active) or '(empty library)'}",
            {cid: 1.0 for cid in active},
        )


class DynamicTopK(_Stateless):
    """Ablation: top `budget` by judge FAIL rate among the low-outcome trajectories (no attribution)."""

    name = "dynamic_topk"

    def __init__(self, keep_previous_when_empty: bool = True) -> None:
        self.keep_previous_when_empty = bool(keep_previous_when_empty)

    def requires(self) -> frozenset[str]:
        return frozenset({"judgments"})

    def select(self, inputs: SelectionInput) -> Selection:
        rates = _need(inputs, "judge_fail_rates", self.name)
        scores = {cid: float(rate) for cid, rate in rates.items() if not math.isnan(float(rate)) and float(rate) > 0.0}
        ranked = sorted(scores, key=lambda cid: (-scores[cid], cid))
        return _finish(
            self.name,
            ranked,
            scores,
            inputs,
            "judge failure frequency among low-outcome trajectories",
            self.keep_previous_when_empty,
        )


class SuccessFailureContrast(_Stateless):
    """Ablation: recurrent failure modes ranked by F_fail - F_succ (attribution on both cohorts)."""

    name = "success_failure_contrast"

    def __init__(self, keep_previous_when_empty: bool = True) -> None:
        self.keep_previous_when_empty = bool(keep_previous_when_empty)

    def requires(self) -> frozenset[str]:
        return frozenset({"attribution", "success_attribution"})

    def select(self, inputs: SelectionInput) -> Selection:
        failures: AggregatedFailures = _need(inputs, "failures", self.name)
        successes: AggregatedFailures = _need(inputs, "successes", self.name)
        succ = successes.frequencies()
        contrast = {m.capability_id: m.frequency - succ.get(m.capability_id, 0.0) for m in failures.modes}
        support = {m.capability_id: m.support for m in failures.modes}
        scores = {cid: value for cid, value in contrast.items() if value > 0.0}
        ranked = sorted(scores, key=lambda cid: (-scores[cid], -support[cid], cid))
        return _finish(
            self.name,
            ranked,
            scores,
            inputs,
            "positive failure-success contrast F_fail - F_succ",
            self.keep_previous_when_empty,
        )


SelectionStrategy = (
    AttributionSelect
    | RandomTrajectoryAttribution
    | StaticTopK
    | RandomActiveSet
    | DynamicTopK
    | SuccessFailureContrast
)

_CLASSES = {
    "attribution": AttributionSelect,
    "static_topk": StaticTopK,
    "random": RandomActiveSet,
    "dynamic_topk": DynamicTopK,
    "random_trajectory": RandomTrajectoryAttribution,
    "success_failure_contrast": SuccessFailureContrast,
}


def make_strategy(name: str, **options) -> SelectionStrategy:
    """A strategy by name (STRATEGIES); `options` go to its constructor."""
    if name not in _CLASSES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    try:
        return _CLASSES[name](**options)
    except TypeError as error:
        raise ValueError(f"strategy {name!r} does not take these options: {error}") from None


def select(strategy: str | SelectionStrategy, inputs: SelectionInput) -> Selection:
    """Functional form: `make_strategy(strategy).select(inputs)` for a name, else `strategy.select(inputs)`.

    A name builds a fresh strategy per call; keep the object across stages for
    "static_topk" without a given ranking (it freezes the first ranking it sees).
    """
    if isinstance(strategy, str):
        strategy = make_strategy(strategy)
    return strategy.select(inputs)
