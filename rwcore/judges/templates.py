"""Prompt templates (files in `rwcore/judges/prompts/`) and the untrusted-data envelope.

Templates are Markdown files read with `importlib.resources`, so they ship as package data.
A template may start with an HTML comment (`<!-- ... -->`) documenting it; that comment is not
part of the prompt. Placeholders are `{name}` with a lowercase identifier; nothing else in a
template is special, so JSON examples with braces need no escaping.

Substitution is a single regex pass over the *template*: values are inserted verbatim and never
re-scanned, so braces or `{placeholder}`-looking text inside a value (trajectory text, rubric
text) cannot trigger further substitution. Every placeholder must be given a value and every
value must be used, so a typo fails loudly instead of leaving `{x}` in a prompt.

Trajectory text never goes into a template at all: it travels in the user message, as one
JSON-encoded value between two marker lines that carry a per-request random id
(`untrusted_block`). JSON encoding escapes quotes and newlines, so text written by the policy can
neither end the JSON string nor start a line of its own, let alone forge the end marker, whose
random id it cannot know.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from collections.abc import Sequence
from importlib import resources

from rwcore.types import RubricSpec, Trajectory

PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")
_HEADER_COMMENT = re.compile(r"\A\s*<!--.*?-->\s*\n", re.DOTALL)

TEMPLATE_NAMES: tuple[str, ...] = (
    "_untrusted_data",
    "capability_proposal",
    "evaluator_revision",
    "failure_attribution",
    "instance_rubrics",
    "rubric_evaluation",
    "rubric_evaluation_diagnostics",
    "rubric_evaluation_scored",
    "rubric_evaluation_structured",
    "rubric_skill_generation",
    "skill_refinement",
    "trajectory_analysis",
)


@functools.cache
def load_template(name: str) -> str:
    """The text of `prompts/<name>.md` without its leading documentation comment."""
    if name not in TEMPLATE_NAMES:
        raise ValueError(f"name must be one of {TEMPLATE_NAMES}, got {name!r}")
    text = resources.files("rwcore.judges").joinpath("prompts", f"{name}.md").read_text(encoding="utf-8")
    return _HEADER_COMMENT.sub("", text, count=1)


def template_digest(*names: str) -> str:
    """sha256 over the named templates: judges put it in cache keys so a prompt edit invalidates them."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(load_template(name).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def render(template: str, **values: str) -> str:
    """`template` with each `{name}` replaced by `values[name]`, in one pass (values are not re-scanned).

    ValueError when a placeholder has no value or a value has no placeholder, or a value is not a str.
    """
    wanted = set(PLACEHOLDER.findall(template))
    missing = sorted(wanted - values.keys())
    unused = sorted(values.keys() - wanted)
    if missing:
        raise ValueError(f"template placeholders without a value: {missing}")
    if unused:
        raise ValueError(f"values without a placeholder in the template: {unused}")
    for key, value in values.items():
        if not isinstance(value, str):
            raise ValueError(f"values[{key!r}] must be a str, got {type(value).__name__}")
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def render_file(name: str, **values: str) -> str:
    """`render(load_template(name), **values)`."""
    return render(load_template(name), **values)


def new_request_id() -> str:
    """A fresh random request id (64 bits, hex): the data markers and every answer object carry it."""
    return secrets.token_hex(8)


def data_rules(request_id: str) -> str:
    """The shared "untrusted data" paragraph for a system prompt."""
    return render_file("_untrusted_data", request_id=request_id)


def untrusted_block(payload: object, request_id: str) -> str:
    """The user message: `payload` as one line of ASCII JSON between the two marker lines.

    ensure_ascii escapes every non-ASCII character (including U+2028 line separators and
    bidirectional overrides), so the block is exactly three lines whatever the payload holds.
    """
    body = json.dumps(payload, ensure_ascii=True, allow_nan=False)
    return f"<<<BEGIN_UNTRUSTED_DATA {request_id}>>>\n{body}\n<<<END_UNTRUSTED_DATA {request_id}>>>"


def operator_json(value: object) -> str:
    """Trusted, operator-side values (rubrics, the pool, a skill) as indented JSON for a system prompt."""
    return json.dumps(value, ensure_ascii=False, indent=1, allow_nan=False)


def rubric_payload(rubric: RubricSpec, *, include_scored: bool = True) -> dict:
    """What a judge is told about one rubric (empty fields are left out)."""
    entry: dict = {"rubric_id": rubric.rubric_id, "criterion": rubric.criterion}
    if rubric.applicability:
        entry["applicability"] = rubric.applicability
    if rubric.capability:
        entry["capability"] = rubric.capability
    if rubric.evaluator_prompt:
        entry["evaluator_instructions"] = rubric.evaluator_prompt
    if include_scored and rubric.scored:
        entry["scored"] = True
    return entry


def _truncate_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f" [... {len(text) - limit} characters omitted ...] "
    keep = max(limit - len(marker), 0)
    head = keep - keep // 2
    return text[:head] + marker + text[len(text) - keep // 2 :] if keep else marker.strip()


def trajectory_payload(
    trajectory: Trajectory, *, include_outcome: bool = True, max_chars: int | None = None, ref: str | None = None
) -> dict:
    """A trajectory as judge/reflector data: task id, tags, optional outcome, turns.

    Only fields covered by `Trajectory.content_hash()` are included (ids and metadata are not),
    so a cache keyed on that hash covers everything the model sees. With `max_chars`, turns longer
    than an equal share of the budget (at least 200 characters each) are cut in the middle, with
    a marker saying how much was left out; the total is then approximately `max_chars`.
    """
    turns = trajectory.turns
    share = None
    if max_chars is not None and sum(len(turn.content) for turn in turns) > max_chars:
        share = max(200, max_chars // max(len(turns), 1))
    payload: dict = {}
    if ref is not None:
        payload["ref"] = ref
    payload["task_id"] = trajectory.task_id
    if trajectory.tags:
        payload["tags"] = list(trajectory.tags)
    if include_outcome:
        payload["outcome"] = trajectory.outcome
    payload["turns"] = [
        {
            "index": index,
            "role": turn.role,
            "by_agent": turn.generated,
            "content": turn.content if share is None else _truncate_middle(turn.content, share),
        }
        for index, turn in enumerate(turns)
    ]
    return payload


def bulleted(items: Sequence[str]) -> str:
    """`items` as a Markdown bullet list (one per line)."""
    return "\n".join(f"- {item}" for item in items)
