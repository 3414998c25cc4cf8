"""The reflection model's Arise roles: initial trajectory analysis, rubric-skill generation (Arise eq. 4) and
skill refinement (eq. 8), each a request and the reader of its answer (prompts in `prompts/`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from rwcore.judges.client import ChatSession, run_sync
from rwcore.judges.parsing import SchemaError, text_field
from rwcore.judges.reflection import (
    MAX_ANALYSIS_ITEMS,
    MAX_FIELD_CHARS,
    MAX_SKILL_CHARS,
    ReflectionError,
    ReflectionModel,
    _list_field,
    _new_id,
    _single_object,
)
from rwcore.judges.structured import analysis_schema, rubric_skill_schema, skill_refinement_schema
from rwcore.judges.templates import bulleted, operator_json, rubric_payload
from rwcore.types import RubricSkillProposal, RubricSpec, Trajectory
from rwcore.validation import check_count, check_rubrics, check_trajectories

logger = logging.getLogger("rwcore.judges")


class AriseReflection(ReflectionModel):
    """`RubricReflector` (propose_rubric_skills, refine_skill) and `analyze_trajectories`."""

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
