"""The TextArena games the adapter supports: per game, its variants, the agent's roles, a scripted opponent,
the built-in policy's action words, and what the programmatic rules read from a finished episode.

Every function here reads the live TextArena environment (`ta_env.state.game_state`) only for the side it
plays: a scripted opponent uses its own private values and what was said in public (a pending offer, the
other side's messages); the only look at the agent's private facts is a feasibility check (does the agent
hold what an offer asks for), so the opponent never makes an offer the agent could not accept.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

RESOURCES = ("Wheat", "Wood", "Sheep", "Brick", "Ore")
_OFFER = re.compile(r"\[Offer:?\s*(?:I\s+(?:give|offer)\s+)?([^\[\]]+?)\s*\.*\]", re.IGNORECASE | re.DOTALL)
_ACCEPT = re.compile(r"\[Accept\]", re.IGNORECASE)
_FACT = re.compile(r"\bfact\s*([12])\b", re.IGNORECASE)
_GUESS = re.compile(r"\[Fact ([12])\]", re.IGNORECASE)


@dataclass(frozen=True)
class Game:
    """One supported TextArena game family.

    family: our tag for it; variants: TextArena ids (raw, unwrapped ids are what we make) -> variant tag;
    roles: agent player id -> role name; opponent: scripted move (ta_env, opponent id, rng, history) -> text;
    action_words: the built-in word-level policy's words for this game; brief: one line on how to win.
    """

    family: str
    variants: dict[str, str]
    roles: dict[int, str]
    opponent: Callable
    action_words: tuple[str, ...]
    brief: str
    extra_words: tuple[str, ...] = field(default_factory=tuple)


# -- SimpleNegotiation ------------------------------------------------------------


def inventory_value(resources: dict, values: dict) -> int:
    return sum(int(q) * int(values[r]) for r, q in resources.items())


def parse_offer(text: str) -> dict | None:
    """'[Offer: 2 Wood -> 3 Sheep]' -> {"give": {...}, "get": {...}} the way SimpleNegotiation reads it, or None."""
    match = _OFFER.search(text or "")
    if not match:
        return None
    body = " ".join(match.group(1).split())
    parts = re.split(r"\s*->\s*", re.sub(r"[.,!?]+$", "", body))
    if len(parts) != 2:
        return None
    out = []
    for part in parts:
        pairs = re.findall(r"(\d+)\s+([A-Za-z]+)", part)
        if not pairs:
            return None
        items: dict[str, int] = {}
        for qty, raw in pairs:
            name = {"Sheeps": "Sheep", "Woods": "Wood"}.get(raw.title(), raw.title())
            if name not in RESOURCES or int(qty) <= 0:
                return None
            items[name] = items.get(name, 0) + int(qty)
        out.append(items)
    return {"give": out[0], "get": out[1]}


def offer_text(give: dict, get: dict) -> str:
    left = ", ".join(f"{q} {r}" for r, q in give.items())
    right = ", ".join(f"{q} {r}" for r, q in get.items())
    return f"[Offer: {left} -> {right}]"


def trade_gain(give: dict, get: dict, values: dict) -> int:
    """Value change for the side that gives `give` and receives `get`, at its `values`."""
    return inventory_value(get, values) - inventory_value(give, values)


def negotiation_opponent(ta_env, me: int, rng: random.Random, history: list) -> str:
    """A rule-based trader: accepts a pending offer that raises its own inventory value (and that it can pay),
    denies anything else; when it has not accepted, proposes a trade that gains it value (2-3 units of its
    cheapest resource for one of a dearer one the other side holds)."""
    gs = ta_env.state.game_state
    values = gs["player_values"][me]
    mine = gs["player_resources"][me]
    theirs = gs["player_resources"][1 - me]
    offer = gs.get("current_offer")
    if offer and offer["from_player"] != me:
        gain = trade_gain(offer["requested_resources"], offer["offered_resources"], values)
        affordable = all(mine.get(r, 0) >= q for r, q in offer["requested_resources"].items())
        if gain > 0 and affordable:
            return "[Accept] That works for me."
    reply = "[Deny]" if offer and offer["from_player"] != me else ""
    candidates = []
    for cheap in RESOURCES:
        for dear in RESOURCES:
            if cheap == dear:
                continue
            for n in (2, 3):
                give, get = {cheap: n}, {dear: 1}
                if trade_gain(give, get, values) > 0 and mine.get(cheap, 0) >= n and theirs.get(dear, 0) >= 1:
                    candidates.append((give, get))
    if candidates:
        give, get = candidates[rng.randrange(len(candidates))]
        reply = f"{reply} {offer_text(give, get)}".strip()
    return reply or "[Deny]"


# -- TruthAndDeception -------------------------------------------------------------


def truth_opponent(ta_env, me: int, rng: random.Random, history: list) -> str:
    """Deceiver (player 0): always argues that the wrong fact is the true one.
    Guesser (player 1): asks questions while the conversation lasts, then guesses the fact the other side
    named last (a seeded coin when it named none) - so it believes whatever it was told."""
    gs = ta_env.state.game_state
    if me == 0:
        wrong = 1 if not gs["fact1"]["is_correct"] else 2
        return f"Fact {wrong} is the correct one, I am certain of it."
    if ta_env.state.turn == ta_env.state.max_turns - 1:
        named = [m.group(1) for text in (t for pid, t in history if pid != me) for m in _FACT.finditer(text)]
        choice = named[-1] if named else str(rng.choice((1, 2)))
        return f"[Fact {choice}]"
    return "Which of the two facts is correct, and why?"


GAMES: dict[str, Game] = {
    "simple_negotiation": Game(
        family="simple_negotiation",
        variants={
            "SimpleNegotiation-v0-short": "short",
            "SimpleNegotiation-v0": "standard",
            "SimpleNegotiation-v0-long": "long",
        },
        roles={0: "first", 1: "second"},
        opponent=negotiation_opponent,
        action_words=(
            "[accept]",
            "[deny]",
            "[offer:",
            "->",
            "]",
            "1",
            "2",
            "3",
            "4",
            "5",
            *(r.lower() for r in RESOURCES),
        ),
        brief="trade so that your inventory value gains more than the opponent's by the turn limit",
    ),
    "truth_and_deception": Game(
        family="truth_and_deception",
        variants={"TruthAndDeception-v0": "standard", "TruthAndDeception-v0-long": "long"},
        roles={0: "deceiver", 1: "guesser"},
        opponent=truth_opponent,
        action_words=(
            "[fact",
            "1]",
            "2]",
            "fact",
            "1",
            "2",
            "is",
            "correct",
            "wrong",
            "true",
            "false",
            "the",
            "which",
            "?",
        ),
        brief="as guesser name the correct fact as [Fact N]; as deceiver make the guesser pick the wrong one",
    ),
}

VARIANT_GAME: dict[str, str] = {vid: fam for fam, g in GAMES.items() for vid in g.variants}


def agent_made_offer(actions: list, agent: int) -> bool:
    return any(parse_offer(text) is not None for pid, text in actions if pid == agent)


def guess_of(text: str) -> int | None:
    m = _GUESS.search(text or "")
    return int(m.group(1)) if m else None


def facts_named(text: str) -> list[int]:
    return [int(m.group(1)) for m in _FACT.finditer(text or "")]
