"""The negotiation environment's task generator: the kinds of buyer, their mix in a split, and one task's
scenario sheet (`make_task_data`: item, cost, list price, budgets, whether a deal is possible and winnable).
"""

from __future__ import annotations

import random

__all__ = ["BUNDLE_EXTRA", "INSULT_MARGIN", "ITEMS", "KINDS", "KIND_WEIGHTS", "make_task_data"]

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


def _apportion(weights: dict[str, float], size: int) -> dict[str, int]:
    """`size` split over the kinds in proportion to `weights` (largest remainders; ties by name)."""
    total = sum(weights.values())
    exact = {kind: size * w / total for kind, w in sorted(weights.items())}
    counts = {kind: int(v) for kind, v in exact.items()}
    for kind in sorted(exact, key=lambda k: (-(exact[k] - counts[k]), k))[: size - sum(counts.values())]:
        counts[kind] += 1
    return counts


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
