"""OpenAIReflector: every method against the loopback chat server, valid and malformed answers."""

from __future__ import annotations

import json

import pytest
from _util import chat_trajectory
from judge_server import (
    ChatServer,
    Reply,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
)

from rwcore.judges import OpenAIReflector, ReflectionError
from rwcore.types import AttributionRecord, RubricSkillProposal, RubricSpec, Trajectory

KEY_ENV = "RWCORE_TEST_JUDGE_KEY"
SECRET = "sk-test-reflector-7e1d"

EXISTING = [
    RubricSpec("verify-output", "The agent checks its output against the requirements.", capability="Verification")
]
LIBRARY = [
    RubricSpec(
        "use-key-information",
        "Uses the key information the partner disclosed.",
        applicability="The partner disclosed decision-relevant information.",
        capability="Information",
        evaluator_prompt="Score 1 when ...",
        scored=True,
    ),
    RubricSpec("state-benefits", "States concrete benefits.", capability="Persuasion", scored=True),
]


def trajectory(i: int = 0, outcome: float = 0.0) -> Trajectory:
    return chat_trajectory(
        f"task{i}", "I wrote it. All tests pass.", outcome, request=f"Task {i}: write the report.", tags=("reporting",)
    )


def reflector_for(server: ChatServer, **options) -> OpenAIReflector:
    settings = dict(base_url=server.base_url, api_key_env=KEY_ENV, timeout=2.0, max_retries=1, backoff=(0.01, 0.02))
    settings.update(options)
    return OpenAIReflector("reflect-test", **settings)


def kind(request) -> str:
    system = request.system
    for marker, name in (
        ("You analyse one rollout", "analysis"),
        ("You are the reflection model", "generation"),
        ("You improve the guidance", "refinement"),
        ("You diagnose why", "attribution"),
        ("You maintain the capability library", "proposal"),
    ):
        if marker in system:
            return name
    raise AssertionError("unknown prompt")


def answer(request, **fields) -> str:
    return json.dumps({"request_id": request.request_id, **fields})


ANALYSIS = {
    "issues": [
        {
            "behavior": "Claims tests pass without running them.",
            "signal": 'turn 1: "All tests pass."',
            "capability": "Verification",
            "covered_by": "verify-output",
        },
        {
            "behavior": "Skips reading the spec.",
            "signal": "turn 1",
            "capability": "Understanding",
            "covered_by": "no-such-rubric",
        },
    ],
    "strategies": [],
}
PROPOSAL = {
    "rubric_id": "run-tests-before-claiming",
    "capability": "Verification",
    "applicability": "The agent claims tests pass.",
    "criterion": "A test run precedes the claim.",
    "pass_when": "A test command and its passing output appear before the claim.",
    "fail_when": "The claim has no test run before it.",
    "skill": "Before saying tests pass, run them and read the output.",
    "evidence": "T0, T3: claims passing tests with no test run; T5 runs them first.",
}


# ---- Arise: trajectory analysis -----------------------------------------------------------------


def test_analyze_trajectories_returns_jsonl_without_outcomes(serve, key):
    server = serve(lambda request: Reply(answer(request, **ANALYSIS)))
    text = reflector_for(server).analyze_trajectories([trajectory(0, 0.0), trajectory(1, 1.0)], EXISTING)
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["trajectory"] for line in lines] == ["T0", "T1"]
    assert lines[0]["task_id"] == "task0" and lines[0]["tags"] == ["reporting"]
    assert "outcome" not in text
    issues = lines[0]["issues"]
    assert issues[0]["covered_by"] == "verify-output" and issues[1]["covered_by"] is None
    assert server.count == 2 and {kind(r) for r in server.requests} == {"analysis"}
    assert "verify-output" in server.requests[0].system
    assert server.requests[0].data["trajectory"]["outcome"] in (0.0, 1.0)  # auxiliary context for the analyst


def test_analysis_with_bad_capability_is_reasked_and_failed_trajectories_left_out(serve, key):
    def script(request):
        if request.data["trajectory"]["task_id"] == "task1":
            return Reply("I cannot analyse this.")
        if len([r for r in server.requests if r.data["trajectory"]["task_id"] == "task0"]) == 1:
            bad = {**ANALYSIS, "issues": [{**ANALYSIS["issues"][0], "capability": "Telepathy"}]}
            return Reply(answer(request, **bad))
        return Reply(answer(request, **ANALYSIS))

    server = serve(script)
    text = reflector_for(server, max_reasks=1).analyze_trajectories([trajectory(0), trajectory(1)])
    assert [json.loads(line)["trajectory"] for line in text.splitlines()] == ["T0"]
    assert server.count == 4


def test_analysis_failing_everywhere_raises(serve, key):
    server = serve(lambda request: Reply("no json here"))
    with pytest.raises(ReflectionError, match="every trajectory"):
        reflector_for(server).analyze_trajectories([trajectory(0)])
    assert reflector_for(server).analyze_trajectories([]) == ""


# ---- Arise: rubric–skill generation -------------------------------------------------------------


def test_propose_rubric_skills_from_given_diagnostics(serve, key):
    second = {**PROPOSAL, "rubric_id": "read-spec-first", "capability": "Understanding"}
    server = serve(lambda request: Reply("```json\n" + answer(request, proposals=[PROPOSAL, second]) + "\n```"))
    proposals = reflector_for(server).propose_rubric_skills([], EXISTING, 8, diagnostics='{"issues": []}')
    assert server.count == 1 and kind(server.requests[0]) == "generation"
    assert server.requests[0].data == {"diagnostics": '{"issues": []}'}
    assert "verify-output" in server.requests[0].system
    assert all(isinstance(p, RubricSkillProposal) for p in proposals)
    first = proposals[0]
    assert first.rubric == RubricSpec(
        "run-tests-before-claiming",
        "A test run precedes the claim.",
        "The agent claims tests pass.",
        "Verification",
        "Pass when: A test command and its passing output appear before the claim.\n"
        "Fail when: The claim has no test run before it.",
    )
    assert first.skill == PROPOSAL["skill"] and first.evidence == PROPOSAL["evidence"]
    assert [p.rubric.rubric_id for p in proposals] == ["run-tests-before-claiming", "read-spec-first"]


def test_propose_rubric_skills_analyses_trajectories_first_and_truncates_to_max_new(serve, key):
    def script(request):
        if kind(request) == "analysis":
            return Reply(answer(request, **ANALYSIS))
        proposals = [{**PROPOSAL, "rubric_id": f"rubric-{i}"} for i in range(5)]
        return Reply(answer(request, proposals=proposals))

    server = serve(script)
    proposals = reflector_for(server).propose_rubric_skills([trajectory(0), trajectory(1)], EXISTING, 2)
    assert [p.rubric.rubric_id for p in proposals] == ["rubric-0", "rubric-1"]
    assert [kind(r) for r in server.requests].count("analysis") == 2
    generation = [r for r in server.requests if kind(r) == "generation"]
    assert len(generation) == 1
    # The generator sees compressed diagnostics, never outcomes or transcripts.
    assert "outcome" not in generation[0].user
    diagnostics = [json.loads(line) for line in generation[0].data["diagnostics"].splitlines()]
    assert [set(d) for d in diagnostics] == [{"trajectory", "task_id", "tags", "issues", "strategies"}] * 2


@pytest.mark.parametrize(
    "bad, message",
    [
        ({**PROPOSAL, "rubric_id": "verify-output"}, "already exists"),
        ({**PROPOSAL, "rubric_id": "other", "capability": "Magic"}, '"capability"'),
        ({**PROPOSAL, "rubric_id": "other", "skill": ""}, '"skill"'),
        ({**PROPOSAL, "rubric_id": "has spaces"}, '"rubric_id"'),
        ("not an object", "must be an object"),
    ],
)
def test_malformed_proposals_raise_after_reasks(serve, key, bad, message):
    server = serve(lambda request: Reply(answer(request, proposals=[PROPOSAL, bad])))
    with pytest.raises(ReflectionError, match="proposals\\[1\\]") as raised:
        reflector_for(server, max_reasks=2).propose_rubric_skills([], EXISTING, 8, diagnostics="evidence")
    assert message in str(raised.value)
    assert server.count == 3


def test_duplicate_new_ids_are_refused(serve, key):
    server = serve(lambda request: Reply(answer(request, proposals=[PROPOSAL, PROPOSAL])))
    with pytest.raises(ReflectionError, match="proposed twice"):
        reflector_for(server, max_reasks=0).propose_rubric_skills([], EXISTING, 8, diagnostics="evidence")


def test_propose_nothing_when_nothing_to_do(serve, key):
    server = serve(lambda request: Reply(answer(request, proposals=[])))
    reflector = reflector_for(server)
    assert reflector.propose_rubric_skills([trajectory()], EXISTING, 0) == []
    assert reflector.propose_rubric_skills([], EXISTING, 4) == []
    assert server.count == 0
    assert reflector.propose_rubric_skills([], EXISTING, 4, diagnostics="some evidence") == []
    assert server.count == 1


# ---- Arise: skill refinement --------------------------------------------------------------------


def test_refine_skill(serve, key):
    server = serve(
        lambda request: Reply(
            "Here you go: " + answer(request, diagnosis="ignored", skill="  Run the tests, then quote their output.  ")
        )
    )
    skill = reflector_for(server).refine_skill(EXISTING[0], "Check your work.", [trajectory(0), trajectory(1)])
    assert skill == "Run the tests, then quote their output."
    [request] = server.requests
    assert kind(request) == "refinement"
    assert '"Check your work."' in request.system and "verify-output" in request.system
    assert [f["ref"] for f in request.data["failures"]] == ["T0", "T1"]


def test_refine_skill_rejects_empty_answers_and_arguments(serve, key):
    server = serve(lambda request: Reply(answer(request, skill="   ")))
    reflector = reflector_for(server)
    with pytest.raises(ReflectionError, match='"skill" must not be empty'):
        reflector.refine_skill(EXISTING[0], "Check your work.", [trajectory()])
    with pytest.raises(ValueError, match="failures"):
        reflector.refine_skill(EXISTING[0], "Check your work.", [])
    with pytest.raises(ValueError, match="skill"):
        reflector.refine_skill(EXISTING[0], "", [trajectory()])
    with pytest.raises(ValueError, match="rubric"):
        reflector.refine_skill("verify-output", "Check.", [trajectory()])


def test_two_skill_objects_are_ambiguous(serve, key):
    server = serve(lambda request: Reply(answer(request, skill="A") + "\n" + answer(request, skill="B")))
    with pytest.raises(ReflectionError, match="ambiguous"):
        reflector_for(server, max_reasks=0).refine_skill(EXISTING[0], "Check.", [trajectory()])


# ---- RewardWeaver: failure attribution ----------------------------------------------------------


def record(request, capability_id, **fields) -> str:
    values = {
        "capability_id": capability_id,
        "deficit": True,
        "confidence": 0.8,
        "evidence": 'turn 1: "All tests pass."',
        "cause": "policy",
    }
    values.update(fields)
    return answer(request, **values)


def test_attribute_returns_records_in_candidate_order(serve, key):
    def script(request):
        assert kind(request) == "attribution"
        return Reply(
            "\n".join(
                [
                    record(request, "state-benefits", deficit=False, evidence="", cause="Partner"),
                    record(request, "use-key-information"),
                ]
            )
        )

    server = serve(script)
    records = reflector_for(server).attribute(trajectory(), LIBRARY)
    assert records == [
        AttributionRecord("task0/g/0", "use-key-information", True, 0.8, 'turn 1: "All tests pass."', "policy"),
        AttributionRecord("task0/g/0", "state-benefits", False, 0.8, "", "partner"),
    ]
    assert server.requests[0].candidate_ids == ["use-key-information", "state-benefits"]


def test_attribute_batches_candidates_and_omits_unanswered_ones(serve, key):
    candidates = [RubricSpec(f"cap-{i}", f"definition {i}") for i in range(5)]

    def script(request):
        return Reply("\n".join(record(request, c) for c in request.candidate_ids if c != "cap-3"))

    server = serve(script)
    records = reflector_for(server, candidates_per_request=2, max_reasks=1).attribute(trajectory(), candidates)
    assert [r.capability_id for r in records] == ["cap-0", "cap-1", "cap-2", "cap-4"]
    asked = sorted(tuple(r.candidate_ids) for r in server.requests)
    assert asked == [("cap-0", "cap-1"), ("cap-2", "cap-3"), ("cap-3",), ("cap-4",)]


@pytest.mark.parametrize("fields", [{"cause": "blame"}, {"deficit": "yes"}, {"confidence": 2}, {"confidence": None}])
def test_attribute_schema_violations(serve, key, fields):
    server = serve(lambda request: Reply(record(request, "state-benefits", **fields)))
    with pytest.raises(ReflectionError, match="no valid record"):
        reflector_for(server, max_reasks=1).attribute(trajectory(), [LIBRARY[1]])
    assert server.count == 2


def test_attribute_transport_failure_raises(serve, key):
    server = serve(lambda request: Reply(status=503, body={"error": {"message": "down"}}))
    with pytest.raises(ReflectionError, match="HTTP 503"):
        reflector_for(server, max_retries=1).attribute(trajectory(), LIBRARY)
    assert server.count == 2
    assert reflector_for(server).attribute(trajectory(), []) == []


# ---- RewardWeaver: capability proposal ----------------------------------------------------------

CAPABILITY = {
    "capability_id": "clear-expression",
    "family": "Goal expression",
    "definition": "States requests in concrete, plain language.",
    "applicability": "The agent makes a request or proposal.",
    "evaluator_instructions": "Decide applicability first; full credit when ...",
    "support": ["T0", "T1"],
}


def test_propose_capabilities(serve, key):
    weak = {**CAPABILITY, "capability_id": "one-off", "support": ["T2"]}
    server = serve(lambda request: Reply(answer(request, proposals=[CAPABILITY, weak])))
    failures = [trajectory(i) for i in range(3)]
    proposals = reflector_for(server, min_support=2).propose_capabilities(failures, LIBRARY, 4)
    assert proposals == [
        RubricSpec(
            "clear-expression",
            CAPABILITY["definition"],
            CAPABILITY["applicability"],
            "Goal expression",
            CAPABILITY["evaluator_instructions"],
            scored=True,
        )
    ]
    [request] = server.requests
    assert kind(request) == "proposal" and "use-key-information" in request.system
    assert [f["ref"] for f in request.data["failures"]] == ["T0", "T1", "T2"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({**CAPABILITY, "support": ["T9"]}, "unknown trajectories"),
        ({**CAPABILITY, "capability_id": "state-benefits"}, "already exists"),
        ({**CAPABILITY, "evaluator_instructions": ""}, '"evaluator_instructions"'),
        ({**CAPABILITY, "support": "T0"}, '"support" must be a list'),
    ],
)
def test_malformed_capability_proposals_raise(serve, key, bad, message):
    server = serve(lambda request: Reply(answer(request, proposals=[bad])))
    with pytest.raises(ReflectionError, match=message):
        reflector_for(server, max_reasks=0).propose_capabilities([trajectory(0), trajectory(1)], LIBRARY, 4)


def test_propose_capabilities_shows_at_most_the_configured_number_of_failures(serve, key):
    server = serve(lambda request: Reply(answer(request, proposals=[])))
    reflector = reflector_for(server, max_trajectories_per_request=2)
    assert reflector.propose_capabilities([trajectory(i) for i in range(5)], LIBRARY, 3) == []
    assert len(server.requests[0].data["failures"]) == 2
    assert reflector.propose_capabilities([], LIBRARY, 3) == []
    assert server.count == 1


# ---- shared ------------------------------------------------------------------------------------


def test_non_json_answers_raise_after_reasks(serve, key):
    server = serve(lambda request: Reply("I'm sorry, I can't help with that."))
    with pytest.raises(ReflectionError, match="no usable answer after 3 request"):
        reflector_for(server, max_reasks=2).refine_skill(EXISTING[0], "Check.", [trajectory()])
    assert server.count == 3


def test_repr_and_state_never_hold_the_key(serve, key):
    server = serve(lambda request: Reply(answer(request, skill="ok")))
    reflector = reflector_for(server)
    reflector.refine_skill(EXISTING[0], "Check.", [trajectory()])
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(reflector) + repr(vars(reflector)) + repr(vars(reflector.client))


def test_reflector_implements_the_protocols():
    from rwcore.types import Attributor, CapabilityProposer, RubricReflector

    reflector = OpenAIReflector("m", base_url="http://127.0.0.1:9/v1")
    assert isinstance(reflector, RubricReflector)
    assert isinstance(reflector, Attributor)
    assert isinstance(reflector, CapabilityProposer)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"capabilities": []}, "capabilities"),
        ({"capabilities": ["A", "A"]}, "capabilities"),
        ({"min_support": 0}, "min_support"),
        ({"max_trajectories_per_request": 0}, "max_trajectories_per_request"),
        ({"max_reasks": -1}, "max_reasks"),
    ],
)
def test_bad_reflector_options(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        OpenAIReflector("m", base_url="http://127.0.0.1:9/v1", **kwargs)
