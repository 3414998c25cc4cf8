"""Reference policies of the negotiation environment and how a policy is measured: `scripted_policy` plays
every task type right (it reaches the ceiling), `random_policy` says a uniform verb, `_bad_policies` each get
one step of the sale wrong (the labelled cases run them); `evaluate_policy` gives a policy's held-out rates.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from rwcore.trainer.envs.base import Environment
from rwcore.trainer.envs.negotiation.language import PRICES, VERBS, parse_observation

__all__ = ["evaluate_policy", "random_policy", "scripted_policy"]


def scripted_policy(observation: str) -> str:
    """A good policy from the latest observation alone (see the package docstring's task types)."""
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


def evaluate_policy(
    env: Environment,
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


def _bad_policies() -> dict[str, Callable[[str, random.Random], str]]:
    """Scripted policies that each get some step of the sale wrong (and the scripted and random ones)."""

    def lowballer(obs, rng):  # offers 20 below the budget it was told
        f = parse_observation(obs)
        if f["bundle_on"] and f["bundle_budget"] is not None:
            return str(max(20, f["bundle_budget"] - 20))
        if f["budget"] is not None and f["bundle_budget"] is None and f["budget"] >= (f["cost"] or 0):
            return str(max(20, f["budget"] - 20))
        return scripted_policy(obs)

    def greedy(obs, rng):  # offers 20 above the budget it was told (the buyer leaves), even on no_deal tasks
        f = parse_observation(obs)
        if f["bundle_on"] and f["bundle_budget"] is not None:
            return str(min(200, f["bundle_budget"] + 20))
        if f["budget"] is not None and f["bundle_budget"] is None:
            return str(min(200, f["budget"] + 20))
        return scripted_policy(obs)

    def bundle_blind(obs, rng):  # a plain offer at the plain budget, bundle or not
        f = parse_observation(obs)
        if f["budget"] is not None:
            return str(f["budget"])
        return scripted_policy(obs)

    def bundle_low(obs, rng):  # proposes the bundle, then offers 20 below its budget
        f = parse_observation(obs)
        if f["bundle_on"] and f["bundle_budget"] is not None:
            return str(max(20, f["bundle_budget"] - 20))
        return scripted_policy(obs)

    def blind(obs, rng):  # never asks: opens at the list price or 20 below it
        f = parse_observation(obs)
        if f["counter"] is not None:
            return "accept"
        return str(max(20, (f["list"] or 100) - rng.choice((0, 20))))

    def stubborn(obs, rng):  # answers a haggler's counter by repeating its opening (out of place)
        f = parse_observation(obs)
        if f["counter"] is not None:
            return str(f["list"])
        return scripted_policy(obs)

    def hesitant(obs, rng):  # ends instead of accepting a counter
        f = parse_observation(obs)
        return "end" if f["counter"] is not None else scripted_policy(obs)

    def unconfirmed(obs, rng):  # answers an agreement with `close` (out of place: nothing confirmed yet)
        f = parse_observation(obs)
        return "close" if f["agreed"] is not None and not f["confirmed"] else scripted_policy(obs)

    def reconfirmer(obs, rng):  # confirms again instead of closing (out of place)
        f = parse_observation(obs)
        return "confirm" if f["confirmed"] else scripted_policy(obs)

    def closer_quits(obs, rng):  # ends the talk once the buyer confirmed
        f = parse_observation(obs)
        return "end" if f["confirmed"] else scripted_policy(obs)

    def asker(obs, rng):  # always asks (a second ask is out of place)
        return "ask"

    def quitter(obs, rng):
        return "end"

    def babbler(obs, rng):
        return rng.choice(("the item", "price is", "ask budget", "one two", "offer", "accept", "bundle", "100"))

    def rand(obs, rng):
        return random_policy(obs, rng)

    def scripted(obs, rng):
        return scripted_policy(obs)

    return {
        "scripted": scripted,
        "random": rand,
        "lowballer": lowballer,
        "greedy": greedy,
        "bundle_blind": bundle_blind,
        "bundle_low": bundle_low,
        "blind": blind,
        "stubborn": stubborn,
        "hesitant": hesitant,
        "unconfirmed": unconfirmed,
        "reconfirmer": reconfirmer,
        "closer_quits": closer_quits,
        "asker": asker,
        "quitter": quitter,
        "babbler": babbler,
    }
