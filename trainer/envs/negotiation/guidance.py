"""The negotiation environment's guidance language (`GuidanceLanguage`): the situations a guidance line in the
policy's prompt names, the phrases it names them by, an observation showing one (`observe_situation`) and the
situation an observation shows (`situation_of`). The built-in model's reading prior is pretrained on it.
"""

from __future__ import annotations

import random

from rwcore.trainer.envs.base import GuidanceSituation
from rwcore.trainer.envs.negotiation.language import PRICES, render_observation
from rwcore.trainer.envs.negotiation.tasks import INSULT_MARGIN, make_task_data

__all__ = ["GUIDANCE_SITUATIONS", "observe_situation", "situation_of"]


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
    return render_observation(state, message)


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
