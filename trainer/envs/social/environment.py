"""`SocialEnv`: two-party scenarios with a scripted, LLM or self-play partner (see the package docstring)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rwcore.trainer.envs.base import Episode, Outcome, Rule, Task, partner_failed
from rwcore.trainer.envs.llm_partner import PartnerFailure, PartnerRequest, make_partner
from rwcore.trainer.envs.social.evaluator import LLMEvaluator, heuristic_scores
from rwcore.trainer.envs.social.keywords import GENERIC_WORDS, words_of
from rwcore.trainer.envs.social.scenarios import DEFAULT_SCENARIOS, load_scenarios
from rwcore.types import RubricSpec

logger = logging.getLogger("rwcore.trainer.social")


class ScriptedPartner:
    """The fallback partner (no server): stalls, and agrees once the agent used enough goal keywords."""

    def reply(self, scenario: dict, state: dict) -> tuple[str, bool]:
        need = int(scenario["difficulty"])
        used = set(state.get("agent_words", ())) & {w for k in scenario["goal_keywords"] for w in words_of(k)}
        if len(used) >= min(need, len(scenario["goal_keywords"])):
            state["agreed"] = True
            return scenario["partner_agrees"], True
        lines = scenario["partner_lines"]
        return lines[(state["turn"] - 1) % len(lines)], False


class SocialEnv:
    """Two-party social scenarios with a scripted, LLM or self-play partner (see the package docstring)."""

    name = "social"
    system_prompt = (
        "You are a person in a social scenario talking with a partner. Pursue your private goal, "
        "keep your secret, stay polite. Write your next message; write goodbye to end."
    )

    def __init__(
        self,
        scenarios: str | None = None,
        partner: str = "scripted",
        partner_model: str = "",
        partner_base_url: str = "",
        partner_api_key_env: str = "OPENAI_API_KEY",
        partner_max_tokens: int = 256,
        partner_timeout: float = 60.0,
        partner_max_concurrency: int = 8,
        partner_reply_format: str = "json",
        partner_max_reply_chars: int = 600,
        partner_temperature: float = 0.7,
        evaluator: str = "auto",
        evaluator_model: str = "",
        evaluator_base_url: str = "",
        evaluator_api_key_env: str = "",
        evaluator_timeout: float = 120.0,
        evaluator_max_tokens: int = 512,
        evaluator_temperature: float = 0.0,
        max_turns: int = 6,
    ) -> None:
        self.scenarios = load_scenarios(scenarios or DEFAULT_SCENARIOS)
        self.by_id = {s["id"]: s for s in self.scenarios}
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"env.options.max_turns must be a positive integer, got {max_turns!r}")
        self.max_turns = max_turns
        if partner not in ("scripted", "llm", "self"):
            raise ValueError(f"env.options.partner must be one of 'scripted', 'llm', 'self', got {partner!r}")
        if evaluator not in ("auto", "llm", "heuristic"):
            raise ValueError(f"env.options.evaluator must be one of 'auto', 'llm', 'heuristic', got {evaluator!r}")
        self.partner_kind = partner
        self.scripted = ScriptedPartner()
        self.partner = (
            None
            if partner == "scripted"
            else make_partner(
                partner,
                model=partner_model,
                base_url=partner_base_url,
                api_key_env=partner_api_key_env or None,
                max_tokens=partner_max_tokens,
                timeout=partner_timeout,
                max_concurrency=partner_max_concurrency,
                reply_format=partner_reply_format,
                max_reply_chars=partner_max_reply_chars,
                temperature=partner_temperature,
            )
            if partner == "llm"
            else make_partner("self", max_reply_chars=partner_max_reply_chars)
        )
        self._evaluator_kind = evaluator
        self._evaluator_settings = dict(
            model=evaluator_model,
            base_url=evaluator_base_url,
            api_key_env=evaluator_api_key_env,
            timeout=evaluator_timeout,
            max_tokens=evaluator_max_tokens,
            temperature=evaluator_temperature,
        )
        self.evaluator: LLMEvaluator | None = None
        self._resolve_evaluator()

    # ------------------------------------------------------------------ settings from the trainer

    def configure_llm_defaults(self, model: str, base_url: str | None, api_key_env: str | None) -> None:
        """The judge's server (judge.kind=openai): the default for evaluator settings left unset."""
        s = self._evaluator_settings
        if not s["model"]:
            s["model"], s["base_url"] = model, s["base_url"] or (base_url or "")
            s["api_key_env"] = s["api_key_env"] or (api_key_env or "")
        self._resolve_evaluator()

    def _resolve_evaluator(self) -> None:
        s = self._evaluator_settings
        kind = self._evaluator_kind
        if kind == "llm" and not s["model"]:
            self.evaluator = None  # may come from the judge (configure_llm_defaults); checked at first use
            return
        if kind in ("llm", "auto") and s["model"]:
            self.evaluator = LLMEvaluator(
                s["model"],
                s["base_url"] or None,
                s["api_key_env"] or None,
                timeout=s["timeout"],
                max_tokens=s["max_tokens"],
                temperature=s["temperature"],
            )
        else:
            self.evaluator = None

    def attach_policy(self, generate) -> None:
        if self.partner_kind == "self":
            self.partner.attach(generate)

    # ------------------------------------------------------------------ simulator

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return [
            Task(s["id"], (s["task_type"], f"difficulty{s['difficulty']}"), dict(s))
            for s in self.scenarios
            if s["split"] == split
        ]

    def _brief(self, s: dict) -> str:
        a = s["agent"]
        secret = f" your secret {a['secret']}" if a["secret"] else ""
        return (
            f"setting {s['setting']} you are {a['name']} {a['background']} your goal {a['goal']}{secret} "
            f"you talk with {s['partner']['name']} you speak first"
        )

    def reset(self, task: Task, seed: int) -> Episode:
        s = self.by_id.get(task.task_id)
        if s is None:
            raise ValueError(f"unknown task id {task.task_id!r} for env.name 'social'")
        state = {"turn": 0, "history": [], "agent_words": [], "agreed": False, "ended_by": "", "seed": int(seed)}
        return Episode(task, self._brief(s), False, state)

    def step(self, episode: Episode, action: str) -> Episode:
        return self.step_many([episode], [action])[0]

    def step_many(self, episodes: Sequence[Episode], actions: Sequence[str]) -> list[Episode]:
        out: list[Episode | None] = [None] * len(episodes)
        pending = []  # (index, scenario, state) waiting for an LLM partner
        for i, (episode, action) in enumerate(zip(episodes, actions)):
            if episode.done:
                out[i] = episode
                continue
            s = self.by_id[episode.task.task_id]
            state = {
                **episode.state,
                "history": list(episode.state["history"]),
                "agent_words": list(episode.state["agent_words"]),
            }
            text = " ".join(str(action).split())
            state["turn"] += 1
            state["history"].append({"role": "agent", "text": text})
            state["agent_words"] = sorted(set(state["agent_words"]) | set(words_of(text)))
            if "goodbye" in words_of(text):
                state["ended_by"] = "agent"
                out[i] = Episode(episode.task, "", True, state)
                continue
            if self.partner is None:
                reply, leave = self.scripted.reply(s, state)
                out[i] = self._after_reply(episode.task, s, state, reply, leave)
            else:
                pending.append((i, episode, s, state))
        if pending:
            requests = [
                PartnerRequest(
                    self._partner_system(s),
                    tuple(
                        {"role": "user" if h["role"] == "agent" else "assistant", "content": h["text"]}
                        for h in state["history"]
                    ),
                )
                for _, _, s, state in pending
            ]
            replies = self.partner.reply_many(requests)
            for (i, episode, s, state), reply in zip(pending, replies):
                if isinstance(reply, PartnerFailure):
                    out[i] = partner_failed(Episode(episode.task, episode.observation, False, state), reply.reason)
                else:
                    out[i] = self._after_reply(episode.task, s, state, reply.message, reply.leave)
        return out

    def _partner_system(self, s: dict) -> str:
        p = s["partner"]
        return (
            f"You are {p['name']}, {p['background']}. Setting: {s['setting']}. Your private goal: {p['goal']}. "
            f"Your secret, which you never reveal: {p['secret']}. You are talking with {s['agent']['name']}. "
            "Stay in character and reply briefly, in one or two sentences."
        )

    def _after_reply(self, task: Task, s: dict, state: dict, reply: str, leave: bool) -> Episode:
        state["history"].append({"role": "partner", "text": reply})
        done = bool(leave) or state["turn"] >= self.max_turns
        if leave:
            state["ended_by"] = "partner"
        elif done:
            state["ended_by"] = "time"
        return Episode(task, f"{s['partner']['name']} says {reply}", done, state)

    def outcome(self, episode: Episode) -> Outcome:
        return self.outcome_many([episode])[0]

    def outcome_many(self, episodes: Sequence[Episode]) -> list[Outcome]:
        out: list[Outcome | None] = [None] * len(episodes)
        llm = []
        for i, episode in enumerate(episodes):
            if episode.partner_failure:
                out[i] = Outcome(
                    0.0, False, f"partner failure: {episode.partner_failure}", failure=episode.partner_failure
                )
            elif self.evaluator is not None:
                llm.append(i)
            else:
                if self._evaluator_kind == "llm":
                    raise ValueError(
                        "env.options.evaluator=llm needs env.options.evaluator_model (or judge.kind=openai, "
                        "whose server is the default)"
                    )
                s = self.by_id[episode.task.task_id]
                messages = [h["text"] for h in episode.state["history"] if h["role"] == "agent"]
                out[i] = self._outcome(heuristic_scores(s, episode.state, messages), "heuristic")
        if llm:
            results = self.evaluator.evaluate_many(
                [(self.by_id[episodes[i].task.task_id], episodes[i].state["history"]) for i in llm]
            )
            for i, result in zip(llm, results):
                if isinstance(result, str):
                    logger.warning("social outcome evaluator: %s; the episode is a partner failure", result)
                    out[i] = Outcome(
                        0.0, False, f"outcome evaluator failure: {result}", failure=f"outcome evaluator: {result}"
                    )
                else:
                    out[i] = self._outcome(result, "llm evaluator")
        return out

    @staticmethod
    def _outcome(scores: dict, by: str) -> Outcome:
        goal = scores["goal"]
        return Outcome(goal / 10.0, goal >= 7, f"{by}: goal {goal}/10", details=dict(scores))

    def vocabulary(self) -> list[str]:
        words = set(GENERIC_WORDS) | set(self.action_vocabulary())
        words |= set(self.system_prompt.lower().split())
        for s in self.scenarios:
            for text in (
                s["setting"],
                s["partner_agrees"],
                *s["partner_lines"],
                *s["agent"].values(),
                s["partner"]["name"],
                self._brief(s),
            ):
                words |= set(text.lower().split())
        words |= {"says", "setting"}
        return sorted(words)

    def action_vocabulary(self) -> list[str]:
        words = set(GENERIC_WORDS)
        for s in self.scenarios:
            for k in s["goal_keywords"]:
                words |= set(words_of(k))
        return sorted(words)

    # ------------------------------------------------------------------ optional providers

    def capability_candidates(self) -> list[RubricSpec]:
        return [rule.spec for rule in self.rules()]

    def rules(self) -> list[Rule]:
        from rwcore.trainer.envs.social.rubrics import keyword_rules

        return keyword_rules(self.by_id)

    def reflector(self):
        from rwcore.trainer.envs.social.rubrics import SocialReflector

        return SocialReflector(self.rules())

    def attributor(self):
        from rwcore.trainer.envs.social.rubrics import SocialAttributor

        return SocialAttributor(self.rules())
