"""The negotiation environment's language: the seller's move words and how its messages are parsed, and the
words the buyer's messages are shown in (`render_observation`).

Agent messages are one word each (`VERB_PHRASES`; with `price_words=True` also the ten price numbers,
`ACTION_PHRASES`); `parse_action` reads any text leniently. An observation restates the seller's private facts,
then the buyer's message, each buyer number followed by `above` or `below` (the package docstring shows them);
`parse_observation` reads one back.
"""

from __future__ import annotations

import re

__all__ = [
    "ACTION_PHRASES",
    "PRICES",
    "PRICE_VERBS",
    "SYSTEM_PROMPT",
    "VERBS",
    "VERB_PHRASES",
    "is_offer",
    "parse_action",
    "parse_observation",
    "render_observation",
]

PRICES: tuple[int, ...] = tuple(range(20, 201, 20))
"""The prices the built-in policy can say; every cost, budget and list price is one of them."""

VERBS: tuple[str, ...] = ("ask", "offer", "match", "list", "bundle", "accept", "confirm", "close", "end")
PRICE_VERBS: tuple[str, ...] = ("offer", "bundle")
# Lenient synonyms: the first recognised word decides the verb.
_SYNONYMS: dict[str, str] = {
    "ask": "ask",
    "budget": "ask",
    "offer": "offer",
    "price": "offer",
    "sell": "offer",
    "bundle": "bundle",
    "match": "match",
    "list": "list",
    "accept": "accept",
    "yes": "accept",
    "agree": "accept",
    "confirm": "confirm",
    "close": "close",
    "deal": "close",
    "end": "end",
    "stop": "end",
    "quit": "end",
    "bye": "end",
}

VERB_PHRASES: tuple[str, ...] = ("ask", "match", "list", "bundle", "accept", "confirm", "close", "end")
"""The one-word moves that need no number (`match` and `list` name their price)."""
ACTION_PHRASES: tuple[str, ...] = VERB_PHRASES + tuple(str(p) for p in PRICES)
"""Every distinct move, one word each (the built-in policy's action vocabulary)."""

SYSTEM_PROMPT = "you are the seller ask the buyer budget and offer a price it accepts or end when no deal is possible"

_OBS_WORDS = (
    "item",
    "cost",
    "list",
    "bundle",
    "buyer",
    "wants",
    "likes",
    "haggles",
    "budget",
    "secret",
    "too",
    "high",
    "offer",
    "leaves",
    "changed",
    "mind",
    "sold",
    "out",
    "no",
    "deal",
    "time",
    "up",
    "above",
    "below",
    "not",
    "interested",
    "price",
    "agrees",
    "confirms",
)


# -- parsing ----------------------------------------------------------------------


def _number(token: str) -> int | None:
    digits = token.strip(".,;:!?$")
    if not digits.isdigit():
        return None
    value = (int(digits) + 5) // 10 * 10  # nearest 10, halves up
    return min(max(value, 10), 200)


def parse_action(text: str) -> tuple[str, int | None]:
    """Agent text -> (verb, price). Deterministic and lenient.

    The first recognised verb word decides the verb (synonyms: budget -> ask, price/sell -> offer,
    yes/agree -> accept, deal -> close, stop/quit/bye -> end; `bundle` -> bundle offer, so "bundle
    offer 90" is a bundle offer and "offer bundle 90" a plain one). The price is the first number in
    the text, rounded to the nearest 10 (halves up) and clipped to [10, 200]; a price without a verb
    is an offer ("90" is "offer 90"). ("bundle", None) proposes the bundle without a price. `offer`
    without a number, and text with neither a recognised verb nor a number, are ("unclear", None).
    `match`, `list`, `confirm`, `close` and the other verbs ignore a number: ("match", None) and
    ("list", None) name their price only in `step`, from the buyer's words and the list price.
    """
    if not isinstance(text, str):
        return "unclear", None
    verb = None
    price = None
    for token in re.split(r"\s+", text.lower().strip()):
        word = token.strip(".,;:!?")
        if verb is None and word in _SYNONYMS:
            verb = _SYNONYMS[word]
        if price is None:
            price = _number(token)
    if verb is None:
        return ("offer", price) if price is not None else ("unclear", None)  # a bare price is an offer
    if verb == "offer":
        return (verb, price) if price is not None else ("unclear", None)
    if verb == "bundle":
        return verb, price
    return verb, None


def parse_observation(observation: str) -> dict:
    """An observation -> its facts: cost, list, bundle_cost, budget, bundle_budget, counter (a haggler's
    counter-offer), and the flags wants_bundle, bundle_on (the buyer likes the proposed bundle),
    haggles, secret, over. Missing facts are None / False."""
    words = observation.split()
    facts: dict = {
        "cost": None,
        "list": None,
        "bundle_cost": None,
        "budget": None,
        "bundle_budget": None,
        "counter": None,
        "wants_bundle": False,
        "bundle_on": False,
        "haggles": False,
        "secret": False,
        "over": False,
        "quote": False,
        "agreed": None,
        "confirmed": False,
    }

    def num(i: int) -> int | None:
        return int(words[i]) if 0 <= i < len(words) and words[i].isdigit() else None

    for i, word in enumerate(words):
        prev = words[i - 1] if i else ""
        if word == "cost":
            facts["bundle_cost" if prev == "bundle" else "cost"] = num(i + 1)
        elif word == "list":
            facts["list"] = num(i + 1)
        elif word == "budget" and num(i + 1) is not None:
            facts["bundle_budget" if prev == "bundle" or facts["bundle_on"] else "budget"] = num(i + 1)
        elif word == "agrees":
            facts["agreed"] = num(i + 1) if num(i + 1) is not None else num(i + 2)
        elif word == "confirms":
            facts["confirmed"] = True
        elif word == "price" and prev == "wants":
            facts["quote"] = True
        elif word == "offer" and prev == "high":
            facts["counter"] = num(i + 1)
        elif word == "wants" and i + 1 < len(words) and words[i + 1] == "bundle":
            facts["wants_bundle"] = True
        elif word == "likes":
            facts["bundle_on"] = True
        elif word in ("haggles", "secret"):
            facts[word] = True
        elif word in ("leaves", "deal", "up", "out"):
            facts["over"] = True
    return facts


# -- observations ---------------------------------------------------------------------


def render_observation(state: dict, message: str) -> str:
    """What the seller sees: the item header (item, cost, bundle cost, list price from `state`), then the buyer's
    `message` with its hints (`_with_hints`)."""
    head = f"item {state['item']} cost {state['cost']}"
    if state["bundle_cost"] is not None:
        head += f" bundle cost {state['bundle_cost']}"
    return f"{head} list {state['list']} {_with_hints(message, state)}"


def _with_hints(message: str, state: dict) -> str:
    """`message` with "above" / "below" after each buyer number: is it at least the cost it must cover
    (the bundle cost for a bundle budget or a bundle agreement)?"""
    words = message.split()
    out = []
    for i, word in enumerate(words):
        out.append(word)
        if word.isdigit() and i:
            bundle = "bundle" in words[max(0, i - 2) : i] and state.get("bundle_cost") is not None
            cost = state["bundle_cost"] if bundle else state["cost"]
            out.append("above" if int(word) >= cost else "below")
    return " ".join(out)


def is_offer(event: dict) -> bool:
    """Whether an episode event is an offer at a price (not the bundle proposal, which has none)."""
    return event["verb"] in PRICE_VERBS and event["price"] is not None
