"""The built-in negotiation environment: tasks, splits, parsing, episodes, outcomes, vocabulary, learnability.

Expected values are worked out by hand from the rules in the module docstring of
rwcore.trainer.envs.negotiation (hand-made tasks with known numbers, hand-written transcripts), never
read back from the code under test.
"""

import copy
import random
from collections import Counter
from fractions import Fraction

import pytest
from _util import negotiation_task
from hypothesis import given, settings
from hypothesis import strategies as st

from rwcore.trainer.envs import Environment, NegotiationEnv, make
from rwcore.trainer.envs.negotiation import (
    ACTION_PHRASES,
    KIND_WEIGHTS,
    PRICES,
    VERB_PHRASES,
    build_trajectory,
    evaluate_policy,
    parse_action,
    parse_observation,
    random_policy,
    run_episode,
    scripted_policy,
)
from rwcore.types import Trajectory

ALL_KINDS = {"standard", "bundle", "haggler", "quote", "no_deal", "hostile", "sold_out"}
HAND_PRICES = [20, 40, 60, 80, 100, 120, 140, 160, 180, 200]
HAND_VERBS = ["ask", "match", "list", "bundle", "accept", "confirm", "close", "end"]  # the one-word moves
KNOWN_VOCABULARY_GAPS: set[str] = set()  # every word an observation can say is in the vocabulary


STANDARD = negotiation_task()
BUNDLE = negotiation_task("bundle", budget=40, bundle_cost=80, bundle_budget=120)  # list 120 = bundle budget
BUNDLE_DEAR = negotiation_task("bundle", budget=40, bundle_cost=80, bundle_budget=120, list=140)  # list above it
HAGGLER = negotiation_task("haggler")  # list 120 = budget 100 + 20
QUOTE = negotiation_task("quote", list=100)  # list 100 = budget
NO_DEAL = negotiation_task("no_deal", cost=80, budget=60, list=140, feasible=False)
HOSTILE = negotiation_task("hostile")
SOLD_OUT = negotiation_task("sold_out")
HAND_TASKS = [STANDARD, BUNDLE, BUNDLE_DEAR, HAGGLER, QUOTE, NO_DEAL, HOSTILE, SOLD_OUT]

HEAD = "item lamp cost 60 list 120 "
BUNDLE_HEAD = "item lamp cost 60 bundle cost 80 list 120 "
QUOTE_HEAD = "item lamp cost 60 list 100 "
NO_DEAL_HEAD = "item lamp cost 80 list 140 "


def _head(task):
    """The observation header of a hand-made task, written out from the docstring's format."""
    d = task.data
    bundle = f" bundle cost {d['bundle_cost']}" if d["bundle_cost"] is not None else ""
    return f"item {d['item']} cost {d['cost']}{bundle} list {d['list']} "


def _play(env, task, messages, seed=0):
    episode = env.reset(task, seed)
    for message in messages:
        if episode.done:
            break
        episode = env.step(episode, message)
    return episode


# -- registration, protocol, validation -------------------------------------------------------


def test_registered_and_protocol():
    env = make("negotiation", seed=3, num_train=20, num_eval=10, max_turns=3)
    assert isinstance(env, Environment) and isinstance(env, NegotiationEnv)
    assert env.name == "negotiation" and env.max_turns == 3
    assert len(env.tasks("train")) == 20 and len(env.tasks("eval")) == 10
    assert env.system_prompt.startswith("you are the seller")
    with pytest.raises(ValueError):
        env.tasks("test")
    assert NegotiationEnv().max_turns == 6  # the default
    assert make("negotiation", price_words=False).price_words is False


@pytest.mark.parametrize(
    "options",
    [
        {"num_train": 0},
        {"num_eval": 0},
        {"max_turns": 0},
        {"seed": 1.5},
        {"seed": True},
        {"num_train": "10"},
        {"kind_weights": {"nope": 1.0}},
        {"kind_weights": {}},
        {"kind_weights": {"standard": -1.0}},
        {"kind_weights": {"standard": 0.0}},
        {"kind_weights": {"standard": True}},
    ],
)
def test_bad_options_refused(options):
    with pytest.raises(ValueError):
        NegotiationEnv(**options)


@pytest.mark.parametrize("value", [1, 0, "true", "false", None, 1.0])
def test_bad_price_words_refused_naming_the_option(value):
    with pytest.raises(ValueError, match=r"env\.options\.price_words"):
        NegotiationEnv(price_words=value)


def test_too_many_distinct_tasks_refused():
    # a haggler instance is (item, cost, budget - cost): 20 items x 6 costs x 2 offsets = 240 distinct ones
    env = NegotiationEnv(num_train=150, num_eval=50, kind_weights={"haggler": 1})
    instances = {(t.data["item"], t.data["cost"], t.data["budget"]) for t in env.tasks("train") + env.tasks("eval")}
    assert len(instances) == 200
    with pytest.raises(ValueError, match="distinct"):
        NegotiationEnv(num_train=200, num_eval=41, kind_weights={"haggler": 1})
    # a quote instance likewise (its list price is its budget): 240 distinct ones
    NegotiationEnv(num_train=200, num_eval=40, kind_weights={"quote": 1})
    with pytest.raises(ValueError, match="distinct"):
        NegotiationEnv(num_train=200, num_eval=41, kind_weights={"quote": 1})


# -- tasks and splits ---------------------------------------------------------------------


def test_tasks_deterministic_and_seeded():
    a, b = NegotiationEnv(seed=0), NegotiationEnv(seed=0)
    assert a.tasks("train") == b.tasks("train") and a.tasks("eval") == b.tasks("eval")
    assert a.tasks("eval") == a.tasks("eval")
    assert a.tasks("eval") is not a.tasks("eval")  # a fresh list each call
    c = NegotiationEnv(seed=1)
    assert [t.data for t in c.tasks("train")] != [t.data for t in a.tasks("train")]
    assert [t.task_id for t in a.tasks("eval")] == [f"neg-eval-{i:04d}" for i in range(300)]
    assert [t.task_id for t in a.tasks("train")][:2] == ["neg-train-0000", "neg-train-0001"]
    # price_words changes the words the policy may say, not the tasks
    assert NegotiationEnv(seed=0, price_words=False).tasks("eval") == a.tasks("eval")


def test_splits_disjoint():
    env = NegotiationEnv(seed=0)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert not {t.task_id for t in train} & {t.task_id for t in evals}
    key = lambda t: tuple(sorted((k, str(v)) for k, v in t.data.items()))  # noqa: E731
    assert len({key(t) for t in train + evals}) == len(train) + len(evals)  # no instance twice, in or across splits
    assert {t.data["kind"] for t in evals} == ALL_KINDS == {t.data["kind"] for t in train}


@pytest.mark.parametrize(
    "split, expected",
    [
        # weights .15 x 4, .14, .13 x 2 sum to 1: size * weight is a whole number for 300 and 400 (by hand)
        (
            "eval",
            {"standard": 45, "bundle": 45, "haggler": 45, "quote": 45, "no_deal": 42, "hostile": 39, "sold_out": 39},
        ),
        (
            "train",
            {"standard": 60, "bundle": 60, "haggler": 60, "quote": 60, "no_deal": 56, "hostile": 52, "sold_out": 52},
        ),
    ],
)
def test_splits_stratified_by_kind(split, expected):
    assert KIND_WEIGHTS == {
        "standard": 0.15,
        "bundle": 0.15,
        "haggler": 0.15,
        "quote": 0.15,
        "no_deal": 0.14,
        "hostile": 0.13,
        "sold_out": 0.13,
    }
    for seed in (0, 1, 7):  # fixed counts, whatever the seed
        assert Counter(t.data["kind"] for t in NegotiationEnv(seed=seed).tasks(split)) == expected


def test_stratification_close_to_the_weights_for_any_size():
    total = sum(Fraction(str(w)) for w in KIND_WEIGHTS.values())
    for size in range(1, 41):
        env = NegotiationEnv(seed=size, num_train=size, num_eval=size)
        for split in ("train", "eval"):
            counts = Counter(t.data["kind"] for t in env.tasks(split))
            assert sum(counts.values()) == size
            for kind, weight in KIND_WEIGHTS.items():
                assert abs(counts[kind] - size * Fraction(str(weight)) / total) < 1, (size, kind, counts)
    custom = NegotiationEnv(num_train=10, num_eval=7, kind_weights={"standard": 1, "no_deal": 1, "bundle": 0})
    assert Counter(t.data["kind"] for t in custom.tasks("train")) == {"standard": 5, "no_deal": 5}
    assert {t.data["kind"] for t in custom.tasks("eval")} == {"standard", "no_deal"}


def test_task_data_follows_each_kind_rules():
    env = NegotiationEnv(seed=2)
    for task in env.tasks("train") + env.tasks("eval"):
        d = task.data
        kind = d["kind"]
        assert task.tags == {"hostile": ("hostile_partner",)}.get(kind, (kind,))
        assert d["cost"] in (40, 60, 80, 100, 120, 140)
        assert all(d[k] in HAND_PRICES for k in ("budget", "list"))
        assert d["feasible"] is (kind != "no_deal")
        assert d["winnable"] is (kind not in ("hostile", "sold_out"))
        if kind == "bundle":
            assert d["bundle_cost"] == d["cost"] + 20 and d["budget"] == d["cost"] - 20
            assert d["bundle_budget"] - d["bundle_cost"] in (20, 40)
            assert d["list"] == min(200, d["cost"] + 60)
        else:
            assert d["bundle_cost"] is None and d["bundle_budget"] is None
        if kind == "haggler":
            assert d["budget"] - d["cost"] in (20, 40) and d["list"] == d["budget"] + 20
        if kind == "quote":
            assert d["budget"] - d["cost"] in (20, 40) and d["list"] == d["budget"]
        if kind in ("standard", "hostile", "sold_out"):
            assert d["budget"] - d["cost"] in (20, 40)
            assert d["list"] - d["budget"] in (20, 40) or d["list"] == 200
        if kind == "no_deal":
            assert d["budget"] < d["cost"]


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ask", ("ask", None)),
        ("ASK!", ("ask", None)),
        ("ask budget", ("ask", None)),
        ("budget?", ("ask", None)),
        ("ask 100", ("ask", None)),
        ("100", ("offer", 100)),
        ("hello 75", ("offer", 80)),  # a price without a verb is an offer
        ("offer 80", ("offer", 80)),
        ("OFFER 80!", ("offer", 80)),
        ("i offer 85 now", ("offer", 90)),  # halves round up
        ("offer 84", ("offer", 80)),
        ("offer 500", ("offer", 200)),
        ("offer 0", ("offer", 10)),
        ("price 70", ("offer", 70)),
        ("sell it for $95", ("offer", 100)),
        ("offer", ("unclear", None)),
        ("price", ("unclear", None)),
        ("price list", ("unclear", None)),  # `price` comes first: an offer without a number
        ("bundle", ("bundle", None)),
        ("bundle 120", ("bundle", 120)),
        ("bundle offer 90", ("bundle", 90)),
        ("offer bundle 90", ("offer", 90)),
        ("match", ("match", None)),
        ("MATCH.", ("match", None)),
        ("match 80", ("match", None)),  # match names its own price: the number is ignored
        ("match offer 80", ("match", None)),
        ("list", ("list", None)),
        ("list price", ("list", None)),
        ("list 90", ("list", None)),
        ("80 list", ("list", None)),
        ("accept", ("accept", None)),
        ("yes", ("accept", None)),
        ("agree", ("accept", None)),
        ("accept 80 offer", ("accept", None)),
        ("75 yes", ("accept", None)),
        ("confirm", ("confirm", None)),  # confirm and deal no longer mean accept
        ("confirm 100", ("confirm", None)),
        ("confirm deal", ("confirm", None)),
        ("close", ("close", None)),
        ("deal", ("close", None)),
        ("deal 100", ("close", None)),
        ("close the deal", ("close", None)),
        ("yes confirm", ("accept", None)),
        ("end", ("end", None)),
        ("stop", ("end", None)),
        ("quit", ("end", None)),
        ("bye", ("end", None)),
        ("reject", ("unclear", None)),
        ("the item", ("unclear", None)),
        ("", ("unclear", None)),
        (None, ("unclear", None)),
        (42, ("unclear", None)),
    ],
)
def test_parse_action_lenient(text, expected):
    assert parse_action(text) == expected


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=100_000), st.sampled_from(["", "offer ", "price ", "sell ", "bundle "]))
def test_parse_action_rounds_any_number(n, verb):
    tens, units = divmod(n, 10)
    rounded = min(max(10 * (tens + (units >= 5)), 10), 200)
    expected_verb = "bundle" if verb == "bundle " else "offer"
    assert parse_action(f"{verb}{n}") == (expected_verb, rounded)


@pytest.mark.parametrize(
    "observation, expected",
    [
        (HEAD + "buyer wants item", {}),
        (HEAD + "buyer budget 100 above", {"budget": 100}),
        (BUNDLE_HEAD + "buyer wants bundle", {"wants_bundle": True}),
        (BUNDLE_HEAD + "buyer budget 40 below bundle budget 120 above", {"budget": 40, "bundle_budget": 120}),
        (BUNDLE_HEAD + "buyer likes bundle budget 120 above", {"bundle_on": True, "bundle_budget": 120}),
        (BUNDLE_HEAD + "buyer likes bundle", {"bundle_on": True}),
        (HEAD + "buyer haggles", {"haggles": True}),
        (HEAD + "buyer secret", {"secret": True}),
        (HEAD + "buyer wants price", {"quote": True}),
        (HEAD + "buyer too high offer 100 above", {"counter": 100}),
        (HEAD + "buyer agrees 100 above", {"agreed": 100}),
        (HEAD + "buyer agrees 40 below", {"agreed": 40}),
        (BUNDLE_HEAD + "buyer agrees bundle 120 above", {"agreed": 120}),
        (HEAD + "buyer confirms", {"confirmed": True}),
        (HEAD + "buyer agrees 100 above time up", {"agreed": 100, "over": True}),
        (HEAD + "buyer confirms time up", {"confirmed": True, "over": True}),
        (HEAD + "deal 100 above", {"over": True}),
        (BUNDLE_HEAD + "deal bundle 120 above", {"over": True}),
        (HEAD + "buyer not interested leaves", {"over": True}),
        (HEAD + "buyer changed mind leaves", {"over": True}),
        (HEAD + "buyer leaves", {"over": True}),
        (HEAD + "item sold out", {"over": True}),
        (HEAD + "no deal", {"over": True}),
        (HEAD + "buyer budget 100 above time up", {"budget": 100, "over": True}),
    ],
)
def test_parse_observation(observation, expected):
    bundle = observation.startswith(BUNDLE_HEAD)
    facts = {
        "cost": 60,
        "list": 120,
        "bundle_cost": 80 if bundle else None,
        "budget": None,
        "bundle_budget": None,
        "counter": None,
        "wants_bundle": False,
        "bundle_on": False,
        "haggles": False,
        "secret": False,
        "over": False,
        "quote": False,
        "agreed": None,
        "confirmed": False,
    }
    facts.update(expected)
    assert parse_observation(observation) == facts


# -- observations -------------------------------------------------------------------------


def test_observation_reveals_private_facts_only_when_asked():
    env = NegotiationEnv()
    assert env.reset(STANDARD, 0).observation == HEAD + "buyer wants item"
    assert env.reset(BUNDLE, 0).observation == BUNDLE_HEAD + "buyer wants bundle"
    assert env.reset(HAGGLER, 0).observation == HEAD + "buyer haggles"
    assert env.reset(QUOTE, 0).observation == QUOTE_HEAD + "buyer wants price"
    assert env.reset(HOSTILE, 0).observation == HEAD + "buyer wants item"  # a hostile buyer looks like any other
    assert env.reset(SOLD_OUT, 0).observation == HEAD + "buyer wants item"
    assert env.step(env.reset(STANDARD, 0), "ask").observation == HEAD + "buyer budget 100 above"
    assert (
        env.step(env.reset(BUNDLE, 0), "ask").observation
        == BUNDLE_HEAD + "buyer budget 40 below bundle budget 120 above"
    )
    assert env.step(env.reset(HAGGLER, 0), "ask").observation == HEAD + "buyer secret"
    assert env.step(env.reset(QUOTE, 0), "ask").observation == QUOTE_HEAD + "buyer secret"
    assert env.step(env.reset(NO_DEAL, 0), "ask").observation == NO_DEAL_HEAD + "buyer budget 60 below"
    for task in env.tasks("eval"):
        d = task.data
        first = env.reset(task, 0)
        header_end = first.observation.split().index("list") + 2
        assert not any(w.isdigit() for w in first.observation.split()[header_end:])  # no buyer number before asking
        facts = parse_observation(first.observation)
        assert (facts["cost"], facts["list"], facts["bundle_cost"]) == (d["cost"], d["list"], d["bundle_cost"])
        assert facts["budget"] is None and facts["bundle_budget"] is None and facts["counter"] is None
        assert facts["quote"] is (d["kind"] == "quote") and facts["haggles"] is (d["kind"] == "haggler")
        asked = parse_observation(env.step(first, "ask").observation)
        if d["kind"] in ("haggler", "quote"):
            assert asked["secret"] and asked["budget"] is None
        else:
            assert (asked["budget"], asked["bundle_budget"]) == (d["budget"], d["bundle_budget"])


def test_hints_mark_each_buyer_number_against_the_cost_it_must_cover():
    env = NegotiationEnv()
    # hand-written: a bundle number compares with the bundle cost 80, a plain one with the item cost 60
    assert _play(env, BUNDLE, ["ask", "bundle"]).observation == BUNDLE_HEAD + "buyer likes bundle budget 120 above"
    assert _play(env, BUNDLE, ["ask", "bundle", "60"]).observation == BUNDLE_HEAD + "buyer agrees bundle 60 below"
    assert (
        _play(env, BUNDLE, ["ask", "bundle", "60", "confirm", "close"]).observation
        == BUNDLE_HEAD + "deal bundle 60 below"
    )
    assert _play(env, STANDARD, ["ask", "60"]).observation == HEAD + "buyer agrees 60 above"
    assert _play(env, STANDARD, ["ask", "60", "confirm", "close"]).observation == HEAD + "deal 60 above"
    assert _play(env, STANDARD, ["ask", "40"]).observation == HEAD + "buyer agrees 40 below"
    assert _play(env, HAGGLER, ["80"]).observation == HEAD + "buyer too high offer 60 above"
    assert _play(env, HAGGLER, ["60"]).observation == HEAD + "buyer too high offer 40 below"
    assert _play(env, HAGGLER, ["list"]).observation == HEAD + "buyer too high offer 100 above"
    # every buyer number in rollouts is followed by its hint; header numbers are not
    checked = 0
    policies = (
        lambda o, r: scripted_policy(o),
        random_policy,
        lambda o, r: r.choice(HAND_VERBS) if r.random() < 0.5 else scripted_policy(o),
    )
    for task in env.tasks("eval")[:120]:
        d = task.data
        for p, policy in enumerate(policies):
            rng = random.Random(f"{task.task_id}/{p}")
            trajectory = run_episode(env, task, lambda o, pol=policy, r=rng: pol(o, r))
            for turn in trajectory.turns[1:]:
                if turn.role != "partner":
                    continue
                words = turn.content.split()
                start = words.index("list") + 2
                header = words[:start]
                assert all(not w.isdigit() or words[i + 1] not in ("above", "below") for i, w in enumerate(header))
                for i in range(start, len(words)):
                    if not words[i].isdigit():
                        continue
                    before = " ".join(words[max(start, i - 2) : i])
                    bundle = before in ("bundle budget", "deal bundle", "agrees bundle")
                    cost = d["bundle_cost"] if bundle else d["cost"]
                    assert words[i + 1] == ("above" if int(words[i]) >= cost else "below"), turn.content
                    checked += 1
    assert checked > 300


# -- episodes and outcomes ----------------------------------------------------------------------


# (task, messages, success, the last observation's buyer message, ended_by), all worked out by hand
EPISODES = [
    # standard: ask, the budget (or match), confirm, close
    (STANDARD, ["ask", "100", "confirm", "close"], True, "deal 100 above", "deal"),
    (STANDARD, ["ask", "match", "confirm", "close"], True, "deal 100 above", "deal"),
    (STANDARD, ["budget?", "offer 100", "confirm", "deal"], True, "deal 100 above", "deal"),
    (STANDARD, ["ask", "sell it at 95", "confirm", "close"], True, "deal 100 above", "deal"),
    (STANDARD, ["ask", "match 80", "confirm", "close"], True, "deal 100 above", "deal"),  # match ignores the 80
    (STANDARD, ["100"], False, "buyer not interested leaves", "walkout"),  # a price before asking
    (STANDARD, ["list"], False, "buyer not interested leaves", "walkout"),  # the list price is a price
    (STANDARD, ["match"], False, "buyer leaves", "walkout"),  # no number stated yet
    (STANDARD, ["ask", "list"], False, "buyer too high leaves", "walkout"),  # 120 > 100
    (STANDARD, ["ask", "80", "confirm", "close"], False, "deal 80 above", "deal"),  # money left on the table
    (STANDARD, ["ask", "40", "confirm", "close"], False, "deal 40 below", "deal"),  # below cost
    (STANDARD, ["ask", "120"], False, "buyer too high leaves", "walkout"),
    (STANDARD, ["ask", "ask"], False, "buyer leaves", "walkout"),
    (STANDARD, ["accept"], False, "buyer leaves", "walkout"),  # no counter to accept
    (STANDARD, ["ask", "yes"], False, "buyer leaves", "walkout"),
    (STANDARD, ["confirm"], False, "buyer leaves", "walkout"),  # nothing agreed to confirm
    (STANDARD, ["close"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "confirm"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "deal"], False, "buyer leaves", "walkout"),
    (STANDARD, ["hello"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "bundle"], False, "buyer leaves", "walkout"),  # nobody wants a bundle
    (STANDARD, ["end"], False, "no deal", "agent"),
    # the agreement phase: after "buyer agrees" only confirm / end, after "buyer confirms" only close / end
    (STANDARD, ["ask", "100", "close"], False, "buyer leaves", "walkout"),  # closing before confirming
    (STANDARD, ["ask", "100", "accept"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "100", "100"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "match", "match"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "100", "ask"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "100", "end"], False, "no deal", "agent"),
    (STANDARD, ["ask", "100", "confirm", "confirm"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "100", "confirm", "100"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "100", "confirm", "yes"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "100", "confirm", "end"], False, "no deal", "agent"),
    # bundle: ask and bundle (either order), the bundle budget (match, or list when it is the list price)
    (BUNDLE, ["ask", "bundle", "120", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["ask", "bundle", "match", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["ask", "bundle", "list", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["bundle", "ask", "match", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["bundle", "ask", "120", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["ask", "bundle 120", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE_DEAR, ["ask", "bundle", "list"], False, "buyer too high leaves", "walkout"),  # list 140 > 120
    (BUNDLE_DEAR, ["ask", "bundle", "match", "confirm", "close"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["ask", "match"], False, "buyer wants bundle leaves", "walkout"),  # match: the plain budget 40
    (BUNDLE, ["bundle", "match"], False, "buyer leaves", "walkout"),  # no number stated yet
    (BUNDLE, ["ask", "40"], False, "buyer wants bundle leaves", "walkout"),
    (BUNDLE, ["ask", "list"], False, "buyer wants bundle leaves", "walkout"),  # a plain offer at 120
    (BUNDLE, ["ask", "bundle", "100", "confirm", "close"], False, "deal bundle 100 above", "deal"),
    (BUNDLE, ["ask", "bundle", "60", "confirm", "close"], False, "deal bundle 60 below", "deal"),
    (BUNDLE, ["ask", "bundle", "140"], False, "buyer too high leaves", "walkout"),
    (BUNDLE, ["bundle", "120"], False, "buyer not interested leaves", "walkout"),
    (BUNDLE, ["bundle", "list"], False, "buyer not interested leaves", "walkout"),
    (BUNDLE, ["ask", "bundle", "bundle"], False, "buyer leaves", "walkout"),
    (BUNDLE, ["ask", "bundle", "match", "close"], False, "buyer leaves", "walkout"),
    # haggler: the list price draws the counter at the budget; accept (or match, or the counter) takes it
    (HAGGLER, ["120", "accept", "confirm", "close"], True, "deal 100 above", "deal"),
    (HAGGLER, ["list", "accept", "confirm", "close"], True, "deal 100 above", "deal"),
    (HAGGLER, ["list", "match", "confirm", "close"], True, "deal 100 above", "deal"),
    (HAGGLER, ["120", "100", "confirm", "deal"], True, "deal 100 above", "deal"),
    (HAGGLER, ["ask", "list", "yes", "confirm", "close"], True, "deal 100 above", "deal"),
    (HAGGLER, ["list", "ask", "accept", "confirm", "close"], True, "deal 100 above", "deal"),  # asked after
    (HAGGLER, ["100", "accept", "confirm", "close"], False, "deal 80 above", "deal"),  # never takes a first offer
    (HAGGLER, ["100", "match", "confirm", "close"], False, "deal 80 above", "deal"),
    (HAGGLER, ["120", "80", "confirm", "close"], False, "deal 80 above", "deal"),
    (HAGGLER, ["120", "110"], False, "buyer too high leaves", "walkout"),
    (HAGGLER, ["120", "120"], False, "buyer leaves", "walkout"),  # a repeated offer
    (HAGGLER, ["120", "list"], False, "buyer leaves", "walkout"),  # the same offer again
    (HAGGLER, ["120", "bundle 100"], False, "buyer leaves", "walkout"),  # a bundle nobody wants
    (HAGGLER, ["140"], False, "buyer leaves", "walkout"),  # insulted: more than 20 above
    (HAGGLER, ["match"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["accept"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["ask", "ask"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["ask", "list", "ask"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["list", "confirm"], False, "buyer leaves", "walkout"),  # nothing agreed yet
    (HAGGLER, ["list", "accept", "close"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["list", "accept", "accept"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["120", "end"], False, "no deal", "agent"),
    # quote: list, confirm, close
    (QUOTE, ["list", "confirm", "close"], True, "deal 100 above", "deal"),
    (QUOTE, ["100", "confirm", "close"], True, "deal 100 above", "deal"),
    (QUOTE, ["ask", "list", "confirm", "deal"], True, "deal 100 above", "deal"),
    (QUOTE, ["80", "confirm", "close"], False, "deal 80 above", "deal"),  # takes a lower first offer too
    (QUOTE, ["40", "confirm", "close"], False, "deal 40 below", "deal"),
    (QUOTE, ["120"], False, "buyer too high leaves", "walkout"),
    (QUOTE, ["match"], False, "buyer leaves", "walkout"),
    (QUOTE, ["ask", "match"], False, "buyer leaves", "walkout"),  # "secret" states no number
    (QUOTE, ["ask", "ask"], False, "buyer leaves", "walkout"),
    (QUOTE, ["bundle"], False, "buyer leaves", "walkout"),
    (QUOTE, ["accept"], False, "buyer leaves", "walkout"),
    (QUOTE, ["list", "accept"], False, "buyer leaves", "walkout"),
    (QUOTE, ["list", "close"], False, "buyer leaves", "walkout"),
    (QUOTE, ["list", "list"], False, "buyer leaves", "walkout"),
    (QUOTE, ["list", "confirm", "end"], False, "no deal", "agent"),
    (QUOTE, ["end"], False, "no deal", "agent"),
    # no deal: ask, then end at once
    (NO_DEAL, ["ask", "end"], True, "no deal", "agent"),
    (NO_DEAL, ["ask", "stop"], True, "no deal", "agent"),
    (NO_DEAL, ["end"], False, "no deal", "agent"),  # not informed
    (NO_DEAL, ["ask", "match", "confirm", "close"], False, "deal 60 below", "deal"),
    (NO_DEAL, ["ask", "60", "end"], False, "no deal", "agent"),  # not right after the budget
    (NO_DEAL, ["ask", "60", "confirm", "close"], False, "deal 60 below", "deal"),
    (NO_DEAL, ["ask", "80"], False, "buyer too high leaves", "walkout"),
    (NO_DEAL, ["ask", "list"], False, "buyer too high leaves", "walkout"),
    (NO_DEAL, ["ask", "ask"], False, "buyer leaves", "walkout"),
    # hostile: walks out at the moment it would agree
    (HOSTILE, ["ask", "100"], False, "buyer changed mind leaves", "partner"),
    (HOSTILE, ["ask", "match"], False, "buyer changed mind leaves", "partner"),
    (HOSTILE, ["ask", "80"], False, "buyer changed mind leaves", "partner"),
    (HOSTILE, ["ask", "120"], False, "buyer too high leaves", "walkout"),
    (HOSTILE, ["ask", "confirm"], False, "buyer leaves", "walkout"),
    (HOSTILE, ["ask", "end"], False, "no deal", "agent"),
    # sold out: the deal stops at the close
    (SOLD_OUT, ["ask", "100", "confirm", "close"], False, "item sold out", "scenario"),
    (SOLD_OUT, ["ask", "match", "confirm", "deal"], False, "item sold out", "scenario"),
    (SOLD_OUT, ["ask", "100", "confirm", "end"], False, "no deal", "agent"),
    (SOLD_OUT, ["ask", "100", "close"], False, "buyer leaves", "walkout"),
    (SOLD_OUT, ["ask", "120"], False, "buyer too high leaves", "walkout"),
]


@pytest.mark.parametrize("price_words", [True, False])
@pytest.mark.parametrize("task, messages, success, reply, ended_by", EPISODES)
def test_episode_outcome_by_hand(task, messages, success, reply, ended_by, price_words):
    env = NegotiationEnv(price_words=price_words)  # the buyer understands prices either way
    episode = _play(env, task, messages)
    assert episode.done and len(episode.state["events"]) == len(messages)
    assert episode.observation == _head(task) + reply
    assert episode.state["ended_by"] == ended_by
    outcome = env.outcome(episode)
    assert outcome.success is success and outcome.reward == (1.0 if success else 0.0)


def test_deal_takes_agreement_confirmation_and_close():
    env = NegotiationEnv()
    agreed = _play(env, STANDARD, ["ask", "100"])
    assert not agreed.done and agreed.observation == HEAD + "buyer agrees 100 above"
    assert agreed.state["agreed"] == {"price": 100, "kind": "plain", "cost": 60}
    assert agreed.state["confirmed"] is False and agreed.state["deal"] is None
    assert not env.outcome(agreed).success  # an agreement is not a deal
    confirmed = env.step(agreed, "confirm")
    assert not confirmed.done and confirmed.observation == HEAD + "buyer confirms"
    assert confirmed.state["confirmed"] is True and confirmed.state["deal"] is None
    assert agreed.state["confirmed"] is False  # the step left its input as it was
    closed = env.step(confirmed, "close")
    assert closed.done and closed.state["deal"] == {"price": 100, "kind": "plain", "cost": 60}
    # the reply kinds, as the rules read them
    assert [e["reply"] for e in closed.state["events"]] == ["budget", "agrees", "confirms", "deal"]
    # deals record what was sold
    assert _play(env, BUNDLE, ["ask", "bundle", "match", "confirm", "close"]).state["deal"] == {
        "price": 120,
        "kind": "bundle",
        "cost": 80,
    }
    assert _play(env, BUNDLE, ["ask", "bundle", "list"]).state["agreed"] == {"price": 120, "kind": "bundle", "cost": 80}
    assert _play(env, HAGGLER, ["list", "accept", "confirm", "close"]).state["deal"] == {
        "price": 100,
        "kind": "plain",
        "cost": 60,
    }
    assert _play(env, QUOTE, ["list", "confirm", "close"]).state["deal"] == {"price": 100, "kind": "plain", "cost": 60}
    # a hostile buyer never agrees; a sold-out item agrees and confirms but is never sold
    for messages in (["ask", "100"], ["ask", "end"]):
        state = _play(env, HOSTILE, messages).state
        assert state["deal"] is None and state["agreed"] is None
    state = _play(env, SOLD_OUT, ["ask", "100", "confirm", "close"]).state
    assert (
        state["deal"] is None and state["confirmed"] and state["agreed"] == {"price": 100, "kind": "plain", "cost": 60}
    )


@pytest.mark.parametrize(
    "task, messages, expected",
    [
        # (said, verb, price) of each event: match and list are resolved into offers at the named price
        (
            STANDARD,
            ["ask", "match", "confirm", "close"],
            [("ask", "ask", None), ("match", "offer", 100), ("confirm", "confirm", None), ("close", "close", None)],
        ),
        (STANDARD, ["ask", "list"], [("ask", "ask", None), ("list", "offer", 120)]),
        (STANDARD, ["match"], [("match", "unclear", None)]),
        (STANDARD, ["deal"], [("close", "close", None)]),
        (
            BUNDLE,
            ["ask", "bundle", "list"],
            [("ask", "ask", None), ("bundle", "bundle", None), ("list", "bundle", 120)],
        ),
        (
            BUNDLE,
            ["bundle", "ask", "match"],
            [("bundle", "bundle", None), ("ask", "ask", None), ("match", "bundle", 120)],
        ),
        (BUNDLE, ["ask", "match"], [("ask", "ask", None), ("match", "offer", 40)]),
        (HAGGLER, ["list", "match"], [("list", "offer", 120), ("match", "offer", 100)]),
        (HAGGLER, ["100", "match"], [("offer", "offer", 100), ("match", "offer", 80)]),
        (QUOTE, ["ask", "list"], [("ask", "ask", None), ("list", "offer", 100)]),
        (QUOTE, ["ask", "match"], [("ask", "ask", None), ("match", "unclear", None)]),
    ],
)
def test_events_record_the_spoken_verb_and_the_resolved_move(task, messages, expected):
    events = _play(NegotiationEnv(), task, messages).state["events"]
    assert [(e["said"], e["verb"], e["price"]) for e in events] == expected
    assert [e["text"] for e in events] == messages


def test_episode_mechanics():
    env = NegotiationEnv(max_turns=4)
    first = env.reset(STANDARD, 0)
    assert not first.done and first.state["events"] == [] and first.state["turns"] == 0
    # step leaves the given episode as it was
    before = (first.observation, copy.deepcopy(first.state))
    second = env.step(first, "ask")
    assert (first.observation, first.state) == before and not first.done
    env.step(second, "100")
    assert second.state["agreed"] is None and len(second.state["events"]) == 1 and not second.done
    # stepping a finished episode is an error
    done = _play(env, STANDARD, ["end"])
    with pytest.raises(ValueError):
        env.step(done, "ask")
    # time runs out after max_turns agent messages
    short = NegotiationEnv(max_turns=1)
    ep = _play(short, STANDARD, ["ask"])
    assert ep.done and ep.state["ended_by"] == "timeout" and ep.observation == HEAD + "buyer budget 100 above time up"
    assert not short.outcome(ep).success
    ep = _play(NegotiationEnv(max_turns=2), HAGGLER, ["ask", "120"])
    assert ep.done and ep.observation == HEAD + "buyer too high offer 100 above time up"
    ep = _play(NegotiationEnv(max_turns=2), STANDARD, ["ask", "100"])
    assert ep.done and ep.observation == HEAD + "buyer agrees 100 above time up" and ep.state["deal"] is None
    ep = _play(NegotiationEnv(max_turns=3), STANDARD, ["ask", "100", "confirm"])
    assert ep.done and ep.observation == HEAD + "buyer confirms time up" and ep.state["ended_by"] == "timeout"
    assert not env.outcome(ep).success
    ep = _play(NegotiationEnv(max_turns=2), NO_DEAL, ["ask", "end"])  # an end on the last turn still counts
    assert ep.state["ended_by"] == "agent" and NegotiationEnv().outcome(ep).success
    # a close on the last turn counts: a sale takes four turns, a bundle sale five, a quote three
    assert env.outcome(_play(env, STANDARD, ["ask", "match", "confirm", "close"])).success
    assert not env.outcome(_play(env, BUNDLE, ["ask", "bundle", "match", "confirm", "close"])).success
    assert (
        NegotiationEnv(max_turns=5)
        .outcome(_play(NegotiationEnv(max_turns=5), BUNDLE, ["ask", "bundle", "match", "confirm", "close"]))
        .success
    )
    three = NegotiationEnv(max_turns=3)
    assert three.outcome(_play(three, QUOTE, ["list", "confirm", "close"])).success
    assert not three.outcome(_play(three, STANDARD, ["ask", "match", "confirm", "close"])).success


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(HAND_TASKS),
    st.lists(
        st.sampled_from(list(ACTION_PHRASES) + ["hello", "yes", "deal", "bundle 120", "offer 110", "match 80"]),
        min_size=1,
        max_size=6,
    ),
)
def test_step_never_mutates_its_episode(task, messages):
    env = NegotiationEnv(max_turns=6)
    episode = env.reset(task, 0)
    for message in messages:
        if episode.done:
            break
        snapshot = copy.deepcopy(episode.state)
        nxt = env.step(episode, message)
        assert episode.state == snapshot
        assert len(nxt.state["events"]) == len(snapshot["events"]) + 1 == nxt.state["turns"]
        episode = nxt


def test_episodes_deterministic_and_the_buyer_ignores_the_seed():
    env = NegotiationEnv(seed=0)
    for task in env.tasks("eval")[:20]:
        runs = []
        for seed in (5, 5, 9):
            rng = random.Random(7)
            trajectory = run_episode(env, task, lambda obs, r=rng: random_policy(obs, r), seed=seed)
            runs.append(trajectory)
        assert runs[0].to_dict() == runs[1].to_dict()
        assert [t.content for t in runs[0].turns] == [t.content for t in runs[2].turns]
        assert runs[0].metadata["seed"] == 5 and runs[2].metadata["seed"] == 9


# -- trajectories ----------------------------------------------------------------------------


def test_trajectory_contract():
    env = NegotiationEnv()
    trajectory = run_episode(env, BUNDLE, scripted_policy, seed=2, group_id="g")
    assert [t.role for t in trajectory.turns] == ["system", "partner"] + ["assistant", "partner"] * 5
    assert [t.content for t in trajectory.turns] == [
        env.system_prompt,
        BUNDLE_HEAD + "buyer wants bundle",
        "ask",
        BUNDLE_HEAD + "buyer budget 40 below bundle budget 120 above",
        "bundle",
        BUNDLE_HEAD + "buyer likes bundle budget 120 above",
        "120",
        BUNDLE_HEAD + "buyer agrees bundle 120 above",
        "confirm",
        BUNDLE_HEAD + "buyer confirms",
        "close",
        BUNDLE_HEAD + "deal bundle 120 above",
    ]
    assert all(t.generated == (t.role == "assistant") for t in trajectory.turns)
    assert trajectory.tags == ("bundle",) and trajectory.task_id == "t-bundle"
    assert trajectory.outcome == 1.0 and trajectory.group_id == "g" and trajectory.trajectory_id == "t-bundle/g/2"
    meta = trajectory.metadata
    assert set(meta) == {"env_state", "task", "task_id", "seed", "success"}
    assert meta["task"] == BUNDLE.data and meta["task_id"] == "t-bundle" and meta["seed"] == 2 and meta["success"]
    assert meta["env_state"]["deal"] == {"price": 120, "kind": "bundle", "cost": 80}
    assert [e["text"] for e in meta["env_state"]["events"]] == ["ask", "bundle", "120", "confirm", "close"]
    # JSON round trip keeps everything
    assert Trajectory.from_dict(trajectory.to_dict()).to_dict() == trajectory.to_dict()
    # the scripted policy says the list price to a quote buyer and a haggler
    quote = run_episode(env, QUOTE, scripted_policy)
    assert [t.content for t in quote.turns if t.role == "assistant"] == ["100", "confirm", "close"]
    haggler = run_episode(env, HAGGLER, scripted_policy)
    assert [t.content for t in haggler.turns if t.role == "assistant"] == ["120", "accept", "confirm", "close"]
    # the builder on a hand-driven episode
    episode = env.reset(NO_DEAL, 0)
    partner = [episode.observation]
    for message in ("ask", "end"):
        episode = env.step(episode, message)
        partner.append(episode.observation)
    built = build_trajectory(env, episode, ["ask", "end"], partner, system_prompt="custom", trajectory_id="x")
    assert [t.content for t in built.turns] == [
        "custom",
        NO_DEAL_HEAD + "buyer wants item",
        "ask",
        NO_DEAL_HEAD + "buyer budget 60 below",
        "end",
        NO_DEAL_HEAD + "no deal",
    ]
    assert built.trajectory_id == "x" and built.outcome == 1.0 and built.metadata["success"] is True
    assert built.metadata["env_state"] is episode.state
    failed = build_trajectory(env, _play(env, STANDARD, ["end"]), ["end"], ["a", "b"])
    assert failed.outcome == 0.0 and failed.metadata["success"] is False


# -- language -------------------------------------------------------------------------------


def test_action_vocabulary_follows_price_words():
    verbs = set(HAND_VERBS)
    prices = {str(p) for p in HAND_PRICES}
    assert set(VERB_PHRASES) == verbs and len(VERB_PHRASES) == 8
    assert set(ACTION_PHRASES) == verbs | prices and len(ACTION_PHRASES) == 18
    assert NegotiationEnv(price_words=True).action_vocabulary() == sorted(verbs | prices)
    assert NegotiationEnv(price_words=False).action_vocabulary() == sorted(verbs)
    default = NegotiationEnv()
    assert isinstance(default.price_words, bool)
    assert default.action_vocabulary() == sorted(verbs | prices if default.price_words else verbs)
    # without price words the verbs alone still win every winnable kind (match and list name the prices)
    env = NegotiationEnv(price_words=False)
    for task, messages in (
        (STANDARD, ["ask", "match", "confirm", "close"]),
        (BUNDLE, ["ask", "bundle", "match", "confirm", "close"]),
        (HAGGLER, ["list", "accept", "confirm", "close"]),
        (QUOTE, ["list", "confirm", "close"]),
        (NO_DEAL, ["ask", "end"]),
    ):
        assert set(messages) <= set(env.action_vocabulary())
        assert env.outcome(_play(env, task, messages)).success, task.task_id


def test_vocabulary_covers_everything():
    env = NegotiationEnv()
    vocab = set(env.vocabulary())
    assert len(vocab) < 150 and all(w and w == w.lower() and " " not in w for w in vocab)
    action_words = set(HAND_VERBS) | {str(p) for p in HAND_PRICES}
    assert set(PRICES) == set(HAND_PRICES)
    assert action_words <= vocab and set(env.system_prompt.split()) <= vocab
    assert set(NegotiationEnv(price_words=False).vocabulary()) == vocab  # observations still say prices
    from rwcore.trainer.envs.negotiation.reference_policies import _bad_policies

    seen = set()
    envs = (NegotiationEnv(num_train=1, num_eval=1, max_turns=2), NegotiationEnv(num_train=1, num_eval=1, max_turns=6))
    for task in env.tasks("train")[:80] + HAND_TASKS:
        for name, policy in _bad_policies().items():
            for short_or_long in envs:  # short episodes time out
                rng = random.Random(f"{task.task_id}/{name}")
                trajectory = run_episode(short_or_long, task, lambda obs, p=policy, r=rng: p(obs, r))
                for turn in trajectory.turns:
                    if turn.role != "assistant" or name in ("scripted", "random"):
                        seen |= set(turn.content.split())
    assert seen - vocab <= KNOWN_VOCABULARY_GAPS, seen - vocab - KNOWN_VOCABULARY_GAPS
    assert {
        "haggles",
        "secret",
        "sold",
        "changed",
        "mind",
        "above",
        "below",
        "time",
        "up",
        "agrees",
        "confirms",
        "price",
        "deal",
        "confirm",
        "close",
        "match",
        "list",
    } <= seen


# -- policies -------------------------------------------------------------------------------


def test_scripted_policy_wins_exactly_the_winnable_tasks():
    env = NegotiationEnv()
    for task in env.tasks("eval"):
        trajectory = run_episode(env, task, scripted_policy)
        assert trajectory.metadata["success"] is task.data["winnable"], (task.data, trajectory.transcript())
    for task in HAND_TASKS:
        assert run_episode(env, task, scripted_policy).metadata["success"] is task.data["winnable"], task.task_id
    rate, reward = evaluate_policy(env, lambda obs, rng: scripted_policy(obs))
    assert rate == reward == pytest.approx(222 / 300)  # 300 - 39 hostile - 39 sold_out


# random_policy: each of the nine verbs (ask, offer, match, list, bundle, accept, confirm, close, end) 1/9, an
# offer's price 1/10 more: each one-word verb 1/9, each price 1/90.
RANDOM_MOVES = [(verb, Fraction(1, 9)) for verb in HAND_VERBS] + [(str(p), Fraction(1, 90)) for p in HAND_PRICES]


def _random_success_probability(env, task):
    """The exact success probability of random_policy on `task` and the longest episode it can play: every
    message it can say with its probability, the episode tree walked to the end."""
    deepest = 0

    def walk(episode, depth):
        nonlocal deepest
        deepest = max(deepest, depth)
        total = Fraction(0)
        for message, p in RANDOM_MOVES:
            nxt = env.step(episode, message)
            total += p * (Fraction(int(env.outcome(nxt).success)) if nxt.done else walk(nxt, depth + 1))
        return total

    return walk(env.reset(task, 0), 1), deepest


# Worked out by hand. Every message that neither makes progress nor is one of the harmless ones listed ends
# the episode, so the probability is a product along the winning paths:
#   standard   ask 1/9; match or "100" 11/90; confirm 1/9; close 1/9                       = 11/65610
#   bundle     ask, bundle in either order 2/81; match, list (= the bundle budget 120) or "120" 21/90;
#              confirm, close 1/81                                                         = 7/98415
#   bundle, list 140 > 120: match or "120" 11/90                                           = 11/295245
#   haggler    list or "120" 11/90; accept, match or "100" 21/90; confirm, close 1/81; an optional single
#              ask ("buyer secret") before the opening or right after the counter: x (1 + 2/9) = 847/1968300
#   quote      list or "100" 11/90; confirm, close 1/81; an optional ask before it: x (1 + 1/9) = 11/6561
#   no_deal    ask, end                                                                    = 1/81
# and no episode outlives 5 messages (one ask, one bundle proposal or counter, agree, confirm, close).
RANDOM_SUCCESS = {
    "standard": Fraction(11, 65610),
    "bundle": Fraction(7, 98415),
    "bundle_dear": Fraction(11, 295245),
    "haggler": Fraction(847, 1968300),
    "quote": Fraction(11, 6561),
    "no_deal": Fraction(1, 81),
    "hostile": Fraction(0),
    "sold_out": Fraction(0),
}


@pytest.mark.parametrize(
    "task, name",
    [
        (STANDARD, "standard"),
        (BUNDLE, "bundle"),
        (BUNDLE_DEAR, "bundle_dear"),
        (HAGGLER, "haggler"),
        (QUOTE, "quote"),
        (NO_DEAL, "no_deal"),
        (HOSTILE, "hostile"),
        (SOLD_OUT, "sold_out"),
    ],
)
def test_random_policy_success_probability_by_hand(task, name):
    probability, deepest = _random_success_probability(NegotiationEnv(), task)
    assert probability == RANDOM_SUCCESS[name]
    assert deepest <= 5  # so the default max_turns (6) never cuts an episode of one-word messages short


def test_random_policy_draws_uniform_verbs_then_prices():
    rng = random.Random(0)
    counts = Counter(random_policy("anything", rng) for _ in range(30000))
    assert set(counts) == set(HAND_VERBS) | {str(p) for p in HAND_PRICES}
    for word in HAND_VERBS:
        assert abs(counts[word] / 30000 - 1 / 9) < 0.01
    assert all(abs(counts[str(p)] / 30000 - 1 / 90) < 0.004 for p in HAND_PRICES)


def _random_rate_by_hand(env, split="eval"):
    """The expected success rate of random_policy on `split`, from the hand-worked probabilities above (a bundle
    task's depends on whether its list price is its bundle budget)."""
    total = Fraction(0)
    tasks = env.tasks(split)
    for task in tasks:
        d = task.data
        name = d["kind"]
        if name == "bundle" and d["list"] != d["bundle_budget"]:
            name = "bundle_dear"
        total += RANDOM_SUCCESS[name]
    return total / len(tasks)


def test_random_vs_scripted_success_gap():
    env = NegotiationEnv()
    seeds = range(20)
    random_rate, random_reward = evaluate_policy(env, random_policy, "eval", seeds=seeds)
    assert random_rate == random_reward
    expected = float(_random_rate_by_hand(env))
    assert 0.0015 < expected < 0.0025  # mostly the 42 no_deal tasks: 42 / 81 / 300 = 0.0017
    n = 300 * len(seeds)
    sd = (expected * (1 - expected) / n) ** 0.5
    assert abs(random_rate - expected) < 4 * sd, (random_rate, expected)
    # evaluate_policy seeds its rng per (task, seed): reproducible
    assert evaluate_policy(env, random_policy, "eval", seeds=seeds)[0] == random_rate
    scripted_rate = evaluate_policy(env, lambda obs, rng: scripted_policy(obs))[0]
    assert random_rate < 0.01 and scripted_rate > 0.7 and scripted_rate - random_rate > 0.7
