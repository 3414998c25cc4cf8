"""The typed boundaries between the method and its trainers: per-rubric rates on `JudgedBatch`, the run files
and training prompt the method itself produces, `Trajectory.partner_failure`, `CapabilityLibrary.add_admitted`."""

import importlib.util
import warnings

import pytest
from _util import ROOT

from rwcore.judged import JudgedBatch
from rwcore.types import JudgeReport, RubricJudgment, Trajectory, Turn
from rwcore.verdict import Verdict

EXAMPLE = ROOT / "examples" / "trl_adaptive_method.py"
_spec = importlib.util.spec_from_file_location("trl_adaptive_method", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def test_rubric_rates_by_hand():
    P, F, N, I = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID
    table = {"a": [P, P, F, N], "b": [N, N, I, N]}
    reports = [
        JudgeReport(f"t{i}", {rid: RubricJudgment(rid, column[i]) for rid, column in table.items()}) for i in range(4)
    ]
    judged = JudgedBatch.from_reports(reports, ["a", "b"], [f"t{i}" for i in range(4)])
    # a: applies to 3 of 4 (PASS, PASS, FAIL), passes 2 of 3; b: a valid verdict nowhere
    assert judged.rubric_rates() == {"a": (0.75, 2 / 3), "b": (0.0, None)}
    assert judged.rubric_rate_metrics() == {
        "rubric/a/applicable": 0.75,
        "rubric/a/pass": 2 / 3,
        "rubric/b/applicable": 0.0,
        "rubric/b/pass": None,
    }


def _run_arise(steps=3):
    from rwcore.method.loop import MethodLoop

    loop = MethodLoop(example.make_method(example.make_rows()), judge=example.make_judge())
    for step in range(steps):
        plan = loop.plan(step, "base")
        trajectories = [
            Trajectory(
                task_id=t,
                turns=[Turn("assistant", "no no no no no", generated=True)],
                outcome=float(k),
                tags=("refund",),
                trajectory_id=f"{step}-{t}-{k}",
            )
            for t in plan.task_ids
            for k in range(2)
        ]
        loop.finish(step, plan.task_ids, trajectories)
        loop.end_step(step)
    return loop.method


def test_the_method_renders_its_prompt_from_a_checkpoint_and_names_its_run_files():
    from rwcore.method import AdaptiveMethod, MethodSettings

    method = _run_arise()
    assert method.system_prompt("base") != "base"  # the pool's skills are active
    assert AdaptiveMethod.system_prompt_from_state(method.state_dict(), "base") == method.system_prompt("base")
    assert set(method.run_files()) == {"pool_counts.json", "pool_events.json", "pool_rubrics.json"}
    assert method.run_files()["pool_rubrics.json"] == method.pool_rubrics()
    outcome = AdaptiveMethod("outcome_only", {"t0": ["x"], "t1": ["y"]}, MethodSettings(batch_size=2, group_size=2))
    assert outcome.run_files() == {} and AdaptiveMethod.system_prompt_from_state(outcome.state_dict(), "b") == "b"
    assert outcome.sampling_probabilities(0) is None
    with pytest.raises(ValueError, match="rwcore.arise_pool|state must be"):
        AdaptiveMethod.system_prompt_from_state({"pool": {"kind": "other"}}, "b")


def test_partner_failure_is_a_field_and_the_old_metadata_key_moves_into_it():
    t = Trajectory(task_id="t", turns=[], outcome=0.0, partner_failure="partner timed out")
    assert t.partner_failure == "partner timed out" and "partner_failure" not in t.metadata
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        given = {"partner_failure": "garbage", "x": 1}
        old = Trajectory(task_id="t", turns=[], outcome=0.0, metadata=given)
    assert old.partner_failure == "garbage" and old.metadata == {"x": 1}
    assert given == {"partner_failure": "garbage", "x": 1}  # the caller's dict is left as it was
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert Trajectory.from_dict(t.to_dict()).partner_failure == "partner timed out"
    with pytest.raises(ValueError, match="partner_failure must be a string"):
        Trajectory(task_id="t", turns=[], outcome=0.0, partner_failure=True)


def test_add_admitted_is_all_or_nothing():
    from rwcore.rewardweaver import Capability, CapabilityLibrary
    from rwcore.rewardweaver.capability import AdmissionReport, AdmittedCapability

    def entry(cid):
        capability = Capability(capability_id=cid, definition=f"{cid} holds", family="f")
        report = AdmissionReport(capability_id=cid, admitted=True, reasons=("test",), evaluator="e")
        return AdmittedCapability(capability, "e", report, AdmittedCapability.compute_hash(capability, "e", report))

    library = CapabilityLibrary()
    library.add_admitted([entry("a")])
    with pytest.raises(ValueError, match="'a' is already in the library"):
        library.add_admitted([entry("b"), entry("a")])
    with pytest.raises(ValueError, match="AdmittedCapability"):
        library.add_admitted(["c"])
    assert list(library.ids()) == ["a"]  # nothing of the failed calls was added
