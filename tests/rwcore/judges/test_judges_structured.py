"""Structured outputs: OpenAIJudge sends the answer's JSON schema as response_format (scripted server).

structured_outputs="auto" (default) sends it and falls back to plain prompts for good when the server
rejects it (400 / 422 where the same request without it works), logged once; "always" makes a rejection
INVALID; "never" sends plain prompts. The real-server check is tests/rwcore/judges/test_judges_vllm_real.py.
"""

from __future__ import annotations

import json
import logging

import pytest
from judge_server import (
    ChatServer,
    Reply,
    all_pass,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
)

from rwcore.judges import OpenAIJudge
from rwcore.types import RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict

KEY_ENV = "RWCORE_TEST_JUDGE_KEY"
SECRET = "sk-test-structured"
pytestmark = pytest.mark.usefixtures("key")  # the judges these tests build read the key from KEY_ENV
RUBRICS = [RubricSpec("cites-order", "Cites the order id."), RubricSpec("verifies", "Verifies.", scored=True)]
UNSCORED = [RUBRICS[0], RubricSpec("polite", "Stays polite.")]
UNIT = {"type": "number", "minimum": 0, "maximum": 1}


def trajectories(n: int = 2) -> list[Trajectory]:
    return [
        Trajectory("t", [Turn("assistant", f"done {i}", generated=True)], 0.0, trajectory_id=f"t/{i}") for i in range(n)
    ]


def judge_for(server: ChatServer, **options) -> OpenAIJudge:
    settings = dict(base_url=server.base_url, api_key_env=KEY_ENV, timeout=2.0, max_retries=0, backoff=(0.01, 0.02))
    return OpenAIJudge("judge-test", **{**settings, **options})


def structured_reply(request) -> Reply:
    """What a schema-constrained server answers: one wrapper object."""
    schema = request.body["response_format"]["json_schema"]["schema"]
    items = [
        {
            "rubric_id": rid,
            "verdict": "fail",
            "score": 0.2 if rid == "verifies" else None,
            "confidence": 0.7,
            "evidence": "turn 0: x",
        }
        for rid in request.rubric_ids
    ]
    answer = {"request_id": schema["properties"]["request_id"]["enum"][0], "verdicts": items}
    if "diagnostics" in schema["properties"]:
        answer["diagnostics"] = {"uncovered": ["turn 0: never restates the goal"]}
    return Reply(json.dumps(answer))


def test_the_answer_schema_is_sent_as_response_format_and_its_answers_are_read():
    seen = []

    def script(request):
        seen.append(request)
        return structured_reply(request)

    with ChatServer(script) as server:
        reports = judge_for(server, rubrics_per_request=2).evaluate(trajectories(), RUBRICS)
    assert [{rid: j.verdict for rid, j in r.judgments.items()} for r in reports] == [
        {"cites-order": Verdict.FAIL, "verifies": Verdict.FAIL}
    ] * 2
    assert reports[0].uncovered == ("turn 0: never restates the goal",)
    assert len(seen) == 2
    for request in seen:
        rf = request.body["response_format"]
        assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
        assert rf["json_schema"]["name"] == "rubric_verdicts"
        schema = rf["json_schema"]["schema"]
        assert schema["additionalProperties"] is False and set(schema["required"]) >= {"request_id", "verdicts"}
        assert schema["properties"]["request_id"]["enum"] == [request.request_id]
        verdicts = schema["properties"]["verdicts"]
        assert verdicts["minItems"] == verdicts["maxItems"] == 2
        unscored, scored, scored_na = verdicts["items"]["anyOf"]
        for item, ids, words, score in (
            (unscored, ["cites-order"], ["pass", "fail", "na"], {"type": "null"}),
            (scored, ["verifies"], ["pass", "fail"], UNIT),
            (scored_na, ["verifies"], ["na"], {"type": "null"}),
        ):
            assert item["properties"]["rubric_id"] == {"type": "string", "enum": ids}
            assert item["properties"]["verdict"] == {"type": "string", "enum": words}
            assert item["properties"]["score"] == score
            assert item["properties"]["confidence"] == UNIT
            assert item["properties"]["evidence"] == {"type": "string", "maxLength": 300}
            assert set(item["required"]) == {"rubric_id", "verdict", "score", "confidence", "evidence"}
            assert item["additionalProperties"] is False
        assert ("diagnostics" in schema["properties"]) == request.wants_diagnostics
        assert "## Structured answer" in request.system


def test_auto_falls_back_to_plain_prompts_when_the_server_rejects_response_format(caplog):
    def script(request):
        if "response_format" in request.body:
            return Reply(status=400, body={"error": {"message": "response_format is not supported"}})
        return all_pass(request)

    with ChatServer(script) as server:
        judge = judge_for(server, rubrics_per_request=1)
        with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
            reports = judge.evaluate(trajectories(), UNSCORED)  # 4 requests, sent concurrently
            first = list(server.requests)
            again = judge.evaluate(trajectories(1), UNSCORED)
        later = server.requests[len(first) :]
    assert all(j.verdict == Verdict.PASS for r in reports + again for j in r.judgments.values()), [
        j.error for r in reports + again for j in r.judgments.values()
    ]
    rejected = [r for r in first if "response_format" in r.body]
    # each request already under way when the first rejection came back is asked again without the schema;
    # from then on this judge sends plain prompts
    assert 1 <= len(rejected) <= 4 and len(first) == len(rejected) + 4
    assert len(later) == 2 and not any("response_format" in r.body for r in later)
    assert judge.uses_structured_outputs is False
    warnings = [r for r in caplog.records if "structured outputs" in r.getMessage()]
    assert len(warnings) == 1


def test_a_400_for_another_reason_keeps_structured_outputs_on():
    with ChatServer(lambda request: Reply(status=400, body={"error": {"message": "context too long"}})) as server:
        judge = judge_for(server)
        [report] = judge.evaluate(trajectories(1), RUBRICS[:1])
        assert server.count == 2  # with the schema, then the same request without it
    judgment = report.judgments["cites-order"]
    assert judgment.verdict == Verdict.INVALID and "context too long" in judgment.error
    assert judge.uses_structured_outputs is True


def test_always_makes_a_rejection_invalid_and_never_sends_plain_prompts():
    def script(request):
        if "response_format" in request.body:
            return Reply(status=422, body={"error": {"message": "unknown field response_format"}})
        return all_pass(request)

    with ChatServer(script) as server:
        [report] = judge_for(server, structured_outputs="always").evaluate(trajectories(1), RUBRICS[:1])
        assert server.count == 1
    assert report.judgments["cites-order"].verdict == Verdict.INVALID
    assert "HTTP 422" in report.judgments["cites-order"].error
    with ChatServer(script) as server:
        [report] = judge_for(server, structured_outputs="never").evaluate(trajectories(1), RUBRICS[:1])
        assert server.count == 1 and "response_format" not in server.requests[0].body
        assert "## Structured answer" not in server.requests[0].system
    assert report.judgments["cites-order"].verdict == Verdict.PASS


@pytest.mark.parametrize("value", ["yes", True, None, "AUTO"])
def test_structured_outputs_refuses_unknown_settings(value):
    with pytest.raises(ValueError, match="structured_outputs"):
        OpenAIJudge("judge-test", base_url="http://127.0.0.1:9/v1", structured_outputs=value)


def test_answer_schema_refuses_bad_arguments():
    from rwcore.judges.verdicts import answer_schema

    with pytest.raises(ValueError, match="rubrics"):
        answer_schema([], "abc")
    with pytest.raises(ValueError, match="rubrics"):
        answer_schema([RUBRICS[0], RUBRICS[0]], "abc")
    with pytest.raises(ValueError, match="rubrics"):
        answer_schema(["a"], "abc")
    with pytest.raises(ValueError, match="request_id"):
        answer_schema(RUBRICS, "")


def test_the_config_option_reaches_the_judge():
    from rwcore.trainer.config import load_config
    from rwcore.trainer.method_setup import build_judge

    base = ["judge.kind=openai", "judge.model=judge-test", "judge.base_url=http://127.0.0.1:9/v1"]
    assert build_judge(load_config(None, base), None).structured_outputs == "auto"
    judge = build_judge(load_config(None, [*base, "judge.structured_outputs=never"]), None)
    assert judge.structured_outputs == "never" and not judge.uses_structured_outputs
    with pytest.raises(ValueError, match="judge.structured_outputs"):
        load_config(None, [*base, "judge.structured_outputs=sometimes"])
