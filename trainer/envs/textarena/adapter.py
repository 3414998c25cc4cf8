"""`TextArenaEnv`: TextArena's two-player text games as an `rw train` environment (see the package docstring)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import OrderedDict
from collections.abc import Sequence

from rwcore.trainer.envs.base import Episode, Outcome, Rule, Task, own_random, partner_failed
from rwcore.trainer.envs.textarena import rubrics
from rwcore.trainer.envs.textarena.games import GAMES, VARIANT_GAME, inventory_value, parse_offer

INSTALL_HINT = (
    "env.name=textarena needs the textarena package (tested with 0.7.4): pip install 'rwcore[textarena]' "
    "(or add textarena to RWCORE_EXTRAS for scripts/setup.sh)"
)
OPPONENTS = ("scripted", "llm", "self")
_LIVE_CACHE = 512  # live TextArena games kept between steps (others are rebuilt by replaying their moves)


def _import_textarena():
    try:
        import textarena  # F401
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from None
    import textarena

    return textarena


def _opponent_rng(game_seed: int, seed: int) -> random.Random:
    return random.Random(f"textarena-opponent:{game_seed}:{seed}")


class TextArenaEnv:
    """env.name=textarena. Options (env.options.*):

    games: game families and/or TextArena ids to play (default: every supported negotiation-style family,
        "simple_negotiation" and "truth_and_deception"); a family means all of its variants.
    roles: "both" (default) or a list of role names (first/second, deceiver/guesser) the agent plays.
    opponent: "scripted" (default, a rule-based player per game), "llm" (an OpenAI-compatible chat model,
        see partner_* options) or "self" (the policy itself writes the opponent's moves; the trainer attaches
        it with `attach_policy`).
    num_train / num_eval: tasks per split (default 64 / 16); seed: the split seed (default 0).
    partner_model / partner_base_url / partner_api_key_env / partner_timeout / partner_max_tokens /
        partner_temperature / partner_max_concurrency / partner_reply_format ("json": structured
        {"message", "leave"} replies, the move is "message"; "text": the plain reply) / partner_max_reply_chars
        (400; keep it below partner_max_tokens' worth of text so a JSON reply is never cut off): the LLM opponent.
    """

    name = "textarena"

    def __init__(
        self,
        games: Sequence[str] | str | None = None,
        roles: Sequence[str] | str = "both",
        opponent: str = "scripted",
        num_train: int = 64,
        num_eval: int = 16,
        seed: int = 0,
        partner_model: str = "",
        partner_base_url: str = "",
        partner_api_key_env: str = "OPENAI_API_KEY",
        partner_timeout: float = 60.0,
        partner_max_tokens: int = 128,
        partner_temperature: float = 0.7,
        partner_max_concurrency: int = 8,
        partner_reply_format: str = "json",
        partner_max_reply_chars: int = 400,
    ) -> None:
        self._ta = _import_textarena()
        self.variants = self._variants(games)
        self.roles = self._roles(roles)
        if opponent not in OPPONENTS:
            raise ValueError(f"env.options.opponent: {opponent!r} is not one of {list(OPPONENTS)}")
        for key, value in (("num_train", num_train), ("num_eval", num_eval)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"env.options.{key}: must be a positive integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"env.options.seed: must be an integer, got {seed!r}")
        self.opponent = opponent
        self.num_train, self.num_eval, self.seed = num_train, num_eval, seed
        self.partner = None
        if opponent in ("llm", "self"):
            from rwcore.trainer.envs.textarena.partner import LLMOpponent

            self.partner = LLMOpponent(
                opponent,
                model=partner_model,
                base_url=partner_base_url,
                api_key_env=partner_api_key_env,
                timeout=partner_timeout,
                max_tokens=partner_max_tokens,
                temperature=partner_temperature,
                max_concurrency=partner_max_concurrency,
                reply_format=partner_reply_format,
                max_reply_chars=partner_max_reply_chars,
            )
        turns = 0
        for vid in self.variants:
            spec = self._ta.envs.registration.ENV_REGISTRY[vid + "-raw"]
            total = int(spec.kwargs.get("max_turns") or 10)
            # TextArena checks the turn limit before counting the move, so a game of N turns has N + 1 moves;
            # every agent move may be resubmitted once after an invalid one
            turns = max(turns, 2 * math.ceil((total + 1) / 2))
        self.max_turns = turns
        families = sorted({VARIANT_GAME[v] for v in self.variants})
        self.system_prompt = "you play a two player text game follow its rules and action format exactly " + " ; ".join(
            GAMES[f].brief for f in families
        )
        self._splits: dict[str, list[Task]] = {}
        self._live: OrderedDict[str, object] = OrderedDict()
        self._vocab: list[str] | None = None

    # -- options --------------------------------------------------------------------

    @staticmethod
    def _variants(games) -> list[str]:
        if games is None:
            games = list(GAMES)
        if isinstance(games, str):
            games = [g.strip() for g in games.split(",") if g.strip()]
        if not isinstance(games, (list, tuple)) or not games:
            raise ValueError(f"env.options.games: a non-empty list of game families or TextArena ids, got {games!r}")
        out: list[str] = []
        for game in games:
            if game in GAMES:
                out += [v for v in GAMES[game].variants if v not in out]
            elif game in VARIANT_GAME:
                if game not in out:
                    out.append(game)
            else:
                raise ValueError(
                    f"env.options.games: {game!r} is not a supported game; families: {sorted(GAMES)}, "
                    f"TextArena ids: {sorted(VARIANT_GAME)}"
                )
        return out

    def _roles(self, roles) -> dict[str, tuple[int, ...]]:
        """family -> agent player ids."""
        if isinstance(roles, str):
            roles = None if roles == "both" else [r.strip() for r in roles.split(",") if r.strip()]
        out = {}
        families = {VARIANT_GAME[v] for v in self.variants}
        known = sorted({name for fam in families for name in GAMES[fam].roles.values()})
        if roles is not None:
            unknown = [r for r in roles if r not in known]
            if unknown or not roles:
                raise ValueError(f"env.options.roles: {roles!r} - use 'both' or role names from {known}")
        for fam in families:
            ids = tuple(pid for pid, name in GAMES[fam].roles.items() if roles is None or name in roles)
            if not ids:
                raise ValueError(
                    f"env.options.roles: {roles!r} leaves game {fam!r} with no role for the agent "
                    f"(its roles: {sorted(GAMES[fam].roles.values())})"
                )
            out[fam] = ids
        return out

    # -- tasks --------------------------------------------------------------------

    def _combos(self) -> list[tuple[str, int]]:
        return [(vid, pid) for vid in self.variants for pid in self.roles[VARIANT_GAME[vid]]]

    def _instance_key(self, vid: str, game_seed: int) -> str:
        """What makes two instances the same game (disjoint splits never share one)."""
        if VARIANT_GAME[vid] == "truth_and_deception":
            env = self._make(vid, game_seed)
            gs = env.state.game_state
            return "facts:" + "|".join(sorted((gs["fact1"]["fact"], gs["fact2"]["fact"])))
        return f"{vid}:{game_seed}"

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if not self._splits:
            combos = self._combos()
            used: set[str] = set()
            rng = random.Random(f"textarena-splits:{self.seed}")
            for name, count in (("eval", self.num_eval), ("train", self.num_train)):
                tasks = []
                while len(tasks) < count:
                    vid, pid = combos[len(tasks) % len(combos)]
                    game_seed = rng.randrange(2**31 - 1)
                    key = self._instance_key(vid, game_seed)
                    if key in used:
                        continue
                    used.add(key)
                    fam = VARIANT_GAME[vid]
                    role = GAMES[fam].roles[pid]
                    tasks.append(
                        Task(
                            task_id=f"{vid}/{role}/{game_seed}",
                            tags=(fam, f"{fam}/{role}", f"{fam}/{GAMES[fam].variants[vid]}"),
                            data={"game_id": vid, "family": fam, "agent_id": pid, "role": role, "game_seed": game_seed},
                        )
                    )
                self._splits[name] = tasks
        return list(self._splits[split])

    # -- the game -------------------------------------------------------------------

    def _make(self, vid: str, game_seed: int):
        with own_random():
            env = self._ta.make(vid + "-raw")
            env.reset(num_players=2, seed=game_seed)
        return env

    @staticmethod
    def _key(task_id: str, seed: int, actions: list) -> str:
        return hashlib.sha256(json.dumps([task_id, seed, actions]).encode()).hexdigest()

    def _game_at(self, episode: Episode):
        """The live TextArena game of `episode` (from the cache, else rebuilt by replaying its moves)."""
        state = episode.state
        key = self._key(episode.task.task_id, state["seed"], state["actions"])
        env = self._live.pop(key, None)
        if env is not None:
            return env
        env = self._make(state["game_id"], state["game_seed"])
        with own_random():
            for _pid, text in state["actions"]:
                env.step(text)
            for pid in (0, 1):
                env.state.observations[pid] = []
        return env

    def _keep(self, episode: Episode, env) -> None:
        if episode.done:
            return
        self._live[self._key(episode.task.task_id, episode.state["seed"], episode.state["actions"])] = env
        while len(self._live) > _LIVE_CACHE:
            self._live.popitem(last=False)

    @staticmethod
    def _render(messages, viewer: int, own: bool = False) -> str:
        """Messages as `viewer` sees them; its own moves are left out (the agent's are in the conversation
        already) unless `own` (an LLM opponent's transcript: "[You] ...")."""
        lines = []
        for from_id, text, kind in messages:
            kind_name = getattr(kind, "name", str(kind))
            if kind_name == "PLAYER_ACTION":
                if from_id == viewer:
                    if own:
                        lines.append(f"[You] {text}")
                    continue
                lines.append(f"[Opponent] {text}")
            elif kind_name == "PROMPT":
                lines.append(str(text))
            else:
                lines.append(f"[GAME] {text}")
        return "\n".join(lines)

    def _drain(self, env, pid: int) -> list:
        messages = env.state.observations[pid]
        env.state.observations[pid] = []
        return messages

    def reset(self, task: Task, seed: int) -> Episode:
        data = task.data
        env = self._make(data["game_id"], data["game_seed"])
        agent = int(data["agent_id"])
        state = {
            "game_id": data["game_id"],
            "family": data["family"],
            "game_seed": data["game_seed"],
            "agent_id": agent,
            "role": data["role"],
            "seed": int(seed),
            "opponent": self.opponent,
            "actions": [],
            "agent_moves": [],
            "opponent_view": "",
            "rewards": None,
            "reason": "",
            "trades": [],
            "initial_values": self._values(env, data["family"]),
        }
        if data["family"] == "truth_and_deception":
            state["wrong_fact"] = 1 if not env.state.game_state["fact1"]["is_correct"] else 2
        episode = Episode(task, "", False, state)
        return self._advance(episode, env, agent_view=[])

    def _values(self, env, family: str) -> dict:
        if family != "simple_negotiation":
            return {}
        gs = env.state.game_state
        return {str(pid): inventory_value(gs["player_resources"][pid], gs["player_values"][pid]) for pid in (0, 1)}

    def step(self, episode: Episode, action: str) -> Episode:
        return self.step_many([episode], [action])[0]

    def step_many(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[Episode]:
        """Each episode's agent move, then the opponents' replies (an LLM opponent's requests go out together)."""
        out: list[Episode | None] = [None] * len(episodes)
        pending = []  # (index, episode, env, view) waiting for an opponent move
        for i, (episode, action) in enumerate(zip(episodes, actions)):
            if episode.done:
                raise ValueError(f"step on a finished episode of task {episode.task.task_id!r}")
            env = self._game_at(episode)
            state = {
                **episode.state,
                "actions": list(episode.state["actions"]),
                "agent_moves": list(episode.state["agent_moves"]),
                "trades": list(episode.state["trades"]),
            }
            agent = state["agent_id"]
            text = action if isinstance(action, str) else str(action)
            before = self._trade_count(env)
            with own_random():
                env.step(text)
            state["actions"].append([agent, text])
            invalid = (not env.state.done and env.state.current_player_id == agent) or bool(
                env.state.done and env.state.game_info[agent].get("invalid_move")
            )
            state["agent_moves"].append({"text": text, "valid": not invalid})
            self._record_trades(env, state, before)
            pending.append((i, Episode(episode.task, "", False, state), env, self._drain(env, agent)))
        while pending:
            movers = []
            for item in pending:
                i, ep, env, view = item
                if not env.state.done and env.state.current_player_id != ep.state["agent_id"]:
                    movers.append(item)
                else:
                    out[i] = self._finish(ep, env, view)
            if not movers:
                break
            replies = self._opponent_moves(movers)
            pending = []
            for (i, ep, env, view), reply in zip(movers, replies):
                state = ep.state
                opp = 1 - state["agent_id"]
                if isinstance(reply, BaseException):
                    out[i] = self._partner_failure(ep, f"opponent: {reply}")
                    continue
                before = self._trade_count(env)
                with own_random():
                    env.step(reply)
                state["actions"].append([opp, reply])
                self._record_trades(env, state, before)
                if env.state.done and env.state.game_info[opp].get("invalid_move"):
                    if self.opponent == "llm":
                        out[i] = self._partner_failure(ep, "opponent: two invalid moves in a row")
                        continue
                view = view + self._drain(env, state["agent_id"])
                pending.append((i, ep, env, view))
        return [e for e in out]  # type: ignore[misc]

    def _advance(self, episode: Episode, env, agent_view: list) -> Episode:
        """Opponent moves until it is the agent's turn (reset of a game the opponent opens)."""
        agent = episode.state["agent_id"]
        agent_view = agent_view + self._drain(env, agent)
        while not env.state.done and env.state.current_player_id != agent:
            reply = self._opponent_moves([(0, episode, env, agent_view)])[0]
            if isinstance(reply, BaseException):
                return self._partner_failure(
                    Episode(episode.task, self._render(agent_view, agent), False, episode.state), f"opponent: {reply}"
                )
            with own_random():
                env.step(reply)
            episode.state["actions"].append([1 - agent, reply])
            agent_view = agent_view + self._drain(env, agent)
        return self._finish(episode, env, agent_view)

    def _finish(self, episode: Episode, env, view: list) -> Episode:
        state = episode.state
        done = bool(env.state.done)
        if done:
            rewards = env.state.rewards or {}
            state["rewards"] = {str(k): float(v) for k, v in rewards.items()}
            infos = env.state.game_info
            state["reason"] = str(infos.get(state["agent_id"], {}).get("reason", ""))
            state["final_values"] = self._values(env, state["family"])
        result = Episode(episode.task, self._render(view, state["agent_id"]), done, state)
        self._keep(result, env)
        return result

    def _partner_failure(self, episode: Episode, reason: str) -> Episode:
        return partner_failed(episode, reason)

    # -- opponents ------------------------------------------------------------------

    def _opponent_moves(self, movers) -> list:
        if self.opponent == "scripted":
            out = []
            for _i, ep, env, _view in movers:
                s = ep.state
                rng = _opponent_rng(s["game_seed"], s["seed"] * 1009 + len(s["actions"]))
                history = [(pid, text) for pid, text in s["actions"]]
                self._drain(env, 1 - s["agent_id"])
                out.append(GAMES[s["family"]].opponent(env, 1 - s["agent_id"], rng, history))
            return out
        requests = []
        for _i, ep, env, _view in movers:
            s = ep.state
            opp = 1 - s["agent_id"]
            s["opponent_view"] = (
                s.get("opponent_view", "") + "\n" + self._render(self._drain(env, opp), opp, own=True)
            ).strip()
            requests.append(s["opponent_view"])
        return self.partner.moves(requests)

    # -- bookkeeping for rules -------------------------------------------------------

    @staticmethod
    def _trade_count(env) -> int:
        return (
            len([t for t in env.state.game_state.get("trade_history", []) if t.get("outcome") == "Accepted"])
            if isinstance(env.state.game_state, dict)
            else 0
        )

    def _record_trades(self, env, state: dict, before: int) -> None:
        if state["family"] != "simple_negotiation":
            return
        accepted = [t for t in env.state.game_state.get("trade_history", []) if t.get("outcome") == "Accepted"]
        values = env.state.game_state["player_values"][state["agent_id"]]
        for t in accepted[before:]:
            agent = state["agent_id"]
            if t["from_player"] == agent:
                give, get = t["offered_resources"], t["requested_resources"]
            else:
                give, get = t["requested_resources"], t["offered_resources"]
            gain = inventory_value(get, values) - inventory_value(give, values)
            state["trades"].append(
                {"proposer": t["from_player"], "give": dict(give), "get": dict(get), "agent_gain": gain}
            )

    # -- outcome --------------------------------------------------------------------

    def outcome(self, episode: Episode) -> Outcome:
        s = episode.state
        if episode.partner_failure:
            return Outcome(0.0, False, f"partner failure: {episode.partner_failure}")
        if not episode.done or s.get("rewards") is None:
            return Outcome(0.0, False, "game not finished")
        r = float(s["rewards"].get(str(s["agent_id"]), 0.0))
        r = max(-1.0, min(1.0, r))
        reward = (r + 1.0) / 2.0
        verdict = "win" if r > 0 else ("loss" if r < 0 else "draw")
        return Outcome(reward, r > 0, f"{verdict}: {s.get('reason', '')}".strip())

    # -- the built-in policy's language ---------------------------------------------

    def attach_policy(self, generate) -> None:
        """Self-play (opponent=self): the trainer's text generator writes the opponent's moves."""
        if self.opponent == "self":
            self.partner.attach(generate)

    def action_vocabulary(self) -> list[str]:
        words: list[str] = []
        for fam in sorted({VARIANT_GAME[v] for v in self.variants}):
            words += [w for w in GAMES[fam].action_words if w not in words]
        return words

    def vocabulary(self) -> list[str]:
        if self._vocab is None:
            words = set(self.system_prompt.split()) | set(self.action_vocabulary())
            for split in ("train", "eval"):  # each game's opening text (no opponent is asked for a move)
                for task in self.tasks(split):
                    env = self._make(task.data["game_id"], task.data["game_seed"])
                    words |= set(self._render(self._drain(env, task.data["agent_id"]), -1).lower().split())
            words |= set(
                "[game] [opponent] player made the following offer to offered items: requested rejected "
                "trade accepted from no new attempted an invalid move. reason: now guess which of two facts "
                "are correct by returning '[fact 1]' or '[fact 2]'. that works for me. [accept] [deny] "
                "is one, i am certain of it. which facts correct, and why? won draw".split()
            )
            self._vocab = sorted(w for w in words if w)
        return list(self._vocab)

    # -- providers ------------------------------------------------------------------

    def rules(self) -> list[Rule]:
        return rubrics.make_rules({VARIANT_GAME[v] for v in self.variants})

    def labelled_cases_by_rule(self, rule_ids: Sequence[str], num_sources: int = 12) -> dict:
        """RewardWeaver acceptance-test cases for each rule: games played with agent moves chosen so that the
        rule passes or fails BY CONSTRUCTION (e.g. a guess in the `[Fact N]` format or not; a trade that the
        game's values make a gain or a loss), against the scripted opponent, one PASS and one FAIL game per
        source (a game instance of its own seed stream, never a train or eval task)."""
        if not hasattr(self, "_cases"):
            self._cases = {}
        out = {}
        for rid in rule_ids:
            if rid not in self._cases:
                self._cases[rid] = rubrics.labelled_cases(self, rid, num_sources)
            out[rid] = list(self._cases[rid])
        return out

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        by_rule = self.labelled_cases_by_rule(rule_ids)
        return [case for rid in rule_ids for case in by_rule[rid]]

    def reflector(self):
        """Arise reflection without an LLM: the rules with fixed skill texts (rubrics.py; judge.kind=rule)."""
        from rwcore.trainer.envs.rule_providers import RuleReflector

        return RuleReflector(self.rules(), rubrics.SKILLS)

    def attributor(self):
        """RewardWeaver attribution without an LLM: a failed rule check is the deficit (judge.kind=rule)."""
        from rwcore.trainer.envs.rule_providers import RuleAttributor

        return RuleAttributor(self.rules())


__all__ = ["INSTALL_HINT", "TextArenaEnv", "parse_offer"]
