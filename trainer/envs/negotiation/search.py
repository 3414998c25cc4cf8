"""The best fixed message sequence of the negotiation environment (`best_fixed_sequence`): an exhaustive,
branch-and-bound search over every sequence of move words said whatever the buyer answers, which measures how
much a policy that does not read the buyer can win (0.150 of the held-out tasks).
"""

from __future__ import annotations

from collections.abc import Sequence

from rwcore.trainer.envs.base import Episode
from rwcore.trainer.envs.negotiation.environment import NegotiationEnv
from rwcore.trainer.envs.negotiation.language import PRICES
from rwcore.trainer.envs.negotiation.tasks import INSULT_MARGIN

__all__ = ["best_fixed_sequence"]


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
