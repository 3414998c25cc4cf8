"""`OpenAIReflector`: Arise's reflection model and RewardWeaver's attribution / expansion model.

One object implements `RubricReflector` (propose_rubric_skills, refine_skill), `Attributor`
(attribute), `CapabilityProposer` (propose_capabilities), `EvaluatorReviser` (revise_evaluator)
and `InstanceRubricWriter` (instance_rubrics), plus Arise's initial trajectory analysis
(`analyze_trajectories`), over the same chat client as `OpenAIJudge` (limits, time-outs,
retries, key handling: `rwcore.judges.client`). Prompts are the files in `prompts/`.

Every request follows the judge's rules: instructions and operator data (rubrics, skills, the
library) in the system message; trajectories, and diagnostics derived from them, only as
untrusted JSON data in the user message; answers accepted only with the request's random id.

Output contract: a reply is either fully valid or not used. A reply that cannot be read, or any of
whose items breaks the schema (missing field, unknown capability category, duplicate or existing
id, support citing unknown trajectories), is asked again up to `max_reasks` times; then the
method raises `ReflectionError` — it never returns half-parsed output, and no other exception
escapes a request or the reading of an answer (anything unexpected is re-asked, then becomes a
`ReflectionError`, which `AdaptiveMethod` logs and skips). Two documented
exceptions, where items are independent: `attribute` returns the records of the candidates that
were answered validly and omits (with a warning) the ones that were not; `analyze_trajectories`
leaves out (with a warning) trajectories whose analysis failed. Both raise `ReflectionError` when
nothing at all could be obtained. Proposals beyond `max_new` are dropped (the first ones are kept),
and `propose_capabilities` drops proposals supported by fewer than `min_support` trajectories.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from rwcore.judges.client import ChatClient, ChatError, ChatSession, ClientOptions, run_sync
from rwcore.judges.parsing import (
    SchemaError,
    answer_objects,
    answer_parts,
    check_request_id,
    text_field,
    unit_number,
)
from rwcore.judges.structured import (
    StructuredOutputs,
    analysis_schema,
    attribution_schema,
    capability_proposal_schema,
    evaluator_revision_schema,
    instance_rubrics_schema,
    keyed_records,
    rubric_skill_schema,
    skill_refinement_schema,
)
from rwcore.judges.templates import (
    bulleted,
    data_rules,
    new_request_id,
    operator_json,
    render_file,
    rubric_payload,
    trajectory_payload,
    untrusted_block,
)
from rwcore.tasks import DEFAULT_CAPABILITIES
from rwcore.types import CAUSES, AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory
from rwcore.validation import (
    check_bool,
    check_count,
    check_optional_count,
    check_rubrics,
    check_trajectories,
    check_trajectory,
)
from rwcore.verdict import Verdict

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


class OpenAIReflector:
    """Reflection over an OpenAI-compatible chat-completions server (see the module docstring).

    Client options as `OpenAIJudge` (timeout defaults to 120 s and max_tokens to 4096: these
    answers are longer). Also:
    capabilities: the allowed capability categories of Arise rubrics (table 3 by default).
    max_reasks: follow-up requests after an unusable answer.
    require_request_id: accept only answer objects carrying the request's random id.
    max_transcript_chars: per-trajectory transcript budget (long turns are cut in the middle).
    max_trajectories_per_request: trajectories shown in one skill-refinement or capability-
        proposal request (the first ones given).
    candidates_per_request: candidate capabilities attributed in one request.
    min_support: trajectories a proposed capability must cite (capped at the number given).
    structured_outputs: "auto" | "always" | "never", as the judge's: each role's request carries its answer's
        JSON schema (rwcore.judges.structured), with the request id pinned.
    max_field_chars: the longest free-text field those schemas allow (criteria, skills, evidence) [400].
    """

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

    def __repr__(self) -> str:
        o = self.client.options
        return f"OpenAIReflector(model={o.model!r}, base_url={o.base_url!r}, api_key_env={o.api_key_env!r})"

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
                    session, lambda structured: build(request_id), schema(request_id) if schema else None
                )
            except ChatError as error:
                raise ReflectionError(f"{what}: request failed: {error.message}") from error
            except Exception as error:  # noqa: BLE001 - never a crash: the caller logs and skips the reflection
                raise ReflectionError(
                    session.scrub(f"{what}: request failed: {type(error).__name__}: {error}")
                ) from error
            try:
                return parse(reply.text, request_id)
            except SchemaError as error:
                problem = str(error)
                if reply.finish_reason == "length":
                    problem += " (the answer was cut off at max_tokens)"
            except Exception as error:  # noqa: BLE001 - an answer that trips the reader: asked again, then an error
                problem = session.scrub(f"unexpected error reading the answer: {type(error).__name__}: {error}")
            logger.info(
                "%s: unusable answer (%s)%s", what, problem, "; asking again" if attempt < self.max_reasks else ""
            )
        raise ReflectionError(f"{what}: no usable answer after {1 + self.max_reasks} request(s): {problem}")

    def _messages(self, template: str, request_id: str, data: object, **values: str) -> list[dict[str, str]]:
        system = render_file(template, request_id=request_id, data_rules=data_rules(request_id), **values)
        return [{"role": "system", "content": system}, {"role": "user", "content": untrusted_block(data, request_id)}]

    # ---- Arise: initial trajectory analysis ---------------------------------------------------

    def analyze_trajectories(self, trajectories: Sequence[Trajectory], existing: Sequence[RubricSpec] = ()) -> str:
        """Synchronous `aanalyze_trajectories`."""
        return run_sync(self.aanalyze_trajectories(trajectories, existing))

    async def aanalyze_trajectories(
        self, trajectories: Sequence[Trajectory], existing: Sequence[RubricSpec] = ()
    ) -> str:
        """Diagnostic evidence per trajectory (Arise B.6 "Initial Trajectory Analysis"), as JSON Lines.

        One request per trajectory, run concurrently. Each line:
        {"trajectory": "T<i>", "task_id", "tags", "issues": [...], "strategies": [...]}, each item
        {"behavior", "signal", "capability", "covered_by"}; outcomes are left out (the generation
        step must not see per-rollout reward labels). "" for no trajectories.
        """
        trajectories = check_trajectories(trajectories)
        existing = check_rubrics(existing, "existing")
        if not trajectories:
            return ""
        async with self.client.session() as session:
            results = await asyncio.gather(
                *(self._analyze_one(session, t, existing) for t in trajectories), return_exceptions=True
            )
        lines = []
        failures = []
        for index, (trajectory, result) in enumerate(zip(trajectories, results)):
            if isinstance(result, Exception):  # ReflectionError, or anything unexpected: that trajectory is left out
                failures.append(
                    f"T{index}: {result}"
                    if isinstance(result, ReflectionError)
                    else f"T{index}: {type(result).__name__}: {result}"
                )
                continue
            if isinstance(result, BaseException):
                raise result
            line = {"trajectory": f"T{index}", "task_id": trajectory.task_id, "tags": list(trajectory.tags), **result}
            lines.append(json.dumps(line, ensure_ascii=False, sort_keys=False))
        if not lines:
            raise ReflectionError(f"trajectory analysis failed for every trajectory: {failures[0]}")
        if failures:
            logger.warning(
                "trajectory analysis left out %d of %d trajectories: %s",
                len(failures),
                len(trajectories),
                "; ".join(failures),
            )
        return "\n".join(lines)

    async def _analyze_one(self, session: ChatSession, trajectory: Trajectory, existing: Sequence[RubricSpec]) -> dict:
        existing_ids = {rubric.rubric_id for rubric in existing}
        listing = operator_json([{"rubric_id": r.rubric_id, "criterion": r.criterion} for r in existing])

        def build(request_id: str) -> list[dict[str, str]]:
            return self._messages(
                "trajectory_analysis",
                request_id,
                {"trajectory": self._payload(trajectory)},
                capabilities=bulleted(self.capabilities),
                existing=listing,
            )

        def parse(text: str, request_id: str) -> dict:
            obj = _single_object(text, "issues", self._checked_id(request_id))
            result = {}
            for key in ("issues", "strategies"):
                items = []
                for position, item in enumerate(_list_field(obj, key)[:MAX_ANALYSIS_ITEMS]):
                    where = f"{key}[{position}]"
                    if not isinstance(item, dict):
                        raise SchemaError(f"{where} must be an object")
                    capability = item.get("capability")
                    if capability not in self.capabilities:
                        raise SchemaError(
                            f'{where}: "capability" must be one of {list(self.capabilities)}, got {capability!r}'
                        )
                    covered_by = item.get("covered_by")
                    items.append(
                        {
                            "behavior": text_field(item, "behavior", required=True, max_chars=MAX_FIELD_CHARS),
                            "signal": text_field(item, "signal", required=False, max_chars=MAX_FIELD_CHARS),
                            "capability": capability,
                            # A reference to a rubric that does not exist carries no information.
                            "covered_by": covered_by if covered_by in existing_ids else None,
                        }
                    )
                result[key] = items
            return result

        return await self._ask(
            session,
            f"trajectory analysis of {trajectory.task_id!r}",
            build,
            parse,
            lambda request_id: analysis_schema(
                request_id, self.capabilities, sorted(existing_ids), MAX_ANALYSIS_ITEMS, self.max_field_chars
            ),
        )

    # ---- Arise: rubric–skill generation -------------------------------------------------------

    def propose_rubric_skills(
        self,
        trajectories: Sequence[Trajectory],
        existing: Sequence[RubricSpec],
        max_new: int,
        *,
        diagnostics: str | None = None,
    ) -> list[RubricSkillProposal]:
        """Synchronous `apropose_rubric_skills`."""
        return run_sync(self.apropose_rubric_skills(trajectories, existing, max_new, diagnostics=diagnostics))

    async def apropose_rubric_skills(
        self,
        trajectories: Sequence[Trajectory],
        existing: Sequence[RubricSpec],
        max_new: int,
        *,
        diagnostics: str | None = None,
    ) -> list[RubricSkillProposal]:
        """At most `max_new` new rubric–skill pairs (Arise eq. 4, B.6 "Rubric–Skill Generation").

        The generator sees compressed diagnostics, not trajectories: `diagnostics` when given (e.g.
        earlier `analyze_trajectories` output, or judges' uncovered behaviours), else the analysis
        of `trajectories`, run first. New rubric ids differ from `existing` ones and from each
        other; capabilities are among `self.capabilities`; rubrics are unscored, with the
        proposal's pass/fail conditions as evaluator instructions; skills start as returned;
        `evidence` is the model's summary of the diagnostics that motivated the pair.
        """
        trajectories = check_trajectories(trajectories)
        existing = check_rubrics(existing, "existing")
        max_new = check_count(max_new, "max_new")
        if diagnostics is not None and not isinstance(diagnostics, str):
            raise ValueError(f"diagnostics must be a str or None, got {type(diagnostics).__name__}")
        if max_new == 0:
            return []
        if diagnostics is None:
            if not trajectories:
                return []
            diagnostics = await self.aanalyze_trajectories(trajectories, existing)
        if not diagnostics.strip():
            return []
        listing = operator_json(
            [
                {
                    key: value
                    for key, value in rubric_payload(r, include_scored=False).items()
                    if key in ("rubric_id", "criterion", "applicability", "capability")
                }
                for r in existing
            ]
        )

        def build(request_id: str) -> list[dict[str, str]]:
            return self._messages(
                "rubric_skill_generation",
                request_id,
                {"diagnostics": diagnostics},
                max_new=str(max_new),
                capabilities=bulleted(self.capabilities),
                existing=listing,
            )

        def parse(text: str, request_id: str) -> list[RubricSkillProposal]:
            obj = _single_object(text, "proposals", self._checked_id(request_id))
            taken = {rubric.rubric_id for rubric in existing}
            proposals = []
            for position, item in enumerate(_list_field(obj, "proposals")):
                where = f"proposals[{position}]"
                if not isinstance(item, dict):
                    raise SchemaError(f"{where} must be an object")
                try:
                    rubric_id = _new_id(item.get("rubric_id"), "rubric_id", taken)
                    capability = item.get("capability")
                    if capability not in self.capabilities:
                        raise SchemaError(f'"capability" must be one of {list(self.capabilities)}, got {capability!r}')
                    criterion = text_field(item, "criterion", required=True, max_chars=MAX_FIELD_CHARS)
                    applicability = text_field(item, "applicability", required=False, max_chars=MAX_FIELD_CHARS)
                    pass_when = text_field(item, "pass_when", required=False, max_chars=MAX_FIELD_CHARS)
                    fail_when = text_field(item, "fail_when", required=False, max_chars=MAX_FIELD_CHARS)
                    skill = text_field(item, "skill", required=True, max_chars=MAX_SKILL_CHARS)
                    evidence = text_field(item, "evidence", required=False, max_chars=MAX_FIELD_CHARS)
                except SchemaError as error:
                    raise SchemaError(f"{where}: {error}") from None
                instructions = "\n".join(
                    part
                    for part in (
                        f"Pass when: {pass_when.strip()}" if pass_when.strip() else "",
                        f"Fail when: {fail_when.strip()}" if fail_when.strip() else "",
                    )
                    if part
                )
                proposals.append(
                    RubricSkillProposal(
                        RubricSpec(rubric_id, criterion.strip(), applicability.strip(), capability, instructions),
                        skill.strip(),
                        evidence.strip(),
                    )
                )
            return proposals[:max_new]

        async with self.client.session() as session:
            return await self._ask(
                session,
                "rubric-skill generation",
                build,
                parse,
                lambda request_id: rubric_skill_schema(request_id, self.capabilities, max_new, self.max_field_chars),
            )

    # ---- Arise: skill refinement ------------------------------------------------------------

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        """Synchronous `arefine_skill`."""
        return run_sync(self.arefine_skill(rubric, skill, failures))

    async def arefine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str:
        """The revised skill text (Arise B.6 "Skill Refinement"), the rubric's requirement unchanged.

        `failures`: trajectories where the rubric failed while the skill was available (the first
        `max_trajectories_per_request` are shown, with outcomes as context); must not be empty.
        """
        if not isinstance(rubric, RubricSpec):
            raise ValueError(f"rubric must be a RubricSpec, got {type(rubric).__name__}")
        if not isinstance(skill, str) or not skill.strip():
            raise ValueError(f"skill must be a non-empty string, got {skill!r}")
        failures = check_trajectories(failures, "failures")
        if not failures:
            raise ValueError("failures must hold at least one trajectory to refine the skill from")
        shown = failures[: self.max_trajectories_per_request]
        data = {"failures": [self._payload(t, ref=f"T{i}") for i, t in enumerate(shown)]}

        def build(request_id: str) -> list[dict[str, str]]:
            return self._messages(
                "skill_refinement",
                request_id,
                data,
                rubric=operator_json(rubric_payload(rubric)),
                skill=operator_json(skill),
            )

        def parse(text: str, request_id: str) -> str:
            obj = _single_object(text, "skill", self._checked_id(request_id))
            return text_field(obj, "skill", required=True, max_chars=MAX_SKILL_CHARS).strip()

        async with self.client.session() as session:
            return await self._ask(
                session,
                f"skill refinement of {rubric.rubric_id!r}",
                build,
                parse,
                lambda request_id: skill_refinement_schema(request_id, self.max_field_chars),
            )

    # ---- RewardWeaver: failure attribution -------------------------------------------------

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        """Synchronous `aattribute`."""
        return run_sync(self.aattribute(trajectory, candidates))

    async def aattribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]:
        """Attribution records a_{i,d} = (deficit, confidence, evidence, cause) for one low-outcome trajectory.

        RewardWeaver §2.3 / D.3: the model is told attribution is selective and who may be to
        blame (policy, partner, scenario, unclear); this method does not filter — the aggregation
        rejects unsupported, unconfident, partner- and scenario-caused records. Records come in
        the candidates' order; a candidate the model did not answer validly after the re-asks is
        omitted (logged). ReflectionError when no candidate could be attributed at all.
        """
        trajectory = check_trajectory(trajectory)
        candidates = check_rubrics(candidates, "candidates")
        if not candidates:
            return []
        batches = [
            candidates[start : start + self.candidates_per_request]
            for start in range(0, len(candidates), self.candidates_per_request)
        ]
        async with self.client.session() as session:
            results = await asyncio.gather(*(self._attribute_batch(session, trajectory, batch) for batch in batches))
        records: dict[str, AttributionRecord] = {}
        problems: dict[str, str] = {}
        for batch_records, batch_problems in results:
            records.update(batch_records)
            problems.update(batch_problems)
        if not records:
            first = next(iter(problems.items()))
            raise ReflectionError(
                f"failure attribution of {trajectory.task_id!r} produced no valid record ({first[0]}: {first[1]})"
            )
        if problems:
            logger.warning(
                "failure attribution of %r omitted %d candidate(s): %s",
                trajectory.task_id,
                len(problems),
                "; ".join(f"{key}: {value}" for key, value in problems.items()),
            )
        return [records[c.rubric_id] for c in candidates if c.rubric_id in records]

    async def _attribute_batch(
        self,
        session: ChatSession,
        trajectory: Trajectory,
        batch: Sequence[RubricSpec],
    ) -> tuple[dict[str, AttributionRecord], dict[str, str]]:
        pending = {c.rubric_id: c for c in batch}
        records: dict[str, AttributionRecord] = {}
        problems: dict[str, str] = {}
        data = {"trajectory": self._payload(trajectory)}
        for _ in range(1 + self.max_reasks):
            request_id = new_request_id()
            listing = operator_json(
                [
                    {
                        key: value
                        for key, value in {
                            "capability_id": c.rubric_id,
                            "definition": c.criterion,
                            "applicability": c.applicability,
                            "family": c.capability,
                            "evaluator_instructions": c.evaluator_prompt,
                        }.items()
                        if value
                    }
                    for c in pending.values()
                ]
            )
            messages = self._messages("failure_attribution", request_id, data, candidates=listing)
            layout = (
                "\n\nWhen your answer is constrained to a JSON schema, write the same records inside one object, "
                f'each under its capability id: {{"request_id": "{request_id}", "records": {{<capability_id>: '
                '{"deficit", "confidence", "evidence", "cause"}, ...}}.'
            )
            structured_messages = [{**messages[0], "content": messages[0]["content"] + layout}, *messages[1:]]
            try:
                reply = await self.structured.complete(
                    session,
                    lambda structured: structured_messages if structured else messages,
                    attribution_schema(request_id, list(pending), CAUSES, self.max_field_chars),
                )
            except ChatError as error:
                problems = {key: f"request failed: {error.message}" for key in pending}
                break
            except Exception as error:  # noqa: BLE001 - never a crash (the candidates are omitted, logged)
                problems = {key: session.scrub(f"request failed: {type(error).__name__}: {error}") for key in pending}
                break
            found: dict[str, list[dict]] = {key: [] for key in pending}
            try:
                objects = answer_objects(reply.text)
                # a structured answer keys its records by capability id in one object (rwcore.judges.structured)
                objects = [*objects, *keyed_records(objects)]
            except Exception as error:  # noqa: BLE001 - an answer that trips the reader: asked again
                problems = {
                    key: f"unexpected error reading the answer: {type(error).__name__}: {error}" for key in pending
                }
                continue
            wanted = self._checked_id(request_id)
            for obj in objects:
                capability_id = obj.get("capability_id")
                if "deficit" in obj and isinstance(capability_id, str) and capability_id in found:
                    if wanted is not None and obj.get("request_id") != wanted:
                        continue  # not written for this request (e.g. quoted from the trajectory): ignored first
                    found[capability_id].append(obj)
            problems = {}
            for capability_id, objs in found.items():
                if len(objs) != 1:
                    problems[capability_id] = (
                        "no record in the answer"
                        if not objs
                        else f"{len(objs)} records in one answer (ambiguous; none used)"
                    )
                    continue
                try:
                    records[capability_id] = self._parse_record(
                        objs[0], trajectory, capability_id, self._checked_id(request_id)
                    )
                except SchemaError as error:
                    problems[capability_id] = f"malformed record: {error}"
                except Exception as error:  # noqa: BLE001 - never a crash (the candidate is omitted, logged)
                    problems[capability_id] = f"unexpected error reading the record: {type(error).__name__}: {error}"
            pending = {key: value for key, value in pending.items() if key not in records}
            if not pending:
                break
        return records, problems

    @staticmethod
    def _parse_record(
        obj: dict, trajectory: Trajectory, capability_id: str, request_id: str | None
    ) -> AttributionRecord:
        check_request_id(obj, request_id)
        deficit = obj.get("deficit")
        if not isinstance(deficit, bool):
            raise SchemaError(f'"deficit" must be true or false, got {deficit!r}')
        confidence = unit_number(obj, "confidence", required=True)
        evidence = text_field(obj, "evidence", required=False, max_chars=MAX_FIELD_CHARS).strip()
        cause = obj.get("cause")
        cause = cause.strip().lower() if isinstance(cause, str) else cause
        if cause not in CAUSES:
            raise SchemaError(f'"cause" must be one of {list(CAUSES)}, got {obj.get("cause")!r}')
        return AttributionRecord(trajectory.trajectory_id, capability_id, deficit, confidence, evidence, cause)

    # ---- RewardWeaver: controlled capability expansion ---------------------------------------

    def propose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]:
        """Synchronous `apropose_capabilities`."""
        return run_sync(self.apropose_capabilities(failures, library, max_new))

    async def apropose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]:
        """At most `max_new` candidate capabilities for recurrent failures outside `library` (§2.5).

        Shows the first `max_trajectories_per_request` failures, as "T0", "T1", ... Each proposal
        must cite the trajectories showing it; those citing fewer than min(min_support, shown)
        distinct ones are dropped. Candidates are `RubricSpec(rubric_id=capability_id,
        criterion=definition, applicability, capability=family, evaluator_prompt, scored=True)`
        — RewardWeaver evaluators score in [0, 1] — and must pass admission before use.
        """
        failures = check_trajectories(failures, "failures")
        library = check_rubrics(library, "library")
        max_new = check_count(max_new, "max_new")
        if max_new == 0 or not failures:
            return []
        shown = failures[: self.max_trajectories_per_request]
        refs = [f"T{i}" for i in range(len(shown))]
        min_support = min(self.min_support, len(shown))
        data = {"failures": [self._payload(t, ref=ref) for t, ref in zip(shown, refs)]}
        listing = operator_json(
            [
                {
                    key: value
                    for key, value in {
                        "capability_id": c.rubric_id,
                        "family": c.capability,
                        "definition": c.criterion,
                        "applicability": c.applicability,
                    }.items()
                    if value
                }
                for c in library
            ]
        )

        def build(request_id: str) -> list[dict[str, str]]:
            return self._messages(
                "capability_proposal",
                request_id,
                data,
                max_new=str(max_new),
                min_support=str(min_support),
                library=listing,
            )

        def parse(text: str, request_id: str) -> list[RubricSpec]:
            obj = _single_object(text, "proposals", self._checked_id(request_id))
            taken = {c.rubric_id for c in library}
            proposals = []
            for position, item in enumerate(_list_field(obj, "proposals")):
                where = f"proposals[{position}]"
                if not isinstance(item, dict):
                    raise SchemaError(f"{where} must be an object")
                try:
                    capability_id = _new_id(item.get("capability_id"), "capability_id", taken)
                    family = text_field(item, "family", required=True, max_chars=200).strip()
                    definition = text_field(item, "definition", required=True, max_chars=MAX_FIELD_CHARS).strip()
                    applicability = text_field(item, "applicability", required=False, max_chars=MAX_FIELD_CHARS).strip()
                    instructions = text_field(
                        item, "evaluator_instructions", required=True, max_chars=MAX_FIELD_CHARS
                    ).strip()
                    support = _list_field(item, "support")
                    unknown = [ref for ref in support if ref not in refs]
                    if unknown:
                        raise SchemaError(f'"support" cites unknown trajectories {unknown!r}; known: {refs}')
                except SchemaError as error:
                    raise SchemaError(f"{where}: {error}") from None
                if len(set(support)) < min_support:
                    logger.info(
                        "dropping proposed capability %r: supported by %d trajectories, %d required",
                        capability_id,
                        len(set(support)),
                        min_support,
                    )
                    continue
                proposals.append(
                    RubricSpec(capability_id, definition, applicability, family, instructions, scored=True)
                )
            return proposals[:max_new]

        async with self.client.session() as session:
            return await self._ask(
                session,
                "capability proposal",
                build,
                parse,
                lambda request_id: capability_proposal_schema(request_id, refs, max_new, self.max_field_chars),
            )

    # ---- RewardWeaver: evaluator revision on the development partition ----------------------

    def revise_evaluator(self, rubric: RubricSpec, disagreements: Sequence[tuple[Trajectory, Verdict, Verdict]]) -> str:
        """Synchronous `arevise_evaluator`."""
        return run_sync(self.arevise_evaluator(rubric, disagreements))

    async def arevise_evaluator(
        self, rubric: RubricSpec, disagreements: Sequence[tuple[Trajectory, Verdict, Verdict]]
    ) -> str:
        """New evaluator instructions for `rubric` (RewardWeaver A.3, D.2: rubric-level diagnostics guide
        revision) from development cases the evaluator got wrong: (trajectory, reference label, the
        evaluator's verdict). The definition is kept; the first `max_trajectories_per_request` cases
        are shown. Implements rwcore.types.EvaluatorReviser."""
        if not isinstance(rubric, RubricSpec):
            raise ValueError(f"rubric must be a RubricSpec, got {type(rubric).__name__}")
        if isinstance(disagreements, (str, bytes)) or not isinstance(disagreements, Sequence) or not disagreements:
            raise ValueError("disagreements must be a non-empty sequence of (trajectory, label, verdict)")
        names = {Verdict.PASS: "pass", Verdict.FAIL: "fail", Verdict.NA: "not_applicable", Verdict.INVALID: "invalid"}
        cases = []
        for i, item in enumerate(disagreements[: self.max_trajectories_per_request]):
            if not (
                isinstance(item, tuple)
                and len(item) == 3
                and isinstance(item[0], Trajectory)
                and isinstance(item[1], Verdict)
                and isinstance(item[2], Verdict)
            ):
                raise ValueError(f"disagreements[{i}] must be (Trajectory, Verdict, Verdict)")
            cases.append(
                {
                    **self._payload(item[0], ref=f"T{i}"),
                    "reference_label": names[item[1]],
                    "evaluator_verdict": names[item[2]],
                }
            )

        def build(request_id: str) -> list[dict[str, str]]:
            return self._messages(
                "evaluator_revision", request_id, {"cases": cases}, rubric=operator_json(rubric_payload(rubric))
            )

        def parse(text: str, request_id: str) -> str:
            obj = _single_object(text, "evaluator_instructions", self._checked_id(request_id))
            return text_field(obj, "evaluator_instructions", required=True, max_chars=MAX_FIELD_CHARS).strip()

        async with self.client.session() as session:
            return await self._ask(
                session,
                f"evaluator revision of {rubric.rubric_id!r}",
                build,
                parse,
                lambda request_id: evaluator_revision_schema(request_id, self.max_field_chars),
            )

    # ---- RewardWeaver ablation: instance-specific rubrics -----------------------------------

    def instance_rubrics(self, context: Trajectory, max_rubrics: int) -> list[RubricSpec]:
        """Synchronous `ainstance_rubrics`."""
        return run_sync(self.ainstance_rubrics(context, max_rubrics))

    async def ainstance_rubrics(self, context: Trajectory, max_rubrics: int) -> list[RubricSpec]:
        """At most `max_rubrics` scored rubrics written for one task instance from `context` (its first
        turns; the outcome is not shown). Ids are prefixed with the task id, so instances never share
        a rubric. Implements rwcore.types.InstanceRubricWriter."""
        context = check_trajectory(context, "context")
        max_rubrics = check_count(max_rubrics, "max_rubrics")
        if max_rubrics == 0:
            return []
        data = {"instance": self._payload(context, include_outcome=False)}

        def build(request_id: str) -> list[dict[str, str]]:
            return self._messages("instance_rubrics", request_id, data, max_rubrics=str(max_rubrics))

        def parse(text: str, request_id: str) -> list[RubricSpec]:
            obj = _single_object(text, "rubrics", self._checked_id(request_id))
            taken: set[str] = set()
            specs = []
            for position, item in enumerate(_list_field(obj, "rubrics")[:max_rubrics]):
                where = f"rubrics[{position}]"
                if not isinstance(item, dict):
                    raise SchemaError(f"{where} must be an object")
                try:
                    local = _new_id(item.get("rubric_id"), "rubric_id", taken)
                    criterion = text_field(item, "criterion", required=True, max_chars=MAX_FIELD_CHARS).strip()
                    applicability = text_field(item, "applicability", required=False, max_chars=MAX_FIELD_CHARS)
                    instructions = text_field(item, "evaluator_instructions", required=False, max_chars=MAX_FIELD_CHARS)
                except SchemaError as error:
                    raise SchemaError(f"{where}: {error}") from None
                specs.append(
                    RubricSpec(
                        f"{context.task_id}:{local}",
                        criterion,
                        applicability.strip(),
                        "instance",
                        instructions.strip(),
                        scored=True,
                    )
                )
            return specs

        async with self.client.session() as session:
            return await self._ask(
                session,
                f"instance rubrics of {context.task_id!r}",
                build,
                parse,
                lambda request_id: instance_rubrics_schema(request_id, max_rubrics, self.max_field_chars),
            )
