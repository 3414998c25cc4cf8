"""The negotiation environment's rubric library, reflector, attributor and labelled cases.

Every verdict below is worked out by hand from the rule's criterion and applicability text (the tasks and
transcripts are hand-made, see tests/test_env_negotiation.py for the buyer's behaviour on them).
"""

import itertools
import random

import pytest

from rwcore.judges import RuleJudge
from rwcore.rewardweaver import AdmissionConfig, Capability, CapabilityLibrary, acceptance_test, attribute
from rwcore.trainer.envs import NegotiationEnv, Task
from rwcore.trainer.envs.negotiation import KINDS, build_trajectory, random_policy, run_episode, scripted_policy
from rwcore.trainer.envs.negotiation_annotator import annotate
from rwcore.trainer.envs.negotiation_rubrics import (
    INITIAL_LIBRARY,
    RULE_DEFS,
    SKILLS,
    NegotiationReflector,
    cases_for,
    explain,
    failure_cause,
)
from rwcore.types import Attributor, CapabilityProposer, InstanceRubricWriter, RubricReflector, RubricSpec, Trajectory
from rwcore.verdict import Verdict

ENV = NegotiationEnv(seed=0, num_train=80, num_eval=60)
RULES = {rule.spec.rubric_id: rule for rule in ENV.rules()}
SPECS = [rule.spec for rule in RULES.values()]
P, F, NA = True, False, None
RULE_IDS = ["asks_budget_first", "offers_at_budget", "proposes_bundle_when_wanted", "offers_bundle_when_wanted",
            "opens_at_list_with_haggler", "accepts_counter", "ends_hopeless_negotiation", "clear_actions"]


def _task(kind="standard", **over):
    """A hand-made task: a lamp costing 60, budget 100, list 120 (the shape make_task_data produces)."""
    data = {"kind": kind, "item": "lamp", "cost": 60, "bundle_cost": None, "bundle_budget": None,
            "budget": 100, "list": 120, "feasible": True, "winnable": kind not in ("hostile", "sold_out")}
    data.update(over)
    return Task("t-" + kind, KINDS[kind], data)


STANDARD = _task()
BUNDLE = _task("bundle", budget=40, bundle_cost=80, bundle_budget=120)
HAGGLER = _task("haggler")
NO_DEAL = _task("no_deal", cost=80, budget=60, list=140, feasible=False)
HOSTILE = _task("hostile")
SOLD_OUT = _task("sold_out")
HAND_TASKS = [STANDARD, BUNDLE, HAGGLER, NO_DEAL, HOSTILE, SOLD_OUT]
ONE_TURN = NegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=1)


def _traj(task, messages, env=ENV, seed=0):
    script = list(messages)
    trajectory = run_episode(env, task, lambda obs: script.pop(0), seed=seed)
    assert not script, "the episode ended before the script did"
    return trajectory


def _empty(task):
    episode = ENV.reset(task, 0)
    return build_trajectory(ENV, episode, [], [episode.observation])


CASES = [
    # asks_budget_first: a non-haggler's first offer comes after an ask
    ("asks_budget_first", STANDARD, ["ask", "100"], P),
    ("asks_budget_first", STANDARD, ["100"], F),
    ("asks_budget_first", BUNDLE, ["bundle", "ask", "120"], P),
    ("asks_budget_first", BUNDLE, ["bundle", "120"], F),          # proposing the bundle is not asking
    ("asks_budget_first", HOSTILE, ["ask", "100"], P),
    ("asks_budget_first", HOSTILE, ["100"], F),
    ("asks_budget_first", HAGGLER, ["120", "accept"], NA),        # a haggler needs no asking
    ("asks_budget_first", STANDARD, ["ask", "end"], P),           # ending is a commitment too
    ("asks_budget_first", NO_DEAL, ["ask", "end"], P),
    ("asks_budget_first", STANDARD, ["end"], F),                  # ended without asking
    ("asks_budget_first", STANDARD, ["ask", "ask"], NA),          # never committed
    # offers_at_budget: the first offer after a stated budget that covers the cost is that budget
    ("offers_at_budget", STANDARD, ["ask", "100"], P),
    ("offers_at_budget", STANDARD, ["budget?", "offer 100"], P),
    ("offers_at_budget", STANDARD, ["ask", "80"], F),
    ("offers_at_budget", STANDARD, ["ask", "120"], F),
    ("offers_at_budget", HOSTILE, ["ask", "100"], P),             # the partner leaves, the seller did right
    ("offers_at_budget", SOLD_OUT, ["ask", "100"], P),
    ("offers_at_budget", STANDARD, ["100"], NA),                  # no budget stated before the offer
    ("offers_at_budget", STANDARD, ["ask", "end"], NA),
    ("offers_at_budget", NO_DEAL, ["ask", "60"], NA),             # the budget does not cover the cost
    ("offers_at_budget", BUNDLE, ["ask", "bundle", "120"], NA),
    ("offers_at_budget", HAGGLER, ["120", "accept"], NA),
    # proposes_bundle_when_wanted: a bundle buyer's first priced offer is a bundle offer
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle", "120"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle 120"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle", "100"], P),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "40"], F),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "120"], F),
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "bundle", "end"], NA),   # the bare proposal has no price
    ("proposes_bundle_when_wanted", BUNDLE, ["ask", "end"], NA),
    ("proposes_bundle_when_wanted", STANDARD, ["ask", "100"], NA),
    ("proposes_bundle_when_wanted", STANDARD, ["ask", "bundle"], F),    # misapplied: a plain-item buyer
    ("proposes_bundle_when_wanted", STANDARD, ["bundle 100"], F),
    ("proposes_bundle_when_wanted", NO_DEAL, ["ask", "bundle"], F),
    # offers_bundle_when_wanted: after the budgets, a bundle offer at exactly the bundle budget
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "120"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["bundle", "ask", "120"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle 120"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "100"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "140"], F),
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "120"], F),      # a plain offer
    ("offers_bundle_when_wanted", BUNDLE, ["bundle", "120"], NA),  # no budget stated before the offer
    ("offers_bundle_when_wanted", BUNDLE, ["ask", "bundle", "end"], NA),
    ("offers_bundle_when_wanted", STANDARD, ["ask", "100"], NA),
    # opens_at_list_with_haggler: a haggler's first offer is the list price
    ("opens_at_list_with_haggler", HAGGLER, ["120", "accept"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["ask", "120", "accept"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["120", "end"], P),
    ("opens_at_list_with_haggler", HAGGLER, ["100", "accept"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["140"], F),
    ("opens_at_list_with_haggler", HAGGLER, ["ask", "end"], NA),
    ("opens_at_list_with_haggler", STANDARD, ["ask", "120"], NA),
    # accepts_counter: after a counter at the budget, the next move takes it (accept, or offer exactly the counter)
    ("accepts_counter", HAGGLER, ["120", "accept"], P),
    ("accepts_counter", HAGGLER, ["120", "confirm"], P),
    ("accepts_counter", HAGGLER, ["ask", "120", "yes"], P),
    ("accepts_counter", HAGGLER, ["120", "end"], F),
    ("accepts_counter", HAGGLER, ["120", "80"], F),
    ("accepts_counter", HAGGLER, ["120", "100"], P),               # re-offering exactly the counter takes it
    ("accepts_counter", HAGGLER, ["120", "offer 100"], P),
    ("accepts_counter", HAGGLER, ["120", "ask", "accept"], F),     # the move right after the counter
    ("accepts_counter", HAGGLER, ["100", "accept"], NA),           # countered at 80, below the budget
    ("accepts_counter", HAGGLER, ["140"], NA),
    ("accepts_counter", STANDARD, ["ask", "100"], NA),
    # ends_hopeless_negotiation: after a budget below cost, the next move is end
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "end"], P),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "bye"], P),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "60"], F),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "ask"], F),
    ("ends_hopeless_negotiation", NO_DEAL, ["ask", "40"], F),
    ("ends_hopeless_negotiation", NO_DEAL, ["end"], NA),           # never heard the budget
    ("ends_hopeless_negotiation", NO_DEAL, ["60"], NA),
    ("ends_hopeless_negotiation", STANDARD, ["ask", "end"], F),    # the budget covered the cost: a deal given up
    ("ends_hopeless_negotiation", BUNDLE, ["ask", "end"], F),      # the bundle covers its cost
    ("ends_hopeless_negotiation", STANDARD, ["ask", "100"], NA),   # feasible and not ended: nothing to check
    ("ends_hopeless_negotiation", HAGGLER, ["ask", "end"], NA),    # a haggler never states its budget
    # clear_actions: at least two moves and an offer; nothing out of place, no insulting offer
    ("clear_actions", STANDARD, ["ask", "100"], P),
    ("clear_actions", STANDARD, ["ask", "120"], P),                # too high is not out of place
    ("clear_actions", HAGGLER, ["120", "accept"], P),
    ("clear_actions", BUNDLE, ["ask", "bundle", "120"], P),
    ("clear_actions", HAGGLER, ["120", "120"], F),                 # a repeated offer
    ("clear_actions", HAGGLER, ["ask", "140"], F),                 # insults the haggler
    ("clear_actions", HAGGLER, ["100", "hello"], F),               # unparsable
    ("clear_actions", HAGGLER, ["120", "bundle"], F),              # a bundle nobody wants
    ("clear_actions", HAGGLER, ["120", "ask", "ask"], F),          # asked twice
    ("clear_actions", STANDARD, ["100"], NA),                      # one move
    ("clear_actions", STANDARD, ["ask", "ask"], NA),               # no offer, no end
    ("clear_actions", NO_DEAL, ["ask", "end"], P),                 # ending after asking is clear
    ("clear_actions", STANDARD, ["end"], NA),                      # one move
    ("clear_actions", STANDARD, ["ask", "accept"], NA),
]


def test_library_shape():
    assert list(RULES) == RULE_IDS and [r.rule_id for r in RULE_DEFS] == RULE_IDS
    assert INITIAL_LIBRARY == tuple(r for r in RULE_IDS if r not in ("ends_hopeless_negotiation",
                                                                     "offers_bundle_when_wanted"))
    assert ENV.initial_library() == INITIAL_LIBRARY
    assert {rule.spec.capability for rule in RULES.values()} == {
        "Understanding", "Execution", "Verification", "Debugging", "Efficiency"}
    assert {rule.family for rule in RULES.values()} == {
        "information", "pricing", "persistence", "boundaries", "communication"}
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
    # the move after the budget / counter never came: NA
    assert RULES["ends_hopeless_negotiation"].check(_traj(NO_DEAL, ["ask"], env=ONE_TURN)) is None
    two = NegotiationEnv(seed=0, num_train=1, num_eval=1, max_turns=2)
    countered = _traj(HAGGLER, ["ask", "120"], env=two)
    assert RULES["accepts_counter"].check(countered) is None
    assert RULES["opens_at_list_with_haggler"].check(countered) is True
    replay = Trajectory.from_dict(countered.to_dict())
    del replay.metadata["env_state"]
    assert RULES["accepts_counter"].check(replay) is None


def test_rules_na_on_empty_episodes_and_invalid_without_metadata():
    for task in HAND_TASKS:
        empty = _empty(task)
        assert all(rule.check(empty) is None for rule in RULES.values()), task.task_id
        replay = Trajectory.from_dict(empty.to_dict())
        del replay.metadata["env_state"]
        assert all(rule.check(replay) is None for rule in RULES.values())
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    bare = Trajectory("x", _traj(STANDARD, ["ask", "100"]).turns, 1.0, trajectory_id="x")
    report = judge.evaluate([bare], SPECS)[0]
    assert set(report.judgments) == set(RULES)
    assert all(j.verdict == Verdict.INVALID for j in report.judgments.values())
    with pytest.raises(KeyError):
        explain("asks_budget_first", bare)


def test_rule_judge_on_rollouts():
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    tasks = ENV.tasks("eval")
    scripted = judge.evaluate([run_episode(ENV, t, scripted_policy, seed=1) for t in tasks], SPECS)
    verdicts = [j.verdict for r in scripted for j in r.judgments.values()]
    assert Verdict.INVALID not in verdicts
    # the scripted policy does each step of the sale as the criteria say: it passes everything that applies
    assert Verdict.FAIL not in verdicts and verdicts.count(Verdict.PASS) > len(tasks)
    for report, task in zip(scripted, tasks):
        passed = {rid for rid, j in report.judgments.items() if j.verdict == Verdict.PASS}
        kind = task.data["kind"]
        # what applies to a scripted episode, by kind (worked out from the applicability texts)
        assert passed == {
            "standard": {"asks_budget_first", "offers_at_budget", "clear_actions"},
            "hostile": {"asks_budget_first", "offers_at_budget", "clear_actions"},
            "sold_out": {"asks_budget_first", "offers_at_budget", "clear_actions"},
            "bundle": {"asks_budget_first", "proposes_bundle_when_wanted", "offers_bundle_when_wanted",
                       "clear_actions"},
            "haggler": {"opens_at_list_with_haggler", "accepts_counter", "clear_actions"},
            "no_deal": {"asks_budget_first", "clear_actions", "ends_hopeless_negotiation"},
        }[kind], (kind, passed)
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
    eligible = sorted((rid for rid, (f, a, _) in stats.items() if f and f / a >= 0.2),
                      key=lambda rid: (-stats[rid][0], RULE_IDS.index(rid)))
    assert len(eligible) >= 3 and [p.rubric.rubric_id for p in proposals] == eligible[:3]
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
        rid for rid, (f, a, _) in stats.items() if f and f == a}
    # the scripted policy fails no rule: nothing to propose
    good = [run_episode(ENV, t, scripted_policy) for t in ENV.tasks("train")]
    assert reflector.propose_rubric_skills(good, [], 12) == []
    # uncheckable trajectories give no evidence and break nothing
    bare = Trajectory("x", good[0].turns, 0.0, trajectory_id="x")
    assert reflector.failure_stats([bare]) == {rid: (0, 0, "") for rid in RULES}


def test_reflector_proposes_a_rule_only_a_bad_policy_breaks():
    reflector = ENV.reflector()
    # a seller who keeps asking fails ends_hopeless_negotiation on every no_deal task and nothing else applies
    trajectories = [_traj(NO_DEAL, ["ask", "ask"]) for _ in range(3)] + [_traj(STANDARD, ["ask", "100"])]
    proposals = reflector.propose_rubric_skills(trajectories, [], 5)
    assert [p.rubric.rubric_id for p in proposals] == ["ends_hopeless_negotiation"]
    assert "3 of 3" in proposals[0].evidence


def test_reflector_refine_cycles_variants():
    reflector = ENV.reflector()
    spec = RULES["asks_budget_first"].spec
    variants = SKILLS["asks_budget_first"]
    seen = [variants[0]]
    for _ in range(len(variants)):
        seen.append(reflector.refine_skill(spec, seen[-1], []))
    assert seen[1:len(variants)] == list(variants[1:]) and seen[-1] == variants[0]
    assert reflector.refine_skill(spec, "something else", []) == variants[0]
    assert reflector.refine_skill(RubricSpec("other", "x"), "keep me", []) == "keep me"


@pytest.mark.parametrize("task, expected", [
    # the rules specific to the instance first, then those that apply to any (library order within each)
    # (a plain-item buyer can still be offered a bundle, a feasible budget can still be ended on: general)
    (STANDARD, ["offers_at_budget", "asks_budget_first", "proposes_bundle_when_wanted", "ends_hopeless_negotiation",
                "clear_actions"]),
    (BUNDLE, ["proposes_bundle_when_wanted", "offers_bundle_when_wanted", "asks_budget_first",
              "ends_hopeless_negotiation", "clear_actions"]),
    (NO_DEAL, ["ends_hopeless_negotiation", "asks_budget_first", "proposes_bundle_when_wanted", "clear_actions"]),
])
def test_instance_rubrics(task, expected):
    reflector = ENV.reflector()
    assert isinstance(reflector, InstanceRubricWriter)
    context = _empty(task)
    assert [s.rubric_id for s in reflector.instance_rubrics(context, 10)] == expected
    assert [s.rubric_id for s in reflector.instance_rubrics(context, 2)] == expected[:2]
    assert reflector.instance_rubrics(context, 0) == []
    with pytest.raises(ValueError):
        reflector.instance_rubrics(Trajectory("x", context.turns, 0.0), 3)


def test_instance_rubrics_cover_every_rule_that_applies():
    reflector = ENV.reflector()
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    for trajectory in _random_trajectories(ENV.tasks("train")) + [run_episode(ENV, t, scripted_policy)
                                                                 for t in ENV.tasks("train")]:
        written = {s.rubric_id for s in reflector.instance_rubrics(trajectory, 8)}
        applied = {rid for rid, j in judge.evaluate([trajectory], SPECS)[0].judgments.items()
                   if j.verdict in (Verdict.PASS, Verdict.FAIL)}
        assert applied <= written, (trajectory.metadata["task"], applied - written)
    haggler = {s.rubric_id for s in reflector.instance_rubrics(_empty(HAGGLER), 8)}
    assert {"opens_at_list_with_haggler", "accepts_counter"} <= haggler and "asks_budget_first" not in haggler


# -- attributor ------------------------------------------------------------------------------


def test_failure_cause():
    assert failure_cause(_traj(HOSTILE, ["ask", "100"]).metadata["env_state"]) == "partner"
    assert failure_cause(_traj(HOSTILE, ["100"]).metadata["env_state"]) == "partner"  # unwinnable whatever it did
    assert failure_cause(_traj(SOLD_OUT, ["ask", "100"]).metadata["env_state"]) == "scenario"
    assert failure_cause(_traj(STANDARD, ["ask", "80"]).metadata["env_state"]) == "policy"
    assert failure_cause(_traj(NO_DEAL, ["ask", "60"]).metadata["env_state"]) == "policy"
    # a loss-making sale is the policy's, even in an unwinnable scenario
    assert failure_cause({"winnable": False, "hostile": True, "deal": {"price": 40, "cost": 60}}) == "policy"
    assert failure_cause({"winnable": False, "hostile": False, "deal": None}) == "scenario"


def test_attributor_causes():
    attributor = ENV.attributor()
    assert isinstance(attributor, Attributor)
    # partner-caused: a hostile buyer walks out at the agreement, whatever the seller did
    for messages in (["ask", "100"], ["ask", "end"], ["100"], ["ask", "ask"]):
        trajectory = _traj(HOSTILE, messages)
        assert not trajectory.metadata["success"]
        records = attributor.attribute(trajectory, SPECS)
        assert [r.capability_id for r in records] == RULE_IDS and {r.cause for r in records} == {"partner"}
        assert all(r.trajectory_id == trajectory.trajectory_id for r in records)
    # scenario-caused: the item turns out sold out
    records = {r.capability_id: r for r in attributor.attribute(_traj(SOLD_OUT, ["ask", "100"]), SPECS)}
    assert {r.cause for r in records.values()} == {"scenario"}
    assert not any(r.deficit for r in records.values())  # the seller did everything right
    passed = records["offers_at_budget"]
    assert (passed.deficit, passed.confidence, passed.evidence) == (False, 0.8, "100")
    na = records["accepts_counter"]
    assert (na.deficit, na.confidence, na.evidence) == (False, 0.5, "")
    # policy-caused: money left on the table
    records = {r.capability_id: r for r in attributor.attribute(_traj(STANDARD, ["ask", "80"]), SPECS)}
    assert {r.cause for r in records.values()} == {"policy"}
    deficit = records["offers_at_budget"]
    assert (deficit.deficit, deficit.confidence, deficit.evidence) == (True, 0.9, "80")
    assert [rid for rid, r in records.items() if r.deficit] == ["offers_at_budget"]
    records = {r.capability_id: r for r in attributor.attribute(_traj(STANDARD, ["100"]), SPECS)}
    assert records["asks_budget_first"].deficit and records["asks_budget_first"].evidence == "100"
    # unknown candidates and uncheckable trajectories
    trajectory = _traj(STANDARD, ["ask", "80"])
    other = attributor.attribute(trajectory, [RubricSpec("other", "x")])[0]
    assert not other.deficit and other.cause == "unclear" and other.confidence == 0.0
    bare = Trajectory("x", trajectory.turns, 0.0, trajectory_id="x")
    assert all(r.cause == "unclear" and not r.deficit for r in attributor.attribute(bare, SPECS))


def test_attribution_screening_keeps_partner_and_scenario_failures_external():
    failures = {"hostile": _traj(HOSTILE, ["100"]), "sold": _traj(SOLD_OUT, ["ask", "100"]),
                "loss": _traj(STANDARD, ["ask", "80"]), "pushy": _traj(STANDARD, ["100"]),
                "end": _traj(STANDARD, ["end"])}
    for name, trajectory in failures.items():
        assert not trajectory.metadata["success"]
        trajectory.trajectory_id = name
    result = attribute(list(failures.values()), SPECS, ENV.attributor())
    # the hostile buyer's failure is not the agent's, even though it offered before asking
    assert set(result.external) == {"hostile", "sold"}
    assert {(r.trajectory_id, r.capability_id) for r in result.accepted} == {
        ("loss", "offers_at_budget"), ("pushy", "asks_budget_first"), ("end", "asks_budget_first")}
    assert set(result.unattributed) == set()  # ending without asking fails asks_budget_first


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
        capability = Capability(rule_id, rule.spec.criterion, family=rule.family,
                                applicability=rule.spec.applicability, scored=False)
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
