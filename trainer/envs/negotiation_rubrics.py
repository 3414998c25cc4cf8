"""The negotiation environment's programmatic pieces: rubric library, reflector, attributor, labelled cases.

Rules read the episode's private state from `trajectory.metadata["env_state"]` (the finished
Episode.state, see `negotiation.build_trajectory`); without it they replay the episode from
`metadata["task"]` (task.data), `metadata.get("task_id", trajectory.task_id)`,
`metadata.get("seed", 0)` and the assistant turns; with neither they raise (RuleJudge: INVALID).

Every rule returns True (PASS), False (FAIL) or None (NA: does not apply); `explain(rule_id,
trajectory)` also gives the evidence (a quote from the turns). RubricSpec.capability holds the
Arise category (Understanding, Execution, Verification, Debugging, Efficiency); Rule.family the
RewardWeaver family (information, pricing, closing, boundaries, persistence, communication).

Each rule checks one step of the sale that the seller controls and that the transcript shows,
judged on the situation (what the buyer said), not on the seller's action, so that a constant message
passes none: every rule needs either a move that depends on what the buyer said (the budget, the list
price, a counter, an agreement) or a sequence of different moves (an offer after asking, a confirmation
after an offer). `constant_action_rates` measures it: no one-word action of the built-in policy passes
any rule on any held-out task (asserted at most 5% in tests/trainer/envs/test_env_negotiation_properties.py).
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Sequence

from rwcore.trainer.envs.base import Rule, RuleDef, Task, rule_spec, rules_from
from rwcore.trainer.envs.negotiation import (
    ACTION_PHRASES,
    KINDS,
    NegotiationEnv,
    is_offer,
    make_task_data,
    parse_observation,
    random_policy,
    run_episode,
    scripted_policy,
)
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory
from rwcore.verdict import Verdict

# -- facts -------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _replay_env(max_turns: int, items: int = 1):
    if items > 1:  # the hard tier (multi-item sales): every item may take all the messages
        from rwcore.trainer.envs.negotiation_hard import HardNegotiationEnv

        return HardNegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=max_turns, items=items)
    return NegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=max_turns)


def episode_state(trajectory: Trajectory) -> dict:
    """The episode's private state (metadata["env_state"], else a replay); KeyError when neither works.
    A hard-tier episode's state holds one learnable-tier state per item reached (`phases`)."""
    metadata = trajectory.metadata or {}
    state = metadata.get("env_state")
    if isinstance(state, dict) and ("events" in state or isinstance(state.get("phases"), list)):
        return state
    data = metadata.get("task")
    if not isinstance(data, dict):
        raise KeyError("trajectory.metadata has neither 'env_state' nor 'task': cannot check negotiation rules")
    messages = [t.content for t in trajectory.turns if t.role == "assistant"]
    items = data.get("items")
    env = _replay_env(max(1, len(messages)), len(items) if isinstance(items, list) else 1)
    task = Task(str(metadata.get("task_id", trajectory.task_id)), tuple(trajectory.tags), data)
    episode = env.reset(task, int(metadata.get("seed", 0)))
    for message in messages:
        if episode.done:
            break
        episode = env.step(episode, message)
    return episode.state


def _items(s: dict) -> list[dict]:
    """The learnable-tier states a rule is checked on: each item's of a hard-tier episode, else the state itself."""
    phases = s.get("phases")
    return list(phases) if isinstance(phases, list) else [s]


def _per_item(check: Callable[[dict], tuple]) -> Callable[[dict], tuple]:
    """A rule over one sale as a rule over every item of a (possibly multi-item) sale: FAIL when it fails on an
    item (that item's evidence), else PASS when it passes on one, else not applicable."""

    def combined(s: dict) -> tuple:
        verdicts = [check(item) for item in _items(s)]
        for wanted in (False, True):
            for verdict, evidence in verdicts:
                if verdict is wanted:
                    return verdict, evidence
        return None, ""

    combined.__name__ = getattr(check, "__name__", "check")
    combined.__doc__ = check.__doc__
    return combined


def _events(s: dict) -> list[dict]:
    return list(s.get("events", []))


def _after(events: list[dict], reply: str) -> list[tuple[dict, dict]]:
    """(event whose buyer reply was `reply`, the seller's next event) pairs."""
    return [(e, nxt) for e, nxt in zip(events, events[1:]) if e["reply"] == reply]


# -- checks: state -> (True / False / None, evidence) ----------------------------------


def _asks_budget_first(s):
    if s.get("haggler") or s.get("quote"):
        return None, ""
    events = _events(s)
    for i, e in enumerate(events):
        if is_offer(e) or e["verb"] == "end":  # the first commitment: a price, or ending the talk
            return any(prev["verb"] == "ask" for prev in events[:i]), e["text"]
    return None, ""


def _move_after_budget(s):
    """The seller's move right after the buyer stated its budget(s) in answer to `ask`, or None."""
    pairs = _after(_events(s), "budget")
    return pairs[0][1] if pairs else None


def _offers_at_budget(s):
    if s.get("bundle_cost") is not None or s["budget"] < s["cost"]:
        return None, ""
    e = _move_after_budget(s)
    if e is None:
        return None, ""
    return e["verb"] == "offer" and e["price"] == s["budget"], e["text"]


def _bundle_affordable(s) -> bool:
    return s.get("bundle_cost") is not None and s["bundle_budget"] >= s["bundle_cost"]


def _proposes_bundle_when_wanted(s):
    if not _bundle_affordable(s):
        return None, ""
    events = _events(s)
    for i, e in enumerate(events[:-1]):
        if e["reply"] == "budget":
            proposed = any(prev["verb"] == "bundle" for prev in events[: i + 2])  # before, or as the next move
            return proposed, events[i + 1]["text"]
    return None, ""


def _offers_bundle_when_wanted(s):
    if not _bundle_affordable(s):
        return None, ""
    events = _events(s)
    bundle_on = revealed = False
    for i, e in enumerate(events[:-1]):
        bundle_on = bundle_on or e["verb"] == "bundle"
        revealed = revealed or e["reply"] == "budget"
        if bundle_on and revealed and e["reply"] in ("budget", "bundle_on"):
            nxt = events[i + 1]
            return nxt["verb"] == "bundle" and nxt["price"] == s["bundle_budget"], nxt["text"]
    return None, ""


def _opening_and_answer(s):
    """(the first offer or None, the seller's move after the buyer answered it or None)."""
    events = _events(s)
    for i, e in enumerate(events):
        if is_offer(e):
            return e, (events[i + 1] if i + 1 < len(events) else None)
    return None, None


def _list_opening_then(s, kind_flag: str, follows) -> tuple:
    """For a `kind_flag` buyer the seller moved on: the first offer is the list price and the move after it
    satisfies `follows(next_event)` (False when either is missing); NA for other buyers."""
    if not s.get(kind_flag) or not _events(s):
        return None, ""
    first, nxt = _opening_and_answer(s)
    if first is None or first["verb"] != "offer" or first["price"] != s["list"]:
        return False, (first or _events(s)[-1])["text"]
    return nxt is not None and follows(nxt), (nxt or first)["text"]


def _opens_at_list_with_haggler(s):
    return _list_opening_then(
        s, "haggler", lambda nxt: nxt["verb"] == "accept" or (nxt["verb"] == "offer" and nxt["price"] == s["budget"])
    )


def _quotes_list_price(s):
    return _list_opening_then(s, "quote", lambda nxt: nxt["verb"] == "confirm")


def _confirms_agreement(s):
    for e, nxt in _after(_events(s), "agrees"):
        return nxt["verb"] == "confirm", nxt["text"]
    return None, ""


def _closes_after_confirmation(s):
    for e, nxt in _after(_events(s), "confirms"):
        return nxt["verb"] == "close", nxt["text"]
    return None, ""


def _accepts_counter(s):
    for e, nxt in _after(_events(s), "counter"):
        if nxt["counter_before"] == s["budget"]:
            # taking the counter: `accept`, or an offer of exactly the counter (the buyer agrees to either)
            return nxt["verb"] == "accept" or (nxt["verb"] == "offer" and nxt["price"] == s["budget"]), nxt["text"]
    return None, ""


def _ends_hopeless_negotiation(s):
    if s.get("feasible", True):
        return None, ""
    e = _move_after_budget(s)
    return (None, "") if e is None else (e["verb"] == "end", e["text"])


def _clear_actions(s):
    events = _events(s)
    if len(events) < 2:
        return None, ""
    seen = set()
    for e in events:
        move = (e["verb"], e["price"])
        if e["verb"] in ("ask", "bundle", "offer", "accept", "confirm", "close") and move in seen:
            return False, e["text"]
        seen.add(move)
    return True, events[-1]["text"]


RULE_DEFS: tuple[RuleDef, ...] = (
    RuleDef(
        "asks_budget_first",
        "the seller asks the buyer's budget before it commits (its first offer, or ending the negotiation)",
        "the seller made an offer or ended, with a buyer who neither haggles nor asked for a price",
        "Understanding",
        "information",
        _asks_budget_first,
    ),
    RuleDef(
        "offers_at_budget",
        "when the buyer states a budget that covers the cost, the seller's next move offers exactly that budget",
        "the buyer (no bundle) stated a budget that covers the cost and the seller moved again",
        "Execution",
        "pricing",
        _offers_at_budget,
    ),
    RuleDef(
        "proposes_bundle_when_wanted",
        "when a buyer who wants the bundle has stated its budgets, the bundle is "
        "proposed by the seller's next move at the latest",
        "a buyer who wants the bundle and can afford it stated its budgets and the seller moved again",
        "Understanding",
        "pricing",
        _proposes_bundle_when_wanted,
    ),
    RuleDef(
        "offers_bundle_when_wanted",
        "once the bundle is on the table and the buyer's bundle budget is known, the "
        "seller's next move offers the bundle at exactly that budget",
        "a buyer who wants the bundle and can "
        "afford it stated its bundle budget with the bundle proposed, and the seller moved again",
        "Execution",
        "pricing",
        _offers_bundle_when_wanted,
    ),
    RuleDef(
        "opens_at_list_with_haggler",
        "against a buyer who haggles, the seller's first offer is at the list "
        "price (which draws a counter at the buyer's budget) and its next move takes that counter",
        "the buyer haggles and the seller moved",
        "Efficiency",
        "information",
        _opens_at_list_with_haggler,
    ),
    RuleDef(
        "quotes_list_price",
        "when the buyer asks for a price, the seller's first offer is the list price and "
        "its next move confirms the buyer's agreement",
        "the buyer asked for a price and the seller moved",
        "Understanding",
        "pricing",
        _quotes_list_price,
    ),
    RuleDef(
        "confirms_agreement",
        "when the buyer agrees to a price, the seller's next move confirms the agreement",
        "the buyer agreed to a price and the seller moved again",
        "Verification",
        "closing",
        _confirms_agreement,
    ),
    RuleDef(
        "closes_after_confirmation",
        "once the buyer has confirmed, the seller's next move closes the deal",
        "the buyer confirmed an agreement and the seller moved again",
        "Execution",
        "closing",
        _closes_after_confirmation,
    ),
    RuleDef(
        "accepts_counter",
        "when the buyer counters at its budget the seller takes the counter (accepts it or "
        "offers exactly the countered price)",
        "the buyer countered at its budget and the seller moved again",
        "Debugging",
        "persistence",
        _accepts_counter,
    ),
    RuleDef(
        "ends_hopeless_negotiation",
        "when the stated budget cannot cover the cost the seller's next move is to end the negotiation",
        "the buyer stated a budget below the cost of anything it would buy and the seller moved again",
        "Verification",
        "boundaries",
        _ends_hopeless_negotiation,
    ),
    RuleDef(
        "clear_actions",
        "the seller never repeats a move the buyer already answered (asking twice, the same "
        "offer or bundle proposal twice, confirming or accepting twice)",
        "the seller moved at least twice",
        "Efficiency",
        "communication",
        _clear_actions,
    ),
)
# every check runs on each item of a hard-tier (multi-item) sale; on a learnable-tier state it is the check itself
RULE_DEFS = tuple(dataclasses.replace(rule, check=_per_item(rule.check)) for rule in RULE_DEFS)
RULES_BY_ID: dict[str, RuleDef] = {r.rule_id: r for r in RULE_DEFS}

# Skill texts (in the environment's vocabulary); refine_skill cycles through the variants. Each names the
# situation of its rule as the guidance language does (negotiation.GUIDANCE_SITUATIONS) and the one move word
# that rule wants there, so that a policy that reads guidance can act on it; clear_actions concerns every
# turn and names no single move.
SKILLS: dict[str, tuple[str, ...]] = {
    "asks_budget_first": (
        "when the buyer wants item say ask",
        "if the buyer wants item say ask first",
        "when the buyer wants item ask the budget before you offer",
    ),
    "offers_at_budget": (
        "when the buyer says budget say match",
        "if budget is above cost say match",
        "when budget is above cost match the buyer offer",
    ),
    "proposes_bundle_when_wanted": (
        "when the buyer wants bundle say bundle",
        "if the buyer says bundle budget say bundle",
        "when the buyer wants bundle say bundle first",
    ),
    "offers_bundle_when_wanted": (
        "when the buyer likes bundle budget say match",
        "if the buyer likes bundle budget say match",
        "after the buyer likes bundle budget match that budget",
    ),
    "opens_at_list_with_haggler": (
        "when the buyer haggles say list",
        "if the buyer haggles say list first",
        "when the buyer haggles list the price",
    ),
    "quotes_list_price": (
        "when the buyer wants price say list",
        "if the buyer wants price say list",
        "after the buyer wants price list the price",
    ),
    "confirms_agreement": (
        "when the buyer agrees say confirm",
        "after the buyer agrees say confirm",
        "if the buyer agrees confirm the deal",
    ),
    "closes_after_confirmation": (
        "when the buyer confirms say close",
        "after the buyer confirms say close",
        "if the buyer confirms close the deal",
    ),
    "accepts_counter": (
        "when the buyer says too high say accept",
        "if the buyer says too high say accept",
        "after the buyer says too high accept the offer",
    ),
    "ends_hopeless_negotiation": (
        "when budget is below cost say end",
        "if budget is below cost say end",
        "when budget is below cost end the deal",
    ),
    "clear_actions": ("use one clear move each turn", "never repeat a move the buyer answered", "say each move once"),
}


def explain(rule_id: str, trajectory: Trajectory) -> tuple[bool | None, str]:
    """(verdict as True/False/None, evidence quote) of one rule on one trajectory."""
    return RULES_BY_ID[rule_id].check(episode_state(trajectory))


def make_rules(env: NegotiationEnv | None = None) -> list[Rule]:
    return rules_from(RULE_DEFS, episode_state)


def rule_judge_rules(env: NegotiationEnv | None = None) -> dict:
    """{rubric id: check} for rwcore.judges.RuleJudge."""
    return {rule.spec.rubric_id: rule.check for rule in make_rules(env)}


def constant_action_rates(
    env: NegotiationEnv, split: str = "eval", phrases: Sequence[str] = ACTION_PHRASES
) -> dict[str, dict[str, float]]:
    """phrase -> rule id -> share of `split`'s tasks on which the policy that says `phrase` every turn
    passes the rule (what a degenerate policy could earn from it)."""
    rates = {}
    for phrase in phrases:
        passes = {r.rule_id: 0 for r in RULE_DEFS}
        tasks = env.tasks(split)
        for task in tasks:
            state = run_episode(env, task, lambda obs: phrase).metadata["env_state"]
            for rule in RULE_DEFS:
                passes[rule.rule_id] += rule.check(state)[0] is True
        rates[phrase] = {rid: count / len(tasks) for rid, count in passes.items()}
    return rates


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
        states = []
        for trajectory in trajectories:
            try:
                states.append((trajectory, episode_state(trajectory)))
            except Exception:  # noqa: BLE001 - an uncheckable trajectory gives no evidence
                continue
        for rule in RULE_DEFS:
            fails = applicable = 0
            example = ""
            for trajectory, state in states:
                verdict, evidence = rule.check(state)
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

    def propose_rubric_skills(
        self,
        trajectories: Sequence[Trajectory],
        existing: Sequence[RubricSpec],
        max_new: int,
        *,
        diagnostics: str | None = None,
    ) -> list[RubricSkillProposal]:
        if max_new <= 0:
            return []
        candidates = self._ranked(trajectories, {spec.rubric_id for spec in existing})
        proposals = []
        for _, _, rule_id, fails, applicable, example in candidates[:max_new]:
            evidence = f"{rule_id} failed on {fails} of {applicable} applicable trajectories, e.g. {example}"
            proposals.append(
                RubricSkillProposal(rubric=rule_spec(RULES_BY_ID[rule_id]), skill=SKILLS[rule_id][0], evidence=evidence)
            )
        return proposals

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        variants = SKILLS.get(rubric.rubric_id)
        if not variants:
            return skill
        if skill in variants:
            return variants[(variants.index(skill) + 1) % len(variants)]
        return variants[0]

    def propose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]:
        if max_new <= 0:
            return []
        candidates = self._ranked(failures, {spec.rubric_id for spec in library})
        return [rule_spec(RULES_BY_ID[rule_id]) for _, _, rule_id, *_ in candidates[:max_new]]

    def instance_rubrics(self, context: Trajectory, max_rubrics: int) -> list[RubricSpec]:
        data = dict((context.metadata or {}).get("task") or {})
        if not data:
            raise ValueError(f"context of task {context.task_id!r} has no scenario sheet (metadata['task'])")
        sheets = data["items"] if isinstance(data.get("items"), list) else [data]  # a hard-tier task: every item's
        specific, general = [], []
        for rule in RULE_DEFS:
            per_item = [INSTANCE_APPLICABILITY[rule.rule_id](sheet) for sheet in sheets]
            fits = True if any(per_item) else (None if any(f is None for f in per_item) else False)
            if fits is None:
                general.append(rule)
            elif fits:
                specific.append(rule)
        return [rule_spec(rule) for rule in (specific + general)[: max(0, int(max_rubrics))]]


def _covers(data: dict) -> bool:
    """A plain sale can be profitable: the buyer's budget covers the item cost."""
    return data.get("budget", 0) >= data.get("cost", 0)


def _bundle(data: dict) -> bool:
    return data.get("bundle_cost") is not None


# rule id -> on a scenario sheet: True (applies to this instance in particular), False (cannot
# apply), None (applies to any instance); what `instance_rubrics` writes per task.
INSTANCE_APPLICABILITY: dict[str, Callable[[dict], bool | None]] = {
    "asks_budget_first": lambda d: False if d.get("kind") in ("haggler", "quote") else None,
    "quotes_list_price": lambda d: d.get("kind") == "quote",
    "confirms_agreement": lambda d: None,
    "closes_after_confirmation": lambda d: None,
    # haggler and quote buyers never state their budget
    "offers_at_budget": lambda d: _covers(d) and not _bundle(d) and d.get("kind") not in ("haggler", "quote"),
    "proposes_bundle_when_wanted": lambda d: _bundle(d) and d.get("bundle_budget", 0) >= d.get("bundle_cost", 0),
    "offers_bundle_when_wanted": lambda d: _bundle(d) and d.get("bundle_budget", 0) >= d.get("bundle_cost", 0),
    "opens_at_list_with_haggler": lambda d: d.get("kind") == "haggler",
    "accepts_counter": lambda d: d.get("kind") == "haggler",
    "ends_hopeless_negotiation": lambda d: not bool(d.get("feasible", True)),
    "clear_actions": lambda d: None,
}

INITIAL_LIBRARY: tuple[str, ...] = tuple(
    r.rule_id
    for r in RULE_DEFS
    if r.rule_id not in ("ends_hopeless_negotiation", "offers_bundle_when_wanted", "quotes_list_price", "clear_actions")
)
"""The capability library RewardWeaver starts from; the other rules are there for controlled
expansion to find (recurrent failures the initial library does not cover) and admit."""


# -- attributor --------------------------------------------------------------------------


def failure_cause(state: dict) -> str:
    """Who controlled the outcome: "partner" (a hostile buyer, who walks out when it would agree whatever
    the seller does) or "scenario" (the item turns out sold out) when the task was unwinnable and the
    seller did not sell at a loss; else "policy" (a loss-making sale is always the policy's). A hard-tier
    episode ends on the first item that fails: the cause is that (last) item's."""
    state = _items(state)[-1]
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
    `failure_cause` ("partner" for hostile buyers, "scenario" for sold-out items). Candidates the
    environment has no rule for, or trajectories it cannot check, get deficit False, confidence 0,
    cause "unclear".
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
    """Scripted policies that each get some step of the sale wrong (and the scripted and random ones)."""

    def lowballer(obs, rng):  # offers 20 below the budget it was told
        f = parse_observation(obs)
        if f["bundle_on"] and f["bundle_budget"] is not None:
            return str(max(20, f["bundle_budget"] - 20))
        if f["budget"] is not None and f["bundle_budget"] is None and f["budget"] >= (f["cost"] or 0):
            return str(max(20, f["budget"] - 20))
        return scripted_policy(obs)

    def greedy(obs, rng):  # offers 20 above the budget it was told (the buyer leaves), even on no_deal tasks
        f = parse_observation(obs)
        if f["bundle_on"] and f["bundle_budget"] is not None:
            return str(min(200, f["bundle_budget"] + 20))
        if f["budget"] is not None and f["bundle_budget"] is None:
            return str(min(200, f["budget"] + 20))
        return scripted_policy(obs)

    def bundle_blind(obs, rng):  # a plain offer at the plain budget, bundle or not
        f = parse_observation(obs)
        if f["budget"] is not None:
            return str(f["budget"])
        return scripted_policy(obs)

    def bundle_low(obs, rng):  # proposes the bundle, then offers 20 below its budget
        f = parse_observation(obs)
        if f["bundle_on"] and f["bundle_budget"] is not None:
            return str(max(20, f["bundle_budget"] - 20))
        return scripted_policy(obs)

    def blind(obs, rng):  # never asks: opens at the list price or 20 below it
        f = parse_observation(obs)
        if f["counter"] is not None:
            return "accept"
        return str(max(20, (f["list"] or 100) - rng.choice((0, 20))))

    def stubborn(obs, rng):  # answers a haggler's counter by repeating its opening (out of place)
        f = parse_observation(obs)
        if f["counter"] is not None:
            return str(f["list"])
        return scripted_policy(obs)

    def hesitant(obs, rng):  # ends instead of accepting a counter
        f = parse_observation(obs)
        return "end" if f["counter"] is not None else scripted_policy(obs)

    def unconfirmed(obs, rng):  # answers an agreement with `close` (out of place: nothing confirmed yet)
        f = parse_observation(obs)
        return "close" if f["agreed"] is not None and not f["confirmed"] else scripted_policy(obs)

    def reconfirmer(obs, rng):  # confirms again instead of closing (out of place)
        f = parse_observation(obs)
        return "confirm" if f["confirmed"] else scripted_policy(obs)

    def closer_quits(obs, rng):  # ends the talk once the buyer confirmed
        f = parse_observation(obs)
        return "end" if f["confirmed"] else scripted_policy(obs)

    def asker(obs, rng):  # always asks (a second ask is out of place)
        return "ask"

    def quitter(obs, rng):
        return "end"

    def babbler(obs, rng):
        return rng.choice(("the item", "price is", "ask budget", "one two", "offer", "accept", "bundle", "100"))

    def rand(obs, rng):
        return random_policy(obs, rng)

    def scripted(obs, rng):
        return scripted_policy(obs)

    return {
        "scripted": scripted,
        "random": rand,
        "lowballer": lowballer,
        "greedy": greedy,
        "bundle_blind": bundle_blind,
        "bundle_low": bundle_low,
        "blind": blind,
        "stubborn": stubborn,
        "hesitant": hesitant,
        "unconfirmed": unconfirmed,
        "reconfirmer": reconfirmer,
        "closer_quits": closer_quits,
        "asker": asker,
        "quitter": quitter,
        "babbler": babbler,
    }


def _source_trajectories(env: NegotiationEnv, source: int, tasks_per_kind: int) -> list[Trajectory]:
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
    env: NegotiationEnv,
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
