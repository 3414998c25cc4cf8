"""`rw train judge.kind=openai` end to end against a loopback OpenAI-compatible server that plays the judge
and the reflection model: the LLM judge is the evaluator admitted to the library and the one that
scores training, and the same server's reflection model generates Arise's rubrics, refines skills,
attributes RewardWeaver's failures and proposes capabilities."""

from __future__ import annotations

import json
import re
import threading

import pytest
from _util import metrics_rows
from judge_server import (
    ChatServer,
    Reply,
    completion,
    diagnostics_line,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
    verdict_line,
)

from rwcore.trainer.config import load_config
from rwcore.trainer.envs.negotiation.annotator import ANNOTATORS, annotate
from rwcore.trainer.trainer import Trainer
from rwcore.types import Trajectory, Turn

KEY_ENV = "RWCORE_TEST_LLM_KEY"
SMALL = [
    "model.init=random",  # these tests are about the loop, not the reading prior
    "env.options.num_train=24",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=3",
    "rollout.group_size=3",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "pool.delta_pool=2",
    "rewardweaver.adaptation_interval=2",
    "rewardweaver.min_support=1",
    "rewardweaver.diagnosis_tasks=2",
    "rewardweaver.diagnostic_tasks=2",
    "rewardweaver.success_sample=2",
]


def answer(request, **fields) -> str:
    return json.dumps({"request_id": request.request_id, **fields})


def transcript(request) -> Trajectory:
    data = request.data["trajectory"]
    turns = [Turn(t["role"], t["content"], t["by_agent"]) for t in data["turns"]]
    return Trajectory(data["task_id"], turns, data.get("outcome", 0.0), trajectory_id="x")


class Server:
    """Judges by reading the transcript (the reference annotator, so admission can pass); reflects with
    fixed, valid answers. Counts requests per kind."""

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}
        self.generated = 0

    def __call__(self, request) -> Reply:
        system = request.system
        for marker, kind in (
            ("careful, impartial evaluator", "judge"),
            ("You analyse one rollout", "analysis"),
            ("You are the reflection model", "generation"),
            ("You improve the guidance", "refinement"),
            ("You diagnose why", "attribution"),
            ("You maintain the capability library", "proposal"),
            ("You calibrate the evaluator", "revision"),
        ):
            if marker in system:
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
                return getattr(self, kind)(request)
        raise AssertionError("unexpected prompt")

    def judge(self, request) -> Reply:
        lines = []
        for rubric_id in request.rubric_ids:
            if rubric_id in ANNOTATORS:
                verdict = {"PASS": "pass", "FAIL": "fail", "NA": "na"}[annotate(rubric_id, transcript(request)).name]
            else:
                verdict = "fail" if len(request.user) % 2 else "pass"
            lines.append(verdict_line(request, rubric_id, verdict))
        if request.wants_diagnostics:
            lines.append(diagnostics_line(request, ["turn 1: the seller never states a price"]))
        return Reply("\n".join(lines))

    def analysis(self, request) -> Reply:
        return Reply(
            answer(
                request,
                issues=[
                    {
                        "behavior": "offers without asking",
                        "signal": "turn 2",
                        "capability": "Understanding",
                        "covered_by": None,
                    }
                ],
                strategies=[],
            )
        )

    def generation(self, request) -> Reply:
        self.generated += 1
        proposals = [
            {
                "rubric_id": f"llm-rubric-{self.generated}",
                "capability": "Understanding",
                "criterion": "The seller asks before it offers.",
                "applicability": "",
                "pass_when": "an ask precedes the first offer",
                "fail_when": "it does not",
                "skill": "ask budget before you offer",
                "evidence": "R0, R1",
            }
        ]
        return Reply(answer(request, proposals=proposals))

    def refinement(self, request) -> Reply:
        return Reply(answer(request, diagnosis="too vague", skill="first ask budget then offer"))

    def attribution(self, request) -> Reply:
        lines = [
            answer(
                request, capability_id=cid, deficit=True, confidence=0.9, evidence="turn 2: offer 200", cause="policy"
            )
            for cid in request.candidate_ids
        ]
        return Reply("\n".join(lines))

    def proposal(self, request) -> Reply:
        return Reply(answer(request, proposals=[]))

    def revision(self, request) -> Reply:
        return Reply(
            answer(
                request,
                diagnosis="applicability unclear",
                evaluator_instructions="Decide applicability from the brief first.",
            )
        )


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-llm-wiring-5f2a")
    script = Server()
    with ChatServer(script) as chat:
        chat.script_state = script
        yield chat


def test_the_llm_judge_is_admitted_and_scores_training_and_the_reflection_model_is_wired(server, tmp_path):
    overrides = [
        *SMALL,
        "train.steps=4",
        "train.method=combined",
        "judge.kind=openai",
        "judge.model=judge-test",
        f"judge.base_url={server.base_url}",
        f"judge.api_key_env={KEY_ENV}",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    method = trainer.method
    from rwcore.judges import OpenAIJudge, OpenAIReflector

    assert isinstance(trainer.judge, OpenAIJudge)
    library = method.weaver.library
    assert library.ids() and {library[c].evaluator for c in library.ids()} == {"OpenAIJudge:judge-test"}
    assert method.providers.evaluator is trainer.judge
    reflector = method.providers.reflector
    assert isinstance(reflector, OpenAIReflector)
    assert method.providers.attributor is reflector and method.providers.proposer is reflector
    assert method.providers.reviser is reflector and method.weaver._reviser is reflector
    trainer.train()
    kinds = server.script_state.kinds
    assert kinds["judge"] > 0 and kinds["attribution"] > 0  # RewardWeaver's attribution asked the LLM
    assert kinds.get("revision", 0) >= 1  # a rejected candidate was revised from its development cases
    assert kinds.get("generation", 0) >= 1  # Arise's rubrics came from the reflection model ...
    assert any(rid.startswith("llm-rubric-") for rid in method.pool.rubric_ids())
    events = json.loads((tmp_path / "run" / "pool_events.json").read_text())
    assert min(e["step"] for e in events if e["kind"] == "created") == 2  # ... at the first scheduled update
    secret = "sk-test-llm-wiring-5f2a"
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".yaml"):
            assert secret not in path.read_text()
    assert all(r.headers.get("authorization") == f"Bearer {secret}" for r in server.requests)
    assert re.fullmatch(r"[0-9a-f]{16}", server.requests[-1].request_id)


def test_every_metrics_row_says_what_the_llm_roles_cost_and_it_matches_the_server(monkeypatch, tmp_path):
    """judge/* and reflector/* in every row, partitioning all requests (admission and the first diagnosis count
    in the first row), equal to what the server received and the usage it reported; prices give the cost."""
    monkeypatch.setenv(KEY_ENV, "sk-test-llm-wiring-5f2a")
    script = Server()
    seen: list[tuple[str, int, int, int]] = []  # (role, status, prompt tokens, completion tokens) per request
    lock = threading.Lock()

    def scripted(request):
        role = "judge" if "careful, impartial evaluator" in request.system else "reflector"
        reply = script(request)
        with lock:
            first_judge = role == "judge" and not any(r == "judge" for r, *_ in seen)
            if first_judge:  # one rate-limited answer: retried, counted as a request, a retry and a 429
                seen.append((role, 429, 0, 0))
                return Reply(status=429, body={"error": {"message": "slow down"}}, headers={"retry-after": "0"})
            prompt, completion = len(json.dumps(request.body)) % 97 + 1, len(seen) % 13 + 1
            seen.append((role, 200, prompt, completion))
        body = completion_body(reply.content, prompt, completion)
        return Reply(body=body)

    with ChatServer(scripted) as server:
        overrides = [
            *SMALL,
            "train.steps=3",
            "train.method=combined",
            "judge.kind=openai",
            "judge.model=judge-test",
            f"judge.base_url={server.base_url}",
            f"judge.api_key_env={KEY_ENV}",
            "judge.price_in=2.5",
            "judge.price_out=10",
        ]
        trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
        trainer.setup()
        trainer.train()
    rows = metrics_rows(tmp_path / "run")
    names = ("requests", "prompt_tokens", "completion_tokens", "cache_hits", "retries", "rate_limited", "failed")
    for row in rows:
        assert all(f"{role}/{name}" in row for role in ("judge", "reflector") for name in names), row["kind"]
    for role in ("judge", "reflector"):
        mine = [s for s in seen if s[0] == role]
        assert sum(r[f"{role}/requests"] for r in rows) == len(mine) > 0
        assert sum(r[f"{role}/prompt_tokens"] for r in rows) == sum(s[2] for s in mine)
        assert sum(r[f"{role}/completion_tokens"] for r in rows) == sum(s[3] for s in mine)
        assert sum(r[f"{role}/rate_limited"] for r in rows) == sum(s[1] == 429 for s in mine)
        assert sum(r[f"{role}/retries"] for r in rows) == sum(s[1] == 429 for s in mine)
        cost = (sum(s[2] for s in mine) * 2.5 + sum(s[3] for s in mine) * 10) / 1e6
        assert rows[-1][f"{role}/cost_total"] == pytest.approx(cost, rel=1e-12)
        assert sum(r[f"{role}/cost"] for r in rows) == pytest.approx(cost, rel=1e-12)
    assert sum(r["judge/rate_limited"] for r in rows) == 1
    train = [r for r in rows if r["kind"] == "train"]
    assert all(r["time/judge"] > 0 and r["time/judge_wait"] <= r["time/judge"] + 1e-9 for r in train)


def completion_body(content, prompt_tokens: int, completion_tokens: int) -> dict:
    body = completion(content)
    body["usage"] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return body


def test_judging_overlapped_with_generation_gives_the_same_run(monkeypatch, tmp_path):
    """judge.overlap: each group is judged as soon as its episodes end; the same requests, so the same verdicts,
    rewards, advantages and metrics as judging after the step's rollouts (timings aside)."""
    monkeypatch.setenv(KEY_ENV, "sk-test-llm-wiring-5f2a")
    rows = {}
    for overlap in ("false", "true"):
        with ChatServer(Server()) as server:  # a fresh scripted server each: the same answers to the same requests
            overrides = [
                *SMALL,
                "train.steps=3",
                "train.method=combined",
                "judge.kind=openai",
                "judge.model=judge-test",
                f"judge.base_url={server.base_url}",
                f"judge.api_key_env={KEY_ENV}",
                f"judge.overlap={overlap}",
            ]
            trainer = Trainer(load_config(None, overrides), tmp_path / overlap, quiet=True)
            trainer.setup()
            trainer.train()
        rows[overlap] = [json.loads(line) for line in (tmp_path / overlap / "metrics.jsonl").read_text().splitlines()]
    timing = ("time/", "judge/seconds", "reflector/seconds")

    def comparable(row):
        return {key: value for key, value in row.items() if not key.startswith(timing)}

    assert [comparable(r) for r in rows["true"]] == [comparable(r) for r in rows["false"]]
    train = [r for r in rows["true"] if r["kind"] == "train"]
    assert all(0 <= r["time/judge_wait"] <= r["time/judge"] + 1e-6 for r in train)
    assert sum(r["judge/requests"] for r in train) > 0
