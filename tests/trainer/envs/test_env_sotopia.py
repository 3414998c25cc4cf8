"""env.name=sotopia: SOTOPIA profiles read from files in sotopia's JSONL export format (no Redis, no sotopia
import); bad files are refused naming the file, the line and the field."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from _util import SMALL_METHOD, metrics_rows

from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.envs.sotopia import DEFAULT_PROFILES, SotopiaEnv
from rwcore.trainer.trainer import Trainer

FILES = ("environment_profiles.jsonl", "agent_profiles.jsonl", "env_agent_combo_storages.jsonl")


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (DEFAULT_PROFILES / name).read_text().splitlines() if line.strip()]


def write(folder: Path, name: str, items: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def copy_profiles(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copy(DEFAULT_PROFILES / name, folder / name)
    return folder


def test_shipped_profiles_make_disjoint_tagged_tasks():
    env = envs.make("sotopia")
    assert isinstance(env, SotopiaEnv) and "sotopia" not in sys.modules  # the package itself is never imported
    train, held_out = env.tasks("train"), env.tasks("eval")
    environments = records("environment_profiles.jsonl")
    combos = records("env_agent_combo_storages.jsonl")
    assert len(train) + len(held_out) == 2 * len(combos)  # every pairing, the agent on either side
    train_envs = {t.data["sotopia"]["env_id"] for t in train}
    eval_envs = {t.data["sotopia"]["env_id"] for t in held_out}
    assert train_envs and eval_envs and not train_envs & eval_envs
    assert train_envs | eval_envs == {e["env_id"] for e in environments}
    names = ["stranger", "know_by_name", "acquaintance", "friend", "romantic_relationship", "family_member"]
    by_id = {e["env_id"]: e for e in environments}
    agents = {a["agent_id"]: a for a in records("agent_profiles.jsonl")}
    for task in train + held_out:
        side = task.data["sotopia"]["side"]
        e = by_id[task.data["sotopia"]["env_id"]]
        me = agents[task.data["sotopia"]["agent_ids"][side - 1]]
        assert task.tags == (
            f"relationship/{names[e['relationship']]}",
            f"sotopia/agent{side}",
            f"codename/{e['codename']}",
        )
        brief = env.reset(task, 0).observation
        assert me["first_name"] in brief and me["secret"] in brief and e["scenario"].split(".")[0] in brief
        assert "<extra_info>" not in brief  # sotopia's hint tags are stripped, their text kept
    again = SotopiaEnv()
    assert [t.task_id for t in again.tasks("eval")] == [t.task_id for t in held_out]
    assert [t.task_id for t in SotopiaEnv(seed=1).tasks("eval")] != [t.task_id for t in held_out]


def test_scripted_partner_and_heuristic_evaluator_end_to_end():
    env = SotopiaEnv()
    task = env.tasks("train")[0]
    goal_words = task.data["goal_keywords"]
    episode = env.reset(task, 0)
    episode = env.step(episode, "hello, how are you today?")
    assert not episode.done
    episode = env.step(episode, f"please, I really need the {goal_words[0]} and the {goal_words[1]}")
    assert episode.done and episode.state["agreed"]  # difficulty 2: two distinct goal words
    out = env.outcome(episode)
    assert out.success and out.reward == 1.0 and out.details["goal"] == 10
    silent = env.reset(task, 0)
    for _ in range(env.max_turns):
        if not silent.done:
            silent = env.step(silent, "hello")
    assert silent.done and not env.outcome(silent).success


@pytest.mark.parametrize(
    "file, field",
    [
        ("environment_profiles.jsonl", "scenario"),
        ("environment_profiles.jsonl", "agent_goals"),
        ("environment_profiles.jsonl", "codename"),
        ("environment_profiles.jsonl", "relationship"),
        ("agent_profiles.jsonl", "first_name"),
        ("agent_profiles.jsonl", "age"),
        ("agent_profiles.jsonl", "occupation"),
        ("agent_profiles.jsonl", "personality_and_values"),
        ("agent_profiles.jsonl", "secret"),
        ("env_agent_combo_storages.jsonl", "agent_ids"),
    ],
)
def test_missing_field_is_refused_naming_file_line_and_field(tmp_path, file, field):
    folder = copy_profiles(tmp_path / "profiles")
    items = records(file)
    del items[2][field]
    path = write(folder, file, items)
    with pytest.raises(ValueError) as error:
        SotopiaEnv(profiles=str(folder))
    message = str(error.value)
    assert str(path) in message and "line 3" in message and f"missing field {field!r}" in message


@pytest.mark.parametrize(
    "file, change, words",
    [
        ("environment_profiles.jsonl", {"agent_goals": ["only one goal"]}, "'agent_goals' must be a list of two"),
        ("environment_profiles.jsonl", {"relationship": 9}, "'relationship' must be 0-5"),
        ("agent_profiles.jsonl", {"age": "forty"}, "'age' must be a non-negative integer"),
        ("env_agent_combo_storages.jsonl", {"agent_ids": ["rw-agent-01", "nobody"]}, "unknown agent 'nobody'"),
        ("env_agent_combo_storages.jsonl", {"env_id": "rw-env-99"}, "unknown environment 'rw-env-99'"),
    ],
)
def test_malformed_field_is_refused_naming_file_and_field(tmp_path, file, change, words):
    folder = copy_profiles(tmp_path / "profiles")
    items = records(file)
    items[0].update(change)
    path = write(folder, file, items)
    with pytest.raises(ValueError, match="profile file") as error:
        SotopiaEnv(profiles=str(folder))
    assert str(path) in str(error.value) and words in str(error.value)


def test_not_json_and_missing_files_are_named(tmp_path):
    folder = copy_profiles(tmp_path / "profiles")
    (folder / "agent_profiles.jsonl").write_text('{"agent_id": "x"\n')
    with pytest.raises(ValueError, match=r"agent_profiles\.jsonl', line 1: not JSON"):
        SotopiaEnv(profiles=str(folder))
    (folder / "agent_profiles.jsonl").unlink()
    with pytest.raises(ValueError, match=r"env\.options\.profiles: .* has no agent_profiles\.jsonl"):
        SotopiaEnv(profiles=str(folder))
    with pytest.raises(ValueError, match=r"env\.options\.profiles: .* is not a folder"):
        SotopiaEnv(profiles=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"env\.options\.roles"):
        SotopiaEnv(roles="agent3")


def test_without_pairings_file_agents_are_paired_by_seed(tmp_path):
    folder = copy_profiles(tmp_path / "profiles")
    (folder / "env_agent_combo_storages.jsonl").unlink()
    env = SotopiaEnv(profiles=str(folder), pairs_per_env=3, roles="agent1")
    tasks = env.tasks("train") + env.tasks("eval")
    assert len(tasks) == 3 * len(records("environment_profiles.jsonl"))
    assert all(t.task_id.endswith("/agent1") for t in tasks)
    assert all(len(set(t.data["sotopia"]["agent_ids"])) == 2 for t in tasks)
    same = SotopiaEnv(profiles=str(folder), pairs_per_env=3, roles="agent1")
    assert [t.task_id for t in same.tasks("train")] == [t.task_id for t in env.tasks("train")]


SMALL = [
    "env.name=sotopia",
    "rollout.tasks_per_step=4",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "model.max_length=512",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    *SMALL_METHOD,
    "train.steps=2",
]


def test_rw_train_with_scripted_partner(tmp_path):
    trainer = Trainer(
        load_config(None, [*SMALL, "train.method=combined", "judge.kind=rule"]), tmp_path / "run", quiet=True
    )
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    metrics = metrics_rows(tmp_path / "run")
    train = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(0.0 <= r["success_rate"] <= 1.0 and r["partner_failures"] == 0 for r in train)
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [0, 2]
    stages = json.loads((tmp_path / "run" / "reward_stages.json").read_text())
    assert [s["start_step"] for s in stages] == [0, 2]


NO_KEY = "RWCORE_SOTOPIA_TEST_NO_KEY"


def test_rw_train_against_real_vllm(tmp_path, vllm_server, monkeypatch):
    """The served model is the partner, the judge and the reflector (the outcome: the heuristic evaluator; the
    LLM outcome evaluator is env.name=social's, tested there)."""
    monkeypatch.delenv(NO_KEY, raising=False)
    overrides = [
        *SMALL,
        "env.options.partner=llm",
        f"env.options.partner_model={vllm_server.model}",
        f"env.options.partner_base_url={vllm_server.base_url}",
        f"env.options.partner_api_key_env={NO_KEY}",
        "env.options.partner_max_tokens=300",
        "env.options.partner_max_reply_chars=16",
        "env.options.partner_timeout=120",
        "env.options.max_turns=2",
        "env.options.evaluator=heuristic",
        "judge.kind=openai",
        f"judge.model={vllm_server.model}",
        f"judge.base_url={vllm_server.base_url}",
        f"judge.api_key_env={NO_KEY}",
        "judge.max_tokens=600",
        "train.method=arise",
        "rollout.tasks_per_step=2",
        "train.eval_every=0",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    train = [r for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(0.0 <= r["success_rate"] <= 1.0 and 0 <= r["partner_failures"] <= 4 for r in train)
    # the served partner's replies came back as conversation turns (not all failures)
    assert sum(r["partner_failures"] for r in train) < 8
    assert (tmp_path / "run" / "pool_events.json").exists()
