"""The built-in negotiation environment ("negotiation"): the embedded default's task family.

This module is its learnable tier (`env.options.difficulty=learnable`, the default), where outcome-only RL finds
sales by exploring; `rwcore.trainer.envs.negotiation_hard` is the hard tier (`difficulty=hard`: multi-item
sales, the papers' regime), built from the same sales.

The agent is a seller facing a scripted, seeded buyer, in the spirit of the RewardWeaver Sales
Benchmark (papers/rewardweaver.txt appendix B: elicit the buyer's constraint before proposing;
standard vs constraint-conflict tasks) and of Arise's sparse-outcome agent tasks (papers/arise.txt
§1: a success needs a sequence of distinct behaviours, so a random policy almost never succeeds
and outcome-only GRPO sees mostly all-failure groups). Everything is said in a small word-level
language so a tiny transformer can learn it with RL on a CPU in minutes.

Language
--------
Agent messages (one word per turn; parsing is lenient, see `parse_action`):

    ask       ask the buyer's budget (its constraint; an honest buyer states it)
    match     offer the buyer's latest number: its counter-offer, else the budget it stated for what is on
              the table (the bundle budget once the bundle is proposed); with no number stated it is unclear
    list      offer the list price
    N         offer at price N (N in 20, 40, ..., 200; "offer N" says the same)
    bundle    propose the item plus an accessory: later prices are the bundle's ("bundle N" offers it at N)
    accept    accept the buyer's counter-offer
    confirm   confirm the price the buyer agreed to
    close     close the confirmed deal
    end       end the negotiation without a deal

The built-in policy samples the eight words (`VERB_PHRASES`; `price_words=True` adds the ten price
numbers, `ACTION_PHRASES`). Observations restate the seller's private facts, then the buyer's
message; every buyer number is followed by `above` or `below` (is it at least the cost of what it
is for?), so a small model need not compare two number tokens:

    item lamp cost 60 list 120 buyer wants item
    item lamp cost 60 list 120 buyer budget 100 above
    item lamp cost 60 bundle cost 80 list 120 buyer budget 40 below bundle budget 120 above
    item lamp cost 60 bundle cost 80 list 120 buyer likes bundle budget 120 above
    item lamp cost 60 list 120 buyer too high offer 100 above   (a haggler's counter)
    item lamp cost 60 list 120 buyer agrees 100 above           (then: confirm)
    item lamp cost 60 list 120 buyer confirms                   (then: close)
    item lamp cost 60 list 120 deal 100 above                   (episode over)

A deal takes three steps once the price is right: the buyer agrees (to an offer at or below its
budget, or to `accept` after its counter), the seller confirms, the seller closes. The buyer is
impatient - it leaves at a price named before the seller asked its budget (`buyer not interested
leaves`; a haggler and a buyer who asked for a price need no asking), at the first offer it refuses
(`buyer too high leaves`, `buyer wants bundle leaves` for a plain offer to a bundle buyer) and at
the first unparsable or out-of-place message (`buyer leaves`: asking twice, `match` with no number
stated, accepting with no counter, a bundle nobody wants or proposed twice, a repeated offer,
confirming or closing out of turn, anything but `confirm` / `end` after an agreement, anything but
`close` / `end` after the confirmation). A haggler says `buyer secret` when asked, and never takes a
first offer: it counters at its budget (`buyer too high offer N`) an offer up to 20 above it, leaves
when insulted by more (`buyer leaves`), and counters 20 lower than a price it could have paid; after
its counter it takes `accept` or any offer up to the counter. A buyer who asks for a price (`buyer
wants price`) also says `buyer secret` when asked, and takes the list price, which is its budget.
Other messages: `buyer changed mind leaves` (a hostile buyer, at the moment it would agree), `item
sold out` (the scenario, at the moment of closing), `no deal` (after `end`), ` time up` at max_turns
(6). `step` never mutates the Episode it is given.

Task types (Task.tags); every split holds them in fixed proportions (`KIND_WEIGHTS`)
--------------------------------------------------------------------------------------
standard         honest buyer, budget 20-40 above cost: ask, match (or the budget), confirm, close.
bundle           the buyer only buys the bundle (bundle cost = item cost + 20); its plain budget is below
                 the item cost: ask, bundle, match (or the bundle budget), confirm, close.
haggler          keeps its budget secret: open at the list price (20 above the budget, which draws the
                 counter), accept (or match), confirm, close.
quote            asks for a price: list, confirm, close.
no_deal          the budget is below cost: the right outcome is no deal - ask, then end at once.
hostile_partner  walks out at the moment it would agree, whatever the seller did: unwinnable, and the
                 failure is the partner's (`task.data["winnable"]` False; the attributor says "partner").
sold_out         the item turns out to be sold out at the moment of closing: unwinnable, the scenario's.

Every winnable type needs a different sequence and none is more than 15% of a split, so no fixed
sequence of messages wins more than one type: the best fixed sequence wins 0.150 of the held-out
tasks (the haggler tasks), a uniformly random policy 0.0021 in expectation, and a policy that plays every type
right 0.740 (26% of the tasks cannot be won).

Outcome (sparse)
----------------
success: a closed deal of what the buyer wanted at exactly the buyer's budget for it (at least its
cost; money left on the table is no success), or, on a no_deal task, `end` right after the buyer
stated its budget. reward = 1.0 on success, 0.0 otherwise.

Policies and measured rates
---------------------------
`scripted_policy(observation)` plays every type as described above; `random_policy(observation,
rng)` picks a uniform verb and price. `evaluate_policy(env, policy, split, seeds)` measures them
and `best_fixed_sequence(env)` searches every fixed message sequence (the same messages whatever
the buyer says) for the best held-out success. `python -m rwcore.trainer.envs.negotiation` prints
all three.

Guidance language
-----------------
`guidance_language()` says how guidance in the policy's prompt talks about this environment: thirteen
situations (`GUIDANCE_SITUATIONS`, one per kind of buyer message an agent turn follows: the buyer wants the
item, agrees, confirms, says too high, ...), the phrases a guidance line names each by ("the buyer agrees"),
`observe_situation` (an observation showing one, no episode behind it) and `situation_of` (the situation an
observation shows). The built-in model's reading prior is pretrained on lines over this language with moves
drawn at random (rwcore.trainer.prior); the skill texts of negotiation_rubrics use the same phrases.

Trajectory contract (what the rubric checks read)
--------------------------------------------------
`build_trajectory` makes the Trajectory the trainer must build the same way:
turns = [system(system prompt + skills), partner(first observation), then alternately
assistant(agent message, generated=True) and partner(reply)], outcome = Outcome.reward,
tags = task.tags, metadata = {"env_state": episode.state, "task": task.data,
"task_id": task.task_id, "seed": the reset seed, "success": Outcome.success}. Rules read
metadata["env_state"] (the finished Episode.state, copied as is); when it is missing they
replay the episode from metadata["task"], metadata["task_id"] (else trajectory.task_id),
metadata["seed"] (else 0) and the assistant turns; when both are missing they raise
(RuleJudge: INVALID).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from rwcore.trainer.envs.base import Episode, GuidanceLanguage, GuidanceSituation, Outcome, Task
from rwcore.types import Trajectory, Turn

__all__ = [
    "ACTION_PHRASES",
    "GUIDANCE_SITUATIONS",
    "KINDS",
    "KIND_WEIGHTS",
    "PRICES",
    "NegotiationEnv",
    "best_fixed_sequence",
    "build_trajectory",
    "evaluate_policy",
    "is_offer",
    "observe_situation",
    "parse_action",
    "parse_observation",
    "random_policy",
    "run_episode",
    "scripted_policy",
    "situation_of",
]

PRICES: tuple[int, ...] = tuple(range(20, 201, 20))
"""The prices the built-in policy can say; every cost, budget and list price is one of them."""
ITEMS: tuple[str, ...] = (
    "laptop",
    "phone",
    "chair",
    "lamp",
    "bike",
    "watch",
    "desk",
    "camera",
    "guitar",
    "kettle",
    "tablet",
    "sofa",
    "drone",
    "heater",
    "printer",
    "radio",
    "scooter",
    "speaker",
    "stove",
    "tent",
)
BUNDLE_EXTRA = 20  # the accessory's cost: bundle cost = item cost + 20
INSULT_MARGIN = 20  # a haggler leaves when an offer is more than this above its budget

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

# task kind -> tags, and the mix of kinds in every split
KINDS: dict[str, tuple[str, ...]] = {
    "standard": ("standard",),
    "bundle": ("bundle",),
    "haggler": ("haggler",),
    "quote": ("quote",),
    "no_deal": ("no_deal",),
    "hostile": ("hostile_partner",),
    "sold_out": ("sold_out",),
}
# Relative weights (normalized when splits are drawn: shares 15 / 15 / 15 / 15 / 14 / 13 / 13 %).
KIND_WEIGHTS: dict[str, float] = {
    "standard": 0.15,
    "bundle": 0.15,
    "haggler": 0.15,
    "quote": 0.15,
    "no_deal": 0.14,
    "hostile": 0.13,
    "sold_out": 0.13,
}

_OPENINGS = {
    "bundle": "buyer wants bundle",
    "haggler": "buyer haggles",
    "quote": "buyer wants price",
}  # every other kind: "buyer wants item"
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


# -- the environment ----------------------------------------------------------------


class NegotiationEnv:
    """Seller negotiations against a scripted buyer (see the module docstring).

    seed: task generation seed; num_train / num_eval: split sizes (disjoint, same every call);
    max_turns: agent turns per episode; kind_weights: mix of task kinds (keys of KINDS).
    price_words: whether the action words (`action_vocabulary`, what the built-in policy samples)
    include the ten price numbers besides the eight verbs (off by default: `match` and `list` name
    every price a win needs, so the numbers only dilute exploration).
    """

    name = "negotiation"

    def __init__(
        self,
        seed: int = 0,
        num_train: int = 400,
        num_eval: int = 300,
        max_turns: int = 6,
        kind_weights: dict | None = None,
        price_words: bool = False,
    ) -> None:
        for key, value, low in (
            ("seed", seed, None),
            ("num_train", num_train, 1),
            ("num_eval", num_eval, 1),
            ("max_turns", max_turns, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
                bound = f" >= {low}" if low is not None else ""
                raise ValueError(f"env.options.{key} must be an integer{bound}, got {value!r}")
        weights = dict(KIND_WEIGHTS if kind_weights is None else kind_weights)
        unknown = set(weights) - set(KINDS)
        if (
            unknown
            or not weights
            or any(not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0 for w in weights.values())
            or sum(weights.values()) <= 0
        ):
            raise ValueError(
                f"env.options.kind_weights must map kinds from {sorted(KINDS)} to non-negative weights "
                f"with a positive sum, got {weights}"
            )
        if not isinstance(price_words, bool):
            raise ValueError(f"env.options.price_words must be true or false, got {price_words!r}")
        self.price_words = price_words
        self.seed = seed
        self.num_train = num_train
        self.num_eval = num_eval
        self.max_turns = max_turns
        self.kind_weights = {k: float(v) for k, v in weights.items() if float(v) > 0}
        self.system_prompt = SYSTEM_PROMPT
        self._splits = self._generate()

    def __repr__(self) -> str:
        return (
            f"NegotiationEnv(seed={self.seed}, num_train={self.num_train}, num_eval={self.num_eval}, "
            f"max_turns={self.max_turns})"
        )

    # -- tasks ----------------------------------------------------------------

    def _generate(self) -> dict[str, list[Task]]:
        """Each split holds every kind in proportion to kind_weights (largest remainders), so held-out
        per-type rates rest on fixed counts; instances are distinct across both splits."""
        rng = random.Random(f"negotiation-tasks-v2-{self.seed}")
        seen: set[tuple] = set()
        splits: dict[str, list[Task]] = {}
        for split, size in (("train", self.num_train), ("eval", self.num_eval)):
            tasks: list[Task] = []
            for kind, count in _apportion(self.kind_weights, size).items():
                attempts = 0
                while count:
                    attempts += 1
                    if attempts > 200 * size:
                        raise ValueError(f"cannot generate {size} distinct {split} tasks; ask for fewer")
                    data = make_task_data(rng, kind)
                    key = tuple(sorted((k, str(v)) for k, v in data.items()))
                    if key in seen:  # distinct instances, so eval tasks never appear in train
                        continue
                    seen.add(key)
                    tasks.append(Task("", KINDS[kind], data))
                    count -= 1
            rng.shuffle(tasks)
            splits[split] = [Task(f"neg-{split}-{i:04d}", t.tags, t.data) for i, t in enumerate(tasks)]
        return splits

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return list(self._splits[split])

    def ceiling(self) -> float:
        """The best held-out success any policy can reach: the share of winnable held-out tasks (0.740 by default;
        `scripted_policy` reaches it)."""
        tasks = self.tasks("eval")
        return sum(bool(t.data["winnable"]) for t in tasks) / len(tasks)

    # -- episodes -----------------------------------------------------------------

    def reset(self, task: Task, seed: int) -> Episode:
        d = task.data
        state = {
            "seed": int(seed),
            "max_turns": self.max_turns,
            "kind": d["kind"],
            "item": d["item"],
            "cost": d["cost"],
            "list": d["list"],
            "budget": d["budget"],
            "bundle_cost": d.get("bundle_cost"),
            "bundle_budget": d.get("bundle_budget"),
            "haggler": d["kind"] == "haggler",
            "quote": d["kind"] == "quote",
            "hostile": d["kind"] == "hostile",
            "sold_out": d["kind"] == "sold_out",
            "feasible": bool(d["feasible"]),
            "winnable": bool(d["winnable"]),
            "budget_revealed": False,  # the buyer stated its budget (ask) or countered at it (haggler)
            "bundle_on": False,  # the bundle was proposed: later prices are the bundle's
            "counter": None,  # a haggler's standing counter-offer
            "offered": [],  # [verb, price] of every offer the buyer answered
            "agreed": None,  # the price, kind and cost the buyer agreed to (then: confirm, close)
            "confirmed": False,  # the seller confirmed the agreement (then: close)
            "turns": 0,
            "events": [],
            "deal": None,
            "ended_by": None,
        }
        opening = _OPENINGS.get(d["kind"], "buyer wants item")
        return Episode(task=task, observation=self._observe(state, opening), state=state)

    @staticmethod
    def _observe(state: dict, message: str) -> str:
        head = f"item {state['item']} cost {state['cost']}"
        if state["bundle_cost"] is not None:
            head += f" bundle cost {state['bundle_cost']}"
        return f"{head} list {state['list']} {_with_hints(message, state)}"

    def step(self, episode: Episode, action: str) -> Episode:
        if episode.done:
            raise ValueError("step called on a finished episode")
        s = _copy_state(episode.state)  # the given episode is left as it was
        verb, price = parse_action(action)
        said = verb
        if verb == "match":  # the buyer's latest number for what is on the table
            price = (
                s["counter"]
                if s["counter"] is not None
                else ((s["bundle_budget"] if s["bundle_on"] else s["budget"]) if s["budget_revealed"] else None)
            )
            verb = "offer" if price is not None else "unclear"
        elif verb == "list":
            verb, price = "offer", s["list"]
        if verb == "offer" and s["bundle_on"]:
            verb = "bundle"  # once the bundle is proposed, a price is the bundle's
        s["turns"] += 1
        event = {
            "turn": s["turns"],
            "text": action if isinstance(action, str) else "",
            "said": said,
            "verb": verb,
            "price": price,
            "budget_known_before": s["budget_revealed"],
            "counter_before": s["counter"],
        }
        reply, kind = self._respond(s, verb, price)
        event["reply"] = kind
        s["events"].append(event)
        done = s["ended_by"] is not None
        if not done and s["turns"] >= s["max_turns"]:
            s["ended_by"] = "timeout"
            reply = reply + " time up"
            done = True
        return Episode(task=episode.task, observation=self._observe(s, reply), done=done, state=s)

    @staticmethod
    def _leave(s: dict, message: str, kind: str) -> tuple[str, str]:
        s["ended_by"] = "walkout"
        return message, kind

    def _out_of_place(self, s: dict) -> tuple[str, str]:
        return self._leave(s, "buyer leaves", "unclear_leaves")

    def _agree(self, s: dict, price: int, kind: str) -> tuple[str, str]:
        """The buyer agrees to `price`: the seller must confirm, then close (unless the partner stops it here)."""
        if s["hostile"]:
            s["ended_by"] = "partner"
            return "buyer changed mind leaves", "partner_leaves"
        cost = s["bundle_cost"] if kind == "bundle" else s["cost"]
        s["agreed"] = {"price": int(price), "kind": kind, "cost": int(cost)}
        return (f"buyer agrees bundle {price}" if kind == "bundle" else f"buyer agrees {price}"), "agrees"

    def _wrap_up(self, s: dict, verb: str) -> tuple[str, str]:
        """After the buyer agreed: `confirm`, then `close` (where the scenario may stop the deal); `end` ends
        the talk; anything else is out of place."""
        if verb == "end":
            s["ended_by"] = "agent"
            return "no deal", "no_deal"
        if verb == "confirm" and not s["confirmed"]:
            s["confirmed"] = True
            return "buyer confirms", "confirms"
        if verb == "close" and s["confirmed"]:
            if s["sold_out"]:
                s["ended_by"] = "scenario"
                return "item sold out", "sold_out"
            deal = dict(s["agreed"])
            s["deal"] = deal
            s["ended_by"] = "deal"
            return (f"deal bundle {deal['price']}" if deal["kind"] == "bundle" else f"deal {deal['price']}"), "deal"
        return self._out_of_place(s)

    def _respond(self, s: dict, verb: str, price: int | None) -> tuple[str, str]:
        bundle_task = s["bundle_cost"] is not None
        if s["agreed"] is not None:
            return self._wrap_up(s, verb)
        if verb in ("confirm", "close"):
            return self._out_of_place(s)  # nothing agreed yet
        if verb == "end":
            s["ended_by"] = "agent"
            return "no deal", "no_deal"
        if verb == "unclear":
            return self._out_of_place(s)
        if verb == "ask":
            if any(e["verb"] == "ask" for e in s["events"]):
                return self._out_of_place(s)  # asked again
            if s["haggler"] or s["quote"]:
                return "buyer secret", "secret"
            s["budget_revealed"] = True
            if bundle_task:
                return f"buyer budget {s['budget']} bundle budget {s['bundle_budget']}", "budget"
            return f"buyer budget {s['budget']}", "budget"
        if verb == "accept":
            if s["counter"] is None:
                return self._out_of_place(s)
            return self._agree(s, s["counter"], "plain")
        if verb == "bundle" and (not bundle_task or price is None and s["bundle_on"]):
            return self._out_of_place(s)  # nobody wants a bundle, or it was proposed already
        if verb == "bundle" and price is None:
            s["bundle_on"] = True
            known = f" budget {s['bundle_budget']}" if s["budget_revealed"] else ""
            return f"buyer likes bundle{known}", "bundle_on"
        # an offer at a price
        if [verb, price] in s["offered"]:
            return self._out_of_place(s)  # the buyer already answered exactly this offer
        s["offered"].append([verb, price])
        if not (s["haggler"] or s["quote"]) and not s["budget_revealed"]:
            return self._leave(s, "buyer not interested leaves", "pushy_leaves")  # a price before asking
        if verb == "bundle":
            s["bundle_on"] = True
            if price <= s["bundle_budget"]:
                return self._agree(s, price, "bundle")
            return self._leave(s, "buyer too high leaves", "too_high_leaves")
        if bundle_task:
            return self._leave(s, "buyer wants bundle leaves", "wants_bundle_leaves")
        if s["haggler"]:
            if s["counter"] is not None:  # a second offer: taken at or below its counter
                if price <= s["counter"]:
                    return self._agree(s, price, "plain")
                return self._leave(s, "buyer too high leaves", "too_high_leaves")
            if price > s["budget"] + INSULT_MARGIN:
                return self._leave(s, "buyer leaves", "insulted_leaves")
            # a haggler never takes a first offer: it counters at its budget, or lower than a price it could pay
            s["counter"] = s["budget"] if price > s["budget"] else max(PRICES[0], price - INSULT_MARGIN)
            s["budget_revealed"] = s["counter"] == s["budget"]
            return f"buyer too high offer {s['counter']}", "counter"
        if price <= s["budget"]:
            return self._agree(s, price, "plain")
        return self._leave(s, "buyer too high leaves", "too_high_leaves")

    def outcome(self, episode: Episode) -> Outcome:
        s = episode.state
        deal = s["deal"]
        if deal is not None:
            limit = s["bundle_budget"] if deal["kind"] == "bundle" else s["budget"]
            if deal["price"] < deal["cost"]:
                return Outcome(0.0, False, f"sold below cost at {deal['price']} (cost {deal['cost']})")
            if deal["price"] < limit:
                return Outcome(0.0, False, f"deal at {deal['price']} left money on the table (budget {limit})")
            return Outcome(1.0, True, f"deal at {deal['price']} (cost {deal['cost']}, budget {limit})")
        if not s["feasible"]:
            events = s["events"]
            if s["ended_by"] == "agent" and len(events) >= 2 and events[-2]["reply"] == "budget":
                return Outcome(1.0, True, "no deal: the agent ended a hopeless negotiation once it heard the budget")
            return Outcome(0.0, False, f"no deal, not an informed end by the agent ({s['ended_by']})")
        return Outcome(0.0, False, f"no deal ({s['ended_by']})")

    # -- language -----------------------------------------------------------------

    def action_vocabulary(self) -> list[str]:
        """The words agent messages are made of (what `rollout.action_words=on` restricts sampling to)."""
        phrases = ACTION_PHRASES if self.price_words else VERB_PHRASES
        return sorted({word for phrase in phrases for word in phrase.split()})

    def vocabulary(self) -> list[str]:
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        words: set[str] = set(SYSTEM_PROMPT.split()) | set(_OBS_WORDS) | set(ITEMS)
        words |= {str(p) for p in PRICES}
        for phrase in ACTION_PHRASES:
            words |= set(phrase.split())
        for variants in rubrics.SKILLS.values():
            for text in variants:
                words |= set(text.split())
        for situation in GUIDANCE_SITUATIONS:
            for phrase in situation.phrases:
                words |= set(phrase.split())
        return sorted(words | {"when", "if", "after", "say"})  # the guidance lines' connectors

    def guidance_language(self) -> GuidanceLanguage:
        """How guidance names this environment's situations and moves (the built-in model's reading prior)."""
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return GuidanceLanguage(
            situations=GUIDANCE_SITUATIONS,
            actions=tuple(self.action_vocabulary()),
            observe=observe_situation,
            situation_of=situation_of,
            skill_texts=tuple(text for variants in rubrics.SKILLS.values() for text in variants),
        )

    # -- adaptive-method pieces -----------------------------------------------------

    def rules(self):
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return rubrics.make_rules(self)

    def reflector(self):
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return rubrics.NegotiationReflector(self)

    def initial_library(self) -> tuple[str, ...]:
        """The rules RewardWeaver's library starts from (the rest are for controlled expansion)."""
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return rubrics.INITIAL_LIBRARY

    def attributor(self):
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return rubrics.NegotiationAttributor(self)

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return rubrics.labelled_cases(self, rule_ids)

    def labelled_cases_by_rule(self, rule_ids: Sequence[str]) -> dict:
        from rwcore.trainer.envs import negotiation_rubrics as rubrics

        return rubrics.labelled_cases_by_rule(self, rule_ids)


def _apportion(weights: dict[str, float], size: int) -> dict[str, int]:
    """`size` split over the kinds in proportion to `weights` (largest remainders; ties by name)."""
    total = sum(weights.values())
    exact = {kind: size * w / total for kind, w in sorted(weights.items())}
    counts = {kind: int(v) for kind, v in exact.items()}
    for kind in sorted(exact, key=lambda k: (-(exact[k] - counts[k]), k))[: size - sum(counts.values())]:
        counts[kind] += 1
    return counts


def _copy_state(state: dict) -> dict:
    """A copy `step` may change: the lists it appends to are new; the dicts inside them (and `agreed`)
    are never mutated once stored, so they are shared."""
    s = dict(state)
    s["events"] = list(state["events"])
    s["offered"] = [list(r) for r in state["offered"]]
    return s


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


def make_task_data(rng: random.Random, kind: str) -> dict:
    """One task instance of `kind` (a key of KINDS), drawn from `rng`."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; known: {sorted(KINDS)}")
    item = rng.choice(ITEMS)
    cost = rng.choice(range(40, 141, 20))
    data = {"kind": kind, "item": item, "cost": cost, "bundle_cost": None, "bundle_budget": None}
    if kind in ("standard", "hostile", "sold_out"):
        budget = cost + rng.choice((20, 40))
        list_price = min(200, budget + rng.choice((20, 40)))
    elif kind == "haggler":
        budget = cost + rng.choice((20, 40))
        list_price = budget + INSULT_MARGIN  # opening at the list price draws the counter
    elif kind == "quote":
        budget = cost + rng.choice((20, 40))
        list_price = budget  # the buyer pays the list price it asked for
    elif kind == "bundle":
        budget = cost - 20
        data["bundle_cost"] = cost + BUNDLE_EXTRA
        data["bundle_budget"] = data["bundle_cost"] + rng.choice((20, 40))
        list_price = min(200, cost + 60)
    else:  # no_deal
        budget = max(20, cost - rng.choice((20, 40)))
        list_price = min(200, cost + 60)
    data["budget"] = budget
    data["list"] = list_price
    feasible = budget >= cost or (data["bundle_budget"] is not None and data["bundle_budget"] >= data["bundle_cost"])
    data["feasible"] = bool(feasible)
    # unwinnable: a hostile buyer leaves when it would agree, a sold-out item cannot be sold
    data["winnable"] = kind not in ("hostile", "sold_out")
    return data


# -- guidance language --------------------------------------------------------------------
# How guidance in the policy's prompt names what the buyer just said (GuidanceLanguage). Each situation is
# one kind of buyer message an agent turn follows; its phrases are the words a guidance line uses for it.
# The phrases say what the buyer did, never what the seller should do about it.

GUIDANCE_SITUATIONS: tuple[GuidanceSituation, ...] = (
    GuidanceSituation("wants_item", ("the buyer wants item",)),
    GuidanceSituation("wants_bundle", ("the buyer wants bundle",)),
    GuidanceSituation("haggles", ("the buyer haggles",)),
    GuidanceSituation("wants_price", ("the buyer wants price",)),
    GuidanceSituation("secret", ("the buyer says secret",)),
    GuidanceSituation("budget_above", ("the buyer says budget", "budget is above cost")),
    GuidanceSituation("budget_below", ("budget is below cost",)),
    GuidanceSituation("bundle_budgets", ("the buyer says bundle budget",)),
    GuidanceSituation("likes_bundle", ("the buyer likes bundle",)),
    GuidanceSituation("likes_bundle_budget", ("the buyer likes bundle budget",)),
    GuidanceSituation("counter", ("the buyer says too high",)),
    GuidanceSituation("agrees", ("the buyer agrees",)),
    GuidanceSituation("confirms", ("the buyer confirms",)),
)
# situation -> (task kinds whose buyer can say it, the message; {b}: budget, {bb}: bundle budget, {p}: a price)
_SITUATION_MESSAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "wants_item": (("standard", "no_deal", "hostile", "sold_out"), "buyer wants item"),
    "wants_bundle": (("bundle",), "buyer wants bundle"),
    "haggles": (("haggler",), "buyer haggles"),
    "wants_price": (("quote",), "buyer wants price"),
    "secret": (("haggler", "quote"), "buyer secret"),
    "budget_above": (("standard", "hostile", "sold_out"), "buyer budget {b}"),
    "budget_below": (("no_deal",), "buyer budget {b}"),
    "bundle_budgets": (("bundle",), "buyer budget {b} bundle budget {bb}"),
    "likes_bundle": (("bundle",), "buyer likes bundle"),
    "likes_bundle_budget": (("bundle",), "buyer likes bundle budget {bb}"),
    "counter": (("haggler",), "buyer too high offer {p}"),
    "agrees": (("standard", "bundle", "haggler", "quote", "sold_out"), "buyer agrees {p}"),
    "confirms": (("standard", "bundle", "haggler", "quote", "sold_out"), "buyer confirms"),
}
# the buyer's message with its numbers and above / below hints left out -> situation
_MESSAGE_SITUATIONS: dict[str, str] = {
    "buyer wants item": "wants_item",
    "buyer wants bundle": "wants_bundle",
    "buyer haggles": "haggles",
    "buyer wants price": "wants_price",
    "buyer secret": "secret",
    "buyer budget bundle budget": "bundle_budgets",
    "buyer likes bundle": "likes_bundle",
    "buyer likes bundle budget": "likes_bundle_budget",
    "buyer too high offer": "counter",
    "buyer agrees": "agrees",
    "buyer agrees bundle": "agrees",
    "buyer confirms": "confirms",
}


def observe_situation(name: str, rng: random.Random) -> str:
    """An observation showing situation `name` (GUIDANCE_SITUATIONS): a fresh instance of a task kind
    whose buyer can say it, with that message - no episode behind it, so nothing about the moves before."""
    if name not in _SITUATION_MESSAGES:
        raise ValueError(f"unknown situation {name!r}; known: {sorted(_SITUATION_MESSAGES)}")
    kinds, template = _SITUATION_MESSAGES[name]
    data = make_task_data(rng, rng.choice(kinds))
    bundle = data["bundle_cost"] is not None
    price = data["bundle_budget"] if bundle else data["budget"]
    if name == "counter":
        price = rng.choice((data["budget"], max(PRICES[0], data["budget"] - INSULT_MARGIN)))
    message = template.format(b=data["budget"], bb=data["bundle_budget"], p=price)
    if name == "agrees" and bundle:
        message = f"buyer agrees bundle {price}"
    state = {"item": data["item"], "cost": data["cost"], "list": data["list"], "bundle_cost": data["bundle_cost"]}
    return NegotiationEnv._observe(state, message)


def situation_of(observation: str) -> str | None:
    """The GUIDANCE_SITUATIONS name an observation shows (None: the buyer left, the deal is done, time is up)."""
    words = observation.split()
    start = next(
        (i + 2 for i, word in enumerate(words) if word == "list" and i + 1 < len(words) and words[i + 1].isdigit()),
        None,
    )
    if start is None:
        return None
    message = words[start:]
    core = " ".join(word for word in message if not word.isdigit() and word not in ("above", "below"))
    if core == "buyer budget":
        return "budget_above" if message[-1] == "above" else "budget_below"
    return _MESSAGE_SITUATIONS.get(core)


# -- policies -------------------------------------------------------------------------


def scripted_policy(observation: str) -> str:
    """A good policy from the latest observation alone (see the module docstring's task types)."""
    f = parse_observation(observation)
    cost = f["cost"] or 0
    if f["confirmed"]:
        return "close"
    if f["agreed"] is not None:
        return "confirm"
    if f["counter"] is not None:
        return "accept" if f["counter"] >= cost else "end"
    if f["bundle_budget"] is not None and f["bundle_cost"] is not None and f["bundle_budget"] >= f["bundle_cost"]:
        return str(f["bundle_budget"]) if f["bundle_on"] else "bundle"
    if f["budget"] is not None:
        return str(f["budget"]) if f["budget"] >= cost else "end"
    if f["haggles"] or f["quote"] or f["secret"]:
        return str(f["list"])
    return "ask"


def random_policy(observation: str, rng: random.Random) -> str:
    """Uniform over the verbs (`VERBS`), then a uniform price for `offer` (ignores the observation)."""
    verb = rng.choice(VERBS)
    return str(rng.choice(PRICES)) if verb == "offer" else verb


# -- trajectories ---------------------------------------------------------------------


def build_trajectory(
    env: NegotiationEnv,
    episode: Episode,
    agent_messages: Sequence[str],
    partner_messages: Sequence[str],
    *,
    system_prompt: str | None = None,
    outcome: Outcome | None = None,
    trajectory_id: str = "",
    group_id: str = "",
    policy_version: int = 0,
    generated_length: int = 0,
) -> Trajectory:
    """The Trajectory of a finished episode, built the way the trainer must build it.

    partner_messages: the observations in order, the first (the brief) included, so
    len(partner_messages) is len(agent_messages) + 1 (or equal when the episode was cut short).
    system_prompt: the system turn's text (default env.system_prompt; pass it with the injected
    skills appended when Arise adds them).
    turns: system, then partner / assistant alternately (assistant turns generated=True).
    metadata: env_state (episode.state), task (task.data), task_id, seed, success.
    """
    outcome = env.outcome(episode) if outcome is None else outcome
    turns = [Turn("system", env.system_prompt if system_prompt is None else system_prompt)]
    for i, observation in enumerate(partner_messages):
        turns.append(Turn("partner", observation))
        if i < len(agent_messages):
            turns.append(Turn("assistant", agent_messages[i], generated=True))
    return Trajectory(
        task_id=episode.task.task_id,
        turns=turns,
        outcome=float(outcome.reward),
        tags=tuple(episode.task.tags),
        group_id=group_id,
        policy_version=policy_version,
        generated_length=generated_length,
        trajectory_id=trajectory_id or f"{episode.task.task_id}/{group_id}/0",
        metadata={
            "env_state": episode.state,
            "task": dict(episode.task.data),
            "task_id": episode.task.task_id,
            "seed": int(episode.state.get("seed", 0)),
            "success": bool(outcome.success),
        },
    )


def evaluate_policy(
    env: NegotiationEnv,
    policy_fn: Callable[[str, random.Random], str],
    split: str = "eval",
    seeds: Sequence[int] = (0,),
) -> tuple[float, float]:
    """(success rate, mean reward) of `policy_fn(observation, rng)` over `split` x `seeds`
    (rng seeded per task and seed, so the figures are reproducible)."""
    wins = total = 0
    reward = 0.0
    for seed in seeds:
        for task in env.tasks(split):
            rng = random.Random(f"{task.task_id}/{seed}")
            episode = env.reset(task, seed)
            while not episode.done:
                episode = env.step(episode, policy_fn(episode.observation, rng))
            outcome = env.outcome(episode)
            wins += bool(outcome.success)
            reward += outcome.reward
            total += 1
    return wins / total, reward / total


def is_offer(event: dict) -> bool:
    """Whether an episode event is an offer at a price (not the bundle proposal, which has none)."""
    return event["verb"] in PRICE_VERBS and event["price"] is not None


def _winning_moves(state: dict, turns_left: int) -> set:
    """Messages at least one of which a fixed continuation of at most `turns_left` messages must say for a
    running episode to succeed (a necessary condition; empty when it cannot succeed): `ask` while the
    budget is unknown, then `match` or the exact budget (the bundle budget, after `bundle`; `list` too when
    the list price is that budget), `end` right
    after a budget below cost, the list price that draws a haggler's counter at its budget, then `accept`
    or `match` or the counter; a quote buyer's list price; after an agreement at the budget, `confirm`,
    then `close`."""
    if not state["winnable"] or turns_left < 1:
        return set()
    if state["agreed"] is not None:
        agreed = state["agreed"]
        limit = state["bundle_budget"] if agreed["kind"] == "bundle" else state["budget"]
        if agreed["price"] != limit or agreed["price"] < agreed["cost"]:
            return set()
        return {"close"} if state["confirmed"] else ({"confirm"} if turns_left >= 2 else set())
    events = state["events"]
    if state["haggler"]:
        counter, budget = state["counter"], state["budget"]
        if counter is None:
            moves = {str(p) for p in PRICES if budget < p <= budget + INSULT_MARGIN} | {"list"}
            return moves if turns_left >= 4 else set()
        ok = counter == budget and budget >= state["cost"] and turns_left >= 3
        return {"accept", "match", str(budget)} if ok else set()
    if state["quote"]:
        return {"list", str(state["budget"])} if turns_left >= 3 else set()
    if not state["budget_revealed"]:
        need = (
            4
            if state["feasible"] and state["bundle_cost"] is None
            else (5 - state["bundle_on"] if state["feasible"] else 2)
        )
        return {"ask"} if turns_left >= need else set()
    if not state["feasible"]:
        return {"end"} if events and events[-1]["reply"] == "budget" else set()
    if turns_left < 3:
        return set()
    offered = {tuple(o) for o in state["offered"]}
    if state["bundle_cost"] is not None:
        if not state["bundle_on"]:
            return {"bundle"} if turns_left >= 4 else set()
        target = state["bundle_budget"]
        moves = {str(target), "match"} | ({"list"} if state["list"] == target else set())
        return moves if ("bundle", target) not in offered else set()
    moves = {str(state["budget"]), "match"} | ({"list"} if state["list"] == state["budget"] else set())
    return moves if ("offer", state["budget"]) not in offered else set()


def best_fixed_sequence(
    env: NegotiationEnv, split: str = "eval", max_length: int | None = None, phrases: Sequence[str] | None = None
) -> tuple[float, tuple[str, ...]]:
    """(success rate, sequence) of the best *fixed* message sequence on `split`: the same messages in the
    same order whatever the buyer says (an episode that ends early stops reading the sequence).

    Exhaustive depth-first search over sequences of `phrases` (default: the environment's action
    words, `env.action_vocabulary()`) up to `max_length` (default env.max_turns), with branch-and-bound: every running
    episode that can still succeed needs one
    of a few messages (`_winning_moves`), and one message of the continuation can serve only the
    episodes that need it, so the successes of the best continuation of k more messages are at most
    the sum of the k largest counts of needed messages. A prefix is extended only while its
    successes plus that bound exceed the best sequence found. The buyer is deterministic, so one
    episode per task decides."""
    tasks = env.tasks(split)
    phrases = tuple(env.action_vocabulary()) if phrases is None else tuple(phrases)
    limit = env.max_turns if max_length is None else max_length
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
    best: list = [0, ()]

    def bound(episodes: list[Episode], turns_left: int) -> int:
        counts: dict = {}
        hopeful = 0
        for episode in episodes:
            moves = _winning_moves(episode.state, turns_left)
            hopeful += bool(moves)
            for move in moves:
                counts[move] = counts.get(move, 0) + 1
        return min(hopeful, sum(sorted(counts.values(), reverse=True)[:turns_left]))

    def search(episodes: list[Episode], wins: int, prefix: tuple[str, ...]) -> None:
        if wins > best[0]:
            best[0], best[1] = wins, prefix
        if len(prefix) >= limit:
            return
        children = []
        for phrase in phrases:
            running, won = [], wins
            for episode in episodes:
                nxt = env.step(episode, phrase)
                if nxt.done:
                    won += bool(env.outcome(nxt).success)
                else:
                    running.append(nxt)
            children.append((won + bound(running, limit - len(prefix) - 1), won, running, phrase))
        children.sort(key=lambda c: (-c[1], -c[0]))  # best so far first: a good incumbent prunes sooner
        for upper, won, running, phrase in children:
            if upper > best[0]:
                search(running, won, prefix + (phrase,))

    search([env.reset(task, 0) for task in tasks], 0, ())
    return best[0] / len(tasks), tuple(best[1])


def run_episode(
    env: NegotiationEnv,
    task: Task,
    policy_fn: Callable[[str], str],
    seed: int = 0,
    trajectory_id: str = "",
    group_id: str = "",
) -> Trajectory:
    """Runs `task` with `policy_fn(observation) -> message` and returns its Trajectory."""
    episode = env.reset(task, seed)
    partner = [episode.observation]
    agent: list[str] = []
    while not episode.done:
        message = policy_fn(episode.observation)
        agent.append(message)
        episode = env.step(episode, message)
        partner.append(episode.observation)
    return build_trajectory(
        env,
        episode,
        agent,
        partner,
        trajectory_id=trajectory_id or f"{task.task_id}/{group_id}/{seed}",
        group_id=group_id,
    )


def _main() -> None:  # python -m rwcore.trainer.envs.negotiation
    env = NegotiationEnv()
    scripted, _ = evaluate_policy(env, lambda observation, rng: scripted_policy(observation))
    rand, _ = evaluate_policy(env, random_policy, seeds=range(20))
    rate, sequence = best_fixed_sequence(env)
    print(
        f"held-out success over {len(env.tasks('eval'))} tasks: scripted {scripted:.3f}, random {rand:.4f} "
        f"(20 seeds), best fixed sequence {rate:.3f} ({', '.join(sequence)})"
    )


if __name__ == "__main__":
    _main()
