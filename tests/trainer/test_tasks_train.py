"""`rw train env.name=tasks` on a named model (the tiny local chat model, nothing downloaded) with a reward module
from the test's own folder on PYTHONPATH, then `rw eval` of its checkpoint on a second task file with --greedy,
--out and --transcripts; the methods that judge rubrics (Arise, RewardWeaver) on a rubrics file's rule checks; and
a reward that raises mid-run as one error line (then how to continue)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _util import metrics_rows, save_tiny_chat_model
from judge_server import ChatServer, Reply, loopback_without_proxy, verdict_line  # noqa: F401 - autouse fixture

from rwcore.trainer import cli
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

ITEMS = ("lamp", "phone", "desk", "radio", "tent", "bike", "sofa", "kettle")
REWARDS = """
ITEMS = {"lamp", "phone", "desk", "radio", "tent", "bike", "sofa", "kettle"}

def score(completion, metadata):
    return 1.0 if metadata["answer"] in completion.split() else 0.0

def names_an_item(completion):
    return bool(ITEMS & set(completion.split()))

def short(completion):
    return len(completion.split()) <= 2

def fails_on_desk(completion, metadata):
    if metadata["answer"] == "desk":
        raise KeyError("gold")
    return 0.0
"""
SMALL = [  # a tiny run: 2 steps of 2 tasks x 2 episodes, 3 new tokens per reply
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
]


def _row(task_id: str, item: str, verb: str) -> dict:
    # words of the tiny model's tokenizer (the negotiation environment's)
    return {"id": task_id, "prompt": f"the buyer {verb} the {item}", "metadata": {"answer": item}, "tags": [verb]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(folder, reward module name, option overrides): the tiny chat model, three task files and a reward module."""
    root = tmp_path_factory.mktemp("tasks")
    save_tiny_chat_model(root / "model")
    files = {
        "train": [_row(f"wants-{item}", item, "wants") for item in ITEMS],
        "eval": [_row(f"likes-{item}", item, "likes") for item in ITEMS[:3]],
        "second": [_row(f"leaves-{item}", item, "leaves") for item in ITEMS[3:]],
    }
    for name, rows in files.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tf_train_rewards.py").write_text(REWARDS)
    options = [
        "env.name=tasks",
        f"env.options.train_file={root / 'train.jsonl'}",
        f"env.options.eval_file={root / 'eval.jsonl'}",
        f"model.name={root / 'model'}",
    ]
    return root, options


def _rw(args, root, timeout=300):
    environ = dict(os.environ, OMP_NUM_THREADS="1")
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "rwcore.trainer.cli", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_rw_train_on_a_task_file_then_rw_eval_scores_a_second_file(setup, tmp_path, monkeypatch, capsys):
    root, options = setup
    run = tmp_path / "run"
    done = _rw(
        ["train", "--out", str(run), "--quiet", *options, "env.options.reward=tf_train_rewards:score",
         "train.method=outcome_only", *SMALL],
        root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["step"] for r in metrics_rows(run, "train")] == [1, 2]
    evals = metrics_rows(run, "eval")
    assert [r["step"] for r in evals] == [0, 2] and all(r["eval/episodes"] == 3 for r in evals)
    assert (run / "checkpoints" / "step_000002").is_dir()

    # rw eval in this process: the reward module from the same folder
    monkeypatch.syspath_prepend(str(root))
    second = str(root / "second.jsonl")
    outputs = []
    for n in (1, 2):
        out = tmp_path / f"scores{n}.json"
        argv = ["eval", str(run), "--tasks-file", second, "--greedy", "--out", str(out), "--transcripts", "2"]
        assert cli.main(argv) == 0
        printed = capsys.readouterr()
        metrics = json.loads(out.read_text())
        assert json.loads(printed.out) == metrics and "rw eval: done in" in printed.err
        outputs.append((out.read_text(), (tmp_path / f"scores{n}.transcripts.jsonl").read_text()))
    assert outputs[0] == outputs[1]  # greedy decoding: the same replies, the same figures
    assert metrics["eval/episodes"] == 5 and metrics["step"] == 2 and set(metrics) >= {"eval/success/leaves"}
    transcripts = [json.loads(line) for line in outputs[0][1].splitlines()]
    assert [t["task_id"] for t in transcripts] == ["leaves-radio", "leaves-tent"]  # the second file's first two
    for transcript in transcripts:
        item = transcript["task_id"].split("-")[1]
        assert transcript["turns"][1] == {"role": "partner", "content": f"the buyer leaves the {item}"}
        reply = transcript["turns"][-1]
        assert reply["role"] == "assistant" and reply["generated"] is True
        assert transcript["reward"] == (1.0 if item in reply["content"].split() else 0.0)  # the reward, recomputed

    assert cli.main(["eval", str(run), "--transcripts", "2"]) == 2
    assert "--transcripts needs --out" in capsys.readouterr().err
    assert cli.main(["eval", str(run), "--tasks-file", str(root / "nope.jsonl")]) == 2
    assert "--tasks-file: " in capsys.readouterr().err

    # --tasks-file replaces the held-out file on purpose; a changed training file is another environment
    train = root / "train.jsonl"
    recorded = train.read_bytes()
    train.write_bytes(recorded + train.read_bytes().splitlines(keepends=True)[0].replace(b"wants-", b"more-"))
    try:
        assert cli.main(["eval", str(run), "--tasks-file", second]) == 2
        refused = capsys.readouterr().err.strip().splitlines()[-1]
        assert refused.startswith("rw: error:") and f"environment provenance entry 'train_file {train}'" in refused
    finally:
        train.write_bytes(recorded)


def test_a_task_file_of_another_run_kind_and_a_bad_tasks_file_are_refused(setup, tmp_path, monkeypatch, capsys):
    root, options = setup
    monkeypatch.syspath_prepend(str(root))
    overrides = [*options, "env.options.reward=tf_train_rewards:score", "train.method=outcome_only", *SMALL]
    config = load_config(None, [*overrides, "train.steps=1", "train.checkpoint_every=1", "train.eval_every=0"])
    trainer = Trainer(config, tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row("x", "lamp", "wants")) + "\n" + json.dumps({"id": "y", "prompt": 3}) + "\n")
    assert cli.main(["eval", str(tmp_path / "run"), "--tasks-file", str(bad)]) == 2
    assert f"{bad.resolve()}:2:prompt: a non-empty string" in capsys.readouterr().err
    saved = (tmp_path / "run" / "config.yaml").read_text()
    (tmp_path / "run" / "config.yaml").write_text(saved.replace("name: tasks", "name: negotiation", 1))
    assert cli.main(["eval", str(tmp_path / "run"), "--tasks-file", str(root / "second.jsonl")]) == 2
    assert "--tasks-file scores a task file with an env.name=tasks run; this run's env.name is 'negotiation'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("method", ["arise", "rewardweaver"])
def test_the_methods_train_on_the_rubrics_files_rule_checks(setup, tmp_path, monkeypatch, method):
    root, options = setup
    monkeypatch.syspath_prepend(str(root))
    rubrics = tmp_path / "rubrics.yaml"
    rubrics.write_text(
        "rubrics:\n"
        "  - {id: names_an_item, criterion: The reply names an item., capability: Understanding,"
        " skill: say the item, check: 'tf_train_rewards:names_an_item'}\n"
        "  - {id: short, criterion: At most two words., capability: Efficiency, check: 'tf_train_rewards:short'}\n"
    )
    overrides = [
        *options,
        "env.options.reward=tf_train_rewards:score",
        f"env.options.rubrics={rubrics}",
        f"train.method={method}",
        *SMALL,
        "train.checkpoint_every=0",
        "pool.delta_pool=1",
        "rewardweaver.adaptation_interval=1",
        "rewardweaver.min_support=1",
        "rewardweaver.diagnosis_tasks=2",
        "rewardweaver.diagnostic_tasks=2",
        "rewardweaver.admission=unvalidated",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    rows = metrics_rows(tmp_path / "run", "train")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["active_rubrics"] >= 1  # the file's rubrics reached the method and were judged


def test_a_reward_that_raises_mid_run_stops_rw_train_with_an_error_naming_it(setup, tmp_path, monkeypatch, capsys):
    root, options = setup
    monkeypatch.syspath_prepend(str(root))
    argv = ["train", "--out", str(tmp_path / "run"), "--quiet", *options,
            "env.options.reward=tf_train_rewards:fails_on_desk", "train.method=outcome_only", *SMALL]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rw: error:")]
    assert len(lines) == 1, err
    first = lines[0]
    assert first.startswith(
        "rw: error: env.options.reward 'tf_train_rewards:fails_on_desk' raised KeyError on task 'likes-desk' ("
    )
    assert f"{root / 'eval.jsonl'}:3): 'gold'" in first and "Traceback" not in err
    assert "the run stopped" in err.split(first, 1)[1].splitlines()[1]


def test_rubrics_without_checks_need_an_llm_judge_for_the_methods_that_judge_them(setup, tmp_path, monkeypatch):
    root, options = setup
    monkeypatch.syspath_prepend(str(root))
    rubrics = tmp_path / "rubrics.yaml"
    rubrics.write_text("rubrics:\n  - {id: polite, criterion: The reply is polite.}\n")
    overrides = [*options, "env.options.reward=tf_train_rewards:score", f"env.options.rubrics={rubrics}", *SMALL]
    trainer = Trainer(load_config(None, [*overrides, "train.method=arise"]), tmp_path / "run", quiet=True)
    with pytest.raises(ValueError, match=r"env.name 'tasks' brings no rules .* set judge.kind=openai"):
        trainer.setup()
    assert not (tmp_path / "run").exists()  # refused before the run folder was written


def test_rubrics_without_checks_are_rewardweavers_library_under_an_llm_judge(setup, tmp_path, monkeypatch):
    """judge.kind=openai on a scripted OpenAI-compatible server on loopback: the rubrics file's entries become
    the library (admitted unvalidated: a task file has no labelled cases) and the judge scores them."""
    root, options = setup
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("RWCORE_TEST_TASKS_KEY", "sk-test-tasks-5e1")
    rubrics = tmp_path / "rubrics.yaml"
    rubrics.write_text(
        "rubrics:\n  - {id: polite, criterion: The reply is polite.}\n"
        "  - {id: on_topic, criterion: The reply is about the item., capability: Understanding}\n"
    )
    kinds: dict[str, int] = {}

    def script(request) -> Reply:
        if "careful, impartial evaluator" in request.system:
            kinds["judge"] = kinds.get("judge", 0) + 1
            return Reply("\n".join(verdict_line(request, rid, "fail") for rid in request.rubric_ids))
        if "You diagnose why" in request.system:
            kinds["attribution"] = kinds.get("attribution", 0) + 1
            rows = [
                {"request_id": request.request_id, "capability_id": cid, "deficit": True, "confidence": 0.9,
                 "evidence": "the reply", "cause": "policy"}
                for cid in request.candidate_ids
            ]  # fmt: skip
            return Reply("\n".join(json.dumps(row) for row in rows))
        raise AssertionError(f"unexpected prompt: {request.system[:200]}")

    with ChatServer(script) as chat:
        overrides = [
            *options,
            "env.options.reward=tf_train_rewards:score",
            f"env.options.rubrics={rubrics}",
            "train.method=rewardweaver",
            *SMALL,
            "train.checkpoint_every=0",
            "rewardweaver.adaptation_interval=2",
            "rewardweaver.min_support=1",
            "rewardweaver.diagnosis_tasks=2",
            "rewardweaver.diagnostic_tasks=2",
            "rewardweaver.expansion=false",
            "judge.kind=openai",
            "judge.model=judge-test",
            f"judge.base_url={chat.base_url}",
            "judge.api_key_env=RWCORE_TEST_TASKS_KEY",
        ]
        trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
        trainer.setup()
        library = trainer.method.weaver.library
        assert set(library.ids()) == {"polite", "on_topic"}
        assert all("unvalidated" in library[c].admission.reasons[0] for c in library.ids())
        trainer.train()
        trainer.cleanup()
    rows = metrics_rows(tmp_path / "run", "train")
    assert len(rows) == 2 and all(r["judgments"] > 0 and r["invalid_rate"] == 0.0 for r in rows)
    assert kinds["judge"] > 0
