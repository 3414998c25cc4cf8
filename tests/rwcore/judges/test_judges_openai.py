"""OpenAIJudge against a real HTTP server on loopback that speaks the chat-completions protocol."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import sqlite3
import threading
import time

import pytest
from _util import chat_trajectory
from judge_server import (
    ChatServer,
    Reply,
    all_pass,
    diagnostics_line,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
    verdict_line,
)

from rwcore.judges import MissingAPIKeyError, OpenAIJudge
from rwcore.types import JudgeReport, RubricSpec, Trajectory
from rwcore.verdict import Verdict

KEY_ENV = "RWCORE_TEST_JUDGE_KEY"
SECRET = "sk-test-DO-NOT-LEAK-5f3a9c"

R1 = RubricSpec(
    "cites-order-id",
    "The agent cites the order id before issuing a refund.",
    applicability="A refund is issued.",
    capability="Verification",
)
R2 = RubricSpec("no-duplicate-calls", "The agent does not repeat an identical tool call.", capability="Efficiency")
R3 = RubricSpec("states-benefit", "The agent states a concrete benefit for the buyer.", scored=True)


def trajectory(task_id: str = "t1", text: str = "Refund issued for order 1234.", outcome: float = 1.0) -> Trajectory:
    return chat_trajectory(task_id, text, outcome, request="Please refund order 1234.", tags=("refund",))


def make_judge(server: ChatServer, **options) -> OpenAIJudge:
    settings = dict(
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        timeout=2.0,
        max_retries=2,
        backoff=(0.01, 0.05),
        max_concurrency=4,
    )
    settings.update(options)
    return OpenAIJudge("judge-test", **settings)


def verdicts(report: JudgeReport) -> dict[str, Verdict]:
    return {rubric_id: judgment.verdict for rubric_id, judgment in report.judgments.items()}


# ---- well-formed and tolerated answers ---------------------------------------------------------


def test_correct_jsonl_gives_verdicts_scores_evidence_and_diagnostics(serve, key):
    def script(request):
        return Reply(
            "\n".join(
                [
                    verdict_line(request, "cites-order-id", "pass", confidence=0.8),
                    verdict_line(request, "no-duplicate-calls", "NA", evidence="no tool calls"),
                    verdict_line(request, "states-benefit", "fail", score=0.7),
                    diagnostics_line(request, ["turn 1: never confirms the refund amount"]),
                ]
            )
        )

    server = serve(script)
    judge = make_judge(server)
    [report] = judge.evaluate([trajectory()], [R1, R2, R3])
    assert report.trajectory_id == "t1/g/0"
    assert list(report.judgments) == ["cites-order-id", "no-duplicate-calls", "states-benefit"]
    first, second, third = report.judgments.values()
    assert (first.verdict, first.score, first.confidence) == (Verdict.PASS, None, 0.8)
    assert first.evidence == "turn 1: evidence for cites-order-id" and first.value == 1.0
    assert (second.verdict, second.score, second.evidence, second.value) == (Verdict.NA, None, "no tool calls", None)
    # Scored rubric: the score decides (0.7 >= 0.5) whatever the verdict word said.
    assert (third.verdict, third.score, third.value) == (Verdict.PASS, 0.7, 0.7)
    assert report.uncovered == ("turn 1: never confirms the refund amount",)

    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.body["model"] == "judge-test" and request.body["temperature"] == 0.0
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert request.rubric_ids == ["cites-order-id", "no-duplicate-calls", "states-benefit"]
    assert request.data["trajectory"]["turns"][1]["content"] == "Refund issued for order 1234."
    assert "Refund issued" not in request.system  # trajectory text never reaches the instructions


def test_json_in_fences_with_prose_is_read(serve, key):
    def script(request):
        lines = "\n".join(verdict_line(request, rubric_id, "fail") for rubric_id in request.rubric_ids)
        return Reply(f"Sure! Here is my evaluation:\n```json\n{lines}\n```\nLet me know if you need more.")

    judge = make_judge(serve(script), diagnostics=False)
    [report] = judge.evaluate([trajectory()], [R1, R2])
    assert verdicts(report) == {"cites-order-id": Verdict.FAIL, "no-duplicate-calls": Verdict.FAIL}
    assert all(j.error == "" for j in report.judgments.values())


def test_array_and_wrapper_forms_are_read(serve, key):
    def script(request):
        objects = [json.loads(verdict_line(request, rubric_id)) for rubric_id in request.rubric_ids]
        if request.data["trajectory"]["task_id"] == "a":
            text = json.dumps(objects, indent=2)  # one JSON array, pretty-printed
        else:  # one wrapper object; the items inherit its request id
            text = json.dumps(
                {
                    "request_id": request.request_id,
                    "verdicts": [{k: v for k, v in o.items() if k != "request_id"} for o in objects],
                    "diagnostics": {"uncovered": ["x"]},
                }
            )
        return Reply(text)

    judge = make_judge(serve(script))
    reports = judge.evaluate([trajectory("a"), trajectory("b")], [R1])
    assert [verdicts(r) for r in reports] == [{"cites-order-id": Verdict.PASS}] * 2
    assert reports[1].uncovered == ("x",)


def test_reasoning_drafts_inside_think_blocks_are_ignored(serve, key):
    def script(request):
        draft = verdict_line(request, "cites-order-id", "fail")
        return Reply(f"<think>First guess: {draft}. Hmm, no.</think>\n" + verdict_line(request, "cites-order-id"))

    [report] = make_judge(serve(script), diagnostics=False).evaluate([trajectory()], [R1])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS}


# ---- partial, missing and wrong answers --------------------------------------------------------


def test_jsonl_with_one_bad_line_keeps_the_valid_lines_and_reasks_the_rest(serve, key):
    def script(request):
        if len(server.requests) == 1:
            good = verdict_line(request, "cites-order-id")
            bad = verdict_line(request, "no-duplicate-calls")[:-25]  # cut mid-object
            return Reply(f"{good}\n{bad}\n", finish_reason="length")
        return Reply(verdict_line(request, "no-duplicate-calls", "fail"))

    server = serve(script)
    [report] = make_judge(server, diagnostics=False).evaluate([trajectory()], [R1, R2])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS, "no-duplicate-calls": Verdict.FAIL}
    assert [r.rubric_ids for r in server.requests] == [["cites-order-id", "no-duplicate-calls"], ["no-duplicate-calls"]]
    assert server.requests[0].request_id != server.requests[1].request_id


def test_rubrics_missing_after_reasks_are_invalid(serve, key):
    server = serve(lambda request: Reply(verdict_line(request, "cites-order-id")))
    [report] = make_judge(server, diagnostics=False, max_reasks=2).evaluate([trajectory()], [R1, R2])
    assert report.judgments["cites-order-id"].verdict == Verdict.PASS
    missing = report.judgments["no-duplicate-calls"]
    assert missing.verdict == Verdict.INVALID and missing.value is None
    assert "no verdict for this rubric" in missing.error
    assert server.count == 3  # the first request and two re-asks


def test_wrong_rubric_ids_are_ignored(serve, key):
    def script(request):
        return Reply(
            "\n".join(
                [verdict_line(request, "some-other-rubric", "fail"), verdict_line(request, "CITES-ORDER-ID", "fail")]
            )
        )

    server = serve(script)
    [report] = make_judge(server, diagnostics=False, max_reasks=0).evaluate([trajectory()], [R1])
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "no verdict" in judgment.error
    assert list(report.judgments) == ["cites-order-id"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"verdict": "maybe"}, '"verdict"'),
        ({"confidence": 1.5}, '"confidence"'),
        ({"confidence": "high"}, '"confidence"'),
        ({"evidence": ["a list"]}, '"evidence"'),
        ({"score": None}, '"score" is required'),
        ({"score": True}, '"score"'),
    ],
)
def test_schema_violations_are_invalid(serve, key, fields, message):
    rubric = R3 if "score" in fields else R1
    server = serve(
        lambda request: Reply(
            verdict_line(request, rubric.rubric_id, **{"score": 0.5, **fields})
            if rubric.scored
            else verdict_line(request, rubric.rubric_id, **fields)
        )
    )
    [report] = make_judge(server, diagnostics=False, max_reasks=1).evaluate([trajectory()], [rubric])
    judgment = report.judgments[rubric.rubric_id]
    assert judgment.verdict == Verdict.INVALID
    assert message in judgment.error and "malformed verdict" in judgment.error
    assert server.count == 2


def test_nan_in_an_answer_is_not_accepted(serve, key):
    server = serve(
        lambda request: Reply(verdict_line(request, "states-benefit").replace('"confidence": 0.9', '"score": NaN'))
    )
    [report] = make_judge(server, diagnostics=False, max_reasks=0).evaluate([trajectory()], [R3])
    assert report.judgments["states-benefit"].verdict == Verdict.INVALID


def test_two_answers_for_one_rubric_are_ambiguous(serve, key):
    def script(request):
        return Reply(
            verdict_line(request, "cites-order-id", "pass") + "\n" + verdict_line(request, "cites-order-id", "fail")
        )

    [report] = make_judge(serve(script), diagnostics=False, max_reasks=0).evaluate([trajectory()], [R1])
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "ambiguous" in judgment.error


def test_answer_without_this_requests_id_is_not_used(serve, key):
    def script(request):
        return Reply(json.dumps({"request_id": "0123456789abcdef", "rubric_id": "cites-order-id", "verdict": "pass"}))

    [report] = make_judge(serve(script), diagnostics=False, max_reasks=0).evaluate([trajectory()], [R1])
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "request_id" in judgment.error


def test_request_id_check_can_be_turned_off(serve, key):
    server = serve(lambda request: Reply(json.dumps({"rubric_id": "cites-order-id", "verdict": "pass"})))
    [report] = make_judge(server, diagnostics=False, require_request_id=False).evaluate([trajectory()], [R1])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS}


def test_empty_or_null_content_is_reasked_then_invalid(serve, key):
    server = serve(lambda request: Reply(None))
    [report] = make_judge(server, diagnostics=False).evaluate([trajectory()], [R1])
    assert report.judgments["cites-order-id"].verdict == Verdict.INVALID
    assert server.count == 2


# ---- transport failures: time-outs, retries, status codes --------------------------------------


def test_slow_responses_time_out_and_become_invalid(serve, key):
    server = serve(lambda request: Reply(verdict_line(request, "cites-order-id"), delay=5.0))
    judge = make_judge(server, diagnostics=False, timeout=0.3, max_retries=1)
    start = time.monotonic()
    [report] = judge.evaluate([trajectory()], [R1])
    elapsed = time.monotonic() - start
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID
    assert "timed out after 0.3 s" in judgment.error and "2 attempts" in judgment.error
    assert server.count == 2
    assert elapsed < 3.0


def test_500_then_success_is_retried(serve, key):
    def script(request):
        if len(server.requests) == 1:
            return Reply(status=500, body={"error": {"message": "internal"}})
        return all_pass(request)

    server = serve(script)
    [report] = make_judge(server).evaluate([trajectory()], [R1, R2])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS, "no-duplicate-calls": Verdict.PASS}
    assert server.count == 2


def test_429_waits_for_retry_after(serve, key):
    def script(request):
        if len(server.requests) == 1:
            return Reply(status=429, body={"error": {"message": "rate limited"}}, headers={"retry-after": "0.4"})
        return all_pass(request)

    server = serve(script)
    start = time.monotonic()
    [report] = make_judge(server).evaluate([trajectory()], [R1])
    assert time.monotonic() - start >= 0.4
    assert verdicts(report) == {"cites-order-id": Verdict.PASS}
    assert server.count == 2


def test_persistent_503_is_invalid_after_max_retries(serve, key):
    server = serve(lambda request: Reply(status=503, body={"error": {"message": "overloaded"}}))
    [report] = make_judge(server, max_retries=3).evaluate([trajectory()], [R1, R2])
    assert server.count == 4  # one try + max_retries
    for judgment in report.judgments.values():
        assert judgment.verdict == Verdict.INVALID
        assert "HTTP 503" in judgment.error and "after 4 attempts" in judgment.error
    assert report.uncovered == ()


def test_400_is_not_retried(serve, key):
    server = serve(lambda request: Reply(status=400, body={"error": {"message": "context too long"}}))
    # (with structured_outputs="auto" the request is also sent once without response_format, in case the
    # 400 was about that: tests/rwcore/judges/test_judges_structured.py)
    [report] = make_judge(server, max_retries=3, structured_outputs="never").evaluate([trajectory()], [R1])
    assert server.count == 1
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "HTTP 400" in judgment.error and "context too long" in judgment.error


def test_malformed_non_json_body_is_retried_then_invalid(serve, key):
    server = serve(lambda request: Reply(status=200, body=b"<html>gateway hiccup</html>"))
    [report] = make_judge(server, max_retries=2).evaluate([trajectory()], [R1])
    assert server.count == 3
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "malformed response" in judgment.error


def test_malformed_body_then_success(serve, key):
    def script(request):
        return Reply(body=b"{not json") if len(server.requests) == 1 else all_pass(request)

    server = serve(script)
    [report] = make_judge(server).evaluate([trajectory()], [R1])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS}


def test_connection_refused_is_retried_then_invalid(key):
    with ChatServer(all_pass) as server:
        base_url = server.base_url  # a loopback port nobody listens on once the server is gone
    judge = OpenAIJudge(
        "judge-test", base_url=base_url, api_key_env=KEY_ENV, timeout=1.0, max_retries=1, backoff=(0.01, 0.02)
    )
    [report] = judge.evaluate([trajectory()], [R1])
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "connection error" in judgment.error


def test_error_messages_never_echo_the_key(serve, key):
    server = serve(lambda request: Reply(status=401, body={"error": {"message": f"bad key {SECRET}"}}))
    [report] = make_judge(server).evaluate([trajectory()], [R1])
    judgment = report.judgments["cites-order-id"]
    assert judgment.verdict == Verdict.INVALID and "HTTP 401" in judgment.error
    assert SECRET not in judgment.error and "***" in judgment.error


# ---- batching, concurrency, cache --------------------------------------------------------------


def test_batching_and_diagnostics_only_in_the_first_request(serve, key):
    rubrics = [RubricSpec(f"r{i}", f"criterion {i}") for i in range(6)]
    server = serve(all_pass)
    [report] = make_judge(server, rubrics_per_request=4).evaluate([trajectory()], rubrics)
    assert all(j.verdict == Verdict.PASS for j in report.judgments.values())
    assert list(report.judgments) == [f"r{i}" for i in range(6)]
    batches = sorted(server.requests, key=lambda r: len(r.rubric_ids), reverse=True)
    assert [r.rubric_ids for r in batches] == [["r0", "r1", "r2", "r3"], ["r4", "r5"]]
    assert [r.wants_diagnostics for r in batches] == [True, False]
    assert batches[0].pool_ids == [f"r{i}" for i in range(6)]  # the whole pool, for uncovered behaviours
    assert report.uncovered == ("turn 0: the agent never restates the goal",)


def test_concurrency_limit_is_respected(serve, key):
    server = serve(lambda request: Reply(all_pass(request).content, delay=0.15))
    judge = make_judge(server, max_concurrency=3, diagnostics=False)
    reports = judge.evaluate([trajectory(f"t{i}") for i in range(9)], [R1])
    assert len(reports) == 9 and all(verdicts(r) == {"cites-order-id": Verdict.PASS} for r in reports)
    assert server.count == 9
    assert server.max_in_flight == 3


def test_rate_limits_are_applied_to_every_attempt(serve, key):
    server = serve(all_pass)
    judge = make_judge(server, diagnostics=False, requests_per_minute=2, tokens_per_minute=10**6)
    # Shrink the one-minute window so the test is quick; the limiter logic is what is under test.
    judge.client._rpm.period = 0.4
    start = time.monotonic()
    reports = judge.evaluate([trajectory(f"t{i}") for i in range(5)], [R1])
    elapsed = time.monotonic() - start
    assert all(verdicts(r) == {"cites-order-id": Verdict.PASS} for r in reports)
    assert server.count == 5 and elapsed >= 0.8  # 2 + 2 + 1 requests over three windows
    assert judge.client._tpm.in_window() == 5 * 15  # estimates settled to the reported usage


def test_cache_hits_make_no_request_and_keys_follow_content(serve, key, tmp_path):
    server = serve(all_pass)
    judge = make_judge(server, cache_dir=tmp_path / "cache")
    first = judge.evaluate([trajectory()], [R1, R2])
    assert server.count == 1
    second = judge.evaluate([trajectory()], [R1, R2])
    assert server.count == 1  # everything, diagnostics included, came from disk
    assert [verdicts(r) for r in second] == [verdicts(r) for r in first]
    assert second[0].uncovered == first[0].uncovered
    assert second[0].judgments["cites-order-id"].evidence == first[0].judgments["cites-order-id"].evidence

    # A new judge object over the same directory reads the same entries.
    make_judge(server, cache_dir=tmp_path / "cache").evaluate([trajectory()], [R1, R2])
    assert server.count == 1

    # Changing the rubric's text changes its key: only that rubric is asked again.
    changed = RubricSpec(R1.rubric_id, R1.criterion + " Exactly.", R1.applicability, R1.capability)
    judge.evaluate([trajectory()], [changed, R2])
    assert server.count == 2 and server.requests[-1].rubric_ids == ["cites-order-id"]

    # Changing the trajectory changes every key.
    judge.evaluate([trajectory(text="Refund issued.")], [R1, R2])
    assert server.count == 3 and server.requests[-1].rubric_ids == ["cites-order-id", "no-duplicate-calls"]
    assert judge.judgment_key(R1, trajectory()) != judge.judgment_key(R1, trajectory(text="Refund issued."))
    assert judge.judgment_key(R1, trajectory()) != judge.judgment_key(changed, trajectory())
    assert judge.judgment_key(R1, trajectory()) != OpenAIJudge(
        "other-model",
        base_url=server.base_url,
    ).judgment_key(R1, trajectory())

    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert "verdicts.sqlite3" in {p.name for p in files}
    for path in files:  # the database, its write-ahead log and its index: no key, no trajectory text
        data = path.read_bytes()
        assert SECRET.encode() not in data and b"Refund issued" not in data


def test_invalid_judgments_are_not_cached(serve, key, tmp_path):
    def script(request):
        if len(server.requests) <= 3:
            return Reply(status=503, body={})
        return all_pass(request)

    server = serve(script)
    judge = make_judge(server, cache_dir=tmp_path, max_retries=2)
    [report] = judge.evaluate([trajectory()], [R1])
    assert report.judgments["cites-order-id"].verdict == Verdict.INVALID
    [report] = judge.evaluate([trajectory()], [R1])
    assert report.judgments["cites-order-id"].verdict == Verdict.PASS
    assert server.count == 4


def test_corrupt_cache_entry_is_a_miss(serve, key, tmp_path):
    server = serve(all_pass)
    judge = make_judge(server, cache_dir=tmp_path, diagnostics=False)
    judge.evaluate([trajectory()], [R1])
    with contextlib.closing(sqlite3.connect(judge.cache.path)) as raw, raw:
        assert raw.execute("UPDATE verdicts SET value = ?", (b"{truncated",)).rowcount == 1
    [report] = judge.evaluate([trajectory()], [R1])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS} and server.count == 2


# ---- keys, repr, sync/async entry points, bad arguments ----------------------------------------


def test_key_is_read_at_call_time_and_never_shown(serve, monkeypatch, tmp_path):
    server = serve(all_pass)
    monkeypatch.setenv(KEY_ENV, "first-key-value")
    judge = make_judge(server, cache_dir=tmp_path)
    monkeypatch.setenv(KEY_ENV, SECRET)
    judge.evaluate([trajectory()], [R1])
    assert server.requests[-1].headers["authorization"] == f"Bearer {SECRET}"
    shown = repr(judge) + repr(judge.client) + repr(vars(judge)) + repr(vars(judge.client))
    assert SECRET not in shown and "first-key-value" not in shown
    assert SECRET.encode() not in pickle.dumps(judge)


def test_missing_key_uses_a_placeholder_for_a_base_url(serve, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    server = serve(all_pass)
    [report] = make_judge(server).evaluate([trajectory()], [R1])
    assert verdicts(report) == {"cites-order-id": Verdict.PASS}
    assert server.requests[0].headers["authorization"] == "Bearer EMPTY"


def test_missing_key_for_the_default_endpoint_fails_before_any_request(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    judge = OpenAIJudge("gpt-test", api_key_env=KEY_ENV)
    with pytest.raises(MissingAPIKeyError, match=KEY_ENV):
        judge.evaluate([trajectory()], [R1])


def test_aevaluate_and_evaluate_inside_a_running_loop(serve, key):
    server = serve(all_pass)
    judge = make_judge(server)

    async def main():
        from_async = await judge.aevaluate([trajectory("a")], [R1])
        from_sync = judge.evaluate([trajectory("b")], [R1])  # runs on a worker thread's loop
        return from_async, from_sync

    from_async, from_sync = asyncio.run(main())
    assert verdicts(from_async[0]) == verdicts(from_sync[0]) == {"cites-order-id": Verdict.PASS}


def test_one_judge_from_several_threads(serve, key):
    server = serve(all_pass)
    judge = make_judge(server, diagnostics=False)
    results = []

    def work(i):
        results.append(judge.evaluate([trajectory(f"t{i}")], [R1, R2]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and server.count == 4


def test_empty_inputs_make_no_request(serve, key):
    server = serve(all_pass)
    judge = make_judge(server)
    assert judge.evaluate([], [R1]) == []
    [report] = judge.evaluate([trajectory()], [])
    assert report.judgments == {} and report.uncovered == ()
    assert server.count == 0


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"timeout": -1}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"backoff": (2.0, 1.0)}, "backoff"),
        ({"rubrics_per_request": 0}, "rubrics_per_request"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"tokens_per_minute": float("nan")}, "tokens_per_minute"),
        ({"pass_threshold": 1.5}, "pass_threshold"),
        ({"temperature": 3.0}, "temperature"),
        ({"api_key_env": ""}, "api_key_env"),
    ],
)
def test_bad_options_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        OpenAIJudge("m", base_url="http://127.0.0.1:9/v1", **kwargs)


def test_bad_arguments_to_evaluate(serve, key):
    judge = make_judge(serve(all_pass))
    with pytest.raises(ValueError, match="rubrics"):
        judge.evaluate([trajectory()], [R1, R1])
    with pytest.raises(ValueError, match=r"trajectories\[0\]"):
        judge.evaluate(["not a trajectory"], [R1])
    with pytest.raises(ValueError, match=r"rubrics\[0\]"):
        judge.evaluate([trajectory()], ["cites-order-id"])
