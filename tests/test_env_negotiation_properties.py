"""Properties of the negotiation environment checked by brute force, independently of the code under test.

1. `best_fixed_sequence` is an upper bound on every fixed message sequence (checked by running the episodes
   of all sequences up to length 2, of random longer ones, and of an exhaustive search written here without
   its branch-and-bound), the sequence it reports scores what it says, and that score is at most 0.15.
2. No constant message (the same message every turn) passes any rubric on more than 5% of held-out tasks,
   measured here with the rule judge and compared with `constant_action_rates`.
3. The independent annotator (`negotiation_annotator`) agrees with the rules' verdicts on trajectories of the
   scripted policy, of the deliberately bad policies, and of perturbed scripted play.
"""

import itertools
import random

import pytest

from rwcore.judges import RuleJudge
from rwcore.trainer.envs import NegotiationEnv
from rwcore.trainer.envs.negotiation import best_fixed_sequence, run_episode, scripted_policy
from rwcore.trainer.envs.negotiation_annotator import ANNOTATORS, annotate
from rwcore.trainer.envs.negotiation_rubrics import _bad_policies, constant_action_rates
from rwcore.types import Trajectory
from rwcore.verdict import Verdict

DEFAULT = NegotiationEnv()  # the default environment: 300 held-out tasks
VOCABULARY = ["ask", "bundle", "accept", "end"] + [str(p) for p in range(20, 201, 20)]  # written out by hand


def _successes(env, tasks, sequence):
    """How many of `tasks` the fixed `sequence` wins (an episode that ends early stops reading it; one that
    outlives it is not a success)."""
    wins = 0
    for task in tasks:
        episode = env.reset(task, 0)
        for message in sequence:
            if episode.done:
                break
            episode = env.step(episode, message)
        wins += env.outcome(episode).success
    return wins


def _exhaustive_best(env, tasks, phrases, max_length):
    """The most successes of any fixed sequence of at most `max_length` phrases: every sequence, with the
    episodes of a common prefix shared; a branch stops only when no episode is left running."""
    best = 0

    def walk(running, wins, depth):
        nonlocal best
        best = max(best, wins)
        if depth == max_length or not running:
            return
        for phrase in phrases:
            still, won = [], wins
            for episode in running:
                nxt = env.step(episode, phrase)
                if nxt.done:
                    won += env.outcome(nxt).success
                else:
                    still.append(nxt)
            walk(still, won, depth + 1)

    walk([env.reset(task, 0) for task in tasks], 0, 0)
    return best


# -- 1. best_fixed_sequence ------------------------------------------------------------------------


def test_best_fixed_sequence_bounds_every_sequence_on_the_default_eval_split():
    assert DEFAULT.action_vocabulary() == sorted(VOCABULARY)
    tasks = DEFAULT.tasks("eval")
    rate, sequence = best_fixed_sequence(DEFAULT)
    assert 1 <= len(sequence) <= DEFAULT.max_turns and set(sequence) <= set(VOCABULARY)
    assert _successes(DEFAULT, tasks, sequence) == round(rate * len(tasks))  # it scores what it says
    assert rate <= 0.15
    best_short = 0
    for length in (1, 2):
        for candidate in itertools.product(VOCABULARY, repeat=length):
            wins = _successes(DEFAULT, tasks, candidate)
            assert wins / len(tasks) <= rate, candidate
            best_short = max(best_short, wins)
    rng = random.Random(2024)
    for _ in range(200):
        candidate = tuple(rng.choice(VOCABULARY) for _ in range(rng.choice((3, 4))))
        assert _successes(DEFAULT, tasks, candidate) / len(tasks) <= rate, candidate
    # at length 2 the search is exact
    assert best_fixed_sequence(DEFAULT, max_length=2)[0] == pytest.approx(best_short / len(tasks))
    # the best fixed sequence wins only the no-deal tasks (ask, end): 32 of 300
    assert best_short == 32 and rate == pytest.approx(32 / 300)


@pytest.mark.parametrize("options, split, max_length", [
    ({}, "eval", None),
    ({}, "train", None),
    ({"num_train": 10, "num_eval": 120, "kind_weights": {"haggler": 1, "bundle": 1, "standard": 1}}, "eval", None),
    ({"num_train": 10, "num_eval": 120, "kind_weights": {"haggler": 3, "no_deal": 1}, "max_turns": 5}, "eval", None),
    ({"num_train": 10, "num_eval": 80, "kind_weights": {"bundle": 1}, "max_turns": 3}, "eval", None),
    ({"num_train": 10, "num_eval": 150, "max_turns": 3}, "eval", 2),
])
def test_best_fixed_sequence_equals_an_exhaustive_search(options, split, max_length):
    env = NegotiationEnv(seed=5, **options)
    tasks = env.tasks(split)
    rate, sequence = best_fixed_sequence(env, split, max_length=max_length)
    best = _exhaustive_best(env, tasks, VOCABULARY, max_length or env.max_turns)
    assert rate == pytest.approx(best / len(tasks)), (rate, best, sequence)
    assert _successes(env, tasks, sequence) == best


def test_best_fixed_sequence_refuses_a_bad_length():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            best_fixed_sequence(DEFAULT, max_length=bad)


# -- 2. constant messages ----------------------------------------------------------------------------


def test_no_constant_message_passes_a_rubric_on_more_than_5_percent():
    tasks = DEFAULT.tasks("eval")
    rules = {rule.spec.rubric_id: rule for rule in DEFAULT.rules()}
    specs = [rule.spec for rule in rules.values()]
    judge = RuleJudge({rid: rule.check for rid, rule in rules.items()})
    reported = constant_action_rates(DEFAULT)
    assert set(reported) == set(VOCABULARY)
    # the vocabulary, and synonyms a policy could say instead (the same moves)
    for phrase in VOCABULARY + ["yes", "budget", "stop", "offer 100", "hello"]:
        trajectories = [run_episode(DEFAULT, task, lambda obs, p=phrase: p) for task in tasks]
        passes = dict.fromkeys(rules, 0)
        for report in judge.evaluate(trajectories, specs):
            for rule_id, judgment in report.judgments.items():
                assert judgment.verdict != Verdict.INVALID
                passes[rule_id] += judgment.verdict == Verdict.PASS
        rates = {rid: count / len(tasks) for rid, count in passes.items()}
        assert max(rates.values()) <= 0.05, (phrase, rates)
        if phrase in reported:
            assert reported[phrase] == pytest.approx(rates), phrase
    # only a price that happens to be a haggler's list price passes anything (opens_at_list_with_haggler)
    assert {rid for rates in reported.values() for rid, r in rates.items() if r > 0} == {"opens_at_list_with_haggler"}


# -- 3. the annotator agrees with the rules ------------------------------------------------------------


def _perturbed(rng):
    """Scripted play with mistakes: another move, a synonym, a near-miss price, a multi-word message."""
    pool = ["ask", "bundle", "accept", "end", "yes", "budget", "hello", "offer", "bundle 120", "offer bundle 100",
            "110", "95", "sell 85", "ask 100", "accept 100", "confirm", ""] + [str(p) for p in range(20, 201, 20)]

    def policy(observation):
        if rng.random() < 0.35:
            return rng.choice(pool)
        message = scripted_policy(observation)
        if message.isdigit() and rng.random() < 0.3:
            message = str(int(message) + rng.choice((-20, -10, 10, 20)))
        return message

    return policy


def test_annotator_agrees_with_the_rules():
    env = NegotiationEnv(seed=11, num_train=10, num_eval=150, max_turns=5)
    rules = {rule.spec.rubric_id: rule for rule in env.rules()}
    assert set(ANNOTATORS) == set(rules)
    judge = RuleJudge({rid: rule.check for rid, rule in rules.items()})
    trajectories = []
    for task in env.tasks("eval"):
        for name, policy in _bad_policies().items():  # the scripted, random and deliberately bad policies
            rng = random.Random(f"{task.task_id}/{name}")
            trajectories.append(run_episode(env, task, lambda obs, p=policy, r=rng: p(obs, r), group_id=name))
        for k in range(3):
            trajectories.append(run_episode(env, task, _perturbed(random.Random(f"{task.task_id}/perturbed/{k}"))))
    seen = set()
    for trajectory, report in zip(trajectories, judge.evaluate(trajectories, [r.spec for r in rules.values()])):
        for rule_id, judgment in report.judgments.items():
            assert judgment.verdict != Verdict.INVALID
            label = annotate(rule_id, trajectory)
            assert label == judgment.verdict, (rule_id, trajectory.metadata["task"], trajectory.transcript())
            seen.add((rule_id, label))
        # the annotator never reads the episode's private state
        stripped = Trajectory.from_dict(trajectory.to_dict())
        del stripped.metadata["env_state"]
        assert [annotate(rid, stripped) for rid in rules] == [annotate(rid, trajectory) for rid in rules]
    # not vacuous: every rule was seen passing, failing and not applying
    assert seen == {(rid, v) for rid in rules for v in (Verdict.PASS, Verdict.FAIL, Verdict.NA)}


def test_annotator_refuses_unknown_rules_and_unreadable_transcripts():
    trajectory = run_episode(DEFAULT, DEFAULT.tasks("eval")[0], scripted_policy)
    with pytest.raises(ValueError):
        annotate("nope", trajectory)
    with pytest.raises(ValueError):
        annotate("clear_actions", Trajectory("x", trajectory.turns[:1], 0.0))  # no partner turn
