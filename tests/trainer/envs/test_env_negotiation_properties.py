"""Properties of the negotiation environment checked by brute force, independently of the code under test.

1. `best_fixed_sequence` is an upper bound on every fixed message sequence (checked by running the episodes
   of all sequences up to length 2, of random longer ones, and of an exhaustive search written here without
   its branch-and-bound), the sequence it reports scores what it says, and that score is 0.15 on the default
   held-out split, with and without the price words.
2. No constant message (the same message every turn) passes any rubric on more than 5% of held-out tasks
   (in fact on none), measured here with the rule judge and compared with `constant_action_rates`.
3. The independent annotator (`negotiation.annotator`) agrees with the rules' verdicts on trajectories of the
   scripted policy, of the deliberately bad policies, and of perturbed scripted play.
"""

import itertools
import random
from collections import Counter

import pytest

from rwcore.judges import RuleJudge
from rwcore.trainer.envs import NegotiationEnv, Task
from rwcore.trainer.envs.negotiation import KINDS, best_fixed_sequence, run_episode, scripted_policy
from rwcore.trainer.envs.negotiation.annotator import ANNOTATORS, annotate
from rwcore.trainer.envs.negotiation.reference_policies import _bad_policies
from rwcore.trainer.envs.negotiation.rubrics import constant_action_rates
from rwcore.trainer.envs.negotiation.search import _winning_moves
from rwcore.types import Trajectory
from rwcore.verdict import Verdict

DEFAULT = NegotiationEnv()  # the default environment: 300 held-out tasks
# written out by hand: the eight verbs, and the ten price words price_words=True adds
VERBS = ["ask", "match", "list", "bundle", "accept", "confirm", "close", "end"]
PRICE_WORDS = [str(p) for p in range(20, 201, 20)]
VOCABULARY = {True: VERBS + PRICE_WORDS, False: VERBS}
ENVS = {price_words: NegotiationEnv(price_words=price_words) for price_words in (True, False)}

# One fixed sequence per winnable kind wins all of its tasks (by hand, from the module docstring); none wins
# tasks of two kinds (each needs a different move at some point), so the best fixed sequence wins the largest
# kind: 45 of the 300 held-out tasks (standard, bundle, haggler and quote 45 each, no_deal 42).
KIND_SEQUENCES = {
    "standard": ("ask", "match", "confirm", "close"),
    "bundle": ("ask", "bundle", "match", "confirm", "close"),
    "haggler": ("list", "accept", "confirm", "close"),
    "quote": ("list", "confirm", "close"),
    "no_deal": ("ask", "end"),
}
EVAL_COUNTS = {"standard": 45, "bundle": 45, "haggler": 45, "quote": 45, "no_deal": 42, "hostile": 39, "sold_out": 39}


def _won(env, tasks, sequence):
    """The tasks the fixed `sequence` wins (an episode that ends early stops reading it; one that outlives it
    is not a success)."""
    won = []
    for task in tasks:
        episode = env.reset(task, 0)
        for message in sequence:
            if episode.done:
                break
            episode = env.step(episode, message)
        if env.outcome(episode).success:
            won.append(task)
    return won


def _successes(env, tasks, sequence):
    return len(_won(env, tasks, sequence))


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


def test_each_kind_has_its_own_winning_sequence():
    tasks = DEFAULT.tasks("eval")
    assert Counter(t.data["kind"] for t in tasks) == EVAL_COUNTS
    for kind, sequence in KIND_SEQUENCES.items():
        won = _won(DEFAULT, tasks, sequence)
        assert Counter(t.data["kind"] for t in won) == {kind: EVAL_COUNTS[kind]}, (kind, sequence)


@pytest.mark.parametrize("price_words", [True, False])
def test_best_fixed_sequence_bounds_every_sequence_on_the_default_eval_split(price_words):
    env = ENVS[price_words]
    vocabulary = VOCABULARY[price_words]
    assert env.action_vocabulary() == sorted(vocabulary)
    tasks = env.tasks("eval")
    rate, sequence = best_fixed_sequence(env)
    assert 1 <= len(sequence) <= env.max_turns and set(sequence) <= set(vocabulary)
    won = _won(env, tasks, sequence)
    assert len(won) == round(rate * len(tasks))  # it scores what it says
    assert rate == pytest.approx(45 / 300)
    assert len({t.data["kind"] for t in won}) == 1  # one kind's tasks
    best_short = 0
    for length in (1, 2):
        for candidate in itertools.product(vocabulary, repeat=length):
            wins = _successes(env, tasks, candidate)
            assert wins / len(tasks) <= rate, candidate
            best_short = max(best_short, wins)
    rng = random.Random(2024)
    for _ in range(200):
        candidate = tuple(rng.choice(vocabulary) for _ in range(rng.choice((3, 4, 5, 6))))
        assert _successes(env, tasks, candidate) / len(tasks) <= rate, candidate
    # at length 2 the search is exact: only the no-deal tasks can be won in two messages (ask, end)
    assert best_short == 42
    assert best_fixed_sequence(env, max_length=2)[0] == pytest.approx(42 / 300)
    # the whole search space, without branch-and-bound
    assert _exhaustive_best(env, tasks, vocabulary, env.max_turns) == 45


@pytest.mark.parametrize(
    "options, split, max_length, phrases",
    [
        ({"price_words": False}, "train", None, None),
        (
            {"num_train": 10, "num_eval": 120, "kind_weights": {"haggler": 1, "bundle": 1, "standard": 1}},
            "eval",
            None,
            None,
        ),
        (
            {
                "num_train": 10,
                "num_eval": 120,
                "kind_weights": {"haggler": 3, "quote": 2, "no_deal": 1},
                "max_turns": 4,
            },
            "eval",
            None,
            None,
        ),
        ({"num_train": 10, "num_eval": 80, "kind_weights": {"bundle": 1}, "max_turns": 4}, "eval", None, None),
        (
            {"num_train": 10, "num_eval": 80, "kind_weights": {"bundle": 1}},
            "eval",
            None,
            ("ask", "bundle", "list", "confirm", "close", "end", "100", "120"),
        ),  # no match: list or a price
        (
            {"num_train": 10, "num_eval": 120, "kind_weights": {"standard": 1, "quote": 1}, "price_words": False},
            "eval",
            None,
            ("ask", "list", "confirm", "close", "end"),
        ),  # no match: only quotes are won
        ({"num_train": 10, "num_eval": 150, "max_turns": 3}, "eval", 2, None),
        ({"num_train": 10, "num_eval": 150}, "eval", 3, None),
    ],
)
def test_best_fixed_sequence_equals_an_exhaustive_search(options, split, max_length, phrases):
    env = NegotiationEnv(seed=5, **options)
    tasks = env.tasks(split)
    rate, sequence = best_fixed_sequence(env, split, max_length=max_length, phrases=phrases)
    vocabulary = env.action_vocabulary() if phrases is None else list(phrases)
    assert set(sequence) <= set(vocabulary)
    best = _exhaustive_best(env, tasks, vocabulary, max_length or env.max_turns)
    assert rate == pytest.approx(best / len(tasks)), (rate, best, sequence)
    assert _successes(env, tasks, sequence) == best


def test_best_fixed_sequence_by_hand_on_small_mixes():
    # standard + quote without match: no standard task can be won (ask, then the budget needs a price word or
    # match), every quote task can (list, confirm, close): the quotes' share of the split
    env = NegotiationEnv(seed=5, num_train=10, num_eval=120, kind_weights={"standard": 1, "quote": 1})
    rate, sequence = best_fixed_sequence(env, phrases=("ask", "list", "confirm", "close", "end"))
    assert rate == pytest.approx(0.5) and sequence[-3:] == ("list", "confirm", "close")
    # four turns are too few for a bundle sale (ask, bundle, match, confirm, close): nothing is won
    bundles = NegotiationEnv(seed=5, num_train=10, num_eval=40, kind_weights={"bundle": 1}, max_turns=4)
    assert best_fixed_sequence(bundles)[0] == 0.0
    # with five every bundle task is won (match names each task's bundle budget)
    bundles = NegotiationEnv(seed=5, num_train=10, num_eval=40, kind_weights={"bundle": 1}, max_turns=5)
    rate, sequence = best_fixed_sequence(bundles)
    assert rate == 1.0 and _successes(bundles, bundles.tasks("eval"), sequence) == 40
    assert sorted(sequence) == sorted(KIND_SEQUENCES["bundle"])  # ask and bundle in some order, then the rest
    # without match, `list` wins exactly the bundle tasks whose list price is their bundle budget
    rate, _ = best_fixed_sequence(bundles, phrases=("ask", "bundle", "list", "confirm", "close"))
    listed = sum(t.data["list"] == t.data["bundle_budget"] for t in bundles.tasks("eval"))
    assert 0 < listed < 40 and rate == pytest.approx(listed / 40)


def test_every_winning_sequence_says_a_needed_move_at_every_step():
    """The premise of best_fixed_sequence's bound: while an episode can still be won, every winning
    continuation says one of the moves `_winning_moves` names (checked on every winning sequence of the
    vocabulary, found by walking each task's whole episode tree)."""
    env = NegotiationEnv(seed=7, num_train=10, num_eval=140)
    tasks = env.tasks("eval") + [
        Task(
            "bundle-list",
            KINDS["bundle"],
            {
                "kind": "bundle",
                "item": "lamp",
                "cost": 60,
                "bundle_cost": 80,
                "bundle_budget": 120,
                "budget": 40,
                "list": 120,
                "feasible": True,
                "winnable": True,
            },
        ),
        Task(
            "standard-list",
            KINDS["standard"],
            {
                "kind": "standard",
                "item": "lamp",
                "cost": 60,
                "bundle_cost": None,
                "bundle_budget": None,
                "budget": 100,
                "list": 100,
                "feasible": True,
                "winnable": True,
            },
        ),
    ]
    checked = Counter()

    def walk(path):
        episode = path[-1][1]
        for phrase in VOCABULARY[True]:
            nxt = env.step(episode, phrase)
            steps = path + [(phrase, nxt)]
            if not nxt.done:
                walk(steps)
            elif env.outcome(nxt).success:
                said = [message for message, _ in steps[1:]]
                for i, (_, before) in enumerate(steps[:-1]):
                    needed = _winning_moves(before.state, env.max_turns - i)
                    assert needed & set(said[i:]), (before.task.task_id, said, i, needed)
                checked[before.task.data["kind"]] += 1

    for task in tasks:
        walk([(None, env.reset(task, 0))])
    assert set(checked) == {"standard", "bundle", "haggler", "quote", "no_deal"}


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
    assert set(reported) == set(VOCABULARY[True])
    # the vocabulary, and synonyms and free text a policy could say instead
    for phrase in VOCABULARY[True] + [
        "yes",
        "budget",
        "stop",
        "deal",
        "agree",
        "offer 100",
        "offer 110",
        "bundle 120",
        "match 100",
        "hello",
    ]:
        trajectories = [run_episode(DEFAULT, task, lambda obs, p=phrase: p) for task in tasks]
        passes = dict.fromkeys(rules, 0)
        for report in judge.evaluate(trajectories, specs):
            for rule_id, judgment in report.judgments.items():
                assert judgment.verdict != Verdict.INVALID
                passes[rule_id] += judgment.verdict == Verdict.PASS
        rates = {rid: count / len(tasks) for rid, count in passes.items()}
        assert max(rates.values()) <= 0.05, (phrase, rates)
        # by hand, none at all: every rule needs a move that follows what the buyer said (an offer after an
        # ask, a confirm after an agreement, a take after a counter, ...) and a repeated message is never it
        assert max(rates.values()) == 0, (phrase, rates)
        if phrase in reported:
            assert reported[phrase] == pytest.approx(rates), phrase


# -- 3. the annotator agrees with the rules ------------------------------------------------------------


def _perturbed(rng):
    """Scripted play with mistakes: another move, a synonym, a near-miss price, a multi-word message."""
    pool = (
        VERBS
        + [
            "yes",
            "budget",
            "hello",
            "offer",
            "deal",
            "agree",
            "bundle 120",
            "bundle 100",
            "offer bundle 100",
            "110",
            "95",
            "sell 85",
            "ask 100",
            "accept 100",
            "match 80",
            "list 100",
            "confirm 100",
            "close deal",
            "",
        ]
        + PRICE_WORDS
    )

    def policy(observation):
        if rng.random() < 0.3:
            return rng.choice(pool)
        message = scripted_policy(observation)
        if message.isdigit() and rng.random() < 0.3:
            message = rng.choice((str(int(message) + rng.choice((-20, -10, 10, 20))), "match", "list"))
        return message

    return policy


def test_annotator_agrees_with_the_rules():
    rules = {rule.spec.rubric_id: rule for rule in DEFAULT.rules()}
    assert set(ANNOTATORS) == set(rules)
    judge = RuleJudge({rid: rule.check for rid, rule in rules.items()})
    trajectories = []
    # the default turns, and a short limit that cuts episodes off mid-sale
    for env in (
        NegotiationEnv(seed=11, num_train=10, num_eval=150),
        NegotiationEnv(seed=12, num_train=10, num_eval=60, max_turns=3),
    ):
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
