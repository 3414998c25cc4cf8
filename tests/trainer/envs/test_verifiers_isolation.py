"""env.name=verifiers against environments that try to hang, kill or flood the run (tests/verifiers_tasksets:
rw_hostile, real verifiers 0.4.0): a reward or `Env.run` that blocks its thread, busy-loops, raises
SystemExit / KeyboardInterrupt / GeneratorExit / a BaseException of its own, or returns huge strings, among
healthy episodes. Only the hostile episodes end, as partner failures naming what happened, within
env.options.timeout; the healthy ones score as worked out by hand from rw_hostile's rewards; the next
batch is served at once; kept strings are cut to 64 KiB; a real Ctrl-C still stops the trainer."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import verifiers.v1  # noqa: F401 - part of the test set-up (RWCORE_EXTRAS=...,verifiers): a missing one fails
from _util import TESTS, child_env, metrics_rows, train_in_process

from rwcore.trainer.envs import make
from rwcore.trainer.envs.base import failure_of

TASKSETS = TESTS / "verifiers_tasksets"
if str(TASKSETS) not in sys.path:
    sys.path.insert(0, str(TASKSETS))

TIMEOUT = 2.0  # env.options.timeout of the direct tests (seconds)
SIZE = 1_000_000  # characters of rw_hostile's huge strings
# the agent's reply to each word, and trace.reward = 0.75 * exact + 0.25 * short for it, worked out by hand
REPLIES = {"apple": "apple", "river": "the river", "stone": "stone and more", "cloud": "no"}
HAND = {"apple": 1.0, "river": 0.25, "stone": 0.75, "cloud": 0.25}
WORDS_IN_REPLY = {"apple": 1.0, "river": 2.0, "stone": 3.0, "cloud": 1.0}
TIMED_OUT = "did not answer within env.options.timeout"
# a busy loop holding up other episodes ends after a quarter of the timeout (0.5 s here) computing without
# yielding; one that holds up nobody (the last to run) at the timeout
SPUN = (TIMED_OUT, "without yielding to its event loop while other episodes waited")


def hostile(fault: str):
    """rw_hostile with `fault` in every third task: train = idx 3..8 (cloud apple river stone cloud apple),
    idx 3 and 6 hostile."""
    return make(
        "verifiers",
        taskset="rw_hostile",
        taskset_options={"fault": fault, "every": 3, "tasks": 12, "size": SIZE},
        num_train=6,
        num_eval=3,
        timeout=TIMEOUT,
    )


def play(env, tasks, seed: int = 0):
    """A batch as rw train's rollout plays it: every episode reset one after the other, then their first
    observations read, then one step_many per turn with every live episode. Returns the episodes, their
    outcomes, every observation each one showed, and the wall time of each environment phase (the resets
    with the first observations, then each step_many)."""
    times = []
    clock = time.monotonic()
    episodes = [env.reset(task, seed + i) for i, task in enumerate(tasks)]
    observations = [[episode.observation] for episode in episodes]
    times.append(time.monotonic() - clock)
    for _ in range(env.max_turns):
        live = [i for i, episode in enumerate(episodes) if not episode.done]
        if not live:
            break
        clock = time.monotonic()
        stepped = env.step_many([episodes[i] for i in live], [REPLIES[episodes[i].task.data["word"]] for i in live])
        times.append(time.monotonic() - clock)
        for i, episode in zip(live, stepped):
            episodes[i] = episode
            if not episode.done:
                observations[i].append(episode.observation)
    return episodes, [env.outcome(e) for e in episodes], observations, times


def assert_healthy(task, episode, outcome) -> None:
    word = task.data["word"]
    assert not failure_of(episode, outcome), failure_of(episode, outcome)
    assert outcome.reward == HAND[word] and outcome.success == (HAND[word] == 1.0)
    assert outcome.details["metrics"]["reply_words"] == WORDS_IN_REPLY[word]


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("reward_sleep", TIMED_OUT),
        ("run_sleep", TIMED_OUT),
        ("run_spin", SPUN),
        ("reward_spin", SPUN),
        ("reward_exit", "raised SystemExit"),
        ("reward_interrupt", "raised KeyboardInterrupt"),
        ("run_generator_exit", "raised GeneratorExit"),
        ("reward_custom", "raised Hostile"),
        ("reward_huge", "reward 'exact' returned a str of 1000000 characters, not a number"),
        ("metric_huge", "metric 'reply_words' returned a str of 1000000 characters, not a number"),
        ("error_huge", "RuntimeError: zzzz"),
    ],
)
def test_a_hostile_episode_is_a_partner_failure_and_the_healthy_ones_score_as_without_it(fault, reason):
    env = hostile(fault)
    try:
        tasks = env.tasks("train")
        assert [t.data["fault"] != "none" for t in tasks] == [True, False, False, True, False, False]
        episodes, outcomes, _, times = play(env, tasks)
        # the hostile episodes cost one env.options.timeout at most, in the phase they hang in
        assert sum(times) <= 2 * TIMEOUT, times
        for task, episode, outcome in zip(tasks, episodes, outcomes):
            if task.data["fault"] == "none":
                assert_healthy(task, episode, outcome)
                continue
            failure = failure_of(episode, outcome)
            reasons = reason if isinstance(reason, tuple) else (reason,)
            assert any(r in failure for r in reasons) and "rw_hostile" in failure and len(failure) <= 500, failure
            assert episode.done and outcome.reward == 0.0 and not outcome.success
        if "spin" in fault:  # the abandoned busy loops are stopped: the process is idle again
            time.sleep(0.5)
            cpu = time.process_time()
            time.sleep(1.0)
            assert time.process_time() - cpu < 0.3
        # the next step: served at once, every episode scored
        healthy = [t for t in tasks if t.data["fault"] == "none"]
        episodes, outcomes, _, times = play(env, healthy, seed=100)
        assert sum(times) < TIMEOUT, times
        for task, episode, outcome in zip(healthy, episodes, outcomes):
            assert_healthy(task, episode, outcome)
    finally:
        env.close()


def test_a_huge_message_reaches_the_agent_cut_to_64_kib_and_the_episode_goes_on():
    env = hostile("message_huge")
    try:
        tasks = env.tasks("train")
        episodes, outcomes, observations, times = play(env, tasks)
        assert sum(times) <= 2 * TIMEOUT
        cut = "m" * 65536 + "... [934464 characters cut]"  # 1_000_000 - 65_536 characters left out
        for task, episode, outcome, seen in zip(tasks, episodes, outcomes, observations):
            assert_healthy(task, episode, outcome)  # a long message is no failure: the second reply scores
            word = task.data["word"]
            if task.data["fault"] == "none":
                assert seen == [f"say {word}"] and episode.state["turns"] == 1
            else:
                assert seen == [f"say {word}", cut] and episode.state["turns"] == 2
    finally:
        env.close()


def test_ctrl_c_of_the_trainer_still_stops_a_step_waiting_on_a_blocked_environment():
    env = hostile("reward_sleep")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    # Ctrl-C as `rw train` gets it: Python's own handler. A library loaded by an earlier test in this worker
    # process (a pytest-xdist worker runs many files) may have installed another one.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        tasks = env.tasks("train")[:2]  # idx 3 blocks in its reward, idx 4 is healthy
        episodes = [env.reset(task, i) for i, task in enumerate(tasks)]
        assert [e.observation for e in episodes] == ["say cloud", "say apple"]
        clock = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            env.step_many(episodes, ["no", "apple"])
        assert time.monotonic() - clock < TIMEOUT  # at once, not when the environment's timeout is up
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        env.close()


MEMORY = """
import json, resource, sys
sys.path.insert(0, {tasksets!r})
from rwcore.trainer.envs import make
from rwcore.trainer.envs.base import failure_of
env = make("verifiers", taskset="rw_hostile", taskset_options={{"fault": "reward_huge", "every": 2, "tasks": 16,
           "size": {size}}}, num_train=8, num_eval=8, timeout=60)
tasks = env.tasks("train")
def batch(tasks):
    episodes = [env.reset(task, i) for i, task in enumerate(tasks)]
    [e.observation for e in episodes]
    episodes = env.step_many(episodes, [t.data["word"] for t in tasks])
    return [failure_of(e, env.outcome(e)) for e in episodes]
batch([t for t in tasks if t.data["fault"] == "none"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
failures = batch(tasks)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"growth_kib": after - before, "failures": failures}}))
"""


def test_huge_reward_strings_are_not_copied_or_kept():
    """4 of 8 episodes' reward returns a 50 MB string: the process's peak memory grows by about one such
    string (the environment's own allocation), not by copies of all four (a subprocess of its own, so
    that the peak is this batch's)."""
    size = 50_000_000
    script = MEMORY.format(tasksets=str(TASKSETS), size=size)
    env = child_env()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failures = report["failures"]
    assert [bool(f) for f in failures] == [True, False] * 4
    assert all("returned a str of 50000000 characters, not a number" in f for f in failures[::2])
    assert report["growth_kib"] * 1024 < 2.5 * size, report["growth_kib"]


def test_rw_train_with_a_hostile_taskset_charges_only_the_hostile_episodes(tmp_path, monkeypatch):
    """A real `rw train` (the Trainer as the CLI runs it) over rw_hostile with faults of every kind in half
    the tasks (blocking and busy-looping rewards, SystemExit, KeyboardInterrupt, a huge string), all ten
    tasks in every step: each step ends within 2 x env.options.timeout; the hostile episodes are partner
    failures naming their fault; every healthy one is scored by the rewards' own definitions."""
    from rwcore.trainer import rank_rollouts

    timeout = 3.0
    seen = []
    real = rank_rollouts.run_episodes

    def spy(*args, **kwargs):
        rollouts = real(*args, **kwargs)
        seen.extend(rollouts)
        return rollouts

    monkeypatch.setattr(rank_rollouts, "run_episodes", spy)
    overrides = [
        "env.name=verifiers",
        "env.options.taskset=rw_hostile",
        "env.options.taskset_options={fault: mixed, every: 2, tasks: 12, size: 5000000}",
        "env.options.train={limit: 10}",
        "env.options.eval={skip: 10, limit: 2}",
        f"env.options.timeout={timeout}",
        "train.method=outcome_only",
        "rollout.tasks_per_step=10",
        "rollout.group_size=2",
        "train.steps=2",
        "train.eval_every=2",
        "train.checkpoint_every=2",
    ]
    train_in_process(tmp_path / "run", overrides)
    rows = metrics_rows(tmp_path / "run")
    steps = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["time/step"] <= 2 * timeout for r in steps), [r["time/step"] for r in steps]
    assert [r["partner_failures"] for r in steps] == [10, 10]  # 5 hostile tasks x 2 episodes
    reasons = {
        "reward_sleep": TIMED_OUT,
        "reward_spin": SPUN,
        "reward_exit": "raised SystemExit",
        "reward_interrupt": "raised KeyboardInterrupt",
        "reward_huge": "reward 'exact' returned a str of 5000000 characters, not a number",
    }
    assert len(seen) == 2 * 20 + 2 * 2  # two steps of 20 episodes, two evaluations of 2
    kinds = set()
    for rollout in seen:
        trajectory = rollout.trajectory
        data = trajectory.metadata["task"]
        if data["fault"] != "none":
            kinds.add(data["fault"])
            expected = reasons[data["fault"]]
            expected = expected if isinstance(expected, tuple) else (expected,)
            assert any(r in trajectory.partner_failure for r in expected), trajectory.partner_failure
            continue
        assert not trajectory.partner_failure
        reply = [t.content for t in trajectory.turns if t.role == "assistant"][-1].strip().lower().split()
        expected = 0.75 * (bool(reply) and reply[0] == data["word"]) + 0.25 * (len(reply) <= 2)
        assert math.isclose(trajectory.outcome, expected), (reply, data["word"], trajectory.outcome)
    assert kinds == set(reasons)
