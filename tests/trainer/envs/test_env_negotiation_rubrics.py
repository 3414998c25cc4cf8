"""The negotiation environment's rubric library, reflector, attributor and labelled cases.

Every verdict below is worked out by hand from the rule's criterion and applicability text (the tasks and
transcripts are hand-made, see tests/trainer/envs/test_env_negotiation.py for the buyer's behaviour on them).
"""

import itertools
import random

import pytest
from _util import negotiation_task

from rwcore.judges import RuleJudge
from rwcore.rewardweaver import AdmissionConfig, Capability, CapabilityLibrary, acceptance_test, attribute
from rwcore.trainer.envs import NegotiationEnv
from rwcore.trainer.envs.negotiation import build_trajectory, random_policy, run_episode, scripted_policy
from rwcore.trainer.envs.negotiation.annotator import annotate
from rwcore.trainer.envs.negotiation.attributor import failure_cause
from rwcore.trainer.envs.negotiation.cases import cases_for
from rwcore.trainer.envs.negotiation.reference_policies import _bad_policies
from rwcore.trainer.envs.negotiation.reflector import NegotiationReflector
from rwcore.trainer.envs.negotiation.rubrics import INITIAL_LIBRARY, RULE_DEFS, SKILLS, explain
from rwcore.types import Attributor, CapabilityProposer, InstanceRubricWriter, RubricReflector, RubricSpec, Trajectory
from rwcore.verdict import Verdict

ENV = NegotiationEnv(seed=0, num_train=80, num_eval=60)
RULES = {rule.spec.rubric_id: rule for rule in ENV.rules()}
SPECS = [rule.spec for rule in RULES.values()]
P, F, NA = True, False, None
RULE_IDS = [
    "asks_budget_first",
    "offers_at_budget",
    "proposes_bundle_when_wanted",
    "offers_bundle_when_wanted",
    "opens_at_list_with_haggler",
    "quotes_list_price",
    "confirms_agreement",
    "closes_after_confirmation",
    "accepts_counter",
    "ends_hopeless_negotiation",
    "clear_actions",
]


STANDARD = negotiation_task()
BUNDLE = negotiation_task("bundle", budget=40, bundle_cost=80, bundle_budget=120)  # list 120 = bundle budget
BUNDLE_DEAR = negotiation_task("bundle", budget=40, bundle_cost=80, bundle_budget=120, list=140)  # list above it
BUNDLE_POOR = negotiation_task("bundle", budget=40, bundle_cost=80, bundle_budget=60, feasible=False)  # unaffordable
HAGGLER = negotiation_task("haggler")  # list 120 = budget + 20
QUOTE = negotiation_task("quote", list=100)  # list 100 = budget
NO_DEAL = negotiation_task("no_deal", cost=80, budget=60, list=140, feasible=False)
HOSTILE = negotiation_task("hostile")
SOLD_OUT = negotiation_task("sold_out")
HAND_TASKS = [STANDARD, BUNDLE, BUNDLE_DEAR, BUNDLE_POOR, HAGGLER, QUOTE, NO_DEAL, HOSTILE, SOLD_OUT]
ONE_TURN = NegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=1)


def _traj(task, messages, seed=0):
    """The trajectory of `messages` on `task`, with exactly as many turns as messages: an episode the last
    message does not end is cut off there (time up), one that ends before it is an error in the table."""
    env = NegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=len(messages))
    script = list(messages)
    trajectory = run_episode(env, task, lambda obs: script.pop(0), seed=seed)
    assert not script and len(trajectory.metadata["env_state"]["events"]) == len(messages)
    return trajectory


def _empty(task):
    episode = ENV.reset(task, 0)
    return build_trajectory(ENV, episode, [], [episode.observation])


CASES = [
    # asks_budget_first: the seller's first commitment (an offer, match / list included, or end) comes after an
    # ask; not for a haggler or a buyer who asked for a price
    ("asks_budget_first", STANDARD, ["ask", "100", "confirm", "close"], P),
    ("asks_budget_first", STANDARD, ["ask", "match"], P),
    ("asks_budget_first", SOLD_OUT, ["ask", "match", "confirm", "close"], P),
    ("asks_budget_first", STANDARD, ["100"], F),
    ("asks_budget_first", STANDARD, ["list"], F),  # the list price is an offer
    ("asks_budget_first", BUNDLE, ["bundle", "ask", "match"], P),
    ("asks_budget_first", BUNDLE, ["bundle", "120"], F),  # proposing the bundle is not asking
    ("asks_budget_first", HOSTILE, ["ask", "100"], P),
    ("asks_budget_first", HOSTILE, ["100"], F),
    ("asks_budget_first", HAGGLER, ["list", "accept"], NA),  # a haggler needs no asking
    ("asks_budget_first", QUOTE, ["list", "confirm", "close"], NA),  # nor does a buyer who asked for a price
    ("asks_budget_first", QUOTE, ["end"], NA),
    ("asks_budget_first", STANDARD, ["ask", "end"], P),  # ending is a commitment too
    ("asks_budget_first", NO_DEAL, ["ask", "end"], P),
    ("asks_budget_first", STANDARD, ["end"], F),  # ended without asking
    ("asks_budget_first", STANDARD, ["ask", "ask"], NA),  # never committed
    ("asks_budget_first", STANDARD, ["match"], NA),  # match with no number stated: no offer
    ("asks_budget_first", STANDARD, ["confirm"], NA),
    # offers_at_budget: the move right after a stated budget that covers the cost offers exactly that budget
    ("offers_at_budget", STANDARD, ["ask", "100", "confirm", "close"], P),
    ("offers_at_budget", STANDARD, ["ask", "match"], P),
    ("offers_at_budget", STANDARD, ["budget?", "offer 100"], P),
    ("offers_at_budget", STANDARD, ["ask", "sell at 95"], P),  # 95 rounds to 100
    ("offers_at_budget", STANDARD, ["ask", "80"], F),
    ("offers_at_budget", STANDARD, ["ask", "list"], F),  # 120
    ("offers_at_budget", STANDARD, ["ask", "end"], F),  # a deal given up
    ("offers_at_budget", STANDARD, ["ask", "ask"], F),
    ("offers_at_budget", STANDARD, ["ask", "confirm"], F),
    ("offers_at_budget", HOSTILE, ["ask", "100"], P),  # the partner leaves, the seller did right
    ("offers_at_budget", SOLD_OUT, ["ask", "match", "confirm", "close"], P),
    ("offers_at_budget", STANDARD, ["100"], NA),  # no budget stated before the offer
    ("offers_at_budget", STANDARD, ["ask"], NA),  # no move after it (time up)
    ("offers_at_budget", NO_DEAL, ["ask", "60"], NA),  # the budget does not cover the cost
    ("offers_at_budget", BUNDLE, ["ask", "bundle", "120"], NA),
    ("offers_at_budget", HAGGLER, ["list", "accept"], NA),
    ("offers_at_budget", QUOTE, ["ask", "list"], NA),  # "buyer secret" states no budget
    # proposes_bundle_when_wanted: a buyer who wants the bundle (and can afford it) stated its budgets and the
    # seller moved again: the bundle was proposed by that move
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle", "120", "confirm", "close"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle 120"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle", "100"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["bundle", "ask", "match"], P),  # proposed before
    ("proposes_bundle_when_wanted", BUNDLE, ["bundle", "ask", "end"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "40"], F),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "match"], F),  # a plain offer at 40
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "list"], F),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "end"], F),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "ask"], F),
    ("proposes_bundle_when_wanted", BUNDLE, ["bundle", "120"], NA),  # no budget stated
    ("proposes_bundle_when_wanted", BUNDLE, ["ask"], NA),  # no move after it
    ("proposes_bundle_when_wanted", STANDARD, ["ask", "bundle"], NA),  # a plain-item buyer
    ("proposes_bundle_when_wanted", STANDARD, ["bundle"], NA),
    ("proposes_bundle_when_wanted", NO_DEAL, ["ask", "bundle"], NA),
    ("proposes_bundle_when_wanted", BUNDLE_POOR, ["ask", "end"], NA),  # cannot afford the bundle
    # offers_bundle_when_wanted: with the bundle on the table and the bundle budget stated, the next move is a
    # bundle offer at exactly the bundle budget
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "120"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "match"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "list"], P),  # the list price is the budget
    ("offers_bundle_when_wanted", BUNDLE_DEAR, ["ask", "bundle", "list"], F),  # 140, not 120
    ("offers_bundle_when_wanted", BUNDLE_DEAR, ["ask", "bundle", "match"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["bundle", "ask", "120"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["bundle", "ask", "match", "confirm", "close"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "100"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "140"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "end"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "bundle"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "ask"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle 120"], NA),  # proposed and priced in one move
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "120"], NA),  # never on the table
    ("offers_bundle_when_wanted", BUNDLE, ["bundle", "120"], NA),  # no budget stated
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle"], NA),  # no move after it
    ("offers_bundle_when_wanted", STANDARD, ["ask", "100"], NA),
    ("offers_bundle_when_wanted", BUNDLE_POOR, ["ask", "bundle", "60"], NA),
    # opens_at_list_with_haggler: once the seller moved, its first offer is the list price AND its next move
    # takes the counter (accept, or an offer of exactly the budget); anything else fails
    ("opens_at_list_with_haggler", HAGGLER, ["list", "accept", "confirm", "close"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["120", "accept"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["list", "match"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["list", "100"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["ask", "list", "yes"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["list", "end"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["list", "ask", "accept"], F),  # not the move right after
    ("opens_at_list_with_haggler", HAGGLER, ["list", "80"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["list", "confirm"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["list", "bundle 100"], F),  # a bundle nobody wants: it leaves
    ("opens_at_list_with_haggler", HAGGLER, ["100", "accept"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["140"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["ask", "end"], F),  # never offered
    ("opens_at_list_with_haggler", HAGGLER, ["match"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["ask", "list"], F),  # time up before the take
    ("opens_at_list_with_haggler", STANDARD, ["ask", "list"], NA),
    ("opens_at_list_with_haggler", QUOTE, ["list", "confirm"], NA),
    # quotes_list_price: a buyer who asked for a price: the first offer is the list price AND the next move
    # confirms; anything else fails once the seller moved
    ("quotes_list_price", QUOTE, ["list", "confirm", "close"], P),
    ("quotes_list_price", QUOTE, ["100", "confirm", "close"], P),  # 100 is the list price
    ("quotes_list_price", QUOTE, ["ask", "list", "confirm"], P),
    ("quotes_list_price", QUOTE, ["list", "accept"], F),
    ("quotes_list_price", QUOTE, ["list", "end"], F),
    ("quotes_list_price", QUOTE, ["list", "deal"], F),  # deal is close: not yet
    ("quotes_list_price", QUOTE, ["80", "confirm", "close"], F),
    ("quotes_list_price", QUOTE, ["120"], F),
    ("quotes_list_price", QUOTE, ["ask", "end"], F),
    ("quotes_list_price", QUOTE, ["match"], F),
    ("quotes_list_price", QUOTE, ["list"], F),  # time up before confirming
    ("quotes_list_price", STANDARD, ["ask", "list"], NA),
    ("quotes_list_price", HAGGLER, ["list", "accept"], NA),
    # confirms_agreement: the buyer agreed and the seller moved again: that move confirms
    ("confirms_agreement", STANDARD, ["ask", "100", "confirm", "close"], P),
    ("confirms_agreement", QUOTE, ["list", "confirm"], P),
    ("confirms_agreement", HAGGLER, ["list", "accept", "confirm"], P),
    ("confirms_agreement", BUNDLE, ["ask", "bundle", "match", "confirm"], P),
    ("confirms_agreement", SOLD_OUT, ["ask", "100", "confirm", "close"], P),
    ("confirms_agreement", STANDARD, ["ask", "80", "confirm"], P),  # confirming a poor price still is
    ("confirms_agreement", STANDARD, ["ask", "100", "close"], F),
    ("confirms_agreement", STANDARD, ["ask", "100", "end"], F),
    ("confirms_agreement", STANDARD, ["ask", "100", "100"], F),
    ("confirms_agreement", STANDARD, ["ask", "100", "accept"], F),
    ("confirms_agreement", QUOTE, ["list", "deal"], F),
    ("confirms_agreement", STANDARD, ["ask", "100"], NA),  # no move after it
    ("confirms_agreement", STANDARD, ["ask", "confirm"], NA),  # nothing agreed
    ("confirms_agreement", HAGGLER, ["list", "confirm"], NA),
    ("confirms_agreement", HOSTILE, ["ask", "100"], NA),  # a hostile buyer never agrees
    ("confirms_agreement", NO_DEAL, ["ask", "end"], NA),
    # closes_after_confirmation: the buyer confirmed and the seller moved again: that move closes
    ("closes_after_confirmation", STANDARD, ["ask", "100", "confirm", "close"], P),
    ("closes_after_confirmation", STANDARD, ["ask", "100", "confirm", "deal"], P),
    ("closes_after_confirmation", QUOTE, ["list", "confirm", "close"], P),
    ("closes_after_confirmation", SOLD_OUT, ["ask", "100", "confirm", "close"], P),  # the scenario stops it
    ("closes_after_confirmation", QUOTE, ["list", "confirm", "end"], F),
    ("closes_after_confirmation", QUOTE, ["list", "confirm", "confirm"], F),
    ("closes_after_confirmation", STANDARD, ["ask", "100", "confirm", "100"], F),
    ("closes_after_confirmation", STANDARD, ["ask", "100", "confirm", "accept"], F),
    ("closes_after_confirmation", STANDARD, ["ask", "100", "confirm"], NA),  # no move after it
    ("closes_after_confirmation", STANDARD, ["ask", "100", "close"], NA),  # never confirmed
    ("closes_after_confirmation", STANDARD, ["ask", "confirm"], NA),
    ("closes_after_confirmation", HOSTILE, ["ask", "100"], NA),
    # accepts_counter: after a counter at the budget, the next move takes it (accept, or offer exactly the counter)
    ("accepts_counter", HAGGLER, ["120", "accept"], P),
    ("accepts_counter", HAGGLER, ["list", "match"], P),  # match names the counter
    ("accepts_counter", HAGGLER, ["120", "yes"], P),
    ("accepts_counter", HAGGLER, ["ask", "120", "yes"], P),
    ("accepts_counter", HAGGLER, ["120", "100"], P),  # re-offering exactly the counter
    ("accepts_counter", HAGGLER, ["120", "offer 100"], P),
    ("accepts_counter", HAGGLER, ["120", "confirm"], F),  # confirm no longer accepts
    ("accepts_counter", HAGGLER, ["120", "deal"], F),
    ("accepts_counter", HAGGLER, ["120", "end"], F),
    ("accepts_counter", HAGGLER, ["120", "80"], F),
    ("accepts_counter", HAGGLER, ["120", "list"], F),  # the opening again
    ("accepts_counter", HAGGLER, ["120", "bundle 100"], F),  # a bundle offer: the buyer leaves
    ("accepts_counter", HAGGLER, ["120", "ask", "accept"], F),  # the move right after the counter
    ("accepts_counter", HAGGLER, ["100", "accept"], NA),  # countered at 80, below the budget
    ("accepts_counter", HAGGLER, ["100", "match"], NA),
    ("accepts_counter", HAGGLER, ["140"], NA),
    ("accepts_counter", HAGGLER, ["list"], NA),  # no move after the counter
    ("accepts_counter", STANDARD, ["ask", "100"], NA),
    # ends_hopeless_negotiation: a stated budget below the cost of anything the buyer would buy, and the seller
    # moved again: that move is end
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "end"], P),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "bye"], P),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "60"], F),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "match"], F),  # match offers the 60
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "ask"], F),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "40"], F),
    ("ends_hopeless_negotiation", BUNDLE_POOR, ["ask", "end"], P),
    ("ends_hopeless_negotiation", BUNDLE_POOR, ["ask", "bundle"], F),
    ("ends_hopeless_negotiation", NO_DEAL, ["end"], NA),  # never heard the budget
    ("ends_hopeless_negotiation", NO_DEAL, ["60"], NA),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask"], NA),  # no move after it
    ("ends_hopeless_negotiation", STANDARD, ["ask", "end"], NA),  # a feasible budget: does not apply
    ("ends_hopeless_negotiation", BUNDLE, ["ask", "end"], NA),
    ("ends_hopeless_negotiation", STANDARD, ["ask", "100"], NA),
    ("ends_hopeless_negotiation", HAGGLER, ["ask", "end"], NA),  # a haggler never states its budget
    # clear_actions: in two or more moves, none repeats an earlier ask / bundle / offer / accept / confirm /
    # close at the same price
    ("clear_actions", STANDARD, ["ask", "100", "confirm", "close"], P),
    ("clear_actions", QUOTE, ["list", "confirm", "close"], P),
    ("clear_actions", BUNDLE, ["bundle", "ask", "120"], P),
    ("clear_actions", STANDARD, ["ask", "120"], P),  # too high is no repetition
    ("clear_actions", STANDARD, ["ask", "end"], P),
    ("clear_actions", STANDARD, ["ask", "accept"], P),  # out of place, but not repeated
    ("clear_actions", STANDARD, ["ask", "100", "accept"], P),
    ("clear_actions", HAGGLER, ["list", "accept"], P),
    ("clear_actions", HAGGLER, ["ask", "140"], P),  # insulting is no repetition
    ("clear_actions", HAGGLER, ["100", "hello"], P),  # nor is an unclear message
    ("clear_actions", HAGGLER, ["120", "bundle"], P),
    ("clear_actions", HAGGLER, ["list", "120"], F),  # the same offer twice
    ("clear_actions", HAGGLER, ["120", "120"], F),
    ("clear_actions", HAGGLER, ["120", "list"], F),
    ("clear_actions", STANDARD, ["ask", "match", "100"], F),  # match said 100 already
    ("clear_actions", STANDARD, ["ask", "100", "100"], F),
    ("clear_actions", STANDARD, ["ask", "ask"], F),
    ("clear_actions", HAGGLER, ["list", "ask", "ask"], F),
    ("clear_actions", BUNDLE, ["ask", "bundle", "bundle"], F),
    ("clear_actions", HAGGLER, ["list", "accept", "accept"], F),
    ("clear_actions", STANDARD, ["ask", "100", "confirm", "confirm"], F),
    ("clear_actions", STANDARD, ["100"], NA),  # one move
    ("clear_actions", STANDARD, ["end"], NA),
    ("clear_actions", STANDARD, ["hello"], NA),
]


def test_library_shape():
    assert list(RULES) == RULE_IDS and [r.rule_id for r in RULE_DEFS] == RULE_IDS
    assert INITIAL_LIBRARY == tuple(
        r
        for r in RULE_IDS
        if r not in ("ends_hopeless_negotiation", "offers_bundle_when_wanted", "quotes_list_price", "clear_actions")
    )
    assert len(INITIAL_LIBRARY) == 7
    assert ENV.initial_library() == INITIAL_LIBRARY
    assert {rule.spec.capability for rule in RULES.values()} == {
        "Understanding",
        "Execution",
        "Verification",
        "Debugging",
        "Efficiency",
    }
    assert {rule.family for rule in RULES.values()} == {
        "information",
        "pricing",
        "closing",
        "persistence",
        "boundaries",
        "communication",
    }
    assert all(not spec.scored and spec.criterion and spec.applicability for spec in SPECS)
    assert set(SKILLS) == set(RULES)
    vocab = set(ENV.vocabulary())
    for variants in SKILLS.values():
        assert len(set(variants)) == len(variants) >= 2
        assert all(set(text.split()) <= vocab for text in variants)
    for rule_id in RULE_IDS:  # every rule is exercised below with each verdict
        assert {expected for rid, _, _, expected in CASES if rid == rule_id} == {P, F, NA}, rule_id


@pytest.mark.parametrize("rule_id, task, messages, expected", CASES)
def test_rule_on_hand_made_trajectory(rule_id, task, messages, expected):
    trajectory = _traj(task, messages)
    assert RULES[rule_id].check(trajectory) is expected
    verdict, evidence = explain(rule_id, trajectory)
    assert verdict is expected
    if expected is not None:  # the evidence quotes an agent message
        assert evidence in messages
    # the replay fallback (no env_state) gives the same verdict, with or without task_id / seed
    replay = Trajectory.from_dict(trajectory.to_dict())
    del replay.metadata["env_state"]
    assert RULES[rule_id].check(replay) is expected
    del replay.metadata["task_id"], replay.metadata["seed"]
    assert RULES[rule_id].check(replay) is expected
    # the independent annotator reads the transcript the same way
    assert annotate(rule_id, trajectory) == {P: Verdict.PASS, F: Verdict.FAIL, NA: Verdict.NA}[expected]


def test_rules_on_timed_out_episodes():
    # the move after the budget / counter / agreement never came: NA for the rules about that move
    assert RULES["ends_hopeless_negotiation"].check(_traj(NO_DEAL, ["ask"])) is None
    countered = _traj(HAGGLER, ["ask", "120"])
    assert countered.turns[-1].content.endswith("buyer too high offer 100 above time up")
    assert RULES["accepts_counter"].check(countered) is None
    assert RULES["opens_at_list_with_haggler"].check(countered) is False  # its next move never took the counter
    replay = Trajectory.from_dict(countered.to_dict())
    del replay.metadata["env_state"]
    assert RULES["accepts_counter"].check(replay) is None
    assert RULES["opens_at_list_with_haggler"].check(replay) is False
    agreed = _traj(STANDARD, ["ask", "100", "confirm"])
    assert agreed.turns[-1].content.endswith("buyer confirms time up")
    verdicts = {rid: rule.check(agreed) for rid, rule in RULES.items()}
    assert verdicts == {
        "asks_budget_first": P,
        "offers_at_budget": P,
        "proposes_bundle_when_wanted": NA,
        "offers_bundle_when_wanted": NA,
        "opens_at_list_with_haggler": NA,
        "quotes_list_price": NA,
        "confirms_agreement": P,
        "closes_after_confirmation": NA,
        "accepts_counter": NA,
        "ends_hopeless_negotiation": NA,
        "clear_actions": P,
    }


def test_rules_na_on_empty_episodes_and_invalid_without_metadata():
    for task in HAND_TASKS:
        empty = _empty(task)
        assert all(rule.check(empty) is None for rule in RULES.values()), task.task_id
        replay = Trajectory.from_dict(empty.to_dict())
        del replay.metadata["env_state"]
        assert all(rule.check(replay) is None for rule in RULES.values())
        assert all(annotate(rid, empty) == Verdict.NA for rid in RULES)
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    bare = Trajectory("x", _traj(STANDARD, ["ask", "100"]).turns, 1.0, trajectory_id="x")
    report = judge.evaluate([bare], SPECS)[0]
    assert set(report.judgments) == set(RULES)
    assert all(j.verdict == Verdict.INVALID for j in report.judgments.values())
    with pytest.raises(KeyError):
        explain("asks_budget_first", bare)


# what the scripted policy's episode passes, by kind (worked out from the applicability texts; everything else
# does not apply)
SCRIPTED_PASSES = {
    "standard": {
        "asks_budget_first",
        "offers_at_budget",
        "confirms_agreement",
        "closes_after_confirmation",
        "clear_actions",
    },
    "sold_out": {
        "asks_budget_first",
        "offers_at_budget",
        "confirms_agreement",
        "closes_after_confirmation",
        "clear_actions",
    },
    "hostile": {"asks_budget_first", "offers_at_budget", "clear_actions"},  # it never agrees
    "bundle": {
        "asks_budget_first",
        "proposes_bundle_when_wanted",
        "offers_bundle_when_wanted",
        "confirms_agreement",
        "closes_after_confirmation",
        "clear_actions",
    },
    "haggler": {
        "opens_at_list_with_haggler",
        "accepts_counter",
        "confirms_agreement",
        "closes_after_confirmation",
        "clear_actions",
    },
    "quote": {"quotes_list_price", "confirms_agreement", "closes_after_confirmation", "clear_actions"},
    "no_deal": {"asks_budget_first", "ends_hopeless_negotiation", "clear_actions"},
}


def test_rule_judge_on_rollouts():
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    tasks = ENV.tasks("eval")
    assert {t.data["kind"] for t in tasks} == set(SCRIPTED_PASSES)
    scripted = judge.evaluate([run_episode(ENV, t, scripted_policy, seed=1) for t in tasks], SPECS)
    verdicts = [j.verdict for r in scripted for j in r.judgments.values()]
    assert Verdict.INVALID not in verdicts
    # the scripted policy does each step of the sale as the criteria say: it passes everything that applies
    assert Verdict.FAIL not in verdicts and verdicts.count(Verdict.PASS) > len(tasks)
    for report, task in zip(scripted, tasks):
        passed = {rid for rid, j in report.judgments.items() if j.verdict == Verdict.PASS}
        kind = task.data["kind"]
        assert passed == SCRIPTED_PASSES[kind], (kind, passed)
    # a random policy fails some rule on many tasks
    randoms = judge.evaluate(_random_trajectories(ENV.tasks("train") + tasks), SPECS)
    random_verdicts = [j.verdict for r in randoms for j in r.judgments.values()]
    assert Verdict.INVALID not in random_verdicts and random_verdicts.count(Verdict.FAIL) > 20


def _random_trajectories(tasks, seed=0):
    out = []
    for i, task in enumerate(tasks):
        rng = random.Random(f"{seed}/{i}")
        out.append(run_episode(ENV, task, lambda obs, r=rng: random_policy(obs, r), seed=i))
    return out


def _bad_trajectories(tasks):
    out = []
    for task in tasks:
        for name, policy in _bad_policies().items():
            rng = random.Random(f"{task.task_id}/{name}")
            out.append(run_episode(ENV, task, lambda obs, p=policy, r=rng: p(obs, r), group_id=name))
    return out


@pytest.mark.parametrize(
    "policy, task, failed",
    [
        # the bad policies added for the agreement phase each break the step they are named for (by hand)
        ("unconfirmed", STANDARD, {"confirms_agreement"}),  # ask, 100, close
        ("reconfirmer", STANDARD, {"closes_after_confirmation", "clear_actions"}),  # ask, 100, confirm, confirm
        ("closer_quits", QUOTE, {"closes_after_confirmation"}),  # 100, confirm, end
        ("unconfirmed", HAGGLER, {"confirms_agreement"}),  # 120, accept, close
        ("stubborn", HAGGLER, {"opens_at_list_with_haggler", "accepts_counter", "clear_actions"}),  # 120, 120
        ("hesitant", HAGGLER, {"opens_at_list_with_haggler", "accepts_counter"}),  # 120, end
        ("scripted", QUOTE, set()),
    ],
)
def test_bad_policies_fail_their_step(policy, task, failed):
    rng = random.Random(0)
    trajectory = run_episode(ENV, task, lambda obs: _bad_policies()[policy](obs, rng))
    assert {rid for rid, rule in RULES.items() if rule.check(trajectory) is False} == failed


# -- reflector ------------------------------------------------------------------------------


def test_reflector_proposes_failing_rules():
    reflector = ENV.reflector()
    assert isinstance(reflector, RubricReflector) and isinstance(reflector, CapabilityProposer)
    trajectories = _random_trajectories(ENV.tasks("train"))
    stats = reflector.failure_stats(trajectories)
    assert set(stats) == set(RULES)
    # failure_stats counted independently from the rules' verdicts
    for rule_id, (fails, applicable, example) in stats.items():
        verdicts = [RULES[rule_id].check(t) for t in trajectories]
        assert (fails, applicable) == (verdicts.count(False), sum(v is not None for v in verdicts))
        assert bool(example) == (fails > 0)
    proposals = reflector.propose_rubric_skills(trajectories, [], 3)
    eligible = sorted(
        (rid for rid, (f, a, _) in stats.items() if f and f / a >= 0.2),
        key=lambda rid: (-stats[rid][0], RULE_IDS.index(rid)),
    )
    assert len(eligible) >= 4 and [p.rubric.rubric_id for p in proposals] == eligible[:3]
    for p in proposals:
        assert p.rubric == RULES[p.rubric.rubric_id].spec
        assert p.skill == SKILLS[p.rubric.rubric_id][0] and p.rubric.rubric_id in p.evidence
    existing = [p.rubric for p in proposals]
    more = reflector.propose_rubric_skills(trajectories, existing, 20)
    assert [p.rubric.rubric_id for p in more] == eligible[3:]
    assert reflector.propose_rubric_skills(trajectories, [], 0) == []
    assert reflector.propose_rubric_skills(trajectories, [], 3, diagnostics="ignored") == proposals  # deterministic
    assert [s.rubric_id for s in reflector.propose_capabilities(trajectories, existing, 20)] == eligible[3:]
    assert reflector.propose_capabilities(trajectories, [], 0) == []
    # a strict threshold keeps only rules failing on every applicable trajectory
    strict = NegotiationReflector(ENV, min_fail_rate=1.0)
    assert {p.rubric.rubric_id for p in strict.propose_rubric_skills(trajectories, [], 20)} == {
        rid for rid, (f, a, _) in stats.items() if f and f == a
    }
    # the scripted policy fails no rule: nothing to propose
    good = [run_episode(ENV, t, scripted_policy) for t in ENV.tasks("train")]
    assert reflector.propose_rubric_skills(good, [], 12) == []
    # uncheckable trajectories give no evidence and break nothing
    bare = Trajectory("x", good[0].turns, 0.0, trajectory_id="x")
    assert reflector.failure_stats([bare]) == {rid: (0, 0, "") for rid in RULES}


@pytest.mark.parametrize(
    "bad, good, expected, evidence",
    [
        # a seller who offers after a hopeless budget fails ends_hopeless_negotiation and nothing else
        (
            [(NO_DEAL, ["ask", "80"])] * 3,
            [(STANDARD, ["ask", "100", "confirm", "close"])],
            "ends_hopeless_negotiation",
            "3 of 3",
        ),
        # a seller who closes without confirming fails confirms_agreement and nothing else
        (
            [(STANDARD, ["ask", "100", "close"])] * 2,
            [(STANDARD, ["ask", "100", "confirm", "close"])],
            "confirms_agreement",
            "2 of 3",
        ),
        # a seller who ends after the confirmation fails closes_after_confirmation and nothing else
        (
            [(QUOTE, ["list", "confirm", "end"])] * 2,
            [(QUOTE, ["list", "confirm", "close"])] * 2,
            "closes_after_confirmation",
            "2 of 4",
        ),
    ],
)
def test_reflector_proposes_a_rule_only_a_bad_policy_breaks(bad, good, expected, evidence):
    reflector = ENV.reflector()
    trajectories = [_traj(task, messages) for task, messages in bad + good]
    proposals = reflector.propose_rubric_skills(trajectories, [], 5)
    assert [p.rubric.rubric_id for p in proposals] == [expected]
    assert evidence in proposals[0].evidence


def test_reflector_refine_cycles_variants():
    reflector = ENV.reflector()
    spec = RULES["asks_budget_first"].spec
    variants = SKILLS["asks_budget_first"]
    seen = [variants[0]]
    for _ in range(len(variants)):
        seen.append(reflector.refine_skill(spec, seen[-1], []))
    assert seen[1 : len(variants)] == list(variants[1:]) and seen[-1] == variants[0]
    assert reflector.refine_skill(spec, "something else", []) == variants[0]
    assert reflector.refine_skill(RubricSpec("other", "x"), "keep me", []) == "keep me"


GENERAL = ["confirms_agreement", "closes_after_confirmation", "clear_actions"]  # can apply to any sale


@pytest.mark.parametrize(
    "task, expected",
    [
        # the rules specific to the instance first, then those that can apply to any (library order within each);
        # rules that cannot apply to the instance are left out
        (STANDARD, ["offers_at_budget", "asks_budget_first"] + GENERAL),
        (HOSTILE, ["offers_at_budget", "asks_budget_first"] + GENERAL),
        (BUNDLE, ["proposes_bundle_when_wanted", "offers_bundle_when_wanted", "asks_budget_first"] + GENERAL),
        (BUNDLE_POOR, ["ends_hopeless_negotiation", "asks_budget_first"] + GENERAL),
        (NO_DEAL, ["ends_hopeless_negotiation", "asks_budget_first"] + GENERAL),
        (HAGGLER, ["opens_at_list_with_haggler", "accepts_counter"] + GENERAL),
        (QUOTE, ["quotes_list_price"] + GENERAL),
    ],
)
def test_instance_rubrics(task, expected):
    reflector = ENV.reflector()
    assert isinstance(reflector, InstanceRubricWriter)
    context = _empty(task)
    assert [s.rubric_id for s in reflector.instance_rubrics(context, 20)] == expected
    assert [s.rubric_id for s in reflector.instance_rubrics(context, 2)] == expected[:2]
    assert reflector.instance_rubrics(context, 0) == []
    with pytest.raises(ValueError):
        reflector.instance_rubrics(Trajectory("x", context.turns, 0.0), 3)


def test_instance_rubrics_are_the_rules_that_can_apply():
    reflector = ENV.reflector()
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    tasks = ENV.tasks("train")
    trajectories = (
        _random_trajectories(tasks)
        + _random_trajectories(tasks, seed=1)
        + _bad_trajectories(tasks)
        + [_traj(STANDARD, ["ask", "100", "confirm", "close"])]
    )
    applied_by_kind: dict[str, set] = {}
    for trajectory, report in zip(trajectories, judge.evaluate(trajectories, SPECS)):
        written = {s.rubric_id for s in reflector.instance_rubrics(trajectory, len(RULES))}
        applied = {rid for rid, j in report.judgments.items() if j.verdict in (Verdict.PASS, Verdict.FAIL)}
        # every rule that applied was written
        assert applied <= written, (trajectory.metadata["task"], applied - written)
        applied_by_kind.setdefault(trajectory.metadata["task"]["kind"], set()).update(applied)
    # and every rule written applied to some episode of that kind, but for the agreement rules on a hostile
    # buyer (who never agrees, but looks like any other buyer)
    for task in tasks:
        kind = task.data["kind"]
        written = {s.rubric_id for s in reflector.instance_rubrics(_empty(task), len(RULES))}
        unseen = written - applied_by_kind[kind]
        assert unseen <= ({"confirms_agreement", "closes_after_confirmation"} if kind == "hostile" else set()), (
            kind,
            unseen,
        )


# -- attributor ------------------------------------------------------------------------------


def test_failure_cause():
    assert failure_cause(_traj(HOSTILE, ["ask", "100"]).metadata["env_state"]) == "partner"
    assert failure_cause(_traj(HOSTILE, ["100"]).metadata["env_state"]) == "partner"  # unwinnable whatever it did
    assert failure_cause(_traj(SOLD_OUT, ["ask", "100", "confirm", "close"]).metadata["env_state"]) == "scenario"
    assert failure_cause(_traj(SOLD_OUT, ["ask", "100", "close"]).metadata["env_state"]) == "scenario"
    assert failure_cause(_traj(STANDARD, ["ask", "80", "confirm", "close"]).metadata["env_state"]) == "policy"
    assert failure_cause(_traj(STANDARD, ["ask", "100", "close"]).metadata["env_state"]) == "policy"
    assert failure_cause(_traj(NO_DEAL, ["ask", "60", "confirm", "close"]).metadata["env_state"]) == "policy"
    # a loss-making sale is the policy's, even in an unwinnable scenario
    assert failure_cause({"winnable": False, "hostile": True, "deal": {"price": 40, "cost": 60}}) == "policy"
    assert failure_cause({"winnable": False, "hostile": False, "deal": None}) == "scenario"


def test_attributor_causes():
    attributor = ENV.attributor()
    assert isinstance(attributor, Attributor)
    # partner-caused: a hostile buyer walks out at the agreement, whatever the seller did
    for messages in (["ask", "100"], ["ask", "end"], ["100"], ["ask", "ask"], ["ask", "match"]):
        trajectory = _traj(HOSTILE, messages)
        assert not trajectory.metadata["success"]
        records = attributor.attribute(trajectory, SPECS)
        assert [r.capability_id for r in records] == RULE_IDS and {r.cause for r in records} == {"partner"}
        assert all(r.trajectory_id == trajectory.trajectory_id for r in records)
    # scenario-caused: the item turns out sold out at the close
    records = {
        r.capability_id: r for r in attributor.attribute(_traj(SOLD_OUT, ["ask", "100", "confirm", "close"]), SPECS)
    }
    assert {r.cause for r in records.values()} == {"scenario"}
    assert not any(r.deficit for r in records.values())  # the seller did everything right
    passed = records["offers_at_budget"]
    assert (passed.deficit, passed.confidence, passed.evidence) == (False, 0.8, "100")
    closed = records["closes_after_confirmation"]
    assert (closed.deficit, closed.confidence, closed.evidence) == (False, 0.8, "close")
    na = records["accepts_counter"]
    assert (na.deficit, na.confidence, na.evidence) == (False, 0.5, "")
    # policy-caused: money left on the table
    records = {
        r.capability_id: r for r in attributor.attribute(_traj(STANDARD, ["ask", "80", "confirm", "close"]), SPECS)
    }
    assert {r.cause for r in records.values()} == {"policy"}
    deficit = records["offers_at_budget"]
    assert (deficit.deficit, deficit.confidence, deficit.evidence) == (True, 0.9, "80")
    assert [rid for rid, r in records.items() if r.deficit] == ["offers_at_budget"]
    records = {r.capability_id: r for r in attributor.attribute(_traj(STANDARD, ["100"]), SPECS)}
    assert records["asks_budget_first"].deficit and records["asks_budget_first"].evidence == "100"
    # policy-caused: closing before confirming
    records = {r.capability_id: r for r in attributor.attribute(_traj(STANDARD, ["ask", "100", "close"]), SPECS)}
    assert [rid for rid, r in records.items() if r.deficit] == ["confirms_agreement"]
    assert records["confirms_agreement"].evidence == "close" and records["confirms_agreement"].cause == "policy"
    # unknown candidates and uncheckable trajectories
    trajectory = _traj(STANDARD, ["ask", "80"])
    other = attributor.attribute(trajectory, [RubricSpec("other", "x")])[0]
    assert not other.deficit and other.cause == "unclear" and other.confidence == 0.0
    bare = Trajectory("x", trajectory.turns, 0.0, trajectory_id="x")
    assert all(r.cause == "unclear" and not r.deficit for r in attributor.attribute(bare, SPECS))


def test_attribution_screening_keeps_partner_and_scenario_failures_external():
    failures = {
        "hostile": _traj(HOSTILE, ["100"]),
        "sold": _traj(SOLD_OUT, ["ask", "100", "confirm", "close"]),
        "loss": _traj(STANDARD, ["ask", "80", "confirm", "close"]),
        "pushy": _traj(STANDARD, ["100"]),
        "end": _traj(STANDARD, ["end"]),
        "unconfirmed": _traj(STANDARD, ["ask", "100", "close"]),
        "quits": _traj(QUOTE, ["list", "confirm", "end"]),
        "lowquote": _traj(QUOTE, ["80", "confirm", "close"]),
    }
    for name, trajectory in failures.items():
        assert not trajectory.metadata["success"]
        trajectory.trajectory_id = name
    result = attribute(list(failures.values()), SPECS, ENV.attributor())
    # the hostile buyer's failure is not the agent's, even though it offered before asking
    assert set(result.external) == {"hostile", "sold"}
    assert {(r.trajectory_id, r.capability_id) for r in result.accepted} == {
        ("loss", "offers_at_budget"),
        ("pushy", "asks_budget_first"),
        ("end", "asks_budget_first"),
        ("unconfirmed", "confirms_agreement"),
        ("quits", "closes_after_confirmation"),
        ("lowquote", "quotes_list_price"),
    }
    assert set(result.unattributed) == set()  # every policy failure above breaks some rule


# -- labelled cases -------------------------------------------------------------------------


def test_labelled_cases_admit_every_rule():
    flat = ENV.labelled_cases(RULE_IDS)
    by_rule = ENV.labelled_cases_by_rule(RULE_IDS)
    assert len(flat) == sum(len(v) for v in by_rule.values())
    eval_ids = {t.task_id for t in ENV.tasks("train") + ENV.tasks("eval")}
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    library = CapabilityLibrary()
    for rule_id, rule in RULES.items():
        cases = cases_for(flat, rule_id)
        assert [c.trajectory.trajectory_id for c in cases] == [c.trajectory.trajectory_id for c in by_rule[rule_id]]
        labels = [c.label for c in cases]
        assert labels.count(Verdict.PASS) >= 10 and labels.count(Verdict.FAIL) >= 10 and Verdict.NA in labels
        assert {c.source for c in cases} == {f"gen{i}" for i in range(10)}
        assert len({c.trajectory.trajectory_id for c in cases}) == len(cases)
        assert not {c.trajectory.task_id for c in cases} & eval_ids
        for case in cases:  # the label is the independent annotator's
            assert case.label == annotate(rule_id, case.trajectory)
            assert case.trajectory.metadata["labelled_rule"] == rule_id
        # any half of the sources holds both labels and >= 10 applicable cases
        for half in itertools.combinations(range(10), 5):
            sub = [c.label for c in cases if int(c.source[3:]) in half]
            assert Verdict.PASS in sub and Verdict.FAIL in sub and sum(v != Verdict.NA for v in sub) >= 10
        capability = Capability(
            rule_id, rule.spec.criterion, family=rule.family, applicability=rule.spec.applicability, scored=False
        )
        report = library.admit(capability, judge, cases)
        assert report.admitted, (rule_id, report.reasons)
        report, entry = acceptance_test(capability, judge, cases, config=AdmissionConfig(seed=3))
        assert entry is not None, (rule_id, report.reasons)
    assert set(library.ids()) == set(RULES)
    assert sorted(library.families()) == sorted({r.family for r in RULES.values()})
    # a wrong evaluator (every rule answered by another rule) is refused for most rules
    swapped = RuleJudge({rid: RULES[RULE_IDS[(i + 1) % len(RULE_IDS)]].check for i, rid in enumerate(RULE_IDS)})
    refused = sum(acceptance_test(RULES[rid].spec, swapped, cases_for(flat, rid))[1] is None for rid in RULE_IDS)
    assert refused >= len(RULE_IDS) - 1
    with pytest.raises(ValueError):
        ENV.labelled_cases(["nope"])
