"""The social-interaction environment ("social"): two-party scenarios in the spirit of SOTOPIA.

Scenarios
---------
trainer/envs/social_scenarios/scenarios.json holds 30 two-party scenarios written for this project
(env.options.scenarios: another JSON file, or a folder of them). Each gives a setting, and for both
sides a name, a background, a private goal and a secret; the agent sees only its own side (and its
partner's name), the partner only its own. Every field is required: a file with a missing field is
refused at start with an error naming the file, the scenario and the field.

    {"format": "rwcore-social-scenarios/1", "scenarios": [{
      "id", "task_type", "difficulty" (1-3), "split" ("train" | "eval"), "setting",
      "agent": {"name", "background", "goal", "secret"}, "partner": {"name", "background", "goal", "secret"},
      "goal_keywords": [...],    # words of the agent's goal (the scripted fallbacks read them)
      "secret_keywords": [...],  # words that would reveal the agent's secret (may be empty)
      "partner_lines": [...],    # the scripted partner's stalling lines
      "partner_agrees": "..."    # the scripted partner's line when it agrees
    }]}

Task types (Task.tags: the type and "difficulty<d>"), 4 train + 2 eval scenarios each:
negotiation (price, terms), persuasion (change the partner's mind), cooperation (divide work, plan
together), conflict (settle a grievance), information (learn something the partner knows).

The episode: the agent speaks first; the partner answers each message; the partner may leave; at most
max_turns (6) agent messages. The agent ends it by writing "goodbye".

Partner (env.options.partner)
-----------------------------
- "scripted" (default; the fallback that needs no server): stalls with its lines and agrees (then
  leaves) once the agent has used enough distinct goal keywords (1, 2 or 3 by difficulty).
- "llm": a fixed LLM partner (rwcore.trainer.envs.llm_partner.OpenAIPartner) role-playing the partner's
  profile: partner_model, partner_base_url, partner_api_key_env (the NAME of the variable holding the
  key), partner_max_tokens (256), partner_timeout (60 s), partner_max_concurrency (8),
  partner_reply_format ("json" structured outputs | "text"), partner_temperature (0.7), partner_max_reply_chars (600;
  with "json"
  keep it well inside partner_max_tokens, or long replies are cut off and count as partner failures).
  All episodes of a turn are answered concurrently.
- "self": self-play; the policy being trained writes the partner's turns without gradients.
A partner request that times out or answers garbage ends THAT episode as a partner failure (never
charged to the agent; see rwcore.trainer.envs.base).

Outcome: a SOTOPIA-EVAL-style rubric (env.options.evaluator)
-------------------------------------------------------------
Seven dimensions, scored over the whole conversation (SOTOPIA's ranges):
goal completion 0..10, believability 0..10, knowledge 0..10, secret -10..0, relationship -5..5,
social rules -10..0, financial and material benefits -5..5.
Reward = goal / 10; success = goal >= 7 (the agent achieved its private goal). All seven scores go
to Outcome.details (trajectory.metadata["outcome_details"]).
- "llm": an LLM outcome evaluator, DISTINCT from the process-reward judge: its own settings
  evaluator_model, evaluator_base_url, evaluator_api_key_env, evaluator_timeout (120 s),
  evaluator_max_tokens (512), evaluator_temperature (0); unset ones default to the judge's server (judge.kind=openai).
  Structured
  outputs (a JSON schema with each dimension's allowed integers and the request's random id); the
  conversation goes to it as delimited untrusted data (rwcore.judges.templates.untrusted_block), so
  nothing the agent or the partner says can change its instructions. A failed or garbage evaluation is
  a partner failure for that episode (Outcome.failure), never a zero charged to the agent.
- "heuristic" (the fallback without a server): goal 10 when the scripted partner agreed, else partial
  credit for the goal keywords used (at most 6); believability from the share of distinct words;
  knowledge 7 when the agent asked something, else 3; secret -10 when a secret keyword was said;
  relationship from polite minus rude words; social rules -5 per rude or threatening word (down to -10);
  financial +5 for an agreement in a negotiation. A keyword heuristic, not a judgment: use it to run
  without servers, not to measure social skill.
- "auto" (default): "llm" when an evaluator model is known (its own or the judge's), else "heuristic".

Rubric families (process rewards)
---------------------------------
`capability_candidates()` / `rules()`: six capabilities with keyword checks - pursues_goal
(Understanding), asks_partner (Understanding), proposes_terms (Execution), stays_polite (Execution),
keeps_secret (Verification), no_repetition (Efficiency). There are no labelled cases: with
RewardWeaver they are admitted without the acceptance test (logged). With judge.kind=openai the LLM
judge scores them from their criteria; with judge.kind=rule the keyword checks do.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from rwcore.trainer.envs.base import Episode, Outcome, Rule, Task, partner_failed, register
from rwcore.trainer.envs.llm_partner import PartnerFailure, PartnerRequest, make_partner
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory

logger = logging.getLogger("rwcore.trainer.social")

DEFAULT_SCENARIOS = Path(__file__).parent / "social_scenarios" / "scenarios.json"
TASK_TYPES = ("negotiation", "persuasion", "cooperation", "conflict", "information")
REQUIRED = (
    "id",
    "task_type",
    "difficulty",
    "split",
    "setting",
    "agent",
    "partner",
    "goal_keywords",
    "secret_keywords",
    "partner_lines",
    "partner_agrees",
)
SIDE_FIELDS = ("name", "background", "goal", "secret")
DIMENSIONS = {  # SOTOPIA-EVAL: name -> (low, high, what it measures)
    "goal": (0, 10, "goal completion: how far the agent achieved its private social goal"),
    "believability": (0, 10, "the agent behaves naturally and consistently with its character"),
    "knowledge": (0, 10, "the agent sought and gained new, relevant information in the interaction"),
    "secret": (-10, 0, "0 when the agent kept its secret, down to -10 when it revealed it"),
    "relationship": (-5, 5, "whether the interaction improved (+) or harmed (-) the relationship"),
    "social_rules": (-10, 0, "0 when the agent kept social norms and laws, negative for violations"),
    "financial": (-5, 5, "material or financial gain (+) or loss (-) for the agent"),
}
POLITE = {"please", "thanks", "thank", "sorry", "appreciate", "understand", "together", "fair"}
RUDE = {"stupid", "shut", "hate", "idiot", "whatever", "liar", "threat", "sue", "force", "useless"}
QUESTION = {"what", "why", "how", "which", "when", "where", "would", "could", "can"}
PROPOSE = {"offer", "propose", "suggest", "deal", "plan", "split", "share", "half", "together", "schedule", "rota"}
GENERIC_WORDS = (
    "hello hi please thanks thank you sorry yes no ok i we can could would what why how which when where "
    "offer propose suggest deal plan split share half together fair agree help understand appreciate "
    "goodbye"
).split()


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def load_scenarios(path: str | Path) -> list[dict]:
    """Every scenario of a JSON file or of a folder's *.json files; ValueError naming the file, the scenario
    and the field on anything missing or malformed."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ValueError(
            f"env.options.scenarios: {str(path)!r} is not a scenario file or a folder holding *.json files"
        )
    scenarios, seen = [], {}
    for file in files:
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"scenario file {str(file)!r}: not readable JSON ({error})") from None
        items = data.get("scenarios") if isinstance(data, dict) else data
        if not isinstance(items, list) or not items:
            raise ValueError(f"scenario file {str(file)!r}: missing field 'scenarios' (a non-empty list)")
        for index, item in enumerate(items):
            where = f"scenario file {str(file)!r}, scenario #{index}"
            if not isinstance(item, dict):
                raise ValueError(f"{where}: must be an object")
            if isinstance(item.get("id"), str):
                where += f" ({item['id']!r})"
            for key in REQUIRED:
                if key not in item:
                    raise ValueError(f"{where}: missing field {key!r}")
            for side in ("agent", "partner"):
                if not isinstance(item[side], dict):
                    raise ValueError(f"{where}: field {side!r} must be an object")
                for key in SIDE_FIELDS:
                    if key not in item[side]:
                        raise ValueError(f"{where}: missing field '{side}.{key}'")
                    if not isinstance(item[side][key], str) or (key != "secret" and not item[side][key].strip()):
                        raise ValueError(f"{where}: field '{side}.{key}' must be a non-empty string")
            for key in ("id", "task_type", "setting", "partner_agrees"):
                if not isinstance(item[key], str) or not item[key].strip():
                    raise ValueError(f"{where}: field {key!r} must be a non-empty string")
            if item["split"] not in ("train", "eval"):
                raise ValueError(f"{where}: field 'split' must be 'train' or 'eval', got {item['split']!r}")
            if isinstance(item["difficulty"], bool) or item["difficulty"] not in (1, 2, 3):
                raise ValueError(f"{where}: field 'difficulty' must be 1, 2 or 3, got {item['difficulty']!r}")
            for key in ("goal_keywords", "secret_keywords", "partner_lines"):
                value = item[key]
                if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                    raise ValueError(f"{where}: field {key!r} must be a list of non-empty strings")
            if not item["goal_keywords"] or not item["partner_lines"]:
                raise ValueError(f"{where}: fields 'goal_keywords' and 'partner_lines' must not be empty")
            if item["id"] in seen:
                raise ValueError(f"{where}: id {item['id']!r} already used in {seen[item['id']]!r}")
            seen[item["id"]] = str(file)
            scenarios.append(item)
    for split in ("train", "eval"):
        if not any(s["split"] == split for s in scenarios):
            raise ValueError(f"env.options.scenarios {str(path)!r}: no scenario has split {split!r}")
    return scenarios


class ScriptedPartner:
    """The fallback partner (no server): stalls, and agrees once the agent used enough goal keywords."""

    def reply(self, scenario: dict, state: dict) -> tuple[str, bool]:
        need = int(scenario["difficulty"])
        used = set(state.get("agent_words", ())) & {w for k in scenario["goal_keywords"] for w in _words(k)}
        if len(used) >= min(need, len(scenario["goal_keywords"])):
            state["agreed"] = True
            return scenario["partner_agrees"], True
        lines = scenario["partner_lines"]
        return lines[(state["turn"] - 1) % len(lines)], False


def heuristic_scores(scenario: dict, state: dict, messages: Sequence[str]) -> dict:
    """The keyword fallback evaluator's seven scores (see the module docstring)."""
    words = [w for m in messages for w in _words(m)]
    goal_words = {w for k in scenario["goal_keywords"] for w in _words(k)}
    secret_words = {w for k in scenario["secret_keywords"] for w in _words(k)}
    if state.get("agreed"):
        goal = 10
    else:
        goal = min(6, round(6 * len(set(words) & goal_words) / max(1, len(goal_words))))
    rude = sum(w in RUDE for w in words)
    return {
        "goal": goal,
        "believability": round(10 * len(set(words)) / len(words)) if words else 0,
        "knowledge": 7 if (any(w in QUESTION for w in words) or any("?" in m for m in messages)) else 3,
        "secret": -10 if secret_words & set(words) else 0,
        "relationship": max(-5, min(5, sum(w in POLITE for w in words) - 2 * rude)),
        "social_rules": max(-10, -5 * rude),
        "financial": 5 if state.get("agreed") and scenario["task_type"] == "negotiation" else 0,
    }


_EVALUATOR_SYSTEM = """You evaluate one finished conversation between two people, the AGENT and the PARTNER, in a \
social scenario, with the SOTOPIA-EVAL rubric, from the AGENT's point of view.

Scenario (trusted, from the operator):
{scenario}

Score the AGENT on each dimension with an integer in its range:
{dimensions}

{data_rules}

Answer with one JSON object only: {{"request_id": "{request_id}", "goal": <int>, "believability": <int>, \
"knowledge": <int>, "secret": <int>, "relationship": <int>, "social_rules": <int>, "financial": <int>, \
"reasoning": "<one or two sentences>"}}."""


def _evaluator_schema(request_id: str) -> dict:
    props = {"request_id": {"type": "string", "enum": [request_id]}}
    for name, (low, high, _) in DIMENSIONS.items():
        props[name] = {"type": "integer", "enum": list(range(low, high + 1))}
    props["reasoning"] = {"type": "string", "maxLength": 200}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "sotopia_eval",
            "strict": True,
            "schema": {"type": "object", "properties": props, "required": list(props), "additionalProperties": False},
        },
    }


class LLMEvaluator:
    """The SOTOPIA-EVAL outcome evaluator over an OpenAI-compatible server (see the module docstring)."""

    def __init__(
        self,
        model: str,
        base_url: str | None,
        api_key_env: str | None,
        timeout: float = 120.0,
        max_tokens: int = 512,
        max_concurrency: int = 8,
        max_retries: int = 1,
        temperature: float = 0.0,
    ) -> None:
        from rwcore.judges.client import ChatClient, ClientOptions

        self.model, self.base_url = model, base_url
        self.client = ChatClient(
            ClientOptions(
                model=model,
                base_url=base_url,
                api_key_env=api_key_env,
                max_concurrency=max_concurrency,
                timeout=timeout,
                max_retries=max_retries,
                temperature=temperature,
                max_tokens=max_tokens,
            )
        )

    def __repr__(self) -> str:
        return f"LLMEvaluator(model={self.model!r}, base_url={self.base_url!r})"

    def messages(self, scenario: dict, history: Sequence[dict], request_id: str) -> list[dict]:
        from rwcore.judges.templates import data_rules, operator_json, untrusted_block

        sheet = {
            "setting": scenario["setting"],
            "task_type": scenario["task_type"],
            "agent": dict(scenario["agent"]),
            "partner": dict(scenario["partner"]),
        }
        dims = "\n".join(f"- {name} ({low}..{high}): {text}" for name, (low, high, text) in DIMENSIONS.items())
        system = _EVALUATOR_SYSTEM.format(
            scenario=operator_json(sheet), dimensions=dims, data_rules=data_rules(request_id), request_id=request_id
        )
        payload = {
            "conversation": [
                {"speaker": "AGENT" if h["role"] == "agent" else "PARTNER", "text": h["text"]} for h in history
            ]
        }
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": untrusted_block(payload, request_id)},
        ]

    @staticmethod
    def parse(text: str, request_id: str) -> dict | str:
        """The seven scores, or why the reply is garbage."""
        try:
            answer = json.loads(text, strict=False)
        except (TypeError, ValueError):
            return "evaluator reply is not JSON (cut off by evaluator_max_tokens?)"
        if not isinstance(answer, dict):
            return "evaluator reply is not an object"
        if answer.get("request_id") != request_id:
            return "evaluator reply lacks this request's id"
        scores = {}
        for name, (low, high, _) in DIMENSIONS.items():
            value = answer.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                return f"evaluator score {name!r} missing or outside {low}..{high}"
            scores[name] = value
        return scores

    def evaluate_many(self, items: Sequence[tuple[dict, Sequence[dict]]]) -> list[dict | str]:
        import asyncio

        from rwcore.judges.client import ChatError, run_sync
        from rwcore.judges.templates import new_request_id

        async def one(session, scenario, history):
            request_id = new_request_id()
            try:
                reply = await session.complete(
                    self.messages(scenario, history, request_id), response_format=_evaluator_schema(request_id)
                )
            except ChatError as error:
                return f"evaluator request failed: {session.scrub(str(error))[:300]}"
            return self.parse(reply.text, request_id)

        async def run():
            async with self.client.session() as session:
                return await asyncio.gather(*(one(session, s, h) for s, h in items))

        return list(run_sync(run())) if items else []


def _skill_hints() -> dict[str, str]:
    return {
        "pursues_goal": "Say plainly what you want, in the words of your goal.",
        "asks_partner": "Ask what your partner needs before you push your own goal.",
        "proposes_terms": "Propose concrete terms: an offer, a split, a plan.",
        "stays_polite": "Stay polite: please, thanks, sorry; never insult.",
        "keeps_secret": "Never say what your secret is.",
        "no_repetition": "Do not repeat a message; move the conversation forward.",
    }


class SocialEnv:
    """Two-party social scenarios with a scripted, LLM or self-play partner (see the module docstring)."""

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
            state["agent_words"] = sorted(set(state["agent_words"]) | set(_words(text)))
            if "goodbye" in _words(text):
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
            if episode.state.get("partner_failure"):
                out[i] = Outcome(
                    0.0,
                    False,
                    f"partner failure: {episode.state['partner_failure']}",
                    failure=str(episode.state["partner_failure"]),
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
                words |= set(_words(k))
        return sorted(words)

    # ------------------------------------------------------------------ optional providers

    def rules(self) -> list[Rule]:
        def agent_words(t: Trajectory) -> list[str]:
            return [w for turn in t.turns if turn.role == "assistant" for w in _words(turn.content)]

        def scenario(t: Trajectory) -> dict:
            return t.metadata.get("task") or self.by_id.get(t.task_id, {})

        def pursues_goal(t):
            s = scenario(t)
            goal = {w for k in s.get("goal_keywords", ()) for w in _words(k)}
            return bool(goal & set(agent_words(t)))

        def keeps_secret(t):
            secret = {w for k in scenario(t).get("secret_keywords", ()) for w in _words(k)}
            return None if not secret else not (secret & set(agent_words(t)))

        def no_repetition(t):
            messages = [turn.content.strip() for turn in t.turns if turn.role == "assistant"]
            return len(messages) == len(set(messages))

        checks = {
            "pursues_goal": (
                "Understanding",
                "The agent states what it wants in terms of its private goal.",
                pursues_goal,
            ),
            "asks_partner": (
                "Understanding",
                "The agent asks the partner about its needs or views.",
                lambda t: bool(QUESTION & set(agent_words(t))),
            ),
            "proposes_terms": (
                "Execution",
                "The agent proposes concrete terms (an offer, a split, a plan).",
                lambda t: bool(PROPOSE & set(agent_words(t))),
            ),
            "stays_polite": (
                "Execution",
                "The agent stays polite and never insults or threatens the partner.",
                lambda t: not (RUDE & set(agent_words(t))),
            ),
            "keeps_secret": ("Verification", "The agent does not reveal its secret.", keeps_secret),
            "no_repetition": (
                "Efficiency",
                "The agent never repeats a message; each moves the conversation on.",
                no_repetition,
            ),
        }
        return [
            Rule(
                RubricSpec(rid, criterion, "" if rid != "keeps_secret" else "The agent has a secret.", cap), rid, check
            )
            for rid, (cap, criterion, check) in checks.items()
        ]

    def capability_candidates(self) -> list[RubricSpec]:
        return [rule.spec for rule in self.rules()]

    def reflector(self):
        return _SocialReflector(self)

    def attributor(self):
        return _SocialAttributor(self)


class _SocialReflector:
    """Reflection without an LLM: proposes the keyword rubrics not in the pool, with a fixed hint each."""

    def __init__(self, env: SocialEnv) -> None:
        self.rules = env.rules()

    def propose_rubric_skills(self, trajectories, existing, max_new):
        known = {spec.rubric_id for spec in existing}
        hints = _skill_hints()
        return [
            RubricSkillProposal(rule.spec, hints[rule.spec.rubric_id])
            for rule in self.rules
            if rule.spec.rubric_id not in known
        ][:max_new]

    def refine_skill(self, rubric, skill, failures):
        return skill if "concrete" in skill else skill + " Be concrete."


class _SocialAttributor:
    """Attribution without an LLM: a candidate capability is deficient when its keyword check fails."""

    def __init__(self, env: SocialEnv) -> None:
        self.checks = {rule.spec.rubric_id: rule.check for rule in env.rules()}

    def attribute(self, trajectory, candidates):
        records = []
        said = next((t.content for t in trajectory.turns if t.role == "assistant"), "")
        for spec in candidates:
            check = self.checks.get(spec.rubric_id)
            result = check(trajectory) if check else None
            if result is None:
                continue
            records.append(
                AttributionRecord(
                    trajectory.trajectory_id,
                    spec.rubric_id,
                    not result,
                    0.7,
                    f"agent said: {said[:200]}" if said else "",
                    "policy",
                )
            )
        return records


register("social", SocialEnv)
