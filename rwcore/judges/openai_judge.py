"""`OpenAIJudge`: rubric verdicts from any OpenAI-compatible chat-completions server.

For each trajectory, the rubrics not found in the cache are split into requests of
`rubrics_per_request`; all requests of all trajectories run concurrently under the client's
limits. Each request carries one system message (instructions, the rubrics, the answer schema —
prompts/rubric_evaluation.md) and one user message holding only the trajectory as untrusted,
JSON-encoded data (see `rwcore.judges.templates`). The reply is read by
`rwcore.judges.verdicts.parse_judge_answer`; rubrics it leaves unresolved (missing, ambiguous,
malformed) are asked again, up to `max_reasks` times, in a fresh request with a new request id.
Whatever is still unresolved then, and every rubric of a request that failed after the
client's retries, is `Verdict.INVALID` with the reason in `RubricJudgment.error` — never PASS or
FAIL. An unexpected exception while a request is sent or its reply read is treated like an
unresolved answer (asked again in a fresh request, then INVALID with the error, scrubbed of the
key); nothing but bad arguments (ValueError) and a missing key for the default endpoint
(MissingAPIKeyError) ever leaves `evaluate`. Rewards score a remaining INVALID as a FAIL
(`rwcore.judged`), evidence and coverage do not count it.

Structured outputs (`structured_outputs`): with "auto" (default) or "always" each request also
carries `response_format` = the answer's JSON schema (`rwcore.judges.verdicts.answer_schema`: this
request's id, the requested rubric ids, the verdict words, a score exactly where a scored rubric
applies, numbers in [0, 1], bounded evidence), so a
server that supports it (vLLM, OpenAI) can only produce a well-formed answer; the tolerant parser
reads it like any other reply. With "auto", a server that rejects `response_format` (HTTP 400 / 422
where the same request without it succeeds) is asked without it from then on, for this judge, and
that is logged once; "always" makes such a rejection INVALID; "never" sends plain prompts only.

Arise B.6 diagnostics: the first request of each trajectory also receives the whole rubric pool
(every rubric passed to `evaluate`) and asks for behaviours it does not cover; they come back in
`JudgeReport.uncovered`. Other requests return verdicts only. Diagnostics come from fresh
requests: when every verdict of a trajectory is served from the cache, `uncovered` is the cached
diagnostics for the same trajectory and the same pool, or () if there are none.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rwcore.judges.cache import DEFAULT_MAX_BYTES, JudgmentCache, cache_key
from rwcore.judges.client import ChatClient, ChatError, ChatSession, ClientOptions, run_sync
from rwcore.judges.structured import STRUCTURED_OUTPUTS, StructuredOutputs  # noqa: F401 - re-exported
from rwcore.judges.templates import (
    data_rules,
    new_request_id,
    operator_json,
    render_file,
    rubric_payload,
    template_digest,
    trajectory_payload,
    untrusted_block,
)
from rwcore.judges.verdicts import parse_judge_answer, response_format
from rwcore.types import JudgeReport, RubricJudgment, RubricSpec, Trajectory
from rwcore.validation import (
    check_bool,
    check_count,
    check_optional_count,
    check_rubrics,
    check_trajectories,
    check_unit,
)
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.judges")

_TEMPLATES = (
    "rubric_evaluation",
    "rubric_evaluation_scored",
    "rubric_evaluation_diagnostics",
    "rubric_evaluation_structured",
    "_untrusted_data",
)


class OpenAIJudge:
    """Judge (rwcore.types.Judge) backed by an OpenAI-compatible chat-completions server.

    Connection and retry options are those of `rwcore.judges.client.ClientOptions` (model,
    base_url, api_key_env, max_concurrency, requests_per_minute, tokens_per_minute, timeout,
    max_retries, backoff, temperature, max_tokens, seed, extra_body, retry_after_cap, max_response_bytes). Also:

    rubrics_per_request: rubrics of one trajectory judged in one request.
    cache_dir: directory of the on-disk cache (None: no cache), one SQLite database in it
        (`rwcore.judges.cache`). Keys cover the model, the rubric's and the trajectory's content hashes,
        the prompt templates and the settings below that change a verdict; entries never contain the API
        key. Each `evaluate` looks all its keys up at once and stores its new verdicts and diagnostics in
        one transaction, once every request has come back.
    cache_max_bytes: the most bytes the cache may take on disk (at least 1 MiB; the least recently used
        entries are evicted past it).
    cache_busy_timeout: seconds a write waits for another process or thread writing to the same cache
        (then it is skipped, logged).
    pass_threshold: a scored rubric passes when its score is at least this.
    max_reasks: follow-up requests for rubrics a reply left unresolved.
    diagnostics: ask for uncovered behaviours (Arise B.6) in each trajectory's first request.
    require_request_id: accept only answer objects carrying the request's random id. Keep it on:
        it is what stops a verdict written inside the trajectory and copied by the judge from
        counting. Turn it off only for a model that cannot copy a 16-character token; then the
        other defences remain (requested ids only, ambiguity -> INVALID).
    include_outcome: show the trajectory's outcome reward to the judge (as auxiliary context).
    max_transcript_chars: cut long turns in the middle so a transcript stays about this long.
    structured_outputs: "auto" (send the answer's JSON schema as response_format; fall back to plain
        prompts for good when the server rejects it), "always" (a rejection is INVALID) or "never"
        (see the module docstring).
    max_field_chars: the longest evidence string and uncovered-behaviour note a structured answer may
        hold [300] (small for a small model, whose escaped bytes fill max_tokens and the reflection's context).

    API key: read from the environment variable `api_key_env` when each `evaluate` starts, never
    stored on the judge; unset with a `base_url` -> the placeholder "EMPTY" is sent (vLLM accepts
    any key); unset for the default OpenAI endpoint -> MissingAPIKeyError (details:
    `rwcore.judges.client`).

    `evaluate` is synchronous (it runs `aevaluate` on an event loop, or on a worker thread when
    one is already running); `aevaluate` is the coroutine. Both return one JudgeReport per
    trajectory, in order, with one judgment per rubric, in the rubrics' order.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: tuple[float, float] = (0.5, 8.0),
        rubrics_per_request: int = 4,
        cache_dir: str | os.PathLike | None = None,
        temperature: float | None = 0.0,
        *,
        cache_max_bytes: int = DEFAULT_MAX_BYTES,
        cache_busy_timeout: float = 5.0,
        max_tokens: int | None = 2048,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        retry_after_cap: float = 60.0,
        pass_threshold: float = 0.5,
        max_reasks: int = 1,
        diagnostics: bool = True,
        require_request_id: bool = True,
        include_outcome: bool = True,
        max_transcript_chars: int | None = None,
        structured_outputs: str = "auto",
        max_response_bytes: int = 8 << 20,
        max_field_chars: int = 300,
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
        self.rubrics_per_request = check_count(rubrics_per_request, "rubrics_per_request", low=1)
        self.cache = (
            JudgmentCache(cache_dir, cache_max_bytes, busy_timeout=cache_busy_timeout)
            if cache_dir is not None
            else None
        )
        self.pass_threshold = check_unit(pass_threshold, "pass_threshold")
        self.max_reasks = check_count(max_reasks, "max_reasks")
        self.diagnostics = check_bool(diagnostics, "diagnostics")
        self.require_request_id = check_bool(require_request_id, "require_request_id")
        self.include_outcome = check_bool(include_outcome, "include_outcome")
        self.max_transcript_chars = check_optional_count(max_transcript_chars, "max_transcript_chars")
        self.structured = StructuredOutputs(structured_outputs, f"judge {model}")  # "auto": off after a rejection
        self.max_field_chars = check_count(max_field_chars, "max_field_chars", low=8)
        self.structured_outputs = structured_outputs
        # Everything besides the model and the two contents that can change a verdict.
        self._config_digest = hashlib.sha256(
            repr(
                (
                    template_digest(*_TEMPLATES),
                    self.pass_threshold,
                    self.include_outcome,
                    self.max_transcript_chars,
                )
            ).encode()
        ).hexdigest()

    @property
    def model(self) -> str:
        return self.client.options.model

    def __repr__(self) -> str:
        o = self.client.options
        return (
            f"OpenAIJudge(model={o.model!r}, base_url={o.base_url!r}, api_key_env={o.api_key_env!r}, "
            f"rubrics_per_request={self.rubrics_per_request}, structured_outputs={self.structured_outputs!r}, "
            f"cache={self.cache!r})"
        )

    # ---- keys -------------------------------------------------------------------------------

    def judgment_key(self, rubric: RubricSpec, trajectory: Trajectory) -> str:
        """The cache key of one (rubric, trajectory) judgment by this judge."""
        return cache_key(
            "judgment",
            model=self.model,
            rubric=rubric.content_hash(),
            trajectory=trajectory.content_hash(),
            config=self._config_digest,
        )

    def _diagnostics_key(self, pool_digest: str, trajectory: Trajectory) -> str:
        return cache_key(
            "diagnostics",
            model=self.model,
            pool=pool_digest,
            trajectory=trajectory.content_hash(),
            config=self._config_digest,
        )

    # ---- prompts ----------------------------------------------------------------------------

    def build_messages(
        self,
        trajectory: Trajectory,
        rubrics: Sequence[RubricSpec],
        request_id: str,
        pool: Sequence[RubricSpec] | None = None,
        structured: bool = False,
    ) -> list[dict[str, str]]:
        """The chat messages of one request; `pool` given -> diagnostics are asked for; `structured` ->
        the system prompt also describes the one-object layout of a structured answer."""
        scored_note = ""
        if any(rubric.scored for rubric in rubrics):
            scored_note = render_file("rubric_evaluation_scored", pass_threshold=f"{self.pass_threshold:g}")
        diagnostics_section = ""
        if pool is not None:
            listing = [
                {
                    key: value
                    for key, value in rubric_payload(r, include_scored=False).items()
                    if key in ("rubric_id", "criterion", "applicability")
                }
                for r in pool
            ]
            diagnostics_section = render_file(
                "rubric_evaluation_diagnostics", request_id=request_id, pool=operator_json(listing)
            )
        system = render_file(
            "rubric_evaluation",
            request_id=request_id,
            rubrics=operator_json([rubric_payload(r) for r in rubrics]),
            scored_note=scored_note,
            diagnostics_section=diagnostics_section,
            data_rules=data_rules(request_id),
        )
        if structured:
            system += "\n\n" + render_file("rubric_evaluation_structured", request_id=request_id)
        data = {
            "trajectory": trajectory_payload(
                trajectory, include_outcome=self.include_outcome, max_chars=self.max_transcript_chars
            )
        }
        return [{"role": "system", "content": system}, {"role": "user", "content": untrusted_block(data, request_id)}]

    # ---- evaluation -------------------------------------------------------------------------

    def evaluate(self, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec]) -> list[JudgeReport]:
        """Synchronous `aevaluate`."""
        return run_sync(self.aevaluate(trajectories, rubrics))

    async def aevaluate(
        self, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec], session: ChatSession | None = None
    ) -> list[JudgeReport]:
        """One JudgeReport per trajectory (in order) with a judgment for every rubric (in order). `session`: an
        open `self.client.session()` to send the requests through (several calls share its connections).

        ValueError for bad arguments (before any request); MissingAPIKeyError when no key is
        configured for the default endpoint. Request failures never raise: they are INVALID.
        """
        trajectories = check_trajectories(trajectories)
        rubrics = check_rubrics(rubrics)
        found: list[dict[str, RubricJudgment]] = [{} for _ in trajectories]
        uncovered: list[tuple[str, ...]] = [() for _ in trajectories]
        pool_digest = hashlib.sha256("\n".join(sorted(r.content_hash() for r in rubrics)).encode()).hexdigest()
        work: list[tuple[int, list[tuple[RubricSpec, str]], bool, str]] = []
        # An entry that holds a secret was written before replies were redacted: not served (that would carry
        # the key into evidence and run folders), so the trajectory is judged again and the entry overwritten.
        redact = self.client.redactor() if self.cache is not None else None
        keys = [[self.judgment_key(rubric, trajectory) for rubric in rubrics] for trajectory in trajectories]
        diagnostics_keys = [self._diagnostics_key(pool_digest, trajectory) for trajectory in trajectories]
        want_any_diagnostics = self.diagnostics and bool(rubrics)
        # Every key of this call in one lookup (a query per 500 keys), not one per rubric and trajectory.
        hits: dict[str, RubricJudgment] = {}
        cached_uncovered: dict[str, tuple[str, ...]] = {}
        if self.cache is not None:
            hits = self.cache.get_judgments(
                (key, rubric.rubric_id) for row in keys for key, rubric in zip(row, rubrics)
            )
            if want_any_diagnostics:
                cached_uncovered = self.cache.get_uncovered_many(diagnostics_keys)
        for index, _trajectory in enumerate(trajectories):
            pending: list[tuple[RubricSpec, str]] = []
            for rubric, key in zip(rubrics, keys[index]):
                hit = hits.get(key)
                if hit is not None and hit.rubric_id != rubric.rubric_id:
                    # The same rubric content under two ids: one entry, relabelled for each.
                    hit = dataclasses.replace(hit, rubric_id=rubric.rubric_id)
                if hit is not None and redact(hit.evidence) != hit.evidence:
                    logger.warning("judge cache: ignoring entry %s, which holds a secret; a miss", key)
                    hit = None
                if hit is not None:
                    found[index][rubric.rubric_id] = hit
                    self.client.usage.add(cache_hits=1)
                else:
                    pending.append((rubric, key))
            diagnostics_key = diagnostics_keys[index]
            want_diagnostics = want_any_diagnostics
            if want_diagnostics and self.cache is not None:
                cached = cached_uncovered.get(diagnostics_key)
                if cached is not None and any(redact(note) != note for note in cached):
                    logger.warning("judge cache: ignoring entry %s, which holds a secret; a miss", diagnostics_key)
                    cached = None
                if cached is not None:
                    uncovered[index] = cached
                    want_diagnostics = False
                    self.client.usage.add(cache_hits=1)
            for start in range(0, len(pending), self.rubrics_per_request):
                work.append(
                    (
                        index,
                        pending[start : start + self.rubrics_per_request],
                        want_diagnostics and start == 0,
                        diagnostics_key,
                    )
                )
        if work:
            async with contextlib.AsyncExitStack() as stack:
                if session is None:
                    session = await stack.enter_async_context(self.client.session())
                results = await asyncio.gather(
                    *(
                        self._judge_batch_safely(session, trajectories[index], batch, rubrics if with_pool else None)
                        for index, batch, with_pool, _ in work
                    )
                )
            new_judgments: list[tuple[str, RubricJudgment]] = []
            new_uncovered: list[tuple[str, tuple[str, ...]]] = []
            for (index, batch, with_pool, diagnostics_key), (judgments, batch_uncovered) in zip(work, results):
                found[index].update(judgments)
                new_judgments += [(key, judgments[rubric.rubric_id]) for rubric, key in batch]
                if with_pool and batch_uncovered is not None:
                    uncovered[index] = batch_uncovered
                    new_uncovered.append((diagnostics_key, batch_uncovered))
            if self.cache is not None:
                # One transaction for the whole call (INVALID verdicts are not stored); a write that fails
                # is logged by the cache and costs only requests later.
                self.cache.put_batch(judgments=new_judgments, uncovered=new_uncovered, model=self.model)
        return [
            JudgeReport(
                trajectory.trajectory_id, {r.rubric_id: found[index][r.rubric_id] for r in rubrics}, uncovered[index]
            )
            for index, trajectory in enumerate(trajectories)
        ]

    async def _complete(
        self,
        session: ChatSession,
        trajectory: Trajectory,
        rubrics: list[RubricSpec],
        request_id: str,
        pool: Sequence[RubricSpec] | None,
    ):
        """One request, with the answer's schema as response_format while structured outputs are on."""
        return await self.structured.complete(
            session,
            lambda structured: self.build_messages(trajectory, rubrics, request_id, pool, structured=structured),
            response_format(rubrics, request_id, diagnostics=pool is not None, chars=self.max_field_chars),
        )

    @property
    def uses_structured_outputs(self) -> bool:
        """Whether requests carry the answer's JSON schema now ("auto" turns it off after a rejection)."""
        return self.structured.active

    @uses_structured_outputs.setter
    def uses_structured_outputs(self, value: bool) -> None:
        self.structured.active = bool(value)

    async def _judge_batch_safely(
        self,
        session: ChatSession,
        trajectory: Trajectory,
        batch: list[tuple[RubricSpec, str]],
        pool: Sequence[RubricSpec] | None,
    ) -> tuple[dict[str, RubricJudgment], tuple[str, ...] | None]:
        """`_judge_batch`, with anything it raises turned into INVALID judgments (never a crashed run)."""
        try:
            return await self._judge_batch(session, trajectory, batch, pool)
        except Exception as error:  # a judge failure is INVALID, whatever it is
            message = session.scrub(f"judging failed: {type(error).__name__}: {error}")
            logger.warning(
                "judge %s: %s (trajectory %r); its %d rubric(s) are INVALID",
                self.model,
                message,
                trajectory.trajectory_id,
                len(batch),
            )
            return {
                rubric.rubric_id: RubricJudgment(rubric.rubric_id, Verdict.INVALID, error=message)
                for rubric, _ in batch
            }, None

    async def _judge_batch(
        self,
        session: ChatSession,
        trajectory: Trajectory,
        batch: list[tuple[RubricSpec, str]],
        pool: Sequence[RubricSpec] | None,
    ) -> tuple[dict[str, RubricJudgment], tuple[str, ...] | None]:
        pending = {rubric.rubric_id: rubric for rubric, _ in batch}
        judgments: dict[str, RubricJudgment] = {}
        problems: dict[str, str] = {}
        uncovered: tuple[str, ...] | None = None
        for round_index in range(1 + self.max_reasks):
            request_id = new_request_id()
            ask_pool = pool if round_index == 0 else None
            try:
                reply = await self._complete(session, trajectory, list(pending.values()), request_id, ask_pool)
                answer = parse_judge_answer(
                    reply.text,
                    pending,
                    request_id=request_id if self.require_request_id else None,
                    pass_threshold=self.pass_threshold,
                    want_diagnostics=ask_pool is not None,
                )
            except ChatError as error:
                # The client already retried; asking again would only repeat that.
                problems = {rubric_id: f"judge request failed: {error.message}" for rubric_id in pending}
                break
            except Exception as error:  # unexpected: asked again in a fresh request, then INVALID
                problem = session.scrub(f"unexpected error: {type(error).__name__}: {error}")
                problems = {rubric_id: problem for rubric_id in pending}
                logger.warning(
                    "judge %s: %s (trajectory %r)%s",
                    self.model,
                    problem,
                    trajectory.trajectory_id,
                    "; asking again" if round_index < self.max_reasks else "",
                )
                continue
            # The client redacted the key from the reply's text; the parsed strings are redacted again in case
            # the parser decoded an escape that spelled it (nothing a reply carries reaches the cache with it).
            if ask_pool is not None:
                uncovered = None if answer.uncovered is None else tuple(session.redact(u) for u in answer.uncovered)
            for rubric_id, judgment in answer.judgments.items():
                judgment = dataclasses.replace(
                    judgment, evidence=session.redact(judgment.evidence), error=session.redact(judgment.error)
                )
                judgments[rubric_id] = judgment
                del pending[rubric_id]
            cut = " (the answer was cut off at max_tokens)" if reply.finish_reason == "length" else ""
            problems = {rubric_id: answer.problems[rubric_id] + cut for rubric_id in pending}
            if not pending:
                break
            if round_index < self.max_reasks:
                logger.info(
                    "judge %s left %d rubric(s) unresolved for trajectory %r; asking again",
                    self.model,
                    len(pending),
                    trajectory.trajectory_id,
                )
        for rubric_id in pending:
            judgments[rubric_id] = RubricJudgment(rubric_id, Verdict.INVALID, error=problems[rubric_id])
        return judgments, uncovered
