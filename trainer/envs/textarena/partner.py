"""The TextArena opponent as an LLM (OpenAI-compatible server) or as the policy itself (self-play), over the
shared partner machinery of rwcore.trainer.envs.llm_partner: the opponent sees TextArena's own prompt for its
side and the game so far, and answers with its next move. Failures come back as exceptions in the result list
(the adapter ends those episodes with base.partner_failed)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rwcore.trainer.envs.llm_partner import OpenAIPartner, PartnerFailure, PartnerRequest, make_partner

SYSTEM = (
    "You are a player in a two-player text game run by TextArena. The game's instructions for your side "
    "and everything that happened so far follow in the user message. Reply with your next move only, in the "
    "game's action format."
)


class OpponentFailure(Exception):
    """The opponent could not move (request failed, garbage reply)."""


class _LenientJSONPartner(OpenAIPartner):
    """OpenAIPartner that also takes a JSON reply with raw control characters inside its strings (servers'
    guided decoding lets them through; strict json.loads refuses them); the garbage checks still apply."""

    def parse(self, text: str):
        if self.reply_format == "json" and isinstance(text, str):
            try:
                text = json.dumps(json.loads(text, strict=False))
            except ValueError:
                pass  # the strict parse below reports it
        return super().parse(text)


class LLMOpponent:
    def __init__(
        self,
        kind: str = "llm",
        *,
        model: str = "",
        base_url: str = "",
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_tokens: int = 128,
        temperature: float = 0.7,
        max_concurrency: int = 8,
        reply_format: str = "json",
        max_reply_chars: int = 400,
    ) -> None:
        options = (
            {}
            if kind == "self"
            else {
                "timeout": timeout,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "max_concurrency": max_concurrency,
                "reply_format": reply_format,
            }
        )
        if kind == "llm" and model:
            self.partner = _LenientJSONPartner(
                model, base_url or None, api_key_env or None, max_reply_chars=max_reply_chars, **options
            )
        else:  # self-play, or the shared factory's error for a missing model
            self.partner = make_partner(
                kind,
                model=model,
                base_url=base_url,
                api_key_env=api_key_env or None,
                argument="env.options.opponent",
                max_reply_chars=max_reply_chars,
                **options,
            )

    def attach(self, generate) -> None:
        self.partner.attach(generate)

    def moves(self, views: Sequence[str]) -> list:
        """One move (str) or an OpponentFailure per view (the game so far from the opponent's side).
        Self-play: the policy's text is the move as it is (an empty or malformed one is the game's to judge,
        as it would be for the agent); only an LLM server's replies can be partner failures."""
        generate = getattr(self.partner, "generate", "absent")
        if generate != "absent":  # self-play (PolicyPartner)
            if generate is None:
                raise RuntimeError(
                    "a self-play opponent needs the policy: the trainer attaches it "
                    "(env.attach_policy) before the first rollout"
                )
            texts = generate([(SYSTEM, view) for view in views])
            return [" ".join(str(text).split())[: self.partner.max_reply_chars] for text in texts]
        requests = [PartnerRequest(SYSTEM, ({"role": "user", "content": view},)) for view in views]
        out = []
        for reply in self.partner.reply_many(requests):
            if isinstance(reply, PartnerFailure):
                out.append(OpponentFailure(reply.reason))
            else:
                out.append(reply.message)
        return out
