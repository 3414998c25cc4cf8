"""The shared LLM counterpart of two-party environments: a partner over an OpenAI-compatible API, or the
policy itself (self-play), answering many episodes at once.

Partners
--------
`OpenAIPartner(model, base_url, api_key_env, ...)`: role-plays a profile (the system prompt an
environment writes from its scenario: who the partner is, what it privately wants) over any
OpenAI-compatible chat-completions server (a hosted model, `vllm serve`). Requests go through
rwcore.judges.client.ChatClient: a concurrency limit, per-attempt timeouts, retries with backoff. The API
key is read from the environment variable named by `api_key_env` when a batch starts and is never stored
in an attribute, a log or a run folder (None: a key-less loopback server).

The reply format (reply_format):
- "json" (default): structured outputs, the reply constrained to
  {"message": "<at most max_reply_chars characters>", "leave": true|false}
  ("leave": the partner ends the conversation). vLLM and OpenAI's API both honour it, and even a random
  model's reply then parses.
- "text": the plain reply text is the message (for servers without structured outputs); "[leave]"
  anywhere in it means leave.

A request that fails for good (time-out, connection error, 5xx after the retries) or whose reply is
garbage (not the JSON object, an empty message, mostly unprintable characters) gives a
`PartnerFailure(reason)` for that episode; the environment ends the episode with
`rwcore.trainer.envs.base.partner_failed`, which is never charged to the agent.

`PolicyPartner`: self-play. The trainer attaches a text generator to the environment
(`attach_policy(generate)`, called by rwcore.trainer.trainer when the environment has it): the policy
being trained writes the partner's turns from the partner's profile and the conversation so far (rendered
as one brief from the partner's point of view), sampled at the rollout temperature without gradients; the
partner's tokens are part of the agent's observations, never of its generated tokens, so no loss flows
through them. Before attachment (e.g. `task_contexts`) a PolicyPartner refuses to reply.

`ScriptedPartner` (fallback without any server) lives with each environment (see rwcore.trainer.envs.social).

Every partner answers `reply_many(requests) -> list[PartnerReply | PartnerFailure]`, one per request;
a request is (system prompt, messages from the partner's point of view: [{"role": "user"|"assistant",
"content": ...}]), "user" being the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger("rwcore.trainer.partner")

__all__ = [
    "OpenAIPartner",
    "PartnerFailure",
    "PartnerReply",
    "PartnerRequest",
    "PolicyPartner",
    "garbage_reason",
    "make_partner",
]


@dataclass(frozen=True)
class PartnerRequest:
    """One partner turn to write: the partner's system prompt (its profile) and the conversation from its
    point of view ("user" = the agent, "assistant" = the partner's own earlier messages)."""

    system: str
    messages: tuple[Mapping[str, str], ...]


@dataclass(frozen=True)
class PartnerReply:
    message: str
    leave: bool = False


@dataclass(frozen=True)
class PartnerFailure:
    """The partner could not answer this episode (time-out, server error, garbage): `reason` says why."""

    reason: str


def garbage_reason(text: object, max_chars: int) -> str | None:
    """Why `text` is not a usable partner message (None when it is)."""
    if not isinstance(text, str):
        return f"message is {type(text).__name__}, not text"
    stripped = text.strip()
    if not stripped:
        return "empty message"
    printable = sum(
        1
        for ch in stripped
        if ch.isprintable() and unicodedata.category(ch) not in ("Co", "Cn", "Cs") and ch != "\ufffd"
    )
    if printable < 0.5 * len(stripped):
        return f"mostly unprintable message ({printable}/{len(stripped)} printable characters)"
    if len(stripped) > 4 * max_chars:
        return f"message of {len(stripped)} characters (at most {max_chars} asked)"
    return None


def _reply_schema(max_chars: int) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "partner_reply",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "message": {"type": "string", "minLength": 1, "maxLength": max_chars},
                    "leave": {"type": "boolean"},
                },
                "required": ["message", "leave"],
                "additionalProperties": False,
            },
        },
    }


_FORMAT_NOTE = {
    "json": (
        '\n\nAnswer with one JSON object only: {"message": "<your next message>", "leave": false}; set "leave" '
        "to true only when you end the conversation."
    ),
    "text": "\n\nAnswer with your next message only. Write [leave] in it when you end the conversation.",
}


class OpenAIPartner:
    """A fixed LLM partner over an OpenAI-compatible server (see the module docstring)."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        *,
        max_concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 1,
        temperature: float = 0.7,
        max_tokens: int = 256,
        max_reply_chars: int = 600,
        reply_format: str = "json",
        seed: int | None = None,
    ) -> None:
        from rwcore.judges.client import ChatClient, ClientOptions

        if reply_format not in ("json", "text"):
            raise ValueError(f"partner reply_format must be 'json' or 'text', got {reply_format!r}")
        if isinstance(max_reply_chars, bool) or not isinstance(max_reply_chars, int) or max_reply_chars < 1:
            raise ValueError(f"partner max_reply_chars must be a positive integer, got {max_reply_chars!r}")
        self.model, self.base_url, self.reply_format = model, base_url, reply_format
        self.max_reply_chars = max_reply_chars
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
                seed=seed,
            )
        )
        self.failures = 0

    def __repr__(self) -> str:  # never the key: it is not held
        return f"OpenAIPartner(model={self.model!r}, base_url={self.base_url!r}, reply_format={self.reply_format!r})"

    def parse(self, text: str) -> PartnerReply | PartnerFailure:
        """A server reply as a PartnerReply, or a PartnerFailure saying why it is garbage."""
        if self.reply_format == "json":
            try:
                answer = json.loads(text, strict=False)  # control characters inside the string: judged below
            except (ValueError, TypeError) as error:
                return PartnerFailure(f"garbage reply: not JSON ({error.__class__.__name__}: {str(error)[:80]})")
            if not isinstance(answer, dict) or "message" not in answer:
                return PartnerFailure('garbage reply: not a {"message", "leave"} object')
            message, leave = answer.get("message"), answer.get("leave", False)
            if not isinstance(leave, bool):
                return PartnerFailure('garbage reply: "leave" is not a boolean')
        else:
            message = text
            leave = "[leave]" in text.lower() if isinstance(text, str) else False
            if isinstance(message, str):
                message = message.replace("[leave]", "").replace("[LEAVE]", "")
        reason = garbage_reason(message, self.max_reply_chars)
        if reason is not None:
            return PartnerFailure(f"garbage reply: {reason}")
        return PartnerReply(" ".join(message.split())[: self.max_reply_chars], leave)

    def reply_many(self, requests: Sequence[PartnerRequest]) -> list[PartnerReply | PartnerFailure]:
        from rwcore.judges.client import ChatError, run_sync

        if not requests:
            return []
        note = _FORMAT_NOTE[self.reply_format]
        response_format = _reply_schema(self.max_reply_chars) if self.reply_format == "json" else None

        async def one(session, request: PartnerRequest):
            messages = [{"role": "system", "content": request.system + note}, *[dict(m) for m in request.messages]]
            if messages[-1]["role"] != "user":  # the partner speaks first: a neutral cue
                messages.append({"role": "user", "content": "(The conversation starts. Say your first message.)"})
            try:
                reply = await session.complete(messages, response_format=response_format)
            except ChatError as error:
                return PartnerFailure(f"partner request failed: {session.scrub(str(error))[:300]}")
            return self.parse(reply.text)

        async def run():
            async with self.client.session() as session:
                return await asyncio.gather(*(one(session, request) for request in requests))

        out = list(run_sync(run()))
        failed = [r.reason for r in out if isinstance(r, PartnerFailure)]
        if failed:
            self.failures += len(failed)
            logger.warning(
                "partner %s: %d of %d replies failed (%s); those episodes end as partner failures",
                self.model,
                len(failed),
                len(out),
                failed[0],
            )
        return out


class PolicyPartner:
    """Self-play: the policy being trained writes the partner's turns (see the module docstring)."""

    def __init__(self, max_reply_chars: int = 600) -> None:
        self.generate: Callable[[Sequence[tuple[str, str]]], list[str]] | None = None
        self.max_reply_chars = max_reply_chars

    def attach(self, generate: Callable[[Sequence[tuple[str, str]]], list[str]]) -> None:
        """generate([(system prompt, brief), ...]) -> one message per item (the trainer's policy, no gradients)."""
        self.generate = generate

    def reply_many(self, requests: Sequence[PartnerRequest]) -> list[PartnerReply | PartnerFailure]:
        if self.generate is None:
            raise RuntimeError(
                "a self-play partner needs the policy: the trainer attaches it "
                "(env.attach_policy) before the first rollout"
            )
        if not requests:
            return []
        briefs = []
        for request in requests:
            lines = [f"{'them' if m['role'] == 'user' else 'you'}: {m['content']}" for m in request.messages]
            briefs.append(
                (
                    request.system,
                    "conversation so far: " + (" | ".join(lines) if lines else "none") + " | your next message:",
                )
            )
        texts = self.generate(briefs)
        out: list[PartnerReply | PartnerFailure] = []
        for text in texts:
            reason = garbage_reason(text, self.max_reply_chars)
            out.append(
                PartnerFailure(f"self-play reply: {reason}")
                if reason
                else PartnerReply(" ".join(str(text).split())[: self.max_reply_chars], "[leave]" in str(text))
            )
        return out


def make_partner(
    kind: str,
    *,
    model: str = "",
    base_url: str = "",
    api_key_env: str | None = "OPENAI_API_KEY",
    argument: str = "env.options.partner",
    **options,
):
    """ "llm" -> OpenAIPartner (model required), "self" -> PolicyPartner; others are the caller's."""
    if kind == "llm":
        if not model:
            raise ValueError(
                f"{argument}=llm needs a model: set env.options.partner_model (and partner_base_url for a "
                "vllm serve / self-hosted server)"
            )
        return OpenAIPartner(model, base_url or None, api_key_env, **options)
    if kind == "self":
        return PolicyPartner(max_reply_chars=options.get("max_reply_chars", 600))
    raise ValueError(f"{argument} must be one of 'scripted', 'llm', 'self', got {kind!r}")
