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
from hypothesis import given, settings, strategies as st

from rwcore.trainer.envs import Environment, NegotiationEnv, Task, make
from rwcore.trainer.envs.negotiation import (
    ACTION_PHRASES,
    KINDS,
    KIND_WEIGHTS,
    PRICES,
    build_trajectory,
    evaluate_policy,
    parse_action,
    parse_observation,
    random_policy,
    run_episode,
    scripted_policy,
)
from rwcore.types import Trajectory

ALL_KINDS = {"standard", "bundle", "haggler", "no_deal", "hostile", "sold_out"}
HAND_PRICES = [20, 40, 60, 80, 100, 120, 140, 160, 180, 200]
KNOWN_VOCABULARY_GAPS: set[str] = set()  # every word an observation can say is in the vocabulary


def _task(kind="standard", **over):
    """A hand-made task (the shape make_task_data produces): a lamp costing 60, budget 100, list 120."""
    data = {"kind": kind, "item": "lamp", "cost": 60, "bundle_cost": None, "bundle_budget": None,
            "budget": 100, "list": 120, "feasible": True, "winnable": kind not in ("hostile", "sold_out")}
    data.update(over)
    return Task("t-" + kind, KINDS[kind], data)


STANDARD = _task()
BUNDLE = _task("bundle", budget=40, bundle_cost=80, bundle_budget=120)
HAGGLER = _task("haggler")                       # list 120 = budget 100 + 20
NO_DEAL = _task("no_deal", cost=80, budget=60, list=140, feasible=False)
HOSTILE = _task("hostile")
SOLD_OUT = _task("sold_out")

HEAD = "item lamp cost 60 list 120 "
BUNDLE_HEAD = "item lamp cost 60 bundle cost 80 list 120 "
NO_DEAL_HEAD = "item lamp cost 80 list 140 "


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


@pytest.mark.parametrize("options", [
    {"num_train": 0}, {"num_eval": 0}, {"max_turns": 0}, {"seed": 1.5}, {"seed": True}, {"num_train": "10"},
    {"kind_weights": {"nope": 1.0}}, {"kind_weights": {}}, {"kind_weights": {"standard": -1.0}},
    {"kind_weights": {"standard": 0.0}}, {"kind_weights": {"standard": True}},
])
def test_bad_options_refused(options):
    with pytest.raises(ValueError):
        NegotiationEnv(**options)


def test_too_many_distinct_tasks_refused():
    # a haggler instance is (item, cost, budget - cost): 20 items x 6 costs x 2 offsets = 240 distinct ones
    env = NegotiationEnv(num_train=150, num_eval=50, kind_weights={"haggler": 1})
    instances = {(t.data["item"], t.data["cost"], t.data["budget"]) for t in env.tasks("train") + env.tasks("eval")}
    assert len(instances) == 200
    with pytest.raises(ValueError, match="distinct"):
        NegotiationEnv(num_train=200, num_eval=41, kind_weights={"haggler": 1})


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


def test_splits_disjoint():
    env = NegotiationEnv(seed=0)
    train, evals = env.tasks("train"), env.tasks("eval")
    assert not {t.task_id for t in train} & {t.task_id for t in evals}
    key = lambda t: tuple(sorted((k, str(v)) for k, v in t.data.items()))  # noqa: E731
    assert len({key(t) for t in train + evals}) == len(train) + len(evals)  # no instance twice, in or across splits
    assert {t.data["kind"] for t in evals} == ALL_KINDS == {t.data["kind"] for t in train}


@pytest.mark.parametrize("split, expected", [
    # weights sum to 0.94; size * w / 0.94, largest remainders (ties by kind name), worked out by hand
    ("eval", {"standard": 102, "bundle": 64, "haggler": 64, "no_deal": 32, "hostile": 19, "sold_out": 19}),
    ("train", {"standard": 136, "bundle": 85, "haggler": 85, "no_deal": 43, "hostile": 26, "sold_out": 25}),
])
def test_splits_stratified_by_kind(split, expected):
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
        else:
            assert d["bundle_cost"] is None and d["bundle_budget"] is None
        if kind == "haggler":
            assert d["budget"] - d["cost"] in (20, 40) and d["list"] == d["budget"] + 20
        if kind in ("standard", "hostile", "sold_out"):
            assert d["budget"] - d["cost"] in (20, 40)
            assert d["list"] - d["budget"] in (20, 40) or d["list"] == 200
        if kind == "no_deal":
            assert d["budget"] < d["cost"]


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("ask", ("ask", None)),
    ("ASK!", ("ask", None)),
    ("ask budget", ("ask", None)),
    ("budget?", ("ask", None)),
    ("ask 100", ("ask", None)),
    ("100", ("offer", 100)),
    ("hello 75", ("offer", 80)),          # a price without a verb is an offer
    ("offer 80", ("offer", 80)),
    ("OFFER 80!", ("offer", 80)),
    ("i offer 85 now", ("offer", 90)),    # halves round up
    ("offer 84", ("offer", 80)),
    ("offer 500", ("offer", 200)),
    ("offer 0", ("offer", 10)),
    ("price 70", ("offer", 70)),
    ("sell it for $95", ("offer", 100)),
    ("offer", ("unclear", None)),
    ("price", ("unclear", None)),
    ("bundle", ("bundle", None)),
    ("bundle 120", ("bundle", 120)),
    ("bundle offer 90", ("bundle", 90)),
    ("offer bundle 90", ("offer", 90)),
    ("accept", ("accept", None)),
    ("yes", ("accept", None)),
    ("confirm", ("accept", None)),
    ("deal", ("accept", None)),
    ("agree", ("accept", None)),
    ("accept 80 offer", ("accept", None)),
    ("75 yes", ("accept", None)),
    ("end", ("end", None)),
    ("stop", ("end", None)),
    ("quit", ("end", None)),
    ("bye", ("end", None)),
    ("reject", ("unclear", None)),
    ("the item", ("unclear", None)),
    ("", ("unclear", None)),
    (None, ("unclear", None)),
    (42, ("unclear", None)),
])
def test_parse_action_lenient(text, expected):
    assert parse_action(text) == expected


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=100_000), st.sampled_from(["", "offer ", "price ", "sell ", "bundle "]))
def test_parse_action_rounds_any_number(n, verb):
    tens, units = divmod(n, 10)
    rounded = min(max(10 * (tens + (units >= 5)), 10), 200)
    expected_verb = "bundle" if verb == "bundle " else "offer"
    assert parse_action(f"{verb}{n}") == (expected_verb, rounded)


@pytest.mark.parametrize("observation, expected", [
    (HEAD + "buyer wants item", {}),
    (HEAD + "buyer budget 100 above", {"budget": 100}),
    (BUNDLE_HEAD + "buyer wants bundle", {"wants_bundle": True}),
    (BUNDLE_HEAD + "buyer budget 40 below bundle budget 120 above", {"budget": 40, "bundle_budget": 120}),
    (BUNDLE_HEAD + "buyer likes bundle budget 120 above", {"bundle_on": True, "bundle_budget": 120}),
    (BUNDLE_HEAD + "buyer likes bundle", {"bundle_on": True}),
    (HEAD + "buyer haggles", {"haggles": True}),
    (HEAD + "buyer secret", {"secret": True}),
    (HEAD + "buyer too high offer 100 above", {"counter": 100}),
    (HEAD + "deal 100 above", {"over": True}),
    (HEAD + "buyer not interested leaves", {"over": True}),
    (HEAD + "item sold out", {"over": True}),
    (HEAD + "no deal", {"over": True}),
    (HEAD + "buyer budget 100 above time up", {"budget": 100, "over": True}),
])
def test_parse_observation(observation, expected):
    bundle = observation.startswith(BUNDLE_HEAD)
    facts = {"cost": 60, "list": 120, "bundle_cost": 80 if bundle else None, "budget": None, "bundle_budget": None,
             "counter": None, "wants_bundle": False, "bundle_on": False, "haggles": False, "secret": False,
             "over": False}
    facts.update(expected)
    assert parse_observation(observation) == facts


# -- observations -------------------------------------------------------------------------


def test_observation_reveals_private_facts_only_when_asked():
    env = NegotiationEnv()
    assert env.reset(STANDARD, 0).observation == HEAD + "buyer wants item"
    assert env.reset(BUNDLE, 0).observation == BUNDLE_HEAD + "buyer wants bundle"
    assert env.reset(HAGGLER, 0).observation == HEAD + "buyer haggles"
    assert env.reset(HOSTILE, 0).observation == HEAD + "buyer wants item"  # a hostile buyer looks like any other
    assert env.step(env.reset(STANDARD, 0), "ask").observation == HEAD + "buyer budget 100 above"
    assert (env.step(env.reset(BUNDLE, 0), "ask").observation
            == BUNDLE_HEAD + "buyer budget 40 below bundle budget 120 above")
    assert env.step(env.reset(HAGGLER, 0), "ask").observation == HEAD + "buyer secret"
    assert env.step(env.reset(NO_DEAL, 0), "ask").observation == NO_DEAL_HEAD + "buyer budget 60 below"
    for task in env.tasks("eval"):
        d = task.data
        first = env.reset(task, 0)
        header_end = first.observation.split().index("list") + 2
        assert not any(w.isdigit() for w in first.observation.split()[header_end:])  # no buyer number before asking
        facts = parse_observation(first.observation)
        assert (facts["cost"], facts["list"], facts["bundle_cost"]) == (d["cost"], d["list"], d["bundle_cost"])
        assert facts["budget"] is None and facts["bundle_budget"] is None and facts["counter"] is None
        asked = parse_observation(env.step(first, "ask").observation)
        if d["kind"] == "haggler":
            assert asked["secret"] and asked["budget"] is None
        else:
            assert (asked["budget"], asked["bundle_budget"]) == (d["budget"], d["bundle_budget"])


def test_hints_mark_each_buyer_number_against_the_cost_it_must_cover():
    env = NegotiationEnv()
    # hand-written: a bundle number compares with the bundle cost 80, a plain one with the item cost 60
    assert _play(env, BUNDLE, ["ask", "bundle"]).observation == BUNDLE_HEAD + "buyer likes bundle budget 120 above"
    assert _play(env, BUNDLE, ["ask", "bundle", "60"]).observation == BUNDLE_HEAD + "deal bundle 60 below"
    assert _play(env, STANDARD, ["ask", "60"]).observation == HEAD + "deal 60 above"
    assert _play(env, HAGGLER, ["80"]).observation == HEAD + "buyer too high offer 60 above"
    assert _play(env, HAGGLER, ["60"]).observation == HEAD + "buyer too high offer 40 below"
    # every buyer number in rollouts is followed by its hint; header numbers are not
    checked = 0
    policies = (lambda o, r: scripted_policy(o), random_policy,
                lambda o, r: r.choice(("ask", "bundle", "accept")) if r.random() < 0.5 else scripted_policy(o))
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
                    before = " ".join(words[max(start, i - 2):i])
                    cost = d["bundle_cost"] if before in ("bundle budget", "deal bundle") else d["cost"]
                    assert words[i + 1] == ("above" if int(words[i]) >= cost else "below"), turn.content
                    checked += 1
    assert checked > 300


# -- episodes and outcomes ----------------------------------------------------------------------


# (task, messages, success, the last observation's buyer message, ended_by), all worked out by hand
EPISODES = [
    (STANDARD, ["ask", "100"], True, "deal 100 above", "deal"),
    (STANDARD, ["budget?", "offer 100"], True, "deal 100 above", "deal"),
    (STANDARD, ["ask", "sell it at 95"], True, "deal 100 above", "deal"),
    (STANDARD, ["100"], False, "buyer not interested leaves", "walkout"),       # a price before asking
    (STANDARD, ["ask", "80"], False, "deal 80 above", "deal"),                   # money left on the table
    (STANDARD, ["ask", "40"], False, "deal 40 below", "deal"),                   # below cost
    (STANDARD, ["ask", "120"], False, "buyer too high leaves", "walkout"),
    (STANDARD, ["ask", "ask"], False, "buyer leaves", "walkout"),
    (STANDARD, ["accept"], False, "buyer leaves", "walkout"),                    # no counter to accept
    (STANDARD, ["hello"], False, "buyer leaves", "walkout"),
    (STANDARD, ["ask", "bundle"], False, "buyer leaves", "walkout"),             # nobody wants a bundle
    (STANDARD, ["end"], False, "no deal", "agent"),
    (BUNDLE, ["ask", "bundle", "120"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["bundle", "ask", "120"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["ask", "bundle 120"], True, "deal bundle 120 above", "deal"),
    (BUNDLE, ["ask", "40"], False, "buyer wants bundle leaves", "walkout"),
    (BUNDLE, ["ask", "bundle", "100"], False, "deal bundle 100 above", "deal"),
    (BUNDLE, ["ask", "bundle", "140"], False, "buyer too high leaves", "walkout"),
    (BUNDLE, ["bundle", "120"], False, "buyer not interested leaves", "walkout"),
    (BUNDLE, ["ask", "bundle", "bundle"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["120", "accept"], True, "deal 100 above", "deal"),
    (HAGGLER, ["120", "deal"], True, "deal 100 above", "deal"),
    (HAGGLER, ["120", "100"], True, "deal 100 above", "deal"),
    (HAGGLER, ["ask", "120", "yes"], True, "deal 100 above", "deal"),
    (HAGGLER, ["100", "accept"], False, "deal 80 above", "deal"),                # never takes a first offer
    (HAGGLER, ["120", "80"], False, "deal 80 above", "deal"),
    (HAGGLER, ["120", "110"], False, "buyer too high leaves", "walkout"),
    (HAGGLER, ["120", "120"], False, "buyer leaves", "walkout"),                 # a repeated offer
    (HAGGLER, ["140"], False, "buyer leaves", "walkout"),                        # insulted: more than 20 above
    (HAGGLER, ["accept"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["ask", "ask"], False, "buyer leaves", "walkout"),
    (HAGGLER, ["120", "end"], False, "no deal", "agent"),
    (NO_DEAL, ["ask", "end"], True, "no deal", "agent"),
    (NO_DEAL, ["ask", "stop"], True, "no deal", "agent"),
    (NO_DEAL, ["end"], False, "no deal", "agent"),                               # not informed
    (NO_DEAL, ["ask", "60"], False, "deal 60 below", "deal"),
    (NO_DEAL, ["ask", "80"], False, "buyer too high leaves", "walkout"),
    (HOSTILE, ["ask", "100"], False, "buyer changed mind leaves", "partner"),
    (HOSTILE, ["ask", "80"], False, "buyer changed mind leaves", "partner"),
    (HOSTILE, ["ask", "end"], False, "no deal", "agent"),
    (SOLD_OUT, ["ask", "100"], False, "item sold out", "scenario"),
    (SOLD_OUT, ["ask", "120"], False, "buyer too high leaves", "walkout"),
]


@pytest.mark.parametrize("task, messages, success, reply, ended_by", EPISODES)
def test_episode_outcome_by_hand(task, messages, success, reply, ended_by):
    env = NegotiationEnv()
    episode = _play(env, task, messages)
    assert episode.done and len(episode.state["events"]) == len(messages)
    head = {"bundle": BUNDLE_HEAD, "no_deal": NO_DEAL_HEAD}.get(task.data["kind"], HEAD)
    assert episode.observation == head + reply
    assert episode.state["ended_by"] == ended_by
    outcome = env.outcome(episode)
    assert outcome.success is success and outcome.reward == (1.0 if success else 0.0)


def test_deal_records_what_was_sold():
    env = NegotiationEnv()
    assert _play(env, STANDARD, ["ask", "100"]).state["deal"] == {"price": 100, "kind": "plain", "cost": 60}
    assert _play(env, BUNDLE, ["ask", "bundle", "120"]).state["deal"] == {"price": 120, "kind": "bundle", "cost": 80}
    assert _play(env, HAGGLER, ["120", "accept"]).state["deal"] == {"price": 100, "kind": "plain", "cost": 60}
    for messages in (["ask", "100"], ["ask", "end"]):
        assert _play(env, HOSTILE, messages).state["deal"] is None
        assert _play(env, SOLD_OUT, messages).state["deal"] is None


def test_episode_mechanics():
    env = NegotiationEnv(max_turns=4)
    first = env.reset(STANDARD, 0)
    assert not first.done and first.state["events"] == [] and first.state["turns"] == 0
    # step leaves the given episode as it was
    before = (first.observation, copy.deepcopy(first.state))
    second = env.step(first, "ask")
    assert (first.observation, first.state) == before and not first.done
    env.step(second, "100")
    assert second.state["deal"] is None and len(second.state["events"]) == 1 and not second.done
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
    ep = _play(NegotiationEnv(max_turns=2), NO_DEAL, ["ask", "end"])  # an end on the last turn still counts
    assert ep.state["ended_by"] == "agent" and NegotiationEnv().outcome(ep).success
    # a three-move sale needs three turns
    assert not env.outcome(_play(NegotiationEnv(max_turns=2), BUNDLE, ["ask", "bundle", "120"])).success


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([STANDARD, BUNDLE, HAGGLER, NO_DEAL, HOSTILE, SOLD_OUT]),
       st.lists(st.sampled_from(list(ACTION_PHRASES) + ["hello", "yes", "bundle 120", "offer 110"]),
                min_size=1, max_size=6))
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
    assert [t.role for t in trajectory.turns] == ["system", "partner", "assistant", "partner", "assistant",
                                                  "partner", "assistant", "partner"]
    assert [t.content for t in trajectory.turns] == [
        env.system_prompt, BUNDLE_HEAD + "buyer wants bundle",
        "ask", BUNDLE_HEAD + "buyer budget 40 below bundle budget 120 above",
        "bundle", BUNDLE_HEAD + "buyer likes bundle budget 120 above",
        "120", BUNDLE_HEAD + "deal bundle 120 above"]
    assert all(t.generated == (t.role == "assistant") for t in trajectory.turns)
    assert trajectory.tags == ("bundle",) and trajectory.task_id == "t-bundle"
    assert trajectory.outcome == 1.0 and trajectory.group_id == "g" and trajectory.trajectory_id == "t-bundle/g/2"
    meta = trajectory.metadata
    assert set(meta) == {"env_state", "task", "task_id", "seed", "success"}
    assert meta["task"] == BUNDLE.data and meta["task_id"] == "t-bundle" and meta["seed"] == 2 and meta["success"]
    assert meta["env_state"]["deal"] == {"price": 120, "kind": "bundle", "cost": 80}
    assert [e["text"] for e in meta["env_state"]["events"]] == ["ask", "bundle", "120"]
    # JSON round trip keeps everything
    assert Trajectory.from_dict(trajectory.to_dict()).to_dict() == trajectory.to_dict()
    # the builder on a hand-driven episode
    episode = env.reset(NO_DEAL, 0)
    partner = [episode.observation]
    for message in ("ask", "end"):
        episode = env.step(episode, message)
        partner.append(episode.observation)
    built = build_trajectory(env, episode, ["ask", "end"], partner, system_prompt="custom", trajectory_id="x")
    assert [t.content for t in built.turns] == ["custom", NO_DEAL_HEAD + "buyer wants item", "ask",
                                                NO_DEAL_HEAD + "buyer budget 60 below", "end", NO_DEAL_HEAD + "no deal"]
    assert built.trajectory_id == "x" and built.outcome == 1.0 and built.metadata["success"] is True
    assert built.metadata["env_state"] is episode.state
    failed = build_trajectory(env, _play(env, STANDARD, ["end"]), ["end"], ["a", "b"])
    assert failed.outcome == 0.0 and failed.metadata["success"] is False


# -- language -------------------------------------------------------------------------------


def test_vocabulary_covers_everything():
    env = NegotiationEnv()
    vocab = set(env.vocabulary())
    assert len(vocab) < 150 and all(w and w == w.lower() and " " not in w for w in vocab)
    action_words = {"ask", "bundle", "accept", "end"} | {str(p) for p in HAND_PRICES}
    assert set(ACTION_PHRASES) == action_words and set(PRICES) == set(HAND_PRICES)
    assert env.action_vocabulary() == sorted(action_words)
    assert action_words <= vocab and set(env.system_prompt.split()) <= vocab
    from rwcore.trainer.envs.negotiation_rubrics import _bad_policies

    seen = set()
    envs = (NegotiationEnv(num_train=1, num_eval=1, max_turns=2), NegotiationEnv(num_train=1, num_eval=1, max_turns=5))
    for task in env.tasks("train")[:80] + [STANDARD, BUNDLE, HAGGLER, NO_DEAL, HOSTILE, SOLD_OUT]:
        for name, policy in _bad_policies().items():
            for short_or_long in envs:  # short episodes time out
                rng = random.Random(f"{task.task_id}/{name}")
                trajectory = run_episode(short_or_long, task, lambda obs, p=policy, r=rng: p(obs, r))
                for turn in trajectory.turns:
                    if turn.role != "assistant" or name in ("scripted", "random"):
                        seen |= set(turn.content.split())
    assert seen - vocab <= KNOWN_VOCABULARY_GAPS, seen - vocab - KNOWN_VOCABULARY_GAPS
    assert {"haggles", "secret", "sold", "changed", "mind", "above", "below", "time", "up"} <= seen


# -- policies -------------------------------------------------------------------------------


def test_scripted_policy_wins_exactly_the_winnable_tasks():
    env = NegotiationEnv()
    for task in env.tasks("eval"):
        trajectory = run_episode(env, task, scripted_policy)
        assert trajectory.metadata["success"] is task.data["winnable"], (task.data, trajectory.transcript())
    rate, reward = evaluate_policy(env, lambda obs, rng: scripted_policy(obs))
    assert rate == reward == pytest.approx(262 / 300)  # 300 - 19 hostile - 19 sold_out


def _random_success_probability(env, task):
    """The exact success probability of random_policy on `task`: every message it can say with its probability
    (each verb 1/5, an offer's price 1/10 more), the episode tree walked to the end."""
    moves = [("ask", 0.2), ("bundle", 0.2), ("accept", 0.2), ("end", 0.2)] + [(str(p), 0.02) for p in HAND_PRICES]

    def walk(episode):
        total = 0.0
        for message, p in moves:
            nxt = env.step(episode, message)
            total += p * (env.outcome(nxt).success if nxt.done else walk(nxt))
        return total

    return walk(env.reset(task, 0))


@pytest.mark.parametrize("task, probability", [
    (STANDARD, 1 / 250),                      # ask (1/5), then the budget (1/50)
    (BUNDLE, 2 / 1250),                       # ask and bundle in either order, then the bundle budget
    (HAGGLER, 77 / 12500),                    # list, then accept or the budget; an ask before or after the list
    (NO_DEAL, 1 / 25),                        # ask, end
    (HOSTILE, 0.0),
    (SOLD_OUT, 0.0),
])
def test_random_policy_success_probability_by_hand(task, probability):
    assert _random_success_probability(NegotiationEnv(), task) == pytest.approx(probability, abs=1e-12)


def test_random_policy_draws_uniform_verbs_then_prices():
    rng = random.Random(0)
    counts = Counter(random_policy("anything", rng) for _ in range(20000))
    assert set(counts) == {"ask", "bundle", "accept", "end"} | {str(p) for p in HAND_PRICES}
    for word in ("ask", "bundle", "accept", "end"):
        assert abs(counts[word] / 20000 - 0.2) < 0.015
    assert all(abs(counts[str(p)] / 20000 - 0.02) < 0.006 for p in HAND_PRICES)


def test_random_vs_scripted_success_gap():
    env = NegotiationEnv()
    seeds = range(20)
    random_rate, random_reward = evaluate_policy(env, random_policy, "eval", seeds=seeds)
    assert random_rate == random_reward
    # the eval mix: 102 standard, 64 bundle, 64 haggler, 32 no_deal (hand-computed probabilities above)
    expected = (102 / 250 + 64 * 2 / 1250 + 64 * 77 / 12500 + 32 / 25) / 300
    n = 300 * len(seeds)
    sd = (expected * (1 - expected) / n) ** 0.5
    assert abs(random_rate - expected) < 4 * sd, (random_rate, expected)
    # evaluate_policy seeds its rng per (task, seed): reproducible
    assert evaluate_policy(env, random_policy, "eval", seeds=seeds)[0] == random_rate
    scripted_rate = evaluate_policy(env, lambda obs, rng: scripted_policy(obs))[0]
    assert random_rate < 0.02 and scripted_rate > 0.85 and scripted_rate - random_rate > 0.8
