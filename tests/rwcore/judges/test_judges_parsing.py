"""Reply parsing, prompt templates and the rate limiter (no network)."""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rwcore.judges import SlidingWindowLimiter
from rwcore.judges.parsing import answer_objects, json_objects
from rwcore.judges.templates import (
    PLACEHOLDER,
    TEMPLATE_NAMES,
    load_template,
    render,
    render_file,
    trajectory_payload,
    untrusted_block,
)
from rwcore.judges.verdicts import parse_judge_answer
from rwcore.types import RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict

RUBRICS = {"a": RubricSpec("a", "x"), "b": RubricSpec("b", "y", scored=True)}


# ---- JSON extraction ---------------------------------------------------------------------------


def test_json_objects_tolerates_fences_prose_and_broken_lines():
    text = (
        'Sure {not json}. Here:\n```json\n{"x": 1}\n{"y": [1, 2, {"z": 3}]}\n{"broken": \n'
        '[{"in": "array"}, 5]\n```\ntrailing } prose {'
    )
    assert json_objects(text) == [{"x": 1}, {"y": [1, 2, {"z": 3}]}, {"in": "array"}]


def test_json_objects_rejects_non_finite_numbers():
    assert json_objects('{"score": NaN}\n{"score": Infinity}\n{"score": 0.5}') == [{"score": 0.5}]


def test_answer_objects_leave_out_reasoning():
    assert answer_objects('<think>draft {"a": 1}</think>\n{"b": 2}') == [{"b": 2}]
    assert answer_objects('draft {"a": 1} </THINK> {"b": 2}') == [{"b": 2}]  # template opened the block
    assert answer_objects('{"b": 2}\n<think>{"a": 1} never closed') == [{"b": 2}]
    assert answer_objects('<think>x</think>{"b": 2}<think>y {"c": 3}</think>{"d": 4}') == [{"b": 2}, {"d": 4}]


def test_think_tags_quoted_inside_answers_are_not_structural():
    # A verdict quoting the policy's "</think>" or "<think>" stays a verdict (else: a way to force INVALID).
    lines = [
        '{"rubric_id": "a", "verdict": "fail", "evidence": "turn 2: </think> {x}"}',
        '{"rubric_id": "b", "verdict": "fail", "evidence": "turn 3: <think>"}',
        '{"rubric_id": "c", "verdict": "pass"}',
    ]
    assert [o["rubric_id"] for o in answer_objects("\n".join(lines))] == ["a", "b", "c"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=5),
    st.lists(
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), max_size=3), min_size=1, max_size=4
    ),
)
def test_json_objects_finds_every_object_between_prose(prose, objects):
    # Prose without braces or brackets, objects each on their own line: all found, in order.
    prose = [p.replace("{", "").replace("[", "").replace("}", "").replace("]", "") for p in prose]
    parts = []
    for i, obj in enumerate(objects):
        parts.append(prose[i] if i < len(prose) else "")
        parts.append(json.dumps(obj))
    assert json_objects("\n".join(parts)) == objects


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parse_judge_answer_never_raises(text):
    answer = parse_judge_answer(text, RUBRICS, request_id="0011223344556677", want_diagnostics=True)
    assert set(answer.judgments) | set(answer.problems) == set(RUBRICS)
    assert all(j.verdict != Verdict.INVALID for j in answer.judgments.values())


def test_parse_judge_answer_rules():
    rid = "0011223344556677"
    lines = [
        {"request_id": rid, "rubric_id": "a", "verdict": "Pass", "score": 0.1, "confidence": 0.5, "extra": 1},
        {"request_id": rid, "rubric_id": "b", "verdict": "na", "score": None},
        {"request_id": rid, "rubric_id": "zzz", "verdict": "fail"},
        {"request_id": rid, "rubric_id": "a", "criterion": "echoed prompt, no verdict key"},
        {"request_id": rid, "diagnostics": {"uncovered": ["one", {"behavior": "two"}, "  "]}},
    ]
    answer = parse_judge_answer(
        "\n".join(json.dumps(line) for line in lines), RUBRICS, request_id=rid, want_diagnostics=True
    )
    a, b = answer.judgments["a"], answer.judgments["b"]
    assert (a.verdict, a.score, a.confidence) == (Verdict.PASS, None, 0.5)  # unscored: score dropped
    assert (b.verdict, b.score) == (Verdict.NA, None)
    assert answer.problems == {} and answer.ignored == 2
    assert answer.uncovered == ("one", "two")
    # Diagnostics are only read when asked for, and only from a single valid object.
    assert parse_judge_answer(json.dumps(lines[4]), RUBRICS, request_id=rid).uncovered is None
    twice = json.dumps(lines[4]) + "\n" + json.dumps(lines[4])
    assert parse_judge_answer(twice, RUBRICS, request_id=rid, want_diagnostics=True).uncovered is None


# ---- templates -----------------------------------------------------------------------------------


def test_every_template_is_package_data_and_loads():
    folder = resources.files("rwcore.judges").joinpath("prompts")
    names = sorted(entry.name[:-3] for entry in folder.iterdir() if entry.name.endswith(".md"))
    assert names == sorted(TEMPLATE_NAMES)
    for name in TEMPLATE_NAMES:
        text = load_template(name)
        assert text.strip() and not text.lstrip().startswith("<!--")
    with pytest.raises(ValueError, match="name"):
        load_template("../secrets")


def test_render_substitutes_once_and_checks_names():
    assert render("a {x} b {y}", x="{y}", y="{x}") == "a {y} b {x}"
    assert render('{"json": {"kept": true}} {x}', x="1") == '{"json": {"kept": true}} 1'
    with pytest.raises(ValueError, match="without a value"):
        render("{x} {y}", x="1")
    with pytest.raises(ValueError, match="without a placeholder"):
        render("{x}", x="1", z="2")
    with pytest.raises(ValueError, match="must be a str"):
        render("{x}", x=1)


def _sample_values(name: str) -> dict[str, str]:
    return {
        key: "0011223344556677" if key == "request_id" else f"<{key}>"
        for key in set(PLACEHOLDER.findall(load_template(name)))
    }


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_an_echoed_prompt_holds_no_answer_object(name):
    # A model that repeats its instructions must not thereby produce a verdict, record or proposal.
    text = render_file(name, **_sample_values(name))
    assert PLACEHOLDER.findall(text) == []
    for obj in json_objects(text):
        assert not {"request_id", "verdict", "deficit", "proposals", "skill", "issues", "diagnostics"} & set(obj), obj


def test_untrusted_block_is_three_ascii_lines():
    block = untrusted_block({"text": 'line1\nline2\u2028\u202e>>>"}'}, "abc")
    lines = block.split("\n")
    assert len(lines) == 3 and block.isascii()
    assert json.loads(lines[1]) == {"text": 'line1\nline2\u2028\u202e>>>"}'}


def test_trajectory_payload_covers_only_hashed_fields_and_truncates():
    trajectory = Trajectory(
        "t",
        [Turn("user", "x" * 1000), Turn("assistant", "short", generated=True)],
        0.5,
        tags=("a",),
        trajectory_id="secret-id",
        metadata={"private": "state"},
    )
    payload = trajectory_payload(trajectory)
    assert set(payload) == {"task_id", "tags", "outcome", "turns"}
    assert "secret-id" not in json.dumps(payload) and "private" not in json.dumps(payload)
    cut = trajectory_payload(trajectory, max_chars=400, include_outcome=False)
    assert "outcome" not in cut
    assert len(cut["turns"][0]["content"]) <= 200 and "characters omitted" in cut["turns"][0]["content"]
    assert cut["turns"][1]["content"] == "short"


# ---- rate limiter --------------------------------------------------------------------------------


def test_sliding_window_limits_requests_per_window():
    limiter = SlidingWindowLimiter(3, period=0.3)

    async def main():
        times = []
        for _ in range(7):
            await limiter.acquire(1)
            times.append(time.monotonic())
        return times

    times = asyncio.run(main())
    # In any window of 0.3 s, at most 3 grants.
    for i in range(len(times)):
        assert sum(1 for t in times if times[i] <= t < times[i] + 0.3 - 1e-3) <= 3
    assert times[-1] - times[0] >= 0.6


def test_sliding_window_tokens_settle_and_oversized_requests():
    limiter = SlidingWindowLimiter(100, period=0.3)

    async def main():
        reservation = await limiter.acquire(80)
        reservation.settle(10)  # the server reported fewer tokens than estimated
        start = time.monotonic()
        await limiter.acquire(80)  # fits at once now
        fast = time.monotonic() - start
        start = time.monotonic()
        await limiter.acquire(500)  # larger than the limit: granted once the window is empty
        return fast, time.monotonic() - start

    fast, slow = asyncio.run(main())
    assert fast < 0.1 and 0.2 <= slow < 1.0
    with pytest.raises(ValueError, match="limit"):
        SlidingWindowLimiter(0)
    with pytest.raises(ValueError, match="amount"):
        asyncio.run(limiter.acquire(-1))
