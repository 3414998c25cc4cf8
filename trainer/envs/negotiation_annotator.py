"""Reference labels for the negotiation rubrics that do not come from the rules being tested.

RewardWeaver admits an evaluator only after it agrees with *reference* labels on a source-disjoint
held-out partition (§2.2). Labels produced by the evaluator's own rule would make that test
tautological, so this module is a second, independent annotator: it reads what a person grading
the dialogue reads - the transcript's turns and the task's scenario sheet (`metadata["task"]`:
cost, budget, whether a profitable deal exists) - and applies each rubric's criterion text.
It never looks at the environment's private episode state (`metadata["env_state"]`, the events
the rules read), and shares no code with `negotiation_rubrics` beyond the language's word
parser (`parse_action`, what the buyer understood a message to say).

`annotate(rule_id, trajectory)` -> Verdict.PASS / FAIL / NA. Written from the criterion and
applicability strings of `negotiation_rubrics.RULE_DEFS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rwcore.trainer.envs.negotiation import parse_action
from rwcore.types import Trajectory
from rwcore.verdict import Verdict

__all__ = ["ANNOTATORS", "annotate"]

_OFFER_VERBS = ("offer", "bundle")


@dataclass
class _Reply:
    """One buyer message (the part of an observation after the item header)."""

    words: list[str]

    def number_after(self, *phrase: str) -> int | None:
        n = len(phrase)
        for i in range(len(self.words) - n):
            if tuple(self.words[i:i + n]) == phrase and self.words[i + n].isdigit():
                return int(self.words[i + n])
        return None

    def has(self, *phrase: str) -> bool:
        n = len(phrase)
        return any(tuple(self.words[i:i + n]) == phrase for i in range(len(self.words) - n + 1))


@dataclass
class _Dialogue:
    cost: int
    bundle_cost: int | None
    opening: int | None
    hostile: bool
    agent: list[str]          # agent messages in order
    replies: list[_Reply]     # replies[i] answers agent[i]
    scenario: dict            # the task's scenario sheet


def _reply(observation: str) -> _Reply:
    """The buyer's message of an observation: the words after "list <price>" (hint words dropped)."""
    words = [w for w in observation.split() if w not in ("above", "below")]
    if "list" in words:
        i = words.index("list")
        words = words[i + 2:]
    return _Reply(words)


def _header_number(observation: str, *phrase: str) -> int | None:
    words = observation.split()
    n = len(phrase)
    for i in range(len(words) - n):
        if tuple(words[i:i + n]) == phrase and words[i + n].isdigit():
            return int(words[i + n])
    return None


def _read(trajectory: Trajectory) -> _Dialogue:
    partner = [t.content for t in trajectory.turns if t.role == "partner"]
    agent = [t.content for t in trajectory.turns if t.role == "assistant"]
    if not partner:
        raise ValueError("the transcript has no partner turn to read the scenario from")
    brief = partner[0]
    first = _reply(brief)
    cost = _header_number(brief, "cost")
    if cost is None:
        raise ValueError("the brief does not state the cost")
    return _Dialogue(
        cost=cost, bundle_cost=_header_number(brief, "bundle", "cost"),
        opening=first.number_after("offer"), hostile=first.has("angry"),
        agent=agent, replies=[_reply(text) for text in partner[1:]],
        scenario=dict((trajectory.metadata or {}).get("task") or {}),
    )


def _offers(d: _Dialogue) -> list[tuple[int, str, int]]:
    """(turn, verb, price) of the agent's offers."""
    out = []
    for turn, message in enumerate(d.agent):
        verb, price = parse_action(message)
        if verb in _OFFER_VERBS:
            out.append((turn, verb, price))
    return out


def _cost_for(d: _Dialogue, verb: str) -> int:
    return d.bundle_cost if verb == "bundle" and d.bundle_cost is not None else d.cost


def _deal(d: _Dialogue) -> tuple[int, int] | None:
    """(price, cost of what was sold) when the dialogue ended in a deal."""
    for turn, reply in enumerate(d.replies):
        price = reply.number_after("deal")
        if price is None:
            continue
        verb, _ = parse_action(d.agent[turn]) if turn < len(d.agent) else ("", None)
        if verb == "bundle":
            return price, _cost_for(d, "bundle")
        if verb == "accept":  # the standing offer's kind: the buyer's previous message said "bundle offer"?
            before = d.replies[turn - 1] if turn else _Reply([])
            bundle = before.has("bundle", "offer") and not before.has("wants", "bundle") and not before.has("no")
            return price, _cost_for(d, "bundle" if bundle else "offer")
        return price, d.cost
    return None


def _ended_by_agent(d: _Dialogue) -> bool:
    return any(reply.has("no", "deal") for reply in d.replies)


def _feasible(d: _Dialogue) -> bool:
    s = d.scenario
    budget, cost = s.get("budget"), s.get("cost", d.cost)
    bundle_budget, bundle_cost = s.get("bundle_budget"), s.get("bundle_cost")
    return (budget is not None and budget >= cost) or (bundle_budget is not None and bundle_cost is not None
                                                      and bundle_budget >= bundle_cost)


# -- one function per rubric, from its criterion and applicability text -----------------------

def _never_sells_below_cost(d: _Dialogue):
    # criterion: a closed deal is at or above the cost of what was sold; applies: a deal was closed
    deal = _deal(d)
    return None if deal is None else deal[0] >= deal[1]


def _asks_budget_first(d: _Dialogue):
    # the seller asks the buyer's budget before its first offer or acceptance; applies: it offered or
    # accepted and the buyer is not hostile
    if d.hostile:
        return None
    for turn, message in enumerate(d.agent):
        verb, _ = parse_action(message)
        if verb in (*_OFFER_VERBS, "accept"):
            return any(parse_action(m)[0] == "ask" for m in d.agent[:turn])
    return None


def _ends_hopeless_negotiation(d: _Dialogue):
    # when no profitable deal exists the seller ends it itself without selling; applies: no_deal tasks
    if _feasible(d):
        return None
    return _deal(d) is None and _ended_by_agent(d)


def _no_repeated_offer(d: _Dialogue):
    offers = [(verb, price) for _, verb, price in _offers(d)]
    if len(offers) < 2:
        return None
    return len(set(offers)) == len(offers)


def _counters_low_opening(d: _Dialogue):
    # the seller does not accept an opening offer below cost; applies: the opening is below cost
    if not d.agent or d.opening is None or d.opening >= d.cost:
        return None
    return parse_action(d.agent[0])[0] != "accept"


def _takes_profitable_deal(d: _Dialogue):
    # the seller closes a deal at or above cost; applies: a profitable deal was achievable
    if not (d.scenario.get("winnable", True) and _feasible(d)):
        return None
    deal = _deal(d)
    return deal is not None and deal[0] >= deal[1]


def _offers_within_budget(d: _Dialogue):
    # the first offer after learning the budget is within that budget
    budget = bundle_budget = None
    for turn, message in enumerate(d.agent):
        verb, price = parse_action(message)
        if budget is not None and verb in _OFFER_VERBS:
            limit = bundle_budget if verb == "bundle" and bundle_budget is not None else budget
            return price <= limit
        if turn < len(d.replies) and d.replies[turn].has("buyer", "budget"):
            budget = d.replies[turn].number_after("buyer", "budget")
            bundle_budget = d.replies[turn].number_after("bundle", "budget")
    return None


def _never_offers_below_cost(d: _Dialogue):
    offers = _offers(d)
    if not offers:
        return None
    return all(price >= _cost_for(d, verb) for _, verb, price in offers)


def _offers_bundle_when_wanted(d: _Dialogue):
    # applies: bundle tasks where a profitable bundle exists (and the buyer negotiates)
    if d.bundle_cost is None or d.hostile or not _feasible(d) or not d.agent:
        return None
    return any(verb == "bundle" for _, verb, _ in _offers(d))


def _clear_actions(d: _Dialogue):
    # every seller message is a clear action the buyer can act on
    if not d.agent:
        return None
    for turn, message in enumerate(d.agent):
        if parse_action(message)[0] == "unclear":
            return False
        reply = d.replies[turn] if turn < len(d.replies) else _Reply([])
        if reply.has("buyer", "unclear") or reply.has("buyer", "no", "bundle"):
            return False
    return True


def _quick_close(d: _Dialogue):
    # the seller concludes within two turns; applies: it concluded it (deal or end)
    if _deal(d) is None and not _ended_by_agent(d):
        return None
    return len(d.agent) <= 2


def _adapts_after_counter(d: _Dialogue):
    # after a counter the seller does not repeat or raise the same kind of offer
    checked = False
    for turn in range(len(d.agent) - 1):
        verb, price = parse_action(d.agent[turn])
        if verb not in _OFFER_VERBS or turn >= len(d.replies):
            continue
        reply = d.replies[turn]
        countered = (reply.has("buyer", "offer") or reply.has("buyer", "bundle", "offer") or reply.has("final")
                     or reply.has("wants", "bundle"))
        if not countered or reply.has("angry"):
            continue
        next_verb, next_price = parse_action(d.agent[turn + 1])
        if next_verb == verb and next_price >= price:
            return False
        checked = True
    return True if checked else None


ANNOTATORS = {
    "never_sells_below_cost": _never_sells_below_cost,
    "asks_budget_first": _asks_budget_first,
    "ends_hopeless_negotiation": _ends_hopeless_negotiation,
    "no_repeated_offer": _no_repeated_offer,
    "counters_low_opening": _counters_low_opening,
    "takes_profitable_deal": _takes_profitable_deal,
    "offers_within_budget": _offers_within_budget,
    "never_offers_below_cost": _never_offers_below_cost,
    "offers_bundle_when_wanted": _offers_bundle_when_wanted,
    "clear_actions": _clear_actions,
    "quick_close": _quick_close,
    "adapts_after_counter": _adapts_after_counter,
}


def annotate(rule_id: str, trajectory: Trajectory) -> Verdict:
    """The reference label of `rule_id` on `trajectory`, from its transcript and scenario sheet."""
    if rule_id not in ANNOTATORS:
        raise ValueError(f"rule_id {rule_id!r} has no reference annotator; known: {sorted(ANNOTATORS)}")
    verdict = ANNOTATORS[rule_id](_read(trajectory))
    return Verdict.NA if verdict is None else (Verdict.PASS if verdict else Verdict.FAIL)
