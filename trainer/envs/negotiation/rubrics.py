"""The negotiation environment's rubric library: its rules (the RuleJudge's checks), their skill texts and
the library RewardWeaver starts from. The reflector, the attributor and the labelled cases build on it.

Rules read the episode's private state from `trajectory.metadata["env_state"]` (the finished
Episode.state, see `trajectories.build_trajectory`); without it they replay the episode from
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
from collections.abc import Callable, Sequence

from rwcore.trainer.envs.base import Rule, RuleDef, Task, rules_from
from rwcore.trainer.envs.negotiation.environment import NegotiationEnv
from rwcore.trainer.envs.negotiation.language import ACTION_PHRASES, is_offer
from rwcore.trainer.envs.negotiation.trajectories import run_episode
from rwcore.types import Trajectory

__all__ = [
    "INITIAL_LIBRARY",
    "RULE_DEFS",
    "RULES_BY_ID",
    "SKILLS",
    "constant_action_rates",
    "episode_state",
    "explain",
    "make_rules",
]

# -- facts -------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _replay_env(max_turns: int, items: int = 1):
    if items > 1:  # the hard tier (multi-item sales): every item may take all the messages
        from rwcore.trainer.envs.negotiation.hard import HardNegotiationEnv

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
    for _e, nxt in _after(_events(s), "agrees"):
        return nxt["verb"] == "confirm", nxt["text"]
    return None, ""


def _closes_after_confirmation(s):
    for _e, nxt in _after(_events(s), "confirms"):
        return nxt["verb"] == "close", nxt["text"]
    return None, ""


def _accepts_counter(s):
    for _e, nxt in _after(_events(s), "counter"):
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
# situation of its rule as the guidance language does (guidance.GUIDANCE_SITUATIONS) and the one move word
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
            state = run_episode(env, task, lambda obs: phrase).metadata["env_state"]  # noqa: B023 - run right here
            for rule in RULE_DEFS:
                passes[rule.rule_id] += rule.check(state)[0] is True
        rates[phrase] = {rid: count / len(tasks) for rid, count in passes.items()}
    return rates


INITIAL_LIBRARY: tuple[str, ...] = tuple(
    r.rule_id
    for r in RULE_DEFS
    if r.rule_id not in ("ends_hopeless_negotiation", "offers_bundle_when_wanted", "quotes_list_price", "clear_actions")
)
"""The capability library RewardWeaver starts from; the other rules are there for controlled
expansion to find (recurrent failures the initial library does not cover) and admit."""
