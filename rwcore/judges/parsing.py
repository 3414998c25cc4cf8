"""Tolerant extraction of JSON objects from a model's reply, and strict field checks.

Models wrap JSON in ``` fences, add prose before or after it, stop half-way through a JSONL line,
or return one array / one wrapper object instead of lines. `json_objects` finds every complete
top-level JSON value in the text (objects, and the objects inside top-level arrays) and skips
everything else; a broken line simply yields nothing. `answer_objects` does the same for a
model's reply, minus what the model wrote while reasoning. What the objects *mean* is decided by
the callers, which accept only objects carrying the expected keys and request id.

Only the model's reply is ever parsed here — never the prompt or the trajectory.
"""

from __future__ import annotations

import json
import math
import re

MAX_REPLY_CHARS = 1_000_000
"""Replies longer than this are cut before parsing (a runaway generation; bounds the work)."""

_THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)
_START = re.compile(r"[\[{]")


def _reject_constant(name: str):
    # json accepts NaN / Infinity by default; a verdict must never carry them.
    raise ValueError(f"non-finite number {name} in JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _check_text(text) -> str:
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return text[:MAX_REPLY_CHARS]


def _json_spans(text: str) -> list[tuple[int, int, object]]:
    """(start, end, value) of every complete top-level JSON object or array in `text`, in order.

    Scans for `{` / `[`, decodes the longest JSON value starting there, and continues after it;
    where decoding fails it moves on by one character, so prose, fences and broken lines are
    skipped. Numbers NaN / Infinity make a value invalid.
    """
    spans: list[tuple[int, int, object]] = []
    position = 0
    while True:
        match = _START.search(text, position)
        if match is None:
            return spans
        start = match.start()
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            position = start + 1
            continue
        spans.append((start, end, value))
        position = end


def _objects_of(values) -> list[dict]:
    objects: list[dict] = []
    for value in values:
        if isinstance(value, dict):
            objects.append(value)
        elif isinstance(value, list):
            objects.extend(item for item in value if isinstance(item, dict))
    return objects


def json_values(text: str) -> list[object]:
    """Every complete top-level JSON object or array in `text`, in order (see `_json_spans`)."""
    return [value for _, _, value in _json_spans(_check_text(text))]


def json_objects(text: str) -> list[dict]:
    """The JSON objects in `text`: top-level objects, and the objects directly inside top-level arrays."""
    return _objects_of(json_values(text))


def answer_objects(text: str) -> list[dict]:
    """`json_objects` of a model's reply, leaving out what it wrote while reasoning.

    Reasoning models served without a reasoning parser write `<think> ... </think>` before the
    answer and may draft answer objects in it; drafts are not the answer. A tag counts only
    outside JSON values: a verdict whose evidence quotes "</think>" from the trajectory stays a
    verdict — otherwise a policy could turn its failing verdicts INVALID by writing the tag.
    Reasoning regions run from a `<think>` to the next `</think>` (or the end of the reply), and
    from the start of the reply to a first `</think>` that has no `<think>` before it (a chat
    template that opens the block itself). Values starting inside a region are left out.
    """
    text = _check_text(text)
    spans = _json_spans(text)

    def structural(position: int) -> bool:
        return not any(start <= position < end for start, end, _ in spans)

    regions: list[tuple[int, int]] = []
    opened: int | None = None
    for match in _THINK_TAG.finditer(text):
        if not structural(match.start()):
            continue
        if match.group().lower() == "<think>":
            if opened is None:
                opened = match.start()
        elif opened is not None:
            regions.append((opened, match.end()))
            opened = None
        elif not regions:
            regions.append((0, match.end()))
    if opened is not None:
        regions.append((opened, len(text)))
    kept = [value for start, _, value in spans if not any(low <= start < high for low, high in regions)]
    return _objects_of(kept)


class SchemaError(ValueError):
    """An answer object that does not follow the requested schema (the message says which field)."""


def unit_number(obj: dict, key: str, *, required: bool) -> float | None:
    """`obj[key]` as a float in [0, 1]; None when absent or null and not required; SchemaError otherwise.

    Booleans and numeric strings are refused: a model that writes "0.8" or true has not followed
    the schema, and guessing would hide it.
    """
    value = obj.get(key)
    if value is None:
        if required:
            raise SchemaError(f'"{key}" is required, got {value!r}')
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f'"{key}" must be a number in [0, 1], got {value!r}')
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise SchemaError(f'"{key}" must be in [0, 1], got {value!r}')
    return number


def text_field(obj: dict, key: str, *, required: bool, max_chars: int | None = None) -> str:
    """`obj[key]` as a str ("" when absent or null and not required); SchemaError otherwise.

    With `required`, an empty or blank string is refused too. `max_chars` cuts long text.
    """
    value = obj.get(key)
    if value is None:
        if required:
            raise SchemaError(f'"{key}" is required')
        return ""
    if not isinstance(value, str):
        raise SchemaError(f'"{key}" must be a string, got {type(value).__name__}')
    if required and not value.strip():
        raise SchemaError(f'"{key}" must not be empty')
    if max_chars is not None and len(value) > max_chars:
        value = value[:max_chars]
    return value


def check_request_id(obj: dict, request_id: str | None) -> None:
    """SchemaError unless `obj["request_id"]` equals `request_id` (no check when `request_id` is None).

    The id is random per request and appears only in the prompt, never in trajectory text, so an
    answer object that lacks it was not written for this request — typically a verdict copied
    from the trajectory (a prompt-injection attempt) or from an earlier answer.
    """
    if request_id is None:
        return
    given = obj.get("request_id")
    if given != request_id:
        raise SchemaError(
            f'"request_id" is {given!r}, not this request\'s id (an object the judge did not write '
            "for this request, e.g. one copied from the trajectory)"
        )
