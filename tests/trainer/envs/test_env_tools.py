"""env.name=tools: every task is solvable (the oracle), verifiers refuse wrong work, bad and hostile tool calls
come back as tool errors in the transcript, the rules read observable behaviour, and `rw train` runs on it with
the built-in policy and the rule judge, and with a real vLLM server as judge and reflector."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections import Counter

import pytest
from _util import SMALL_METHOD, metrics_rows, overrides_with

from rwcore.judges import RuleJudge
from rwcore.trainer import cli
from rwcore.trainer.config import load_config
from rwcore.trainer.envs import make
from rwcore.trainer.envs.base import rule_spec, step_all
from rwcore.trainer.envs.tools import KINDS, TOOL_SCHEMAS, OraclePolicy, ToolsEnv, parse_call, run_episode
from rwcore.trainer.envs.tools.providers import ToolsAttributor
from rwcore.trainer.envs.tools.rubrics import INITIAL_LIBRARY, RULES_BY_ID
from rwcore.trainer.method_setup import admit_library
from rwcore.trainer.policy import WordCodec
from rwcore.trainer.trainer import Trainer
from rwcore.verdict import Verdict


@pytest.fixture(scope="module")
def env():
    environment = make("tools", num_train=15, num_eval=10)
    yield environment
    environment.close()


def _play(env, tasks, policies):
    """All episodes advanced together, one step_many per turn (as the trainer does)."""
    episodes = [env.reset(task, 0) for task in tasks]
    while any(not e.done for e in episodes):
        live = [i for i, e in enumerate(episodes) if not e.done]
        actions = [policies[i](episodes[i].observation) for i in live]
        for i, nxt in zip(live, step_all(env, [episodes[i] for i in live], actions)):
            episodes[i] = nxt
    return episodes


def test_oracle_solves_every_task_of_both_splits(env):
    tasks = env.tasks("train") + env.tasks("eval")
    kinds = Counter((t.tags[0], t.data["difficulty"]) for t in tasks)
    assert {k for k, _ in kinds} == set(KINDS) and len(kinds) >= 8  # every type, most in both difficulties
    episodes = _play(env, tasks, [OraclePolicy(t) for t in tasks])
    outcomes = [env.outcome(e) for e in episodes]
    failed = [(t.task_id, o.reason) for t, o in zip(tasks, outcomes) if not o.success]
    assert failed == []
    assert all(o.reward == 1.0 for o in outcomes)
    assert all(e.state["sandbox"] is None for e in episodes) and env._boxes == {}  # every sandbox closed


def test_splits_are_seeded_disjoint_and_balanced():
    a, b = ToolsEnv(seed=3, num_train=20, num_eval=10), ToolsEnv(seed=3, num_train=20, num_eval=10)
    other = ToolsEnv(seed=4, num_train=20, num_eval=10)
    assert [t.data for t in a.tasks("train")] == [t.data for t in b.tasks("train")]
    assert [t.data for t in a.tasks("train")] != [t.data for t in other.tasks("train")]
    train = {json.dumps(t.data, sort_keys=True) for t in a.tasks("train")}
    evals = {json.dumps(t.data, sort_keys=True) for t in a.tasks("eval")}
    assert len(train) == 20 and len(evals) == 10 and not train & evals
    assert Counter(t.tags[0] for t in a.tasks("train")) == {k: 4 for k in KINDS}
    with pytest.raises(ValueError, match="split"):
        a.tasks("test")


def _task(env, kind):
    return next(t for t in env.tasks("train") if t.tags[0] == kind)


def test_verifiers_refuse_wrong_or_unverified_work(env):
    # the right number without fixing the script: the verifier re-runs stats.py and refuses
    fix = _task(env, "fix_bug")
    lazy = run_episode(env, fix, lambda obs: json.dumps({"answer": str(fix.data["expected"])}))
    assert lazy.outcome == 0.0 and "printed" in lazy.metadata["env_state"]["verdict"]["reason"]
    # a wrong number, a file with the wrong content, no answer at all
    compute = _task(env, "compute")
    wrong = run_episode(env, compute, lambda obs: json.dumps({"answer": str(float(compute.data["expected"]) + 1)}))
    assert wrong.outcome == 0.0
    write = _task(env, "write_file")
    bad_file = iter(
        [
            json.dumps({"tool": "shell", "cmd": "mkdir -p notes && echo wrong > notes/summary.txt"}),
            json.dumps({"answer": "done"}),
        ]
    )
    assert run_episode(env, write, lambda obs: next(bad_file)).outcome == 0.0
    silent = run_episode(env, _task(env, "search"), lambda obs: json.dumps({"tool": "shell", "cmd": "ls docs"}))
    assert silent.outcome == 0.0 and len(silent.metadata["env_state"]["events"]) == env.max_turns
    assert "no answer" in silent.metadata["env_state"]["verdict"]["reason"]


def test_parse_call_formats():
    assert parse_call('{"tool": "python", "code": "print(1)"}') == ("python", "print(1)")
    assert parse_call('sure: {"tool": "shell", "cmd": "ls"} then more') == ("shell", "ls")
    assert parse_call('{ "tool" : "shell" , "cmd" : "ls" }') == ("shell", "ls")
    assert parse_call('{"answer": 42}') == ("answer", "42")
    qwen = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2)"}}\n</tool_call>'
    assert parse_call(qwen) == ("python", "print(2)")
    assert parse_call('<tool_call>{"name": "shell", "arguments": "{\\"cmd\\": \\"pwd\\"}"}</tool_call>') == (
        "shell",
        "pwd",
    )
    assert parse_call('<tool_call>{"name": "answer", "arguments": {"answer": "teal"}}</tool_call>') == (
        "answer",
        "teal",
    )
    for bad, why in [
        ("hello", "no tool call"),
        ('{"tool": "rm", "cmd": "x"}', "unknown tool"),
        ('{"tool": "python"}', "non-empty string 'code'"),
        ('{"tool": "shell", "cmd": 5}', "'cmd'"),
        ('{"answer": [1]}', "answer must be a string"),
        ("x" * 9000, "9000 characters"),
        (None, "not text"),
        ('<tool_call>{"name": "python", "arguments": "{oops"}</tool_call>', "not valid JSON"),
    ]:
        kind, message = parse_call(bad)
        assert kind == "error" and why in message, (bad, message)
    # the schemas are OpenAI function schemas naming the three tools
    assert [s["function"]["name"] for s in TOOL_SCHEMAS] == ["python", "shell", "answer"]


def test_bad_and_hostile_calls_are_tool_errors_in_the_transcript(env, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-in-the-sandbox-42")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    small = ToolsEnv(num_train=5, num_eval=1, max_turns=9, max_call_chars=600, wall_seconds=3.0)
    calls = [
        "let me think",  # no call
        "x" * 700,  # too long
        json.dumps({"tool": "python", "code": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)"}),
        json.dumps(
            {
                "tool": "shell",
                "cmd": "echo key=$OPENAI_API_KEY; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c sk-never",
            }
        ),
        json.dumps(
            {"tool": "shell", "cmd": f"echo x > /rw-tools-escape-{port} ; echo y > /tmp/rw-tools-escape-{port}"}
        ),
        json.dumps({"tool": "python", "code": "while True: pass"}),
        json.dumps({"tool": "python", "code": "import os\nwhile True: os.fork()"}),
        json.dumps({"tool": "python", "code": "print('still alive')"}),
        json.dumps({"answer": "done"}),
    ]
    script = iter(calls)
    trajectory = run_episode(small, _task(small, "compute"), lambda obs: next(script))
    server.close()
    replies = [t.content for t in trajectory.turns if t.role == "partner"][1:]
    assert len(replies) == len(calls)
    assert replies[0].startswith("tool error") and "no tool call" in replies[0]
    assert replies[1].startswith("tool error") and "700 characters" in replies[1]
    assert "Network is unreachable" in replies[2]
    assert "sk-never" not in replies[3] and "key=\n" in replies[3]
    assert "Read-only file system" in replies[4]
    assert not os.path.exists(f"/tmp/rw-tools-escape-{port}") and not os.path.exists(f"/rw-tools-escape-{port}")
    assert "error timeout" in replies[5] or "error cpu_limit" in replies[5]
    assert "exit 0" not in replies[6].splitlines()[0]
    assert "still alive" in replies[7]
    events = trajectory.metadata["env_state"]["events"]
    assert [e["kind"] for e in events[:2]] == ["error", "error"] and events[-1]["kind"] == "answer"
    assert trajectory.metadata["env_state"]["verdict"]["success"] is False  # and the run goes on
    small.close()


def test_a_sandbox_fault_is_a_partner_failure_not_the_agents(env, monkeypatch):
    from rwcore.trainer.envs.tools.sandbox import Sandbox, ToolResult

    task = _task(env, "compute")
    episode = env.reset(task, 0)
    monkeypatch.setattr(
        Sandbox,
        "run_shell",
        lambda self, cmd: ToolResult(False, 111, "", "sandbox setup failed: x", error="sandbox_setup"),
    )
    after = env.step(episode, json.dumps({"tool": "shell", "cmd": "ls"}))
    assert after.done and "tool sandbox failed" in after.partner_failure
    outcome = env.outcome(after)
    assert outcome.failure and outcome.reward == 0.0
    from rwcore.types import Trajectory

    trajectory = Trajectory("t", [], 0.0, metadata={"env_state": after.state}, partner_failure=after.partner_failure)
    records = ToolsAttributor().attribute(trajectory, [rule_spec(RULES_BY_ID["inspects_input"])])
    assert records[0].cause == "partner"


def test_options_are_checked_by_name():
    for options, name in [
        ({"num_train": 0}, "num_train"),
        ({"kinds": ["compute", "poetry"]}, "kinds"),
        ({"call_format": "xml"}, "call_format"),
        ({"isolation": "vm"}, "isolation"),
        ({"wall_seconds": -1}, "wall_seconds"),
        ({"max_turns": True}, "max_turns"),
    ]:
        with pytest.raises(ValueError, match=f"env.options.{name}"):
            ToolsEnv(**options)


def test_chat_template_format_ends_on_a_plain_message():
    env = ToolsEnv(num_train=5, num_eval=1, call_format="chat_template")
    assert '"tool"' not in env.system_prompt
    task = _task(env, "search")
    pattern = f"the {task.data['key']} of {task.data['entity']} is"
    script = iter(
        [f'<tool_call>\n{{"name": "shell", "arguments": {{"cmd": "grep -rh \'{pattern}\' docs"}}}}\n</tool_call>', None]
    )

    def policy(obs):
        message = next(script)
        return message if message is not None else obs.split(pattern)[1].split(".")[0].strip()

    trajectory = run_episode(env, task, policy)
    assert trajectory.metadata["success"] and [e["kind"] for e in trajectory.metadata["env_state"]["events"]] == [
        "shell",
        "answer",
    ]
    env.close()


def test_rules_read_observable_behaviour(env):
    rules = {r.spec.rubric_id: r for r in env.rules()}
    assert {r.spec.capability for r in rules.values()} == {
        "Understanding",
        "Execution",
        "Verification",
        "Debugging",
        "Efficiency",
    }
    for kind in KINDS:  # the oracle passes every rule that applies
        task = _task(env, kind)
        trajectory = run_episode(env, task, OraclePolicy(task))
        verdicts = {rid: rule.check(trajectory) for rid, rule in rules.items()}
        assert all(v in (True, None) for v in verdicts.values()), (kind, verdicts)
        assert verdicts["runs_code_before_answer"] is True and verdicts["answer_format"] is True
    # a careless agent on a transform task: writes without looking, never checks, repeats a failing call, rambles
    task = _task(env, "transform")
    code = "import csv, json\njson.dump([r['name'] for r in csv.DictReader(open('people.csv'))], open('out.json', 'w'))"
    script = iter(
        [
            json.dumps({"tool": "python", "code": "print(undefined)"}),
            json.dumps({"tool": "python", "code": "print(undefined)"}),
            json.dumps({"tool": "python", "code": code}),
            json.dumps({"answer": "i wrote it"}),
        ]
    )
    careless = run_episode(env, task, lambda obs: next(script))
    verdicts = {rid: rule.check(careless) for rid, rule in rules.items()}
    assert verdicts == {
        "inspects_input": False,
        "runs_code_before_answer": True,
        "checks_output": False,
        "reruns_after_fix": None,
        "recovers_from_errors": False,
        "answer_format": False,
        "efficient_calls": False,
    }


def test_labelled_cases_admit_the_initial_library(env):
    cases = env.labelled_cases_by_rule(list(RULES_BY_ID))
    for rule_id, rule_cases in cases.items():
        labels = Counter(c.label for c in rule_cases)
        assert labels[Verdict.PASS] >= 10 and labels[Verdict.FAIL] >= 10, (rule_id, labels)
        assert len({c.source for c in rule_cases}) == 10
    judge = RuleJudge({r.spec.rubric_id: r.check for r in env.rules()})
    library = admit_library(env, judge, list(env.initial_library()))
    assert set(library.ids()) == set(INITIAL_LIBRARY)


def test_the_word_level_policy_can_spell_a_tool_call(env):
    codec = WordCodec(env.vocabulary())
    message = '{ "tool" : "shell" , "cmd" : "ls docs" }'
    ids = codec._words(message)
    assert codec.vocab["<unk>"] not in ids
    assert set(message.split()) <= set(env.action_vocabulary())
    assert parse_call(codec.decode(ids)) == ("shell", "ls docs")
    assert parse_call(codec.decode(codec._words('{ "answer" : "done" }'))) == ("answer", "done")


SMALL = [
    "env.name=tools",
    "env.options.num_train=8",
    "env.options.num_eval=4",
    "env.options.max_turns=3",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=12",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    *overrides_with(SMALL_METHOD, "rewardweaver.diagnosis_tasks=2", "rewardweaver.diagnostic_tasks=2"),
    "train.steps=2",
]


@pytest.mark.parametrize("method", ["arise", "rewardweaver"])
def test_rw_train_with_the_built_in_policy_and_the_rule_judge(tmp_path, method, monkeypatch):
    out = tmp_path / "run"
    # the sandboxes' folders go to a temporary directory of this test's own: tests in other pytest-xdist
    # workers create and remove theirs in /tmp meanwhile
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert cli.main(["train", "--out", str(out), "--quiet", *SMALL, f"train.method={method}"]) == 0
    metrics = metrics_rows(out)
    train = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [0, 2]
    assert all(0.0 <= r["success_rate"] <= 1.0 for r in train)
    assert not [p for p in os.listdir(scratch) if p.startswith("rw-sandbox-")]  # none outlives its episode
    if method == "rewardweaver":
        stages = json.loads((out / "reward_stages.json").read_text())
        assert stages and set(stages[0]["active"]) <= set(INITIAL_LIBRARY)
    else:
        assert (out / "pool_events.json").exists()


NO_KEY = "RWCORE_TOOLS_TEST_NO_KEY"  # unset: the loopback server takes no key


def test_rw_train_with_a_real_vllm_judge_and_reflector(tmp_path, vllm_server, monkeypatch):
    monkeypatch.delenv(NO_KEY, raising=False)
    # one step, one group of two: the pool update at step 1 asks the served model to reflect (kept short: the
    # tiny model is slow on a CPU and tool transcripts are long)
    overrides = [
        *SMALL,
        "env.options.num_eval=2",
        "env.options.max_turns=2",
        "env.options.max_observation_chars=200",
        "rollout.tasks_per_step=1",
        "train.steps=1",
        "pool.delta_pool=1",
        "train.checkpoint_every=1",
        "train.eval_every=0",
        "train.method=arise",
        "judge.kind=openai",
        f"judge.model={vllm_server.model}",
        f"judge.base_url={vllm_server.base_url}",
        f"judge.api_key_env={NO_KEY}",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    train = [r for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1]
    assert all(0.0 <= r["success_rate"] <= 1.0 and r.get("partner_failures", 0) == 0 for r in train)
    assert (tmp_path / "run" / "pool_events.json").exists()  # the pool update at step 1 asked the LLM reflector
