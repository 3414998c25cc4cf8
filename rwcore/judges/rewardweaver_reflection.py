"""The reflection model's RewardWeaver roles: failure attribution, controlled capability expansion, evaluator
revision and instance-specific rubrics, each a request and the reader of its answer (prompts in `prompts/`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from rwcore.judges.client import ChatError, ChatSession, run_sync
from rwcore.judges.parsing import SchemaError, answer_objects, check_request_id, text_field, unit_number
from rwcore.judges.reflection import (
    MAX_FIELD_CHARS,
    ReflectionError,
    ReflectionModel,
    _list_field,
    _new_id,
    _single_object,
)
from rwcore.judges.structured import (
    attribution_schema,
    capability_proposal_schema,
    evaluator_revision_schema,
    instance_rubrics_schema,
    keyed_records,
)
from rwcore.judges.templates import new_request_id, operator_json, rubric_payload
from rwcore.types import CAUSES, AttributionRecord, RubricSpec, Trajectory
from rwcore.validation import check_count, check_rubrics, check_trajectories, check_trajectory
from rwcore.verdict import Verdict

logger = logging.getLogger("rwcore.judges")


class RewardWeaverReflection(ReflectionModel):
    """`Attributor` (attribute), `CapabilityProposer` (propose_capabilities), `EvaluatorReviser`
    (revise_evaluator) and `InstanceRubricWriter` (instance_rubrics)."""

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
                    lambda structured: structured_messages if structured else messages,  # noqa: B023 - awaited here
                    attribution_schema(request_id, list(pending), CAUSES, self.max_field_chars),
                )
            except ChatError as error:
                problems = {key: f"request failed: {error.message}" for key in pending}
                break
            except Exception as error:  # never a crash (the candidates are omitted, logged)
                problems = {key: session.scrub(f"request failed: {type(error).__name__}: {error}") for key in pending}
                break
            found: dict[str, list[dict]] = {key: [] for key in pending}
            try:
                objects = answer_objects(reply.text)
                # a structured answer keys its records by capability id in one object (rwcore.judges.structured)
                objects = [*objects, *keyed_records(objects)]
            except Exception as error:  # an answer that trips the reader: asked again
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
                except Exception as error:  # never a crash (the candidate is omitted, logged)
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
