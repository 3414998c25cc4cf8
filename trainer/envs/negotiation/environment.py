"""The negotiation environment's learnable tier (`env.options.difficulty=learnable`, the embedded default):
`NegotiationEnv`, the seller's episodes against a scripted, seeded buyer. The rules of the sale are in the
package docstring; the buyer answers in `_respond`.

The rubric library, reflector, attributor and labelled cases it hands out are imported when asked for: they
replay this environment's episodes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rwcore.trainer.envs.base import Episode, GuidanceLanguage, Outcome, Task
from rwcore.trainer.envs.negotiation.guidance import GUIDANCE_SITUATIONS, observe_situation, situation_of
from rwcore.trainer.envs.negotiation.language import (
    _OBS_WORDS,
    ACTION_PHRASES,
    PRICES,
    SYSTEM_PROMPT,
    VERB_PHRASES,
    parse_action,
    render_observation,
)
from rwcore.trainer.envs.negotiation.tasks import (
    INSULT_MARGIN,
    ITEMS,
    KIND_WEIGHTS,
    KINDS,
    _apportion,
    make_task_data,
)

__all__ = ["NegotiationEnv"]


_OPENINGS = {
    "bundle": "buyer wants bundle",
    "haggler": "buyer haggles",
    "quote": "buyer wants price",
}  # every other kind: "buyer wants item"


class NegotiationEnv:
    """Seller negotiations against a scripted buyer (see the package docstring).

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
        return Episode(task=task, observation=render_observation(state, opening), state=state)

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
        return Episode(task=episode.task, observation=render_observation(s, reply), done=done, state=s)

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
        from rwcore.trainer.envs.negotiation.rubrics import SKILLS

        words: set[str] = set(SYSTEM_PROMPT.split()) | set(_OBS_WORDS) | set(ITEMS)
        words |= {str(p) for p in PRICES}
        for phrase in ACTION_PHRASES:
            words |= set(phrase.split())
        for variants in SKILLS.values():
            for text in variants:
                words |= set(text.split())
        for situation in GUIDANCE_SITUATIONS:
            for phrase in situation.phrases:
                words |= set(phrase.split())
        return sorted(words | {"when", "if", "after", "say"})  # the guidance lines' connectors

    def guidance_language(self) -> GuidanceLanguage:
        """How guidance names this environment's situations and moves (the built-in model's reading prior)."""
        from rwcore.trainer.envs.negotiation.rubrics import SKILLS

        return GuidanceLanguage(
            situations=GUIDANCE_SITUATIONS,
            actions=tuple(self.action_vocabulary()),
            observe=observe_situation,
            situation_of=situation_of,
            skill_texts=tuple(text for variants in SKILLS.values() for text in variants),
        )

    # -- adaptive-method pieces -----------------------------------------------------

    def rules(self):
        from rwcore.trainer.envs.negotiation.rubrics import make_rules

        return make_rules(self)

    def reflector(self):
        from rwcore.trainer.envs.negotiation.reflector import NegotiationReflector

        return NegotiationReflector(self)

    def initial_library(self) -> tuple[str, ...]:
        """The rules RewardWeaver's library starts from (the rest are for controlled expansion)."""
        from rwcore.trainer.envs.negotiation.rubrics import INITIAL_LIBRARY

        return INITIAL_LIBRARY

    def attributor(self):
        from rwcore.trainer.envs.negotiation.attributor import NegotiationAttributor

        return NegotiationAttributor(self)

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        from rwcore.trainer.envs.negotiation.cases import labelled_cases

        return labelled_cases(self, rule_ids)

    def labelled_cases_by_rule(self, rule_ids: Sequence[str]) -> dict:
        from rwcore.trainer.envs.negotiation.cases import labelled_cases_by_rule

        return labelled_cases_by_rule(self, rule_ids)


def _copy_state(state: dict) -> dict:
    """A copy `step` may change: the lists it appends to are new; the dicts inside them (and `agreed`)
    are never mutated once stored, so they are shared."""
    s = dict(state)
    s["events"] = list(state["events"])
    s["offered"] = [list(r) for r in state["offered"]]
    return s
