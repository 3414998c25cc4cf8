"""Structured outputs for every LLM role: the answers' JSON schemas and the auto | always | never fallback.

Every request of the judge and of the reflection model (reflection, refinement, attribution, capability
proposal, evaluator revision, instance rubrics) can carry `response_format` = the JSON schema of its answer,
with the request's random id pinned (`"enum": [request_id]`), so a server with guided decoding (vLLM,
OpenAI) can only answer with an object the parsers accept. The parsers stay as strict as without it and
keep treating every string in the answer as data.

`StructuredOutputs(mode)`:
- "auto" (default): send the schema; a server that rejects `response_format` (HTTP 400 / 422) is asked
  again with the plain prompt, and from then on every request goes without it (logged once);
- "always": send it; a rejection is the request's failure (INVALID verdicts, a skipped reflection);
- "never": plain prompts and the tolerant parsers only.

Schemas bound every string (`maxLength`: `chars`, the client's `max_field_chars`) and list (`maxItems`) so
a constrained answer ends within the client's `max_tokens` (a small model writing escaped bytes needs a small
bound); identifiers follow the parsers' pattern and categories are enums. The parsers still check what a
schema cannot (ids proposed twice, support cited from unknown trajectories) and cut long text with a logged
reason (`rwcore.judges.parsing.text_field`) whatever a server without guided decoding sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rwcore.judges.client import ChatError, ChatReply, ChatSession

__all__ = [
    "ID_REGEX",
    "STRUCTURED_OUTPUTS",
    "SCHEMA_REJECTED",
    "StructuredOutputs",
    "analysis_schema",
    "attribution_schema",
    "capability_proposal_schema",
    "evaluator_revision_schema",
    "instance_rubrics_schema",
    "json_schema_format",
    "keyed_records",
    "rubric_skill_schema",
    "skill_refinement_schema",
]

logger = logging.getLogger("rwcore.judges")

STRUCTURED_OUTPUTS = ("auto", "always", "never")
SCHEMA_REJECTED = (400, 422)  # what servers answer to a response_format they do not support
ID_REGEX = "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,47}$"  # within the parsers' identifier pattern
TEXT_CHARS = 400  # default bound of a structured answer's free-text fields (plain answers: up to 4000, cut)


class StructuredOutputs:
    """The auto | always | never behaviour of one client (see the module docstring); `active` says whether
    schemas are sent now ("auto" turns them off after the server's first rejection)."""

    def __init__(self, mode: str, owner: str) -> None:
        if mode not in STRUCTURED_OUTPUTS:
            raise ValueError(f"structured_outputs must be one of {STRUCTURED_OUTPUTS}, got {mode!r}")
        self.mode = mode
        self.owner = owner
        self.active = mode != "never"

    async def complete(
        self,
        session: ChatSession,
        build: Callable[[bool], Sequence[Mapping[str, str]]],
        schema: Mapping[str, Any] | None,
    ) -> ChatReply:
        """`session.complete` of `build(structured)`, with `schema` as response_format while active."""
        if not self.active or schema is None:
            return await session.complete(build(False))
        try:
            return await session.complete(build(True), response_format=schema)
        except ChatError as error:
            if self.mode != "auto" or error.status not in SCHEMA_REJECTED or _too_long(error.message):
                if error.status in SCHEMA_REJECTED:
                    error.message += " (structured_outputs='always': the server refused response_format?)"
                raise
            rejection = error.message
        reply = await session.complete(build(False))
        if self.active:  # the plain request worked: it was response_format the server refused
            self.active = False
            logger.warning(
                "%s: the server rejected structured outputs (%s); asking with plain prompts and the tolerant "
                "parser from now on (structured_outputs=auto)",
                self.owner,
                rejection,
            )
        return reply


def _too_long(message: str) -> bool:
    """A 400 that says the prompt exceeds the model's context: not a rejection of response_format."""
    text = message.lower()
    return any(words in text for words in ("context length", "maximum context", "too many tokens", "input tokens"))


def json_schema_format(name: str, schema: Mapping[str, Any]) -> dict:
    """A chat request's `response_format` for `schema` (OpenAI's json_schema form, which vLLM reads)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": dict(schema), "strict": True}}


def _text(max_chars: int, *, required: bool = True) -> dict:
    return {"type": "string", "minLength": 1 if required else 0, "maxLength": max_chars}


def _object(properties: Mapping[str, Any], required: Sequence[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties if required is None else required),
        "additionalProperties": False,
    }


def _answer(request_id: str, name: str, properties: Mapping[str, Any]) -> dict:
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    return json_schema_format(name, _object({"request_id": {"type": "string", "enum": [request_id]}, **properties}))


def _list(item: Mapping[str, Any], max_items: int, min_items: int = 0) -> dict:
    return {"type": "array", "items": dict(item), "minItems": min_items, "maxItems": max(min_items, max_items)}


def analysis_schema(
    request_id: str, capabilities: Sequence[str], existing_ids: Sequence[str], max_items: int, chars: int = TEXT_CHARS
) -> dict:
    """Arise's trajectory analysis: {"request_id", "issues": [...], "strategies": [...]}."""
    item = _object(
        {
            "behavior": _text(chars),
            "signal": _text(chars, required=False),
            "capability": {"type": "string", "enum": list(capabilities)},
            "covered_by": {"anyOf": [{"type": "string", "enum": list(existing_ids)}, {"type": "null"}]}
            if existing_ids
            else {"type": "null"},
        }
    )
    return _answer(
        request_id, "trajectory_analysis", {"issues": _list(item, max_items), "strategies": _list(item, max_items)}
    )


def rubric_skill_schema(request_id: str, capabilities: Sequence[str], max_new: int, chars: int = TEXT_CHARS) -> dict:
    """Arise's rubric-skill generation: {"request_id", "proposals": [1 to max_new pairs]} (the generation step
    of every pool update proposes pairs; a plain answer may still hold none)."""
    item = _object(
        {
            "rubric_id": {"type": "string", "pattern": ID_REGEX},
            "capability": {"type": "string", "enum": list(capabilities)},
            "criterion": _text(chars),
            "applicability": _text(chars, required=False),
            "pass_when": _text(chars, required=False),
            "fail_when": _text(chars, required=False),
            "skill": _text(chars),
            "evidence": _text(chars, required=False),
        }
    )
    return _answer(request_id, "rubric_skill_proposals", {"proposals": _list(item, max_new, min(1, max_new))})


def skill_refinement_schema(request_id: str, chars: int = TEXT_CHARS) -> dict:
    """Arise's skill refinement: {"request_id", "skill"}."""
    return _answer(request_id, "skill_refinement", {"skill": _text(chars)})


def attribution_schema(
    request_id: str, candidate_ids: Sequence[str], causes: Sequence[str], chars: int = TEXT_CHARS
) -> dict:
    """RewardWeaver's failure attribution: {"request_id", "records": {capability id: record}}, one record per
    candidate, keyed by its id (a list could name a candidate twice or never); the parser reads each record as it
    reads one JSON line of the plain answer."""
    record = _object(
        {
            "deficit": {"type": "boolean"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "evidence": _text(chars, required=False),
            "cause": {"type": "string", "enum": list(causes)},
        }
    )
    return _answer(request_id, "failure_attribution", {"records": _object({cid: record for cid in candidate_ids})})


def keyed_records(objects: Sequence[Mapping], key: str = "capability_id") -> list[dict]:
    """The records of structured attribution answers ({"request_id", "records": {id: record}}) as the plain
    answer's objects: {**record, key: id, "request_id": the answer's}; anything else is left out."""
    found = []
    for obj in objects:
        records = obj.get("records")
        if isinstance(records, Mapping):
            for cid, record in records.items():
                if isinstance(record, Mapping):
                    found.append({**record, key: cid, "request_id": obj.get("request_id")})
    return found


def capability_proposal_schema(request_id: str, refs: Sequence[str], max_new: int, chars: int = TEXT_CHARS) -> dict:
    """RewardWeaver's controlled expansion: {"request_id", "proposals": [at most max_new capabilities]}."""
    item = _object(
        {
            "capability_id": {"type": "string", "pattern": ID_REGEX},
            "family": _text(min(200, chars)),
            "definition": _text(chars),
            "applicability": _text(chars, required=False),
            "evaluator_instructions": _text(chars),
            "support": _list({"type": "string", "enum": list(refs)}, len(refs)),
        }
    )
    return _answer(request_id, "capability_proposals", {"proposals": _list(item, max_new)})


def evaluator_revision_schema(request_id: str, chars: int = TEXT_CHARS) -> dict:
    """RewardWeaver's evaluator revision: {"request_id", "evaluator_instructions"}."""
    return _answer(request_id, "evaluator_revision", {"evaluator_instructions": _text(chars)})


def instance_rubrics_schema(request_id: str, max_rubrics: int, chars: int = TEXT_CHARS) -> dict:
    """Instance-specific rubrics: {"request_id", "rubrics": [at most max_rubrics]}."""
    item = _object(
        {
            "rubric_id": {"type": "string", "pattern": ID_REGEX},
            "criterion": _text(chars),
            "applicability": _text(chars, required=False),
            "evaluator_instructions": _text(chars, required=False),
        }
    )
    return _answer(request_id, "instance_rubrics", {"rubrics": _list(item, max_rubrics)})
