"""Tolerant extraction of JSON objects from a model's reply, and strict field checks.

Models wrap JSON in ``` fences, add prose before or after it, stop half-way through a JSONL line,
or return one array / one wrapper object instead of lines. `json_objects` finds every complete
top-level JSON value in the text (objects, and the objects inside top-level arrays) and skips
everything else; a broken line simply yields nothing. `answer_objects` does the same for a
model's reply, minus what the model wrote while reasoning. What the objects *mean* is decided by
the callers, which accept only objects carrying the expected keys and request id.

Only the model's reply is ever parsed here — never the prompt or the trajectory. Replies quote
trajectory text, which the policy under training wrote, so reading a reply is hardened against it:

- Linear time. One left-to-right scan with a JSON tokenizer and a bracket stack finds the values;
  a value that breaks off does not make the scan start again at every bracket inside it: its
  complete inner values are taken from the same scan, and only openers inside its strings get a
  fresh attempt, within a total budget of twice the reply's length. Only complete values are
  decoded (by `json`), each character at most once.
- Bounded nesting. Values nested deeper than `MAX_DEPTH` brackets are skipped whole (never
  decoded, so `json` cannot recurse into them); a JSON value's own structure is all that counts,
  brackets inside JSON strings are text.
- Nothing but the documented errors: ValueError for a `text` that is not a str; never
  RecursionError, MemoryError from nesting, or a hang.

Semantics, as `_json_spans` documents: the values found are those a decoder trying every `{` /
`[` from left to right would find (taking each complete value whole and going on after it),
except that openers inside strings of a value that is itself complete are never tried, values
deeper than `MAX_DEPTH` are skipped, and retries inside the strings of broken values stop once
their budget is spent.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
from array import array

MAX_REPLY_CHARS = 1_000_000
"""Replies longer than this are cut before parsing (a runaway generation; bounds the work)."""

MAX_DEPTH = 64
"""Values nested deeper than this many brackets are skipped whole (answer objects need 3)."""

_THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)
_START = re.compile(r"[\[{]")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# One JSON token after optional JSON whitespace; strings and numbers as the json module reads them,
# except that strings may hold raw control characters other than line breaks (grammar-constrained
# decoders such as xgrammar emit them; a string still never spans lines). NaN / Infinity are not
# numbers here.
_TOKEN = re.compile(
    r"[ \t\n\r]*+(?:(?P<open>[\[{])|(?P<close>[\]}])|(?P<colon>:)|(?P<comma>,)"
    r'|(?P<string>"[^"\\\n\r]*+(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\n\r]*+)*+")'
    r"|(?P<scalar>-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?|true|false|null))"
)

# parser states of an open container
_OBJ_FIRST, _OBJ_COLON, _VALUE, _AFTER, _OBJ_KEY, _ARR_FIRST = range(6)


logger = logging.getLogger("rwcore.judges")


def _reject_constant(name: str):
    # json accepts NaN / Infinity by default; a verdict must never carry them.
    raise ValueError(f"non-finite number {name} in JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, strict=False)  # control characters: see _TOKEN


def _check_text(text) -> str:
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return text[:MAX_REPLY_CHARS]


class _Scan:
    """The outcome of scanning one value from an opener: complete (`end`) or broken (`failure`)."""

    __slots__ = ("end", "depth", "failure", "children", "strings")

    def __init__(self, end, depth, failure, children, strings):
        self.end = end  # index after the value, or None when it broke off
        self.depth = depth  # bracket depth of the complete value
        self.failure = failure  # where it broke off (index of the offending token), or None
        self.children = children  # broken: the maximal complete inner values (start, end, depth)
        self.strings = strings  # broken: (start, end) of string tokens outside complete inner values


def _scan(text: str, start: int, limit: int) -> _Scan:
    """Tokenizes one JSON value from the opener at `start` with an explicit stack (no recursion).

    Stops at the end of the value, at the first token the JSON grammar does not allow there, or
    when a token would end beyond `limit` (then it counts as broken at that token). The stack is
    kept in compact arrays (about 14 bytes per open bracket), so a reply of a million `[` costs
    megabytes, not a Python object per bracket.
    """
    match = _TOKEN.match
    kinds = bytearray()  # per open container: 1 object, 0 array
    states = bytearray()  # its parser state
    starts = array("q")  # where it opened
    deepest = array("l")  # depth of its deepest complete child
    children: list[tuple[int, int, int]] = []
    strings: list[tuple[int, int]] = []
    position = start
    while True:
        token = match(text, position)
        if token is None or token.end() > limit:
            failure = _WHITESPACE.match(text, position).end() if token is None else token.start(token.lastgroup)
            return _Scan(None, 0, failure, children, strings)
        kind = token.lastgroup
        at = token.start(kind)
        position = token.end()
        if not states:  # the opener at `start`
            is_object = text[at] == "{"
            kinds.append(is_object)
            states.append(_OBJ_FIRST if is_object else _ARR_FIRST)
            starts.append(at)
            deepest.append(0)
            continue
        state = states[-1]
        closing = False
        if state == _VALUE or state == _ARR_FIRST:
            if kind == "open":
                states[-1] = _AFTER
                is_object = text[at] == "{"
                kinds.append(is_object)
                states.append(_OBJ_FIRST if is_object else _ARR_FIRST)
                starts.append(at)
                deepest.append(0)
                continue
            if kind == "string" or kind == "scalar":
                if kind == "string":
                    strings.append((at, position))
                states[-1] = _AFTER
                continue
            closing = kind == "close" and state == _ARR_FIRST and text[at] == "]"
        elif state == _OBJ_FIRST or state == _OBJ_KEY:
            if kind == "string":
                strings.append((at, position))
                states[-1] = _OBJ_COLON
                continue
            closing = kind == "close" and state == _OBJ_FIRST and text[at] == "}"
        elif state == _OBJ_COLON:
            if kind == "colon":
                states[-1] = _VALUE
                continue
        else:  # _AFTER
            if kind == "comma":
                states[-1] = _OBJ_KEY if kinds[-1] else _VALUE
                continue
            closing = kind == "close" and text[at] == ("}" if kinds[-1] else "]")
        if not closing:
            return _Scan(None, 0, at, children, strings)
        kinds.pop()
        states.pop()
        opened = starts.pop()
        depth = deepest.pop() + 1
        if not states:
            return _Scan(position, depth, None, None, None)
        # values inside this one are no longer maximal
        while children and children[-1][0] > opened:
            children.pop()
        while strings and strings[-1][0] > opened:
            strings.pop()
        children.append((opened, position, depth))
        if depth > deepest[-1]:
            deepest[-1] = depth


def _decode(text: str, start: int, end: int, depth: int, spans: list) -> None:
    if depth > MAX_DEPTH:
        return
    try:
        value, stop = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):  # e.g. an integer too long to convert
        return
    if stop == end:
        spans.append((start, end, value))


def _attempt(text: str, start: int, spans: list, limit: int, budget: list[int] | None) -> tuple[int, int]:
    """Reads the value at the opener `start` into `spans`; returns (resume, taken).

    Complete: the value (when not too deep). Broken at f: its maximal complete inner values, and,
    with a `budget` (characters, shared by the whole reply; None inside such a retry), a fresh
    attempt at each opener inside its strings while the budget lasts, in text order.
    resume: where the scan goes on (f, or after the last value taken when that is later);
    taken: the end of the last value taken (start + 1 when none).
    """
    scan = _scan(text, start, limit)
    if scan.end is not None:
        _decode(text, start, scan.end, scan.depth, spans)
        return scan.end, scan.end
    taken = start + 1
    events = scan.children
    if budget is not None and scan.strings:
        events = list(events)
        for low, high in scan.strings:
            events.extend((m.start(), -1, 0) for m in _START.finditer(text, low + 1, high - 1))
        events.sort()
    for where, end, depth in events:
        if where < taken:
            continue
        if end >= 0:
            _decode(text, where, end, depth, spans)
            taken = end
        elif budget is not None and budget[0] > 0:
            resume, taken = _attempt(text, where, spans, min(len(text), where + budget[0]), None)
            budget[0] -= max(resume - where, 1)
    return max(scan.failure, taken), taken


def _json_spans(text: str) -> list[tuple[int, int, object]]:
    """(start, end, value) of every complete top-level JSON object or array in `text`, in order.

    Scans for `{` / `[` and reads the value starting there (see the module docstring): a complete
    value is taken whole and the scan goes on after it; where a value breaks off, its complete
    inner values are taken and the scan goes on where it broke. Prose, fences and broken lines
    are skipped. Numbers NaN / Infinity make a value invalid. Linear in len(text).
    """
    spans: list[tuple[int, int, object]] = []
    budget = [2 * len(text) + 4096]
    position = 0
    find = _START.search
    while True:
        match = find(text, position)
        if match is None:
            return spans
        position, _ = _attempt(text, match.start(), spans, len(text), budget)


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


def answer_parts(text: str) -> tuple[list[dict], list[dict]]:
    """(answer objects, reasoning objects) of a model's reply: `json_objects`, split by reasoning regions.

    Reasoning models served without a reasoning parser write `<think> ... </think>` before the
    answer and may draft answer objects in it; drafts are not the answer. A tag counts only
    outside JSON values: a verdict whose evidence quotes "</think>" from the trajectory stays a
    verdict — otherwise a policy could turn its failing verdicts INVALID by writing the tag.
    Reasoning regions run from a `<think>` to the next `</think>` (or the end of the reply), and
    from the start of the reply to a first `</think>` that has no `<think>` before it (a chat
    template that opens the block itself). Values starting inside a region are reasoning objects.
    Callers that can tell the judge's own objects apart (by the request id) may fall back to the
    reasoning objects: a judge that quotes a stray tag from the trajectory in its prose opens a
    "region" that would otherwise hide its real answer.
    """
    text = _check_text(text)
    spans = _json_spans(text)
    starts = [start for start, _, _ in spans]

    def structural(position: int) -> bool:
        i = bisect.bisect_right(starts, position) - 1
        return i < 0 or position >= spans[i][1]

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
    lows = [low for low, _ in regions]

    def reasoning(position: int) -> bool:
        i = bisect.bisect_right(lows, position) - 1
        return i >= 0 and position < regions[i][1]

    kept, drafts = [], []
    for start, _, value in spans:
        (drafts if reasoning(start) else kept).append(value)
    return _objects_of(kept), _objects_of(drafts)


def answer_objects(text: str) -> list[dict]:
    """`json_objects` of a model's reply, leaving out what it wrote while reasoning (`answer_parts`)."""
    return answer_parts(text)[0]


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
        logger.warning('answer field "%s": %d characters, cut to the first %d', key, len(value), max_chars)
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
