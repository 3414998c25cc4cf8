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
_SLACK = 0  # "exactly that budget", as the criteria say


@dataclass
class _Reply:
    """One buyer message (the part of an observation after the item header, hint words dropped)."""

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
    list_price: int
    haggles: bool
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
    cost = _header_number(brief, "cost")
    list_price = _header_number(brief, "list")
    if cost is None or list_price is None:
        raise ValueError("the brief does not state the cost and the list price")
    return _Dialogue(cost=cost, bundle_cost=_header_number(brief, "bundle", "cost"), list_price=list_price,
                     haggles=_reply(brief).has("buyer", "haggles"), agent=agent,
                     replies=[_reply(text) for text in partner[1:]],
                     scenario=dict((trajectory.metadata or {}).get("task") or {}))


def _moves(d: _Dialogue) -> list[tuple[str, int | None]]:
    """(verb, price) of each agent message as the buyer took it: once the bundle was proposed (the buyer
    said it likes it), a price is the bundle's."""
    out = []
    bundle_on = False
    for turn, message in enumerate(d.agent):
        verb, price = parse_action(message)
        if verb == "offer" and bundle_on:
            verb = "bundle"
        out.append((verb, price))
        reply = d.replies[turn] if turn < len(d.replies) else _Reply([])
        if reply.has("buyer", "likes", "bundle") or (verb == "bundle" and price is not None
                                                     and d.bundle_cost is not None):
            bundle_on = True
    return out


def _offers(d: _Dialogue) -> list[tuple[int, str, int]]:
    """(turn, verb, price) of the agent's offers at a price."""
    return [(turn, verb, price) for turn, (verb, price) in enumerate(_moves(d))
            if verb in _OFFER_VERBS and price is not None]


def _budget_turn(d: _Dialogue) -> int | None:
    """The turn whose reply stated the buyer's budget."""
    for turn, reply in enumerate(d.replies):
        if reply.has("buyer", "budget"):
            return turn
    return None


def _first_offer_after(d: _Dialogue, turn: int) -> tuple[str, int] | None:
    for later, verb, price in _offers(d):
        if later > turn:
            return verb, price
    return None


# -- one function per rubric, from its criterion and applicability text -----------------------

def _asks_budget_first(d: _Dialogue):
    # the seller asks the buyer's budget before it commits (its first offer, or ending the talk); applies: it
    # committed, the buyer does not haggle
    if d.haggles:
        return None
    moves = _moves(d)
    offer_turns = {turn for turn, _, _ in _offers(d)}
    commits = [turn for turn, (verb, _) in enumerate(moves) if turn in offer_turns or verb == "end"]
    if not commits:
        return None
    return any(verb == "ask" for verb, _ in moves[:commits[0]])


def _offers_at_budget(d: _Dialogue):
    # the first offer after the buyer states its budget asks exactly that budget; applies: a stated budget
    # that covers the cost, no bundle, and an offer afterwards
    turn = _budget_turn(d)
    if d.bundle_cost is not None or turn is None:
        return None
    budget = d.replies[turn].number_after("buyer", "budget")
    if budget is None or budget < d.cost:
        return None
    offer = _first_offer_after(d, turn)
    if offer is None:
        return None
    verb, price = offer
    return verb == "offer" and price == budget


def _proposes_bundle_when_wanted(d: _Dialogue):
    # applies: a bundle buyer who could afford the bundle (scenario sheet) and an offer; passes: the first
    # offer is for the bundle
    # a buyer who wants the plain item (no bundle on its sheet): any bundle proposal fails
    bundle_budget = d.scenario.get("bundle_budget")
    if d.bundle_cost is None:
        return False if any(verb == "bundle" for verb, _ in _moves(d)) else None
    offers = _offers(d)
    if bundle_budget is None or bundle_budget < d.bundle_cost or not offers:
        return None
    return offers[0][1] == "bundle"


def _offers_bundle_when_wanted(d: _Dialogue):
    # a buyer who wants the bundle: the first offer after its budgets is a bundle offer at exactly the
    # bundle budget
    turn = _budget_turn(d)
    if d.bundle_cost is None or turn is None:
        return None
    bundle_budget = d.replies[turn].number_after("bundle", "budget")
    if bundle_budget is None or bundle_budget < d.bundle_cost:
        return None
    offer = _first_offer_after(d, turn)
    if offer is None:
        return None
    verb, price = offer
    return verb == "bundle" and price == bundle_budget


def _opens_at_list_with_haggler(d: _Dialogue):
    offers = _offers(d)
    if not d.haggles or not offers:
        return None
    _, verb, price = offers[0]
    return verb == "offer" and price == d.list_price


def _accepts_counter(d: _Dialogue):
    # when the buyer counters at its budget (the scenario sheet's) the seller accepts; applies: such a counter
    # and a move after it
    moves = _moves(d)
    for turn, reply in enumerate(d.replies):
        counter = reply.number_after("too", "high", "offer")
        if counter is None or turn + 1 >= len(d.agent):
            continue
        if counter == d.scenario.get("budget"):  # taking it: accept, or an offer of exactly the counter
            verb, price = moves[turn + 1]
            return verb == "accept" or (verb in _OFFER_VERBS and price == counter)
    return None


def _ends_hopeless_negotiation(d: _Dialogue):
    # applies: the stated budget is below the cost of anything the buyer would buy (the scenario sheet says
    # no profitable deal exists) and the seller moved after hearing it
    # ... and fails ending right after a budget that covers the cost
    turn = _budget_turn(d)
    if turn is None or turn + 1 >= len(d.agent):
        return None
    ended = _moves(d)[turn + 1][0] == "end"
    if d.scenario.get("feasible", True):
        return False if ended else None
    return ended


def _out_of_place(d: _Dialogue) -> list[bool]:
    """For each agent message: did it not fit the moment - unparsable, or a move the dialogue so far
    gives no ground for (asking again, accepting without a counter, a bundle nobody wants or proposed
    before, an offer made before)?"""
    flags = []
    asked = bundle_on = counter = False
    offered: set = set()
    for turn, (verb, price) in enumerate(_moves(d)):
        if verb == "unclear":
            bad = True
        elif verb == "ask":
            bad = asked
        elif verb == "accept":
            bad = not counter
        elif verb == "bundle" and d.bundle_cost is None:
            bad = True
        elif verb == "bundle" and price is None:
            bad = bundle_on
        elif verb in _OFFER_VERBS:
            bad = (verb, price) in offered
        else:
            bad = False
        flags.append(bad)
        reply = d.replies[turn] if turn < len(d.replies) else _Reply([])
        if verb == "ask":
            asked = True
        if verb == "bundle":
            bundle_on = True
        if verb in _OFFER_VERBS and price is not None:
            offered.add((verb, price))
        counter = counter or reply.has("too", "high", "offer")  # a counter stands until the episode ends
    return flags


def _clear_actions(d: _Dialogue):
    # every seller message is a clear action that fits the moment and no offer insults the buyer; applies:
    # the seller made an offer or ended the talk, in at least two moves
    offers = _offers(d)
    if len(d.agent) < 2 or not (offers or any(verb == "end" for verb, _ in _moves(d))):
        return None
    if any(_out_of_place(d)):
        return False
    for turn, _, _ in offers:  # a plain "buyer leaves" after an offer in place: insulted by the price
        reply = d.replies[turn] if turn < len(d.replies) else _Reply([])
        if reply.words == ["buyer", "leaves"]:
            return False
    return True


ANNOTATORS = {
    "asks_budget_first": _asks_budget_first,
    "offers_at_budget": _offers_at_budget,
    "proposes_bundle_when_wanted": _proposes_bundle_when_wanted,
    "offers_bundle_when_wanted": _offers_bundle_when_wanted,
    "opens_at_list_with_haggler": _opens_at_list_with_haggler,
    "accepts_counter": _accepts_counter,
    "ends_hopeless_negotiation": _ends_hopeless_negotiation,
    "clear_actions": _clear_actions,
}


def annotate(rule_id: str, trajectory: Trajectory) -> Verdict:
    """The reference label of `rule_id` on `trajectory`, from its transcript and scenario sheet."""
    if rule_id not in ANNOTATORS:
        raise ValueError(f"rule_id {rule_id!r} has no reference annotator; known: {sorted(ANNOTATORS)}")
    verdict = ANNOTATORS[rule_id](_read(trajectory))
    return Verdict.NA if verdict is None else (Verdict.PASS if verdict else Verdict.FAIL)
