"""The negotiation environment's programmatic pieces: rubric library, reflector, attributor, labelled cases.

Rules read the episode's private state from `trajectory.metadata["env_state"]` (the finished
Episode.state, see `negotiation.build_trajectory`); without it they replay the episode from
`metadata["task"]` (task.data), `metadata.get("task_id", trajectory.task_id)`,
`metadata.get("seed", 0)` and the assistant turns; with neither they raise (RuleJudge: INVALID).

Every rule returns True (PASS), False (FAIL) or None (NA: does not apply); `explain(rule_id,
trajectory)` also gives the evidence (a quote from the turns). RubricSpec.capability holds the
Arise category (Understanding, Execution, Verification, Debugging, Efficiency); Rule.family the
RewardWeaver family (pricing, information, persistence, boundaries, communication).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rwcore.trainer.envs.base import Rule, Task
from rwcore.trainer.envs.negotiation import (
    KINDS,
    NegotiationEnv,
    make_task_data,
    random_policy,
    run_episode,
    scripted_policy,
    parse_observation,
)
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory
from rwcore.verdict import Verdict

PRICE_VERBS = ("offer", "bundle")


# -- facts -------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _replay_env(max_turns: int) -> NegotiationEnv:
    return NegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=max_turns)


def episode_state(trajectory: Trajectory) -> dict:
    """The episode's private state (metadata["env_state"], else a replay); KeyError when neither works."""
    metadata = trajectory.metadata or {}
    state = metadata.get("env_state")
    if isinstance(state, dict) and "events" in state:
        return state
    data = metadata.get("task")
    if not isinstance(data, dict):
        raise KeyError("trajectory.metadata has neither 'env_state' nor 'task': cannot check negotiation rules")
    messages = [t.content for t in trajectory.turns if t.role == "assistant"]
    env = _replay_env(max(1, len(messages)))
    task = Task(str(metadata.get("task_id", trajectory.task_id)), tuple(trajectory.tags), data)
    episode = env.reset(task, int(metadata.get("seed", 0)))
    for message in messages:
        if episode.done:
            break
        episode = env.step(episode, message)
    return episode.state


def _events(s: dict) -> list[dict]:
    return list(s.get("events", []))


def _cost_of(s: dict, verb: str) -> int:
    if verb == "bundle" and s.get("bundle_cost") is not None:
        return int(s["bundle_cost"])
    return int(s["cost"])


def _last_text(s: dict) -> str:
    events = _events(s)
    return events[-1]["text"] if events else ""


# -- checks: state -> (True / False / None, evidence) ----------------------------------


def _never_sells_below_cost(s):
    deal = s.get("deal")
    if deal is None:
        return None, ""
    return deal["price"] >= deal["cost"], _last_text(s)


def _asks_budget_first(s):
    if s.get("hostile"):
        return None, ""
    events = _events(s)
    for i, e in enumerate(events):
        if e["verb"] in PRICE_VERBS + ("accept",):
            asked = any(prev["verb"] == "ask" for prev in events[:i])
            return asked, e["text"]
    return None, ""


def _ends_hopeless_negotiation(s):
    if s.get("feasible"):
        return None, ""
    ok = s.get("deal") is None and s.get("ended_by") == "agent"
    return ok, _last_text(s)


def _no_repeated_offer(s):
    offers = [(e["verb"], e["price"], e["text"]) for e in _events(s) if e["verb"] in PRICE_VERBS]
    if len(offers) < 2:
        return None, ""
    seen = set()
    for verb, price, text in offers:
        if (verb, price) in seen:
            return False, text
        seen.add((verb, price))
    return True, offers[-1][2]


def _counters_low_opening(s):
    events = _events(s)
    if not events or s["opening_offer"] >= s["cost"]:
        return None, ""
    return events[0]["verb"] != "accept", events[0]["text"]


def _takes_profitable_deal(s):
    if not s.get("winnable") or not s.get("feasible"):
        return None, ""
    deal = s.get("deal")
    return deal is not None and deal["price"] >= deal["cost"], _last_text(s)


def _offers_within_budget(s):
    events = _events(s)
    revealed = False
    for e in events:
        if revealed and e["verb"] in PRICE_VERBS:
            limit = s["bundle_budget"] if e["verb"] == "bundle" and s.get("bundle_budget") is not None else s["budget"]
            return e["price"] <= limit, e["text"]
        if e.get("reply") == "budget":
            revealed = True
    return None, ""


def _never_offers_below_cost(s):
    offers = [e for e in _events(s) if e["verb"] in PRICE_VERBS]
    if not offers:
        return None, ""
    for e in offers:
        if e["price"] < _cost_of(s, e["verb"]):
            return False, e["text"]
    return True, offers[-1]["text"]


def _offers_bundle_when_wanted(s):
    if s.get("bundle_cost") is None or s.get("hostile") or not s.get("feasible"):
        return None, ""
    events = _events(s)
    if not events:
        return None, ""
    for e in events:
        if e["verb"] == "bundle":
            return True, e["text"]
    return False, events[-1]["text"]


def _clear_actions(s):
    events = _events(s)
    if not events:
        return None, ""
    for e in events:
        if e["verb"] == "unclear" or e.get("reply") in ("no_bundle", "unclear"):
            return False, e["text"]
    return True, events[-1]["text"]


def _quick_close(s):
    if s.get("ended_by") not in ("deal", "agent"):
        return None, ""
    events = _events(s)
    return len(events) <= 2, events[-1]["text"] if events else ""


def _adapts_after_counter(s):
    events = _events(s)
    checked = None
    for e, nxt in zip(events, events[1:]):
        if e["verb"] in PRICE_VERBS and e.get("reply") in ("counter", "final", "wants_bundle"):
            stubborn = nxt["verb"] == e["verb"] and nxt["price"] >= e["price"]
            if stubborn:
                return False, nxt["text"]
            checked = nxt["text"]
    if checked is None:
        return None, ""
    return True, checked


@dataclass(frozen=True)
class RuleDef:
    rule_id: str
    criterion: str
    applicability: str
    category: str      # Arise capability category -> RubricSpec.capability
    family: str        # RewardWeaver family -> Rule.family
    check: Callable[[dict], tuple]


RULE_DEFS: tuple[RuleDef, ...] = (
    RuleDef("never_sells_below_cost", "a closed deal is at or above the cost of what was sold",
            "a deal was closed", "Verification", "boundaries", _never_sells_below_cost),
    RuleDef("asks_budget_first", "the seller asks the buyer's budget before its first offer or acceptance",
            "the seller made an offer or accepted, and the buyer is not hostile", "Understanding", "information",
            _asks_budget_first),
    RuleDef("ends_hopeless_negotiation", "when no profitable deal exists the seller ends the negotiation itself "
            "without selling", "the buyer's budget is below the cost (no_deal tasks)", "Understanding", "boundaries",
            _ends_hopeless_negotiation),
    RuleDef("no_repeated_offer", "the seller never makes the same offer twice", "the seller made two or more offers",
            "Efficiency", "persistence", _no_repeated_offer),
    RuleDef("counters_low_opening", "the seller does not accept an opening offer below cost",
            "the buyer's opening offer is below cost", "Execution", "persistence", _counters_low_opening),
    RuleDef("takes_profitable_deal", "the seller closes a deal at or above cost", "a profitable deal was achievable",
            "Execution", "pricing", _takes_profitable_deal),
    RuleDef("offers_within_budget", "the first offer after learning the budget is within that budget",
            "the budget was revealed and the seller offered afterwards", "Understanding", "information",
            _offers_within_budget),
    RuleDef("never_offers_below_cost", "every offer is at or above the cost of what is offered",
            "the seller made an offer", "Verification", "pricing", _never_offers_below_cost),
    RuleDef("offers_bundle_when_wanted", "the seller makes a bundle offer when the buyer wants a bundle",
            "bundle tasks where a profitable bundle exists", "Understanding", "pricing", _offers_bundle_when_wanted),
    RuleDef("clear_actions", "every seller message is a clear action the buyer can act on",
            "the seller said something", "Execution", "communication", _clear_actions),
    RuleDef("quick_close", "the seller concludes the negotiation within two turns",
            "the seller concluded it (deal or end)", "Efficiency", "persistence", _quick_close),
    RuleDef("adapts_after_counter", "after a counter the seller does not repeat or raise the same kind of offer",
            "the buyer countered an offer and the seller moved again", "Debugging", "persistence",
            _adapts_after_counter),
)
RULES_BY_ID: dict[str, RuleDef] = {r.rule_id: r for r in RULE_DEFS}

# Skill texts (in the environment's vocabulary); refine_skill cycles through the variants.
SKILLS: dict[str, tuple[str, ...]] = {
    "never_sells_below_cost": ("never sell below cost", "check cost before you accept",
                               "only accept a price above cost"),
    "asks_budget_first": ("ask budget before you offer", "first ask budget then offer", "ask the buyer budget first"),
    "ends_hopeless_negotiation": ("end when budget is below cost", "if budget is below cost say end",
                                  "end when no deal is possible"),
    "no_repeated_offer": ("never repeat the same offer", "change the price of each offer",
                          "do not offer the same price twice"),
    "counters_low_opening": ("do not accept the first low offer", "reject a first offer below cost",
                             "ask budget when the offer is low"),
    "takes_profitable_deal": ("close a deal when the price is above cost", "accept an offer above cost",
                              "do not end when a deal is possible"),
    "offers_within_budget": ("offer at the buyer budget not above", "offer the budget when it is above cost",
                             "never offer above the budget"),
    "never_offers_below_cost": ("never offer below cost", "offer at cost or above", "each offer must be above cost"),
    "offers_bundle_when_wanted": ("offer a bundle when the buyer wants bundle",
                                  "use bundle offer when the buyer wants bundle",
                                  "make a bundle offer at the bundle budget"),
    "clear_actions": ("use short clear actions", "say one action like offer or accept",
                      "use only offer accept reject ask budget end"),
    "quick_close": ("close the deal in two turns", "ask budget then offer at once", "do not waste turns"),
    "adapts_after_counter": ("lower the price after a counter", "when the buyer counters offer less",
                             "after a counter ask budget or accept"),
}


def rule_spec(rule: RuleDef) -> RubricSpec:
    return RubricSpec(rubric_id=rule.rule_id, criterion=rule.criterion, applicability=rule.applicability,
                      capability=rule.category, scored=False)


def _wrap(rule: RuleDef) -> Callable[[Trajectory], object]:
    def check(trajectory: Trajectory):
        return rule.check(episode_state(trajectory))[0]

    check.__name__ = f"check_{rule.rule_id}"
    check.__doc__ = rule.criterion
    return check


def explain(rule_id: str, trajectory: Trajectory) -> tuple[bool | None, str]:
    """(verdict as True/False/None, evidence quote) of one rule on one trajectory."""
    return RULES_BY_ID[rule_id].check(episode_state(trajectory))


def make_rules(env: NegotiationEnv | None = None) -> list[Rule]:
    return [Rule(spec=rule_spec(r), family=r.family, check=_wrap(r)) for r in RULE_DEFS]


def rule_judge_rules(env: NegotiationEnv | None = None) -> dict:
    """{rubric id: check} for rwcore.judges.RuleJudge."""
    return {rule.spec.rubric_id: rule.check for rule in make_rules(env)}


# -- reflector -------------------------------------------------------------------------


class NegotiationReflector:
    """Arise's reflection model and RewardWeaver's proposers without an LLM.

    rwcore.types.RubricReflector - propose_rubric_skills: rules not in `existing` that FAIL on at
    least `min_fail_rate` of the trajectories where they apply (and at least once), most failures
    first (ties: library order), with the rule's first skill text; its evidence is the
    trajectories' episode state, so a `diagnostics` text is accepted and not needed.
    refine_skill: the next variant of the rule's skill texts (cycling); an unknown rubric keeps
    its skill.
    rwcore.types.CapabilityProposer - propose_capabilities: the same ranking over the failures,
    as capability candidates (unscored rule rubrics) not already in the library.
    rwcore.types.InstanceRubricWriter - instance_rubrics: the rules that can apply to the task
    instance (read from its scenario sheet), the ones specific to its kind first.
    """

    def __init__(self, env: NegotiationEnv | None = None, min_fail_rate: float = 0.2) -> None:
        self.env = env
        self.min_fail_rate = float(min_fail_rate)

    def failure_stats(self, trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, int, str]]:
        """rule id -> (fails, applicable, evidence of the first failure)."""
        stats = {}
        for rule in RULE_DEFS:
            fails = applicable = 0
            example = ""
            for trajectory in trajectories:
                try:
                    verdict, evidence = rule.check(episode_state(trajectory))
                except Exception:  # noqa: BLE001 - an uncheckable trajectory gives no evidence
                    continue
                if verdict is None:
                    continue
                applicable += 1
                if verdict is False:
                    fails += 1
                    if not example:
                        example = f"{trajectory.trajectory_id or trajectory.task_id}: {evidence!r}"
            stats[rule.rule_id] = (fails, applicable, example)
        return stats

    def _ranked(self, trajectories: Sequence[Trajectory], taken: set[str]) -> list[tuple]:
        stats = self.failure_stats(trajectories)
        order = {r.rule_id: i for i, r in enumerate(RULE_DEFS)}
        candidates = []
        for rule_id, (fails, applicable, example) in stats.items():
            if rule_id in taken or fails == 0 or fails / applicable < self.min_fail_rate:
                continue
            candidates.append((-fails, order[rule_id], rule_id, fails, applicable, example))
        candidates.sort()
        return candidates

    def propose_rubric_skills(self, trajectories: Sequence[Trajectory], existing: Sequence[RubricSpec],
                              max_new: int, *, diagnostics: str | None = None) -> list[RubricSkillProposal]:
        if max_new <= 0:
            return []
        candidates = self._ranked(trajectories, {spec.rubric_id for spec in existing})
        proposals = []
        for _, _, rule_id, fails, applicable, example in candidates[:max_new]:
            evidence = f"{rule_id} failed on {fails} of {applicable} applicable trajectories, e.g. {example}"
            proposals.append(RubricSkillProposal(rubric=rule_spec(RULES_BY_ID[rule_id]), skill=SKILLS[rule_id][0],
                                                 evidence=evidence))
        return proposals

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        variants = SKILLS.get(rubric.rubric_id)
        if not variants:
            return skill
        if skill in variants:
            return variants[(variants.index(skill) + 1) % len(variants)]
        return variants[0]

    def propose_capabilities(self, failures: Sequence[Trajectory], library: Sequence[RubricSpec],
                             max_new: int) -> list[RubricSpec]:
        if max_new <= 0:
            return []
        candidates = self._ranked(failures, {spec.rubric_id for spec in library})
        return [rule_spec(RULES_BY_ID[rule_id]) for _, _, rule_id, *_ in candidates[:max_new]]

    def instance_rubrics(self, context: Trajectory, max_rubrics: int) -> list[RubricSpec]:
        data = dict((context.metadata or {}).get("task") or {})
        if not data:
            raise ValueError(f"context of task {context.task_id!r} has no scenario sheet (metadata['task'])")
        specific, general = [], []
        for rule in RULE_DEFS:
            fits = INSTANCE_APPLICABILITY[rule.rule_id](data)
            if fits is None:
                general.append(rule)
            elif fits:
                specific.append(rule)
        return [rule_spec(rule) for rule in (specific + general)[:max(0, int(max_rubrics))]]


def _feasible(data: dict) -> bool:
    return bool(data.get("feasible", True))


# rule id -> on a scenario sheet: True (applies to this instance in particular), False (cannot
# apply), None (applies to any instance); what `instance_rubrics` writes per task.
INSTANCE_APPLICABILITY: dict[str, Callable[[dict], bool | None]] = {
    "never_sells_below_cost": lambda d: None,
    "asks_budget_first": lambda d: False if d.get("hostile") else None,
    "ends_hopeless_negotiation": lambda d: not _feasible(d),
    "no_repeated_offer": lambda d: None,
    "counters_low_opening": lambda d: d.get("opening", 0) < d.get("cost", 0),
    "takes_profitable_deal": lambda d: _feasible(d) and bool(d.get("winnable", True)),
    "offers_within_budget": lambda d: False if d.get("hostile") else None,
    "never_offers_below_cost": lambda d: None,
    "offers_bundle_when_wanted": lambda d: d.get("bundle_cost") is not None and _feasible(d) and not d.get("hostile"),
    "clear_actions": lambda d: None,
    "quick_close": lambda d: None,
    "adapts_after_counter": lambda d: False if d.get("hostile") else None,
}

INITIAL_LIBRARY: tuple[str, ...] = tuple(r.rule_id for r in RULE_DEFS
                                         if r.rule_id not in ("ends_hopeless_negotiation", "offers_bundle_when_wanted"))
"""The capability library RewardWeaver starts from; the other rules are there for controlled
expansion to find (recurrent failures the initial library does not cover) and admit."""


# -- attributor --------------------------------------------------------------------------


def failure_cause(state: dict) -> str:
    """Who controlled the outcome: "partner" (an unwinnable hostile-partner task, i.e. an angry buyer
    whose only acceptable price was below cost, and the agent did not sell at a loss), "scenario"
    (any other unwinnable task without a loss), else "policy" (a loss-making sale is always the policy's)."""
    deal = state.get("deal")
    loss = deal is not None and deal["price"] < deal["cost"]
    if not state.get("winnable", True) and not loss:
        return "partner" if state.get("hostile") else "scenario"
    return "policy"


class NegotiationAttributor:
    """rwcore.types.Attributor without an LLM: one record per candidate.

    deficit: the candidate's rule FAILs on the trajectory; evidence: the quoted agent message
    (a deficit whose rule has no message to quote quotes the last partner turn); confidence
    0.9 for a deficit, 0.8 for a pass, 0.5 when the rule does not apply; cause from
    `failure_cause` ("partner" for hostile-partner walkaways). Candidates the environment has
    no rule for, or trajectories it cannot check, get deficit False, confidence 0, cause "unclear".
    """

    def __init__(self, env: NegotiationEnv | None = None) -> None:
        self.env = env

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        tid = trajectory.trajectory_id or trajectory.task_id
        try:
            state = episode_state(trajectory)
        except Exception:  # noqa: BLE001
            state = None
        cause = failure_cause(state) if state is not None else "unclear"
        partner_turns = [t.content for t in trajectory.turns if t.role == "partner"]
        records = []
        for spec in candidates:
            rule = RULES_BY_ID.get(spec.rubric_id)
            if rule is None or state is None:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.0, "", "unclear"))
                continue
            verdict, evidence = rule.check(state)
            if verdict is False:
                quote = evidence or (partner_turns[-1] if partner_turns else "")
                records.append(AttributionRecord(tid, spec.rubric_id, True, 0.9, quote, cause))
            elif verdict is True:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.8, evidence, cause))
            else:
                records.append(AttributionRecord(tid, spec.rubric_id, False, 0.5, "", cause))
        return records


# -- labelled cases -------------------------------------------------------------------------


def _bad_policies() -> dict[str, Callable[[str, random.Random], str]]:
    def accepter(obs, rng):
        return "accept"

    def lowballer(obs, rng):
        f = parse_observation(obs)
        return f"offer {max(10, (f['cost'] or 50) - 20)}"

    def stubborn(obs, rng):
        f = parse_observation(obs)
        return f"offer {f['list'] or 100}"

    def descender(obs, rng):
        f = parse_observation(obs)
        offer = f["offer"] or 0
        top = f["list"] or 100
        if offer >= (f["cost"] or 0):
            return "accept"
        return f"offer {max(10, top - 10 * rng.choice((1, 2, 3, 4)))}"

    def quitter(obs, rng):
        return "end"

    def babbler(obs, rng):
        return rng.choice(("the item", "price is", "ask budget", "one two", "offer", "accept"))

    def bundle_blind(obs, rng):
        f = parse_observation(obs)
        if f["budget"] is not None:
            return f"offer {max(f['budget'], 10)}"
        return "ask budget"

    def greedy(obs, rng):
        f = parse_observation(obs)
        if f["budget"] is not None:
            return f"offer {min(200, f['budget'] + 20)}"
        if f["offer"] is not None and "final" in obs.split():
            return "accept"
        return "ask budget" if rng.random() < 0.5 else f"offer {min(200, (f['list'] or 100))}"

    def rand(obs, rng):
        return random_policy(obs, rng)

    def scripted(obs, rng):
        return scripted_policy(obs)

    return {"scripted": scripted, "random": rand, "accepter": accepter, "lowballer": lowballer,
            "stubborn": stubborn, "descender": descender, "quitter": quitter, "babbler": babbler,
            "bundle_blind": bundle_blind, "greedy": greedy}


def _source_trajectories(env: NegotiationEnv, source: int, tasks_per_kind: int) -> list[Trajectory]:
    rng = random.Random(f"negotiation-labelled-{env.seed}-{source}")
    tasks = []
    for kind in sorted(KINDS):
        for j in range(tasks_per_kind):
            tasks.append(Task(f"neg-case-{source}-{kind}-{j}", KINDS[kind], make_task_data(rng, kind)))
    out = []
    for name, policy in _bad_policies().items():
        for task in tasks:
            prng = random.Random(f"{task.task_id}-{name}")
            trajectory = run_episode(env, task, lambda obs, p=policy, r=prng: p(obs, r), seed=source,
                                     trajectory_id=f"{task.task_id}/{name}", group_id=name)
            trajectory.metadata["policy"] = name
            out.append(trajectory)
    return out


def labelled_cases_by_rule(env: NegotiationEnv, rule_ids: Sequence[str], *, num_sources: int = 10,
                           per_label: int = 3, per_na: int = 1, tasks_per_kind: int = 4) -> dict[str, list]:
    """rule id -> LabelledCases for admitting that rule.

    Sources are "gen0".."gen<num_sources-1>": each draws its own tasks (every kind, `tasks_per_kind`
    each, not the train/eval tasks) and runs the scripted, random and eight deliberately bad policies
    on them; from each source up to `per_label` PASS, `per_label` FAIL and `per_na` NA cases are kept
    per rule. The label is the reference annotator's (`negotiation_annotator.annotate`: the
    transcript and the scenario sheet, never the rule's own check or the episode's private
    state), so admission tests the rule against an independent reading. Any half of the sources
    then holds both labels and >= 10 applicable cases.
    """
    from rwcore.rewardweaver import LabelledCase
    from rwcore.trainer.envs.negotiation_annotator import annotate

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


def labelled_cases(env: NegotiationEnv, rule_ids: Sequence[str], **options) -> list:
    """All rules' cases in one list, rule by rule; each case's trajectory.metadata["labelled_rule"]
    names the rule its label is for (filter with `cases_for` before admitting a rule)."""
    by_rule = labelled_cases_by_rule(env, rule_ids, **options)
    return [case for rule_id in rule_ids for case in by_rule[rule_id]]


def cases_for(cases: Sequence, rule_id: str) -> list:
    """The cases of `labelled_cases` labelled for `rule_id`."""
    return [c for c in cases if c.trajectory.metadata.get("labelled_rule") == rule_id]
