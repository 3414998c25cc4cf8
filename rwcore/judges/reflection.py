"""The machinery every role of the reflection model shares (`ReflectionModel`): its options, the chat client,
and the request loop that asks again after an unusable answer (`_ask`), with the readers of the answers' JSON
objects. The roles are rwcore.judges.arise_reflection and rwcore.judges.rewardweaver_reflection; the class
that combines them is `rwcore.judges.reflector.OpenAIReflector`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from rwcore.judges.client import ChatClient, ChatError, ChatSession, ClientOptions
from rwcore.judges.parsing import SchemaError, answer_parts, check_request_id
from rwcore.judges.structured import StructuredOutputs
from rwcore.judges.templates import data_rules, new_request_id, render_file, trajectory_payload, untrusted_block
from rwcore.tasks import DEFAULT_CAPABILITIES
from rwcore.types import Trajectory
from rwcore.validation import check_bool, check_count, check_optional_count

logger = logging.getLogger("rwcore.judges")

_T = TypeVar("_T")
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,79}$")
MAX_SKILL_CHARS = 4000
MAX_FIELD_CHARS = 4000
MAX_ANALYSIS_ITEMS = 8


class ReflectionError(RuntimeError):
    """A reflection request failed, or its answer stayed unusable after the re-asks."""


def _single_object(text: str, key: str, request_id: str | None) -> dict:
    """The one JSON object of the reply that has `key`; SchemaError when none, several, or a foreign id.

    With a request id, objects without it are ignored first (e.g. one the model quoted from the
    trajectory: its writer cannot know the id), so they can neither win nor make the real answer
    ambiguous; objects inside a reasoning block count only when none outside carries the id (the
    rules of `rwcore.judges.verdicts`).
    """
    answer, drafts = answer_parts(text)
    found = [obj for obj in answer if key in obj]
    if request_id is not None:
        mine = [obj for obj in found if obj.get("request_id") == request_id]
        if not mine:
            mine = [obj for obj in drafts if key in obj and obj.get("request_id") == request_id]
        if not mine and found:
            check_request_id(found[0], request_id)  # SchemaError naming the request id
        found = mine
    if not found:
        raise SchemaError(f'no JSON object with "{key}" in the answer')
    if len(found) > 1:
        raise SchemaError(f'{len(found)} JSON objects with "{key}" in the answer (ambiguous)')
    check_request_id(found[0], request_id)
    return found[0]


def _list_field(obj: dict, key: str) -> list:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SchemaError(f'"{key}" must be a list, got {type(value).__name__}')
    return value


def _new_id(value, field: str, taken: set[str]) -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise SchemaError(f'"{field}" must be a short identifier (letters, digits, - _ . :), got {value!r}')
    if value in taken:
        raise SchemaError(f'"{field}" {value!r} already exists or is proposed twice')
    taken.add(value)
    return value


class ReflectionModel:
    """The options and request machinery of `OpenAIReflector` (its docstring lists the options)."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: tuple[float, float] = (0.5, 8.0),
        temperature: float | None = 0.0,
        *,
        max_tokens: int | None = 4096,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        retry_after_cap: float = 60.0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
        max_reasks: int = 1,
        require_request_id: bool = True,
        max_transcript_chars: int | None = 24000,
        max_trajectories_per_request: int = 16,
        candidates_per_request: int = 8,
        min_support: int = 2,
        max_response_bytes: int = 8 << 20,
        structured_outputs: str = "auto",
        max_field_chars: int = 400,
    ) -> None:
        self.client = ChatClient(
            ClientOptions(
                model=model,
                base_url=base_url,
                api_key_env=api_key_env,
                max_concurrency=max_concurrency,
                requests_per_minute=requests_per_minute,
                tokens_per_minute=tokens_per_minute,
                timeout=timeout,
                max_retries=max_retries,
                backoff=backoff,
                temperature=temperature,
                max_tokens=max_tokens,
                seed=seed,
                extra_body=extra_body,
                retry_after_cap=retry_after_cap,
                max_response_bytes=max_response_bytes,
            )
        )
        if (
            isinstance(capabilities, (str, bytes))
            or not isinstance(capabilities, Sequence)
            or not capabilities
            or not all(isinstance(c, str) and c for c in capabilities)
            or len(set(capabilities)) != len(capabilities)
        ):
            raise ValueError(f"capabilities must be a non-empty sequence of distinct names, got {capabilities!r}")
        self.capabilities = tuple(capabilities)
        self.max_reasks = check_count(max_reasks, "max_reasks")
        self.require_request_id = check_bool(require_request_id, "require_request_id")
        self.max_transcript_chars = check_optional_count(max_transcript_chars, "max_transcript_chars")
        self.max_trajectories_per_request = check_count(
            max_trajectories_per_request, "max_trajectories_per_request", low=1
        )
        self.candidates_per_request = check_count(candidates_per_request, "candidates_per_request", low=1)
        self.min_support = check_count(min_support, "min_support", low=1)
        self.structured = StructuredOutputs(structured_outputs, f"reflection model {model}")
        self.max_field_chars = check_count(max_field_chars, "max_field_chars", low=8)

    @property
    def uses_structured_outputs(self) -> bool:
        """Whether requests carry their answer's JSON schema now (see rwcore.judges.structured)."""
        return self.structured.active

    @property
    def model(self) -> str:
        return self.client.options.model

    # ---- shared machinery -------------------------------------------------------------------

    def _checked_id(self, request_id: str) -> str | None:
        return request_id if self.require_request_id else None

    def _payload(self, trajectory: Trajectory, *, ref: str | None = None, include_outcome: bool = True) -> dict:
        return trajectory_payload(
            trajectory, include_outcome=include_outcome, max_chars=self.max_transcript_chars, ref=ref
        )

    async def _ask(
        self,
        session: ChatSession,
        what: str,
        build: Callable[[str], list[dict[str, str]]],
        parse: Callable[[str, str], _T],
        schema: Callable[[str], dict] | None = None,
    ) -> _T:
        """`parse(reply, request_id)` of the first usable answer; ReflectionError otherwise. `schema(request_id)`:
        the answer's response_format (rwcore.judges.structured), sent while structured outputs are on."""
        problem = ""
        for attempt in range(1 + self.max_reasks):
            request_id = new_request_id()
            try:
                reply = await self.structured.complete(
                    session,
                    lambda structured: build(request_id),  # noqa: B023 - awaited here, in this iteration
                    schema(request_id) if schema else None,
                )
            except ChatError as error:
                raise ReflectionError(f"{what}: request failed: {error.message}") from error
            except Exception as error:  # never a crash: the caller logs and skips the reflection
                raise ReflectionError(
                    session.scrub(f"{what}: request failed: {type(error).__name__}: {error}")
                ) from error
            try:
                return parse(reply.text, request_id)
            except SchemaError as error:
                problem = str(error)
                if reply.finish_reason == "length":
                    problem += " (the answer was cut off at max_tokens)"
            except Exception as error:  # an answer that trips the reader: asked again, then an error
                problem = session.scrub(f"unexpected error reading the answer: {type(error).__name__}: {error}")
            logger.info(
                "%s: unusable answer (%s)%s", what, problem, "; asking again" if attempt < self.max_reasks else ""
            )
        raise ReflectionError(f"{what}: no usable answer after {1 + self.max_reasks} request(s): {problem}")

    def _messages(self, template: str, request_id: str, data: object, **values: str) -> list[dict[str, str]]:
        system = render_file(template, request_id=request_id, data_rules=data_rules(request_id), **values)
        return [{"role": "system", "content": system}, {"role": "user", "content": untrusted_block(data, request_id)}]
