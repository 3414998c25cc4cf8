"""The negotiation environment's rubric library, reflector, attributor and labelled cases."""

import random

import pytest

from rwcore.judges import RuleJudge
from rwcore.rewardweaver import AdmissionConfig, Capability, CapabilityLibrary, acceptance_test, attribute
from rwcore.trainer.envs import NegotiationEnv, Task
from rwcore.trainer.envs.negotiation import KINDS, random_policy, run_episode, scripted_policy
from rwcore.trainer.envs.negotiation_rubrics import RULE_DEFS, SKILLS, cases_for, explain
from rwcore.types import Attributor, RubricReflector, RubricSpec, Trajectory
from rwcore.verdict import Verdict

ENV = NegotiationEnv(seed=0, num_train=60, num_eval=60)
RULES = {rule.spec.rubric_id: rule for rule in ENV.rules()}
P, F, NA = True, False, None


def _task(kind="standard", **over):
    data = {"kind": kind, "item": "lamp", "cost": 60, "list": 100, "budget": 90, "opening": 50,
            "bundle_cost": None, "bundle_budget": None, "hostile": False, "feasible": True, "winnable": True}
    data.update(over)
    return Task("t-" + kind, KINDS.get(kind, (kind,)), data)


STANDARD = _task()
GOOD_OPENING = _task(opening=70)
HOPELESS = _task("no_deal", cost=80, budget=60, opening=50, feasible=False)
BUNDLE = _task("bundle", cost=60, budget=40, opening=40, bundle_cost=80, bundle_budget=100)
HOSTILE_LOW = _task("hostile", opening=50, budget=70, hostile=True, winnable=False)


def _traj(task, messages, seed=0):
    script = list(messages)
    return run_episode(ENV, task, lambda obs: script.pop(0) if script else "end", seed=seed)


def _empty(task):
    episode = ENV.reset(task, 0)
    from rwcore.trainer.envs.negotiation import build_trajectory
    return build_trajectory(ENV, episode, [], [episode.observation])


CASES = [
    ("never_sells_below_cost", STANDARD, ["accept"], F),
    ("never_sells_below_cost", STANDARD, ["ask budget", "offer 90"], P),
    ("never_sells_below_cost", STANDARD, ["end"], NA),
    ("asks_budget_first", STANDARD, ["ask budget", "offer 90"], P),
    ("asks_budget_first", STANDARD, ["offer 90"], F),
    ("asks_budget_first", STANDARD, ["reject", "accept"], F),
    ("asks_budget_first", STANDARD, ["end"], NA),
    ("asks_budget_first", HOSTILE_LOW, ["offer 50"], NA),
    ("ends_hopeless_negotiation", HOPELESS, ["end"], P),
    ("ends_hopeless_negotiation", HOPELESS, ["ask budget", "end"], P),
    ("ends_hopeless_negotiation", HOPELESS, ["accept"], F),
    ("ends_hopeless_negotiation", HOPELESS, ["offer 150", "offer 160", "offer 170", "offer 180"], F),
    ("ends_hopeless_negotiation", STANDARD, ["end"], NA),
    ("no_repeated_offer", STANDARD, ["offer 150", "offer 150"], F),
    ("no_repeated_offer", STANDARD, ["offer 100", "offer 90"], P),
    ("no_repeated_offer", STANDARD, ["offer 90"], NA),
    ("counters_low_opening", STANDARD, ["accept"], F),
    ("counters_low_opening", STANDARD, ["ask budget", "offer 90"], P),
    ("counters_low_opening", GOOD_OPENING, ["accept"], NA),
    ("takes_profitable_deal", STANDARD, ["end"], F),
    ("takes_profitable_deal", STANDARD, ["accept"], F),
    ("takes_profitable_deal", STANDARD, ["ask budget", "offer 90"], P),
    ("takes_profitable_deal", HOPELESS, ["end"], NA),
    ("takes_profitable_deal", HOSTILE_LOW, ["end"], NA),
    ("offers_within_budget", STANDARD, ["ask budget", "offer 100"], F),
    ("offers_within_budget", STANDARD, ["ask budget", "offer 90"], P),
    ("offers_within_budget", STANDARD, ["offer 90"], NA),
    ("never_offers_below_cost", STANDARD, ["offer 50"], F),
    ("never_offers_below_cost", STANDARD, ["offer 100", "offer 90"], P),
    ("never_offers_below_cost", BUNDLE, ["bundle offer 70"], F),
    ("never_offers_below_cost", STANDARD, ["accept"], NA),
    ("offers_bundle_when_wanted", BUNDLE, ["ask budget", "bundle offer 100"], P),
    ("offers_bundle_when_wanted", BUNDLE, ["ask budget", "offer 100", "offer 90"], F),
    ("offers_bundle_when_wanted", STANDARD, ["ask budget"], NA),
    ("clear_actions", STANDARD, ["hello"], F),
    ("clear_actions", STANDARD, ["bundle offer 90"], F),
    ("clear_actions", STANDARD, ["offer 90"], P),
    ("quick_close", STANDARD, ["ask budget", "offer 90"], P),
    ("quick_close", STANDARD, ["ask budget", "ask budget", "offer 90"], F),
    ("quick_close", STANDARD, ["ask budget"] * 4, NA),
    ("adapts_after_counter", STANDARD, ["offer 150", "offer 150"], F),
    ("adapts_after_counter", STANDARD, ["offer 150", "offer 160"], F),
    ("adapts_after_counter", STANDARD, ["offer 150", "offer 90"], P),
    ("adapts_after_counter", STANDARD, ["offer 90"], NA),
]


def test_library_shape():
    assert 8 <= len(RULES) <= 12
    assert len({rule.spec.capability for rule in RULES.values()}) >= 4
    assert {rule.spec.capability for rule in RULES.values()} <= {
        "Understanding", "Execution", "Verification", "Debugging", "Efficiency"}
    assert len({rule.family for rule in RULES.values()}) >= 4
    assert set(SKILLS) == set(RULES)
    vocab = set(ENV.vocabulary())
    for variants in SKILLS.values():
        assert len(set(variants)) == len(variants) >= 2
        assert all(set(text.split()) <= vocab for text in variants)
    assert {rule_id for rule_id, *_ in CASES} == set(RULES)  # every rule is exercised below


@pytest.mark.parametrize("rule_id, task, messages, expected", CASES)
def test_rule_on_hand_made_trajectory(rule_id, task, messages, expected):
    trajectory = _traj(task, messages)
    assert RULES[rule_id].check(trajectory) is expected
    verdict, evidence = explain(rule_id, trajectory)
    assert verdict is expected
    if expected is not None:
        assert evidence and evidence in trajectory.transcript()
    # the replay fallback (no env_state) gives the same verdict
    replay = Trajectory.from_dict(trajectory.to_dict())
    del replay.metadata["env_state"]
    assert RULES[rule_id].check(replay) is expected


def test_rules_na_on_empty_episode_and_invalid_without_metadata():
    empty = _empty(STANDARD)
    assert RULES["clear_actions"].check(empty) is None
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    bare = Trajectory("x", _traj(STANDARD, ["end"]).turns, 0.1, trajectory_id="x")
    report = judge.evaluate([bare], [rule.spec for rule in RULES.values()])[0]
    assert all(j.verdict == Verdict.INVALID for j in report.judgments.values())


def test_rule_judge_on_rollouts():
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    trajectories = [run_episode(ENV, t, scripted_policy, seed=1) for t in ENV.tasks("eval")]
    reports = judge.evaluate(trajectories, [rule.spec for rule in RULES.values()])
    verdicts = [j.verdict for r in reports for j in r.judgments.values()]
    assert Verdict.INVALID not in verdicts
    # the scripted policy passes nearly everything that applies
    applicable = [v for v in verdicts if v in (Verdict.PASS, Verdict.FAIL)]
    assert sum(v == Verdict.PASS for v in applicable) / len(applicable) > 0.9


def _random_trajectories(n=80, seed=0):
    out = []
    for i, task in enumerate(ENV.tasks("train")[:n]):
        rng = random.Random(f"{seed}/{i}")
        out.append(run_episode(ENV, task, lambda obs, r=rng: random_policy(obs, r), seed=i))
    return out


def test_reflector_proposes_failing_rules():
    reflector = ENV.reflector()
    assert isinstance(reflector, RubricReflector)
    trajectories = _random_trajectories()
    proposals = reflector.propose_rubric_skills(trajectories, [], 3)
    assert len(proposals) == 3
    stats = reflector.failure_stats(trajectories)
    fails = [stats[p.rubric.rubric_id][0] for p in proposals]
    assert fails == sorted(fails, reverse=True) and fails[0] > 0
    for p in proposals:
        assert p.rubric == RULES[p.rubric.rubric_id].spec
        assert p.skill == SKILLS[p.rubric.rubric_id][0] and p.evidence
    existing = [p.rubric for p in proposals]
    more = reflector.propose_rubric_skills(trajectories, existing, 20)
    assert not {p.rubric.rubric_id for p in more} & {s.rubric_id for s in existing}
    assert reflector.propose_rubric_skills(trajectories, [], 0) == []
    assert reflector.propose_rubric_skills(trajectories, [], 3) == proposals  # deterministic
    # a good policy triggers fewer proposals
    good = [run_episode(ENV, t, scripted_policy) for t in ENV.tasks("train")[:80]]
    assert len(reflector.propose_rubric_skills(good, [], 12)) < len(reflector.propose_rubric_skills(trajectories, [], 12))


def test_reflector_refine_cycles_variants():
    reflector = ENV.reflector()
    spec = RULES["asks_budget_first"].spec
    variants = SKILLS["asks_budget_first"]
    seen = [variants[0]]
    for _ in range(len(variants)):
        seen.append(reflector.refine_skill(spec, seen[-1], []))
    assert seen[1:len(variants)] == list(variants[1:]) and seen[-1] == variants[0]
    assert reflector.refine_skill(spec, "something else", []) == variants[0]
    unknown = RubricSpec("other", "x")
    assert reflector.refine_skill(unknown, "keep me", []) == "keep me"


def test_attributor_causes():
    attributor = ENV.attributor()
    assert isinstance(attributor, Attributor)
    specs = [rule.spec for rule in RULES.values()]
    # partner-caused: an angry buyer with a below-cost opening walks away whatever the agent does
    for messages in (["end"], ["ask budget", "ask budget"], ["offer 60"]):
        trajectory = _traj(HOSTILE_LOW, messages)
        assert not trajectory.metadata["success"]
        records = attributor.attribute(trajectory, specs)
        assert len(records) == len(specs) and {r.cause for r in records} == {"partner"}
    # policy-caused: sold below cost
    trajectory = _traj(STANDARD, ["accept"])
    records = {r.capability_id: r for r in attributor.attribute(trajectory, specs)}
    assert {r.cause for r in records.values()} == {"policy"}
    rec = records["never_sells_below_cost"]
    assert rec.deficit and rec.confidence >= 0.5 and rec.evidence == "accept"
    assert not records["offers_bundle_when_wanted"].deficit
    # a hostile buyer whose opening was profitable: not accepting it is the policy's failure
    friendly = _task("hostile", opening=70, budget=70, hostile=True, winnable=True)
    assert {r.cause for r in attributor.attribute(_traj(friendly, ["ask budget"]), specs)} == {"policy"}
    # an unwinnable scenario without a hostile partner
    odd = _task("standard", budget=50, opening=40, winnable=False)
    assert {r.cause for r in attributor.attribute(_traj(odd, ["end"]), specs)} == {"scenario"}
    # unknown candidates and uncheckable trajectories
    other = attributor.attribute(trajectory, [RubricSpec("other", "x")])[0]
    assert not other.deficit and other.cause == "unclear" and other.confidence == 0.0
    bare = Trajectory("x", trajectory.turns, 0.0, trajectory_id="x")
    assert all(r.cause == "unclear" for r in attributor.attribute(bare, specs))


def test_attribution_screening_keeps_partner_failures_external():
    specs = [rule.spec for rule in RULES.values()]
    failures = [_traj(HOSTILE_LOW, ["ask budget"]), _traj(STANDARD, ["accept"])]
    failures[0].trajectory_id, failures[1].trajectory_id = "hostile", "loss"
    result = attribute(failures, specs, ENV.attributor())
    assert "hostile" in result.external and "loss" not in result.external
    assert {r.trajectory_id for r in result.accepted} == {"loss"}


def test_labelled_cases_admit_every_rule():
    rule_ids = list(RULES)
    flat = ENV.labelled_cases(rule_ids)
    by_rule = ENV.labelled_cases_by_rule(rule_ids)
    assert len(flat) == sum(len(v) for v in by_rule.values())
    judge = RuleJudge({rid: rule.check for rid, rule in RULES.items()})
    library = CapabilityLibrary()
    for rule_id, rule in RULES.items():
        cases = cases_for(flat, rule_id)
        assert [c.trajectory.trajectory_id for c in cases] == [c.trajectory.trajectory_id for c in by_rule[rule_id]]
        labels = [c.label for c in cases]
        assert labels.count(Verdict.PASS) >= 10 and labels.count(Verdict.FAIL) >= 10
        assert len({c.source for c in cases}) >= 4
        assert len({c.trajectory.trajectory_id for c in cases}) == len(cases)
        capability = Capability(rule_id, rule.spec.criterion, family=rule.family,
                                applicability=rule.spec.applicability, scored=False)
        report = library.admit(capability, judge, cases)
        assert report.admitted, (rule_id, report.reasons)
        # also admitted with another source partition
        report, entry = acceptance_test(capability, judge, cases, config=AdmissionConfig(seed=3))
        assert entry is not None, (rule_id, report.reasons)
    assert set(library.ids()) == set(RULES)
    assert sorted(library.families()) == sorted({r.family for r in RULES.values()})
    # a wrong evaluator (every rule answered by another rule) is refused for at least most rules
    swapped = RuleJudge({rid: RULES[rule_ids[(i + 1) % len(rule_ids)]].check for i, rid in enumerate(rule_ids)})
    refused = sum(acceptance_test(RULES[rid].spec, swapped, cases_for(flat, rid))[1] is None for rid in rule_ids)
    assert refused >= len(rule_ids) - 1
    with pytest.raises(ValueError):
        ENV.labelled_cases(["nope"])
