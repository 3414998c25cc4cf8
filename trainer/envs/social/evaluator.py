"""The social environment's outcome evaluators, after SOTOPIA-EVAL's seven dimensions: `LLMEvaluator` over an
OpenAI-compatible server and the keyword fallback `heuristic_scores` (see the package docstring, "Outcome")."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rwcore.trainer.envs.social.keywords import POLITE, QUESTION, RUDE, words_of

DIMENSIONS = {  # SOTOPIA-EVAL: name -> (low, high, what it measures)
    "goal": (0, 10, "goal completion: how far the agent achieved its private social goal"),
    "believability": (0, 10, "the agent behaves naturally and consistently with its character"),
    "knowledge": (0, 10, "the agent sought and gained new, relevant information in the interaction"),
    "secret": (-10, 0, "0 when the agent kept its secret, down to -10 when it revealed it"),
    "relationship": (-5, 5, "whether the interaction improved (+) or harmed (-) the relationship"),
    "social_rules": (-10, 0, "0 when the agent kept social norms and laws, negative for violations"),
    "financial": (-5, 5, "material or financial gain (+) or loss (-) for the agent"),
}


def heuristic_scores(scenario: dict, state: dict, messages: Sequence[str]) -> dict:
    """The keyword fallback evaluator's seven scores (see the package docstring, "Outcome")."""
    words = [w for m in messages for w in words_of(m)]
    goal_words = {w for k in scenario["goal_keywords"] for w in words_of(k)}
    secret_words = {w for k in scenario["secret_keywords"] for w in words_of(k)}
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
    """The SOTOPIA-EVAL outcome evaluator over an OpenAI-compatible server (see the package docstring, "Outcome")."""

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
