"""Reference labels for the negotiation rubrics that do not come from the rules being tested.

RewardWeaver admits an evaluator only after it agrees with *reference* labels on a source-disjoint
held-out partition (§2.2). Labels produced by the evaluator's own rule would make that test
tautological, so this module is a second, independent annotator: it reads what a person grading
the dialogue reads - the transcript's turns and the task's scenario sheet (`metadata["task"]`:
cost, budget, whether a profitable deal exists) - and applies each rubric's criterion text.
It never looks at the environment's private episode state (`metadata["env_state"]`, the events
the rules read), and shares no code with `rubrics` beyond the language's word
parser (`parse_action`, what the buyer understood a message to say).

`annotate(rule_id, trajectory)` -> Verdict.PASS / FAIL / NA. Written from the criterion and
applicability strings of `rubrics.RULE_DEFS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rwcore.trainer.envs.negotiation.language import parse_action
from rwcore.types import Trajectory
from rwcore.verdict import Verdict

__all__ = ["ANNOTATORS", "annotate", "item_dialogues"]

_OFFER_VERBS = ("offer", "bundle")
_SLACK = 0  # "exactly that budget", as the criteria say


@dataclass
class _Reply:
    """One buyer message (the part of an observation after the item header, hint words dropped)."""

    words: list[str]

    def number_after(self, *phrase: str) -> int | None:
        n = len(phrase)
        for i in range(len(self.words) - n):
            if tuple(self.words[i : i + n]) == phrase and self.words[i + n].isdigit():
                return int(self.words[i + n])
        return None

    def has(self, *phrase: str) -> bool:
        n = len(phrase)
        return any(tuple(self.words[i : i + n]) == phrase for i in range(len(self.words) - n + 1))


@dataclass
class _Dialogue:
    cost: int
    bundle_cost: int | None
    list_price: int
    haggles: bool
    quote: bool  # the buyer asked for a price
    agent: list[str]  # agent messages in order
    replies: list[_Reply]  # replies[i] answers agent[i]
    scenario: dict  # the task's scenario sheet


def _reply(observation: str) -> _Reply:
    """The buyer's message of an observation: the words after "list <price>" (hint words dropped)."""
    words = [w for w in observation.split() if w not in ("above", "below")]
    if "list" in words:
        i = words.index("list")
        words = words[i + 2 :]
    return _Reply(words)


def _header_number(observation: str, *phrase: str) -> int | None:
    words = observation.split()
    n = len(phrase)
    for i in range(len(words) - n):
        if tuple(words[i : i + n]) == phrase and words[i + n].isdigit():
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
    return _Dialogue(
        cost=cost,
        bundle_cost=_header_number(brief, "bundle", "cost"),
        list_price=list_price,
        haggles=_reply(brief).has("buyer", "haggles"),
        quote=_reply(brief).has("buyer", "wants", "price"),
        agent=agent,
        replies=[_reply(text) for text in partner[1:]],
        scenario=dict((trajectory.metadata or {}).get("task") or {}),
    )


def _moves(d: _Dialogue) -> list[tuple[str, int | None]]:
    """(verb, price) of each agent message as the buyer took it: `list` offers the list price, `match` the
    buyer's latest number (its counter, else the budget it stated for what is on the table; with no number
    stated it is unclear); once the bundle was proposed (the buyer said it likes it), a price is the
    bundle's."""
    out = []
    bundle_on = False
    budget = bundle_budget = counter = None
    for turn, message in enumerate(d.agent):
        verb, price = parse_action(message)
        if verb == "list":
            verb, price = "offer", d.list_price
        elif verb == "match":
            price = counter if counter is not None else (bundle_budget if bundle_on else budget)
            verb = "offer" if price is not None else "unclear"
        if verb == "offer" and bundle_on:
            verb = "bundle"
        out.append((verb, price))
        reply = d.replies[turn] if turn < len(d.replies) else _Reply([])
        if reply.has("buyer", "likes", "bundle") or (
            verb == "bundle" and price is not None and d.bundle_cost is not None
        ):
            bundle_on = True
        budget = reply.number_after("buyer", "budget") if budget is None else budget
        bundle_budget = reply.number_after("bundle", "budget") if bundle_budget is None else bundle_budget
        counter = reply.number_after("too", "high", "offer") if counter is None else counter
    return out


def _offers(d: _Dialogue) -> list[tuple[int, str, int]]:
    """(turn, verb, price) of the agent's offers at a price."""
    return [
        (turn, verb, price)
        for turn, (verb, price) in enumerate(_moves(d))
        if verb in _OFFER_VERBS and price is not None
    ]


def _budget_turn(d: _Dialogue) -> int | None:
    """The turn whose reply stated the buyer's budget."""
    for turn, reply in enumerate(d.replies):
        if reply.has("buyer", "budget"):
            return turn
    return None


# -- one function per rubric, from its criterion and applicability text -----------------------


def _asks_budget_first(d: _Dialogue):
    # the seller asks the buyer's budget before it commits (its first offer, or ending the talk); applies: it
    # committed, the buyer neither haggles nor asked for a price
    if d.haggles or d.quote:
        return None
    moves = _moves(d)
    offer_turns = {turn for turn, _, _ in _offers(d)}
    commits = [turn for turn, (verb, _) in enumerate(moves) if turn in offer_turns or verb == "end"]
    if not commits:
        return None
    return any(verb == "ask" for verb, _ in moves[: commits[0]])


def _move_after_budget(d: _Dialogue) -> tuple[int, str, int | None] | None:
    """(turn, verb, price) of the seller's move right after the buyer stated its budget, or None."""
    turn = _budget_turn(d)
    if turn is None or turn + 1 >= len(d.agent):
        return None
    return (turn + 1,) + _moves(d)[turn + 1]


def _offers_at_budget(d: _Dialogue):
    # the buyer (no bundle) stated a budget that covers the cost and the seller moved again: that move offers
    # exactly the budget
    after = _move_after_budget(d)
    if d.bundle_cost is not None or after is None:
        return None
    budget = d.replies[after[0] - 1].number_after("buyer", "budget")
    if budget is None or budget < d.cost:
        return None
    return after[1] == "offer" and after[2] == budget


def _wants_affordable_bundle(d: _Dialogue) -> bool:
    bundle_budget = d.scenario.get("bundle_budget")
    return d.bundle_cost is not None and bundle_budget is not None and bundle_budget >= d.bundle_cost


def _proposes_bundle_when_wanted(d: _Dialogue):
    # a buyer who wants the bundle and can afford it stated its budgets and the seller moved again: the bundle
    # was proposed by then, or that move proposes it
    after = _move_after_budget(d)
    if not _wants_affordable_bundle(d) or after is None:
        return None
    return any(verb == "bundle" for verb, _ in _moves(d)[: after[0] + 1])


def _offers_bundle_when_wanted(d: _Dialogue):
    # once the bundle is on the table and the bundle budget was stated, the next move offers the bundle at
    # exactly that budget
    if not _wants_affordable_bundle(d):
        return None
    moves = _moves(d)
    proposed = False
    bundle_budget = None
    for turn, reply in enumerate(d.replies[: len(d.agent) - 1]):
        proposed = proposed or moves[turn][0] == "bundle"
        stated = reply.number_after("bundle", "budget")
        bundle_budget = stated if stated is not None else bundle_budget
        if proposed and bundle_budget is not None and stated is not None:
            verb, price = moves[turn + 1]
            return verb == "bundle" and price == bundle_budget
    return None


def _first_offer_and_next(d: _Dialogue):
    """((verb, price) of the first offer or None, (verb, price) of the move after it or None)."""
    offers = _offers(d)
    if not offers:
        return None, None
    turn, verb, price = offers[0]
    return (verb, price), (_moves(d)[turn + 1] if turn + 1 < len(d.agent) else None)


def _opens_at_list_with_haggler(d: _Dialogue):
    # a buyer who haggles: the first offer is the list price and the next move takes the counter it draws
    # (accept, or an offer of exactly the buyer's budget); applies: the seller moved
    if not d.haggles or not d.agent:
        return None
    first, nxt = _first_offer_and_next(d)
    if first != ("offer", d.list_price) or nxt is None:
        return False
    return nxt[0] == "accept" or (nxt[0] == "offer" and nxt[1] == d.scenario.get("budget"))


def _quotes_list_price(d: _Dialogue):
    # a buyer who asked for a price: the first offer is the list price and the next move confirms
    if not d.quote or not d.agent:
        return None
    first, nxt = _first_offer_and_next(d)
    return first == ("offer", d.list_price) and nxt is not None and nxt[0] == "confirm"


def _next_move_after(d: _Dialogue, *phrase: str) -> str | None:
    """The verb of the seller's move right after the first reply containing `phrase` (None: no such move)."""
    for turn, reply in enumerate(d.replies):
        if reply.has(*phrase):
            return _moves(d)[turn + 1][0] if turn + 1 < len(d.agent) else None
    return None


def _confirms_agreement(d: _Dialogue):
    # the buyer agreed to a price and the seller moved again: that move confirms
    verb = _next_move_after(d, "buyer", "agrees")
    return None if verb is None else verb == "confirm"


def _closes_after_confirmation(d: _Dialogue):
    # the buyer confirmed and the seller moved again: that move closes the deal
    verb = _next_move_after(d, "buyer", "confirms")
    return None if verb is None else verb == "close"


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
            return verb == "accept" or (verb == "offer" and price == counter)
    return None


def _ends_hopeless_negotiation(d: _Dialogue):
    # the buyer stated a budget below the cost of anything it would buy (the scenario sheet says no profitable
    # deal exists) and the seller moved again: that move ends the negotiation
    after = _move_after_budget(d)
    if after is None or d.scenario.get("feasible", True):
        return None
    return after[1] == "end"


def _clear_actions(d: _Dialogue):
    # the seller never repeats a move the buyer already answered; applies: at least two moves
    if len(d.agent) < 2:
        return None
    moves = [
        (verb, price) for verb, price in _moves(d) if verb in ("ask", "bundle", "offer", "accept", "confirm", "close")
    ]
    return len(set(moves)) == len(moves)


ANNOTATORS = {
    "asks_budget_first": _asks_budget_first,
    "offers_at_budget": _offers_at_budget,
    "proposes_bundle_when_wanted": _proposes_bundle_when_wanted,
    "offers_bundle_when_wanted": _offers_bundle_when_wanted,
    "opens_at_list_with_haggler": _opens_at_list_with_haggler,
    "quotes_list_price": _quotes_list_price,
    "confirms_agreement": _confirms_agreement,
    "closes_after_confirmation": _closes_after_confirmation,
    "accepts_counter": _accepts_counter,
    "ends_hopeless_negotiation": _ends_hopeless_negotiation,
    "clear_actions": _clear_actions,
}


def _header(observation: str) -> str:
    """The item header of an observation: its words up to and including the list price."""
    words = observation.split()
    if "list" in words and words.index("list") + 1 < len(words):
        return " ".join(words[: words.index("list") + 2])
    return observation


def item_dialogues(trajectory: Trajectory) -> list[Trajectory]:
    """A hard-tier (multi-item) transcript as one transcript per item sold, each with that item's scenario sheet:
    a new item begins where the partner's message opens with another item header (item names differ within a
    task). A learnable-tier transcript is returned as it is."""
    items = ((trajectory.metadata or {}).get("task") or {}).get("items")
    if not isinstance(items, list):
        return [trajectory]
    parts: list[list] = []
    header = None
    system = [t for t in trajectory.turns[:1] if t.role == "system"]
    for turn in trajectory.turns:
        if turn.role == "partner" and _header(turn.content) != header:
            header = _header(turn.content)
            parts.append(list(system))
        if parts and turn.role in ("partner", "assistant"):
            parts[-1].append(turn)
    return [
        Trajectory(
            task_id=f"{trajectory.task_id}/item{i}",
            turns=turns,
            outcome=0.0,
            tags=tuple(trajectory.tags),
            trajectory_id=f"{trajectory.trajectory_id}/item{i}",
            metadata={"task": dict(items[i]) if i < len(items) else {}},
        )
        for i, turns in enumerate(parts)
    ]


def annotate(rule_id: str, trajectory: Trajectory) -> Verdict:
    """The reference label of `rule_id` on `trajectory`, from its transcript and scenario sheet. A multi-item
    transcript (the hard tier) is read item by item: FAIL when the criterion fails on one item, else PASS when it
    holds on one, else NA."""
    if rule_id not in ANNOTATORS:
        raise ValueError(f"rule_id {rule_id!r} has no reference annotator; known: {sorted(ANNOTATORS)}")
    verdicts = [ANNOTATORS[rule_id](_read(part)) for part in item_dialogues(trajectory)]
    if any(v is False for v in verdicts):
        return Verdict.FAIL
    return Verdict.PASS if any(v is True for v in verdicts) else Verdict.NA
