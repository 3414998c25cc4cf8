"""TextArena's programmatic pieces: the rule library (checks over the finished game's `env_state`), the
skill texts of its rule reflector, and the labelled cases for RewardWeaver's acceptance test (games played with
agent moves that make a rule pass or fail by construction).
"""

from __future__ import annotations

import random

from rwcore.trainer.envs.base import Rule, Task
from rwcore.trainer.envs.textarena.games import GAMES, agent_made_offer, facts_named, guess_of
from rwcore.types import RubricSpec, Trajectory, Turn


def make_rules(fams: set[str]) -> list[Rule]:
    """The rules of the game families `fams` (ta_valid_moves always)."""
    out = [
        Rule(
            RubricSpec(
                "ta_valid_moves",
                "Every move the agent made was valid in the game's action format "
                "(TextArena never had to ask it to resubmit).",
                "always",
                "Execution",
            ),
            "format",
            _valid_moves,
        )
    ]
    if "simple_negotiation" in fams:
        out += [
            Rule(
                RubricSpec(
                    "ta_offer_made",
                    "In a trading game the agent made at least one well-formed offer "
                    "'[Offer: N Resource -> M Resource]'.",
                    "SimpleNegotiation games",
                    "Execution",
                ),
                "negotiation",
                _offer_made,
            ),
            Rule(
                RubricSpec(
                    "ta_profitable_trades",
                    "Every trade the agent took part in raised the value of its "
                    "own inventory at its own resource values.",
                    "SimpleNegotiation games with at least one executed trade",
                    "Verification",
                ),
                "negotiation",
                _profitable_trades,
            ),
        ]
    if "truth_and_deception" in fams:
        out += [
            Rule(
                RubricSpec(
                    "ta_guess_format",
                    "As guesser, the final message states the guess as '[Fact 1]' or '[Fact 2]'.",
                    "TruthAndDeception, agent is the guesser",
                    "Execution",
                ),
                "format",
                _guess_format,
            ),
            Rule(
                RubricSpec(
                    "ta_deceiver_consistent",
                    "As deceiver, every fact the agent names as its pick is "
                    "the wrong one (it never points the guesser to the correct fact).",
                    "TruthAndDeception, agent is the deceiver, naming at least one fact",
                    "Understanding",
                ),
                "deception",
                _deceiver_consistent,
            ),
        ]
    return out


def labelled_cases(env, rid: str, num_sources: int) -> list:
    """`num_sources` PASS and FAIL case pairs for rule `rid`, played on `env` (a TextArenaEnv) against its
    scripted opponent (see TextArenaEnv.labelled_cases_by_rule)."""
    from rwcore.rewardweaver import LabelledCase

    known = {rule.spec.rubric_id for rule in env.rules()}
    if rid not in known:
        raise ValueError(f"env.name 'textarena': no rule {rid!r} (rules: {sorted(known)})")
    trading = rid in ("ta_offer_made", "ta_profitable_trades")
    family = "simple_negotiation" if trading else "truth_and_deception"
    vid = "SimpleNegotiation-v0-short" if trading else "TruthAndDeception-v0"
    pid = 0 if trading or rid == "ta_deceiver_consistent" else 1
    rng = random.Random(f"textarena-cases:{rid}")
    cases, tries = [], 0
    while len(cases) < 2 * num_sources and tries < 50 * num_sources:
        tries += 1
        game_seed = rng.randrange(2**31 - 1)
        gs = env._make(vid, game_seed).state.game_state
        plans = case_moves(rid, gs)
        if plans is None:
            continue
        role = GAMES[family].roles[pid]
        task = Task(
            f"{vid}/{role}/{game_seed}",
            (family, f"{family}/{role}"),
            {"game_id": vid, "family": family, "agent_id": pid, "role": role, "game_seed": game_seed},
        )
        for label, moves in plans:
            episode = env.reset(task, 0)
            turns = [Turn("system", env.system_prompt), Turn("partner", episode.observation)]
            for move in moves:
                if episode.done:
                    break
                episode = env.step(episode, move)
                turns.append(Turn("assistant", move, generated=True))
                if not episode.done:
                    turns.append(Turn("partner", episode.observation))
            traj = Trajectory(
                task_id=task.task_id,
                turns=turns,
                outcome=env.outcome(episode).reward,
                tags=task.tags,
                trajectory_id=f"case/{rid}/{game_seed}/{label}",
                metadata={
                    "env_state": episode.state,
                    "task": task.data,
                    "task_id": task.task_id,
                    "seed": 0,
                    "labelled_rule": rid,
                },
            )
            cases.append(LabelledCase(traj, label, f"{vid}:{game_seed}"))
    return cases


def case_moves(rid: str, gs: dict):
    """[(label, agent moves)] for one game instance, or None when it has no clear case."""
    deny = ["[Deny]"] * 6
    if rid == "ta_valid_moves":
        return [(True, ["which one?", "why?", "[Fact 1]"]), (False, ["which one?", "why?", "no idea", "none"])]
    if rid == "ta_guess_format":
        return [(True, ["hello", "hello", "[Fact 2]"]), (False, ["hello", "hello", "fact two", "fact two"])]
    if rid == "ta_deceiver_consistent":
        wrong = 1 if not gs["fact1"]["is_correct"] else 2
        return [(True, [f"Fact {wrong} is the true one."] * 3), (False, [f"Fact {3 - wrong} is the true one."] * 3)]
    if rid == "ta_offer_made":
        return [(True, ["[Offer: 1 Wheat -> 1 Wood]"] + deny), (False, deny)]
    values, stock = gs["player_values"], gs["player_resources"]
    gain = lossy = None
    for a in ("Wheat", "Wood", "Sheep", "Brick", "Ore"):
        for b in ("Wheat", "Wood", "Sheep", "Brick", "Ore"):
            for na in (1, 2, 3):
                for nb in (1, 2, 3):
                    if a == b or stock[1][b] < nb or na * values[1][a] - nb * values[1][b] <= 0:
                        continue  # the opponent would not take it
                    mine = nb * values[0][b] - na * values[0][a]
                    if mine > 0 and gain is None:
                        gain = f"[Offer: {na} {a} -> {nb} {b}]"
                    if mine < 0 and lossy is None:
                        lossy = f"[Offer: {na} {a} -> {nb} {b}]"
    if gain is None or lossy is None:
        return None
    return [(True, [gain] + deny), (False, [lossy] + deny)]


SKILLS = {
    "ta_valid_moves": "use the game's exact action format: [offer: n resource -> m resource] , [accept] , [deny] , "
    "[fact 1] or [fact 2]",
    "ta_offer_made": "make an offer in the format [offer: n resource -> m resource]",
    "ta_profitable_trades": "only accept or offer trades where what you get is worth more to you than what you give",
    "ta_guess_format": "on your last turn as guesser answer only [fact 1] or [fact 2]",
    "ta_deceiver_consistent": "as deceiver always say the wrong fact is the correct one",
}


# -- rule checks: read Trajectory.metadata["env_state"] (the finished Episode.state) --------------


def _state(trajectory: Trajectory) -> dict:
    state = (trajectory.metadata or {}).get("env_state")
    if not isinstance(state, dict) or "agent_moves" not in state:
        raise ValueError(f"trajectory {trajectory.trajectory_id!r} has no textarena env_state in its metadata")
    return state


def _valid_moves(trajectory: Trajectory):
    moves = _state(trajectory)["agent_moves"]
    return None if not moves else all(m["valid"] for m in moves)


def _offer_made(trajectory: Trajectory):
    s = _state(trajectory)
    if s["family"] != "simple_negotiation":
        return None
    return agent_made_offer([(p, t) for p, t in s["actions"]], s["agent_id"])


def _profitable_trades(trajectory: Trajectory):
    s = _state(trajectory)
    if s["family"] != "simple_negotiation" or not s["trades"]:
        return None
    return all(t["agent_gain"] > 0 for t in s["trades"])


def _guess_format(trajectory: Trajectory):
    s = _state(trajectory)
    if s["family"] != "truth_and_deception" or s["role"] != "guesser" or not s["agent_moves"]:
        return None
    return guess_of(s["agent_moves"][-1]["text"]) is not None


def _deceiver_consistent(trajectory: Trajectory):
    s = _state(trajectory)
    if s["family"] != "truth_and_deception" or s["role"] != "deceiver":
        return None
    wrong = s.get("wrong_fact")
    named = [n for m in s["agent_moves"] for n in facts_named(m["text"])]
    if not named or wrong is None:
        return None
    return all(n == wrong for n in named)
