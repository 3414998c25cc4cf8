"""The judge's answer schema, and turning one reply into per-rubric judgments.

Answer schema (JSON Lines; one object per line, see prompts/rubric_evaluation.md):

    {"request_id": "<id of this request>", "rubric_id": "<a requested rubric id>",
     "verdict": "pass" | "fail" | "na", "score": number in [0, 1] or null,
     "confidence": number in [0, 1] or null, "evidence": "<string>"}
    {"request_id": "<id of this request>", "diagnostics": {"uncovered": ["<string>", ...]}}

Also accepted, because models produce them: the same objects inside one JSON array, or inside a
wrapper object `{"request_id": ..., "verdicts": [...], "diagnostics": {...}}` (objects inside
inherit the wrapper's request id); `"uncovered"` directly on the diagnostics object; verdict words
in any case, and "n/a" / "not applicable" / "not_applicable" for "na". Extra keys are ignored.

Rules (each rubric independently):
- only objects with a "verdict" key whose "rubric_id" is one of the requested ids are candidates;
  anything else (other ids, echoed prompt fragments) is ignored;
- when a request id is required, candidates are filtered by it FIRST: an object without this
  request's id was not written for this request (typically a verdict the judge quoted from the
  trajectory, whose writer cannot know the random id) and is ignored, so it can neither win nor
  make the real verdict ambiguous;
- reasoning (`parsing.answer_parts`): objects the model wrote inside a `<think>` block are drafts,
  not the answer. With request ids, a rubric whose only candidates lie in such a block falls
  back to them: a stray `<think>` or `</think>` that the judge quoted from the trajectory in its
  prose opens a "block" that would otherwise hide the real answer, and the id shows the object
  was written for this request. Without request ids, objects in reasoning blocks never count;
- no candidate -> unresolved ("missing"); more than one candidate -> unresolved ("ambiguous":
  picking one would let a drafted verdict win by position);
- the single candidate must carry a valid verdict word, a score in [0, 1] when the rubric is
  scored and the verdict is not "na", and, when present, confidence in [0, 1] and a string
  evidence; otherwise unresolved with the field named;
- scored rubrics: the score decides (PASS iff score >= pass_threshold), the verdict word only
  distinguishes "na"; unscored rubrics: the verdict word decides and any score is dropped.
The diagnostics object follows the same request-id and reasoning rules.

Structured outputs: `answer_schema` is the same answer as one JSON Schema - one wrapper object
{"request_id": <this id>, "verdicts": [one object per requested rubric], "diagnostics": ...} -
which `OpenAIJudge` sends as `response_format` when the server supports it (vLLM does); the
reply is then read by the same rules above (a wrapper's items inherit its request id).
Unresolved rubrics are re-asked or become INVALID in the caller — never PASS or FAIL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from rwcore.judges.parsing import (
    SchemaError,
    answer_parts,
    check_request_id,
    text_field,
    unit_number,
)
from rwcore.types import RubricJudgment, RubricSpec
from rwcore.verdict import Verdict

VERDICT_WORDS: Mapping[str, Verdict] = {
    "pass": Verdict.PASS,
    "fail": Verdict.FAIL,
    "na": Verdict.NA,
    "n/a": Verdict.NA,
    "not applicable": Verdict.NA,
    "not_applicable": Verdict.NA,
}
MAX_EVIDENCE_CHARS = 4000
MAX_UNCOVERED_ITEMS = 32
MAX_UNCOVERED_CHARS = 1000
SCHEMA_EVIDENCE_CHARS = 300  # what the prompt asks for; also bounds a constrained reply's length
SCHEMA_UNCOVERED_ITEMS = 8


@dataclass(frozen=True)
class JudgeAnswer:
    """One reply, read.

    judgments: valid judgments by rubric id (only requested ids).
    problems: requested rubric id -> why it has no valid judgment in this reply.
    uncovered: the diagnostics' uncovered behaviours, or None when diagnostics were not wanted or
        the reply has no single valid diagnostics object.
    ignored: how many JSON objects in the reply were not candidates for anything.
    """

    judgments: dict[str, RubricJudgment] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    uncovered: tuple[str, ...] | None = None
    ignored: int = 0


def parse_verdict(
    obj: dict, rubric: RubricSpec, *, request_id: str | None, pass_threshold: float = 0.5
) -> RubricJudgment:
    """One candidate object -> a RubricJudgment (PASS / FAIL / NA); SchemaError naming the bad field."""
    check_request_id(obj, request_id)
    word = obj.get("verdict")
    verdict = VERDICT_WORDS.get(word.strip().lower()) if isinstance(word, str) else None
    if verdict is None:
        raise SchemaError(f'"verdict" must be one of "pass", "fail", "na", got {word!r}')
    confidence = unit_number(obj, "confidence", required=False)
    evidence = text_field(obj, "evidence", required=False, max_chars=MAX_EVIDENCE_CHARS)
    score = None
    if verdict != Verdict.NA:
        score = unit_number(obj, "score", required=rubric.scored)
        if rubric.scored:
            verdict = Verdict.PASS if score >= pass_threshold else Verdict.FAIL
        else:
            score = None
    return RubricJudgment(rubric.rubric_id, verdict, score=score, confidence=confidence, evidence=evidence)


def parse_uncovered(obj: dict, *, request_id: str | None) -> tuple[str, ...]:
    """A diagnostics object -> its uncovered behaviours; SchemaError when malformed.

    Items are strings; an object item is reduced to its "behavior" / "behaviour" / "description"
    string, else its compact JSON. Empty items are dropped; at most 32 items of 1000 characters.
    """
    check_request_id(obj, request_id)
    inner = obj.get("diagnostics", obj)
    if not isinstance(inner, dict):
        raise SchemaError(f'"diagnostics" must be an object, got {type(inner).__name__}')
    items = inner.get("uncovered", [])
    if items is None:
        items = []
    if not isinstance(items, list):
        raise SchemaError(f'"uncovered" must be a list, got {type(items).__name__}')
    found: list[str] = []
    for item in items:
        if isinstance(item, dict):
            text = next(
                (item[key] for key in ("behavior", "behaviour", "description") if isinstance(item.get(key), str)), None
            )
            item = text if text is not None else json.dumps(item, sort_keys=True, ensure_ascii=False)
        if not isinstance(item, str):
            raise SchemaError(f'"uncovered" items must be strings, got {type(item).__name__}')
        if item.strip():
            found.append(item.strip()[:MAX_UNCOVERED_CHARS])
    return tuple(found[:MAX_UNCOVERED_ITEMS])


def _flatten(objects: list[dict]) -> list[dict]:
    """Unwraps `{"verdicts": [...], "diagnostics": ...}` wrappers; other objects pass through."""
    flat: list[dict] = []
    for obj in objects:
        inner = obj.get("verdicts")
        if isinstance(inner, list) and "rubric_id" not in obj:
            for item in inner:
                if isinstance(item, dict):
                    if "request_id" in obj and "request_id" not in item:
                        item = {"request_id": obj["request_id"], **item}
                    flat.append(item)
            rest = {key: value for key, value in obj.items() if key != "verdicts"}
            if "diagnostics" in rest or "uncovered" in rest:
                flat.append(rest)
        else:
            flat.append(obj)
    return flat


def parse_judge_answer(
    text: str,
    rubrics: Mapping[str, RubricSpec],
    *,
    request_id: str | None,
    pass_threshold: float = 0.5,
    want_diagnostics: bool = False,
) -> JudgeAnswer:
    """Reads one judge reply for the requested `rubrics` (id -> spec); see the module docstring."""
    answer, drafts = (_flatten(part) for part in answer_parts(text))

    def mine(obj: dict) -> bool:
        return request_id is None or obj.get("request_id") == request_id

    def sort(objects: list[dict]):
        candidates: dict[str, list[dict]] = {rubric_id: [] for rubric_id in rubrics}
        foreign = dict.fromkeys(rubrics, 0)
        diagnostics: list[dict] = []
        ignored = 0
        for obj in objects:
            rubric_id = obj.get("rubric_id")
            if "verdict" in obj and isinstance(rubric_id, str) and rubric_id in candidates:
                if mine(obj):
                    candidates[rubric_id].append(obj)
                else:
                    foreign[rubric_id] += 1
                    ignored += 1
            elif "rubric_id" not in obj and ("diagnostics" in obj or "uncovered" in obj) and mine(obj):
                diagnostics.append(obj)
            else:
                ignored += 1
        return candidates, foreign, diagnostics, ignored

    candidates, foreign, diagnostics, ignored = sort(answer)
    if request_id is not None and drafts:
        # a quoted stray <think> must not hide what carries this request's id (module docstring)
        draft_candidates, _, draft_diagnostics, _ = sort(drafts)
        for rubric_id, found in candidates.items():
            if not found:
                found.extend(draft_candidates[rubric_id])
        if not diagnostics:
            diagnostics = draft_diagnostics
    judgments: dict[str, RubricJudgment] = {}
    problems: dict[str, str] = {}
    for rubric_id, found in candidates.items():
        if not found:
            problems[rubric_id] = "no verdict for this rubric in the judge's answer"
            if foreign[rubric_id]:
                problems[rubric_id] += (
                    f" ({foreign[rubric_id]} verdict object(s) without this request's "
                    '"request_id" ignored, e.g. copied from the trajectory)'
                )
        elif len(found) > 1:
            problems[rubric_id] = f"{len(found)} verdict objects for this rubric in one answer (ambiguous; none used)"
        else:
            try:
                judgments[rubric_id] = parse_verdict(
                    found[0], rubrics[rubric_id], request_id=request_id, pass_threshold=pass_threshold
                )
            except SchemaError as error:
                problems[rubric_id] = f"malformed verdict: {error}"
    uncovered = None
    if want_diagnostics and len(diagnostics) == 1:
        try:
            uncovered = parse_uncovered(diagnostics[0], request_id=request_id)
        except SchemaError:
            uncovered = None
    return JudgeAnswer(judgments, problems, uncovered, ignored)


def answer_schema(rubrics, request_id: str, *, diagnostics: bool = False, chars: int = SCHEMA_EVIDENCE_CHARS) -> dict:
    """The JSON Schema of one structured answer for `rubrics` (RubricSpecs, distinct ids) and `request_id`.

    {"request_id": request_id, "verdicts": [exactly len(rubrics) objects], and with `diagnostics`
    "diagnostics": {"uncovered": [at most 8 strings]}}; each verdict object is
    {"rubric_id", "verdict", "score", "confidence": number in [0, 1], "evidence": at most `chars`
    characters (300; the uncovered notes too)}, where an unscored rubric has "verdict" pass | fail | na
    and "score" null, and a scored one has "verdict" pass | fail with a "score" in [0, 1], or "na" with
    null. No other keys (strict). ValueError for bad arguments. A rubric listed twice by a model is still "ambiguous"
    when read (the schema cannot say "each id once" in the subset servers support).
    """
    specs = list(rubrics) if not isinstance(rubrics, (str, bytes)) else []
    if (
        not specs
        or any(not isinstance(r, RubricSpec) for r in specs)
        or len({r.rubric_id for r in specs}) != len(specs)
    ):
        raise ValueError(f"rubrics must be a non-empty sequence of RubricSpecs with distinct ids, got {rubrics!r}")
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    unit = {"type": "number", "minimum": 0, "maximum": 1}
    null = {"type": "null"}

    def item(ids: list[str], verdicts: list[str], score: dict) -> dict:
        return {
            "type": "object",
            "properties": {
                "rubric_id": {"type": "string", "enum": ids},
                "verdict": {"type": "string", "enum": verdicts},
                "score": score,
                "confidence": unit,
                "evidence": {"type": "string", "maxLength": chars},
            },
            "required": ["rubric_id", "verdict", "score", "confidence", "evidence"],
            "additionalProperties": False,
        }

    unscored = [r.rubric_id for r in specs if not r.scored]
    scored = [r.rubric_id for r in specs if r.scored]
    variants = []
    if unscored:
        variants.append(item(unscored, ["pass", "fail", "na"], null))
    if scored:
        variants += [item(scored, ["pass", "fail"], unit), item(scored, ["na"], null)]
    properties: dict = {
        "request_id": {"type": "string", "enum": [request_id]},
        "verdicts": {
            "type": "array",
            "items": variants[0] if len(variants) == 1 else {"anyOf": variants},
            "minItems": len(specs),
            "maxItems": len(specs),
        },
    }
    required = ["request_id", "verdicts"]
    if diagnostics:
        properties["diagnostics"] = {
            "type": "object",
            "properties": {
                "uncovered": {
                    "type": "array",
                    "maxItems": SCHEMA_UNCOVERED_ITEMS,
                    "items": {"type": "string", "maxLength": chars},
                }
            },
            "required": ["uncovered"],
            "additionalProperties": False,
        }
        required.append("diagnostics")
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def response_format(rubrics, request_id: str, *, diagnostics: bool = False, chars: int = SCHEMA_EVIDENCE_CHARS) -> dict:
    """The chat request's `response_format` for `answer_schema` (the json_schema form of OpenAI's API,
    which vLLM's server reads as `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`)."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "rubric_verdicts",
            "schema": answer_schema(rubrics, request_id, diagnostics=diagnostics, chars=chars),
            "strict": True,
        },
    }
