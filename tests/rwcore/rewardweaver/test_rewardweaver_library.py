"""Capability library: source-disjoint admission, collapse detection, immutability, hash-checked files."""

import dataclasses
import json

import pytest
import yaml
from rewardweaver_fakes import ConstantJudge, LabelJudge, build_library, labelled_cases, traj

from rwcore.rewardweaver import (
    AdmissionConfig,
    AdmittedCapability,
    Capability,
    CapabilityLibrary,
    LabelledCase,
    acceptance_test,
    partition_by_source,
)
from rwcore.types import RubricSpec
from rwcore.verdict import Verdict

CAND = Capability(
    "empathy",
    "Responds to the partner's feelings",
    family="Relationship",
    applicability="the partner expresses a feeling",
    evaluator_prompt="Score empathy.",
)


def test_accurate_evaluator_is_admitted_with_metrics():
    library = CapabilityLibrary()
    judge = LabelJudge()
    report = library.admit(CAND, judge, labelled_cases("empathy"))
    assert report.admitted and "empathy" in library
    # 4 sources -> 2 held out (seeded), 7 cases each: 3 PASS, 3 FAIL, 1 NA per source.
    assert len(report.heldout_sources) == 2 and len(report.dev_sources) == 2
    assert not set(report.heldout_sources) & set(report.dev_sources)
    assert (report.n_heldout, report.n_dev) == (14, 14)
    assert (report.n_pass, report.n_fail, report.n_na, report.n_invalid) == (6, 6, 2, 0)
    assert report.validity_rate == 1.0 and report.applicable_pass_rate == 0.5
    # Only the held-out partition was judged.
    judged = set(judge.calls[0])
    assert all(any(f"-{s}-" in tid for s in report.heldout_sources) for tid in judged)
    entry = library["empathy"]
    assert entry.evaluator == "fake:label-judge"
    assert entry.rubric == RubricSpec(
        "empathy",
        "Responds to the partner's feelings",
        "the partner expresses a feeling",
        "Relationship",
        "Score empathy.",
        True,
    )
    assert library.families() == {"Relationship": ("empathy",)}


def test_collapsed_evaluator_is_rejected_even_with_high_validity():
    # Paper D.2: applicable to 23, all 23 pass. Reference: 22 PASS, 1 FAIL -> validity 22/23 = 0.957 >= 0.8.
    cases = [LabelledCase(traj(f"p{j}"), Verdict.PASS, f"src{j % 4}") for j in range(22)]
    cases.append(LabelledCase(traj("f0"), Verdict.FAIL, "src0"))
    report, entry = acceptance_test(CAND, ConstantJudge(Verdict.PASS), heldout_cases=cases)
    assert entry is None and not report.admitted
    assert report.n_applicable == 23 and report.n_pass == 23
    assert report.validity_rate == pytest.approx(22 / 23)
    assert report.collapsed
    assert any("collapsed" in reason for reason in report.reasons)
    # An always-FAIL evaluator is collapsed too.
    report, _ = acceptance_test(CAND, ConstantJudge(Verdict.FAIL), heldout_cases=cases)
    assert report.collapsed and not report.admitted


def test_nearly_collapsed_within_tolerance():
    cases = [LabelledCase(traj(f"p{j}", verdicts={"empathy": Verdict.PASS}), Verdict.PASS, "a") for j in range(19)]
    cases.append(LabelledCase(traj("f", verdicts={"empathy": Verdict.FAIL}), Verdict.FAIL, "a"))
    report, _ = acceptance_test(CAND, LabelJudge(), heldout_cases=cases)  # pass rate 19/20 = 0.95 >= 1 - 0.05
    assert report.collapsed and not report.admitted
    report, entry = acceptance_test(
        CAND, LabelJudge(), heldout_cases=cases, config=AdmissionConfig(collapse_tolerance=0.04)
    )
    assert not report.collapsed and report.admitted and entry is not None


def test_too_low_validity_is_rejected():
    report = CapabilityLibrary().admit(CAND, LabelJudge(flip=True), labelled_cases("empathy"))
    assert not report.admitted
    # flipped PASS/FAIL: only the 2 NA cases agree -> 2/14.
    assert report.validity_rate == pytest.approx(2 / 14)
    assert any("validity rate" in reason for reason in report.reasons)


def test_validity_threshold_is_configurable():
    # 12 applicable held-out cases, the judge wrong on 2 of them -> validity 12/14.
    cases = labelled_cases("empathy", sources=("a", "b"))
    wrong = [
        LabelledCase(
            dataclasses.replace(c.trajectory, metadata={"verdicts": {"empathy": Verdict.FAIL}}), c.label, c.source
        )
        if c.trajectory.trajectory_id in ("empathy-a-0", "empathy-b-0")
        else c
        for c in cases
    ]
    report, _ = acceptance_test(CAND, LabelJudge(), heldout_cases=wrong)
    assert report.validity_rate == pytest.approx(12 / 14) and report.admitted
    report, _ = acceptance_test(CAND, LabelJudge(), heldout_cases=wrong, config=AdmissionConfig(min_validity=0.9))
    assert not report.admitted


def test_too_few_applicable_and_not_contrastive_and_invalid():
    few = [c for c in labelled_cases("empathy", sources=("a",))]  # 6 applicable < 10
    report, _ = acceptance_test(CAND, LabelJudge(), heldout_cases=few)
    assert any("too few applicable" in r for r in report.reasons)
    only_pass = [LabelledCase(traj(f"p{j}", verdicts={"empathy": Verdict.PASS}), Verdict.PASS, "a") for j in range(12)]
    report, _ = acceptance_test(CAND, LabelJudge(), heldout_cases=only_pass)
    assert any("not contrastive" in r for r in report.reasons)
    # Judge fails (INVALID, the LabelJudge default) on cases without a scripted verdict.
    broken = labelled_cases("empathy", sources=("a", "b")) + [
        LabelledCase(traj(f"x{j}"), Verdict.PASS, "a") for j in range(6)
    ]
    report, _ = acceptance_test(CAND, LabelJudge(), heldout_cases=broken)
    assert report.n_invalid == 6 and report.invalid_rate == pytest.approx(6 / 20)
    assert any("INVALID" in r for r in report.reasons) and not report.admitted
    # INVALID judgments are excluded from the validity rate, never counted as pass or fail.
    assert report.validity_rate == 1.0 and report.n_valid == 14


def test_overlapping_source_partitions_are_an_error():
    cases = labelled_cases("empathy")
    dev = [c for c in cases if c.source in ("s1", "s2")]
    held = [c for c in cases if c.source in ("s2", "s3")]
    with pytest.raises(ValueError, match=r"share source\(s\) \['s2'\]"):
        acceptance_test(CAND, LabelJudge(), dev_cases=dev, heldout_cases=held)
    library = CapabilityLibrary()
    with pytest.raises(ValueError, match="source-disjoint"):
        library.admit(CAND, LabelJudge(), dev_cases=dev, heldout_cases=held)
    assert len(library) == 0


def test_partition_by_source():
    cases = labelled_cases("x", sources=("a", "b", "c", "d", "e"))
    dev, held = partition_by_source(cases, ["b", "d"])
    assert {c.source for c in held} == {"b", "d"} and {c.source for c in dev} == {"a", "c", "e"}
    dev1, held1 = partition_by_source(cases, heldout_fraction=0.4, seed=3)
    dev2, held2 = partition_by_source(cases, heldout_fraction=0.4, seed=3)
    assert [c.source for c in held1] == [c.source for c in held2] and len({c.source for c in held1}) == 2
    assert not {c.source for c in dev1} & {c.source for c in held1}
    with pytest.raises(ValueError, match="heldout_sources"):
        partition_by_source(cases, ["zzz"])


def test_bad_labels_and_bad_judge_output():
    with pytest.raises(ValueError, match="label"):
        LabelledCase(traj("a"), Verdict.INVALID, "s")
    with pytest.raises(ValueError, match="label"):
        LabelledCase(traj("a"), 1, "s")

    class Short:
        def evaluate(self, trajectories, rubrics):
            return []

    with pytest.raises(ValueError, match="evaluator"):
        acceptance_test(CAND, Short(), labelled_cases("empathy"))


def test_admitted_entries_are_immutable_and_ids_never_reused():
    library = build_library(("a", "b"))
    entry = library["a"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.capability = Capability("a", "changed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.capability.definition = "changed"
    with pytest.raises(ValueError, match="content hash"):
        dataclasses.replace(entry, capability=dataclasses.replace(entry.capability, definition="changed"))
    with pytest.raises(ValueError, match="already in the library"):
        library.admit(Capability("a", "a revised definition"), LabelJudge(), labelled_cases("a"))
    # Revision under a new id; the old one withdrawn from candidacy, its entry untouched.
    report = library.admit(Capability("a.v2", "a revised definition"), LabelJudge(), labelled_cases("a.v2"))
    assert report.admitted
    library.withdraw("a", "superseded by a.v2")
    assert library.ids() == ("b", "a.v2") and library["a"] is entry
    with pytest.raises(ValueError, match="withdrawn"):
        library.check_ids(["a"], "active")
    with pytest.raises(ValueError, match="capability_ids\\[0\\] 'nope'"):
        library.rubrics(["nope"])


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_save_load_round_trip(tmp_path, suffix):
    library = build_library(("a", "b", "c"), families=["F1", "F2", "F1"], min_applicable=8)
    library.withdraw("b", "superseded")
    path = tmp_path / f"library{suffix}"
    library.save(path)
    loaded = CapabilityLibrary.load(path)
    assert loaded.state_dict() == library.state_dict()
    assert loaded.config.min_applicable == 8
    assert loaded.families() == {"F1": ("a", "c")}
    assert loaded["a"] == library["a"]


@pytest.mark.parametrize("suffix", [".json", ".yml"])
@pytest.mark.parametrize(
    "field,value",
    [
        (("capability", "definition"), "a quietly edited definition"),
        (("capability", "evaluator_prompt"), "new prompt"),
        (("evaluator",), "another-model"),
        (("admission", "validity_rate"), 0.99),
    ],
)
def test_tampered_file_is_refused_naming_the_capability(tmp_path, suffix, field, value):
    library = build_library(("a", "b"))
    path = tmp_path / f"library{suffix}"
    library.save(path)
    load = json.loads if suffix == ".json" else yaml.safe_load
    data = load(path.read_text())
    target = data["entries"][1]
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    path.write_text(json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))
    with pytest.raises(ValueError, match="capability 'b'.*hash"):
        CapabilityLibrary.load(path)


def test_load_rejects_unknown_suffix_and_garbage(tmp_path):
    library = build_library(("a",))
    with pytest.raises(ValueError, match="path"):
        library.save(tmp_path / "library.txt")
    bad = tmp_path / "library.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CapabilityLibrary.load(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        CapabilityLibrary.load(bad)


def test_rubric_spec_candidates_and_entry_construction():
    spec = RubricSpec("x", "criterion", capability="Fam", evaluator_prompt="p", scored=True)
    cap = Capability.from_rubric(spec)
    assert cap.family == "Fam" and cap.rubric == spec
    with pytest.raises(ValueError):
        AdmittedCapability(cap, "e", None, "0" * 64)


def test_evaluator_identity_is_frozen_with_the_entry():
    from rwcore.rewardweaver.admission import evaluator_name

    class ModelJudge(LabelJudge):
        evaluator_id = None
        model = "qwen2.5-72b"

    class Plain:
        def evaluate(self, trajectories, rubrics):
            return []

    assert evaluator_name(ModelJudge()) == "ModelJudge:qwen2.5-72b"
    assert evaluator_name(Plain()).endswith("Plain")
    library = CapabilityLibrary()
    report = library.admit(CAND, ModelJudge(), labelled_cases("empathy"), evaluator_id="judge-v2")
    assert report.evaluator == library["empathy"].evaluator == "judge-v2"
