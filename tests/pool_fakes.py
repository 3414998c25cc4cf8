"""A scripted RubricReflector and report builders for the rubric-skill pool tests."""

from rwcore.types import JudgeReport, RubricJudgment, RubricSkillProposal, RubricSpec, Trajectory, Turn
from rwcore.verdict import Verdict


def proposal(rubric_id: str, capability: str = "Verification", skill: str | None = None) -> RubricSkillProposal:
    return RubricSkillProposal(
        rubric=RubricSpec(
            rubric_id=rubric_id,
            criterion=f"criterion of {rubric_id}",
            applicability=f"when {rubric_id} applies",
            capability=capability,
        ),
        skill=skill if skill is not None else f"skill of {rubric_id}",
    )


class FakeReflector:
    """Proposes `per_call` pairs ("p<n>", cycling capabilities) per call and refines by appending a revision tag.

    Every call is logged in `calls` as ("propose", trajectory ids, existing ids, max_new) or
    ("refine", rubric id, old skill, failure trajectory ids). `fail_propose` / `fail_refine`
    make the corresponding call raise; `bad` replaces the proposals with the given list.
    """

    def __init__(
        self,
        per_call: int | None = None,
        capabilities=("Verification", "Efficiency"),
        fail_propose: bool = False,
        fail_refine: bool = False,
        bad=None,
        refine_result=None,
    ):
        self.per_call = per_call
        self.capabilities = tuple(capabilities)
        self.fail_propose = fail_propose
        self.fail_refine = fail_refine
        self.bad = bad
        self.refine_result = refine_result
        self.counter = 0
        self.calls: list[tuple] = []

    def propose_rubric_skills(self, trajectories, existing, max_new):
        self.calls.append(
            ("propose", [t.trajectory_id for t in trajectories], [r.rubric_id for r in existing], max_new)
        )
        if self.fail_propose:
            raise RuntimeError("reflection model is down")
        if self.bad is not None:
            return self.bad
        count = max_new if self.per_call is None else self.per_call
        out = []
        for _ in range(count):
            out.append(proposal(f"p{self.counter}", self.capabilities[self.counter % len(self.capabilities)]))
            self.counter += 1
        return out

    def refine_skill(self, rubric, skill, failures):
        self.calls.append(("refine", rubric.rubric_id, skill, [t.trajectory_id for t in failures]))
        if self.fail_refine:
            raise RuntimeError("refinement failed")
        if self.refine_result is not None:
            return self.refine_result
        return f"{skill} [rev]"


def reports(
    rubric_id: str, passes: int = 0, fails: int = 0, na: int = 0, invalid: int = 0, prefix: str = "t"
) -> list[JudgeReport]:
    """One single-judgment report per verdict; trajectory ids "<prefix>-<rubric>-<verdict>-<n>"."""
    out = []
    for verdict, count in ((Verdict.PASS, passes), (Verdict.FAIL, fails), (Verdict.NA, na), (Verdict.INVALID, invalid)):
        for n in range(count):
            trajectory_id = f"{prefix}-{rubric_id}-{verdict.name.lower()}-{n}"
            out.append(JudgeReport(trajectory_id, {rubric_id: RubricJudgment(rubric_id, verdict)}))
    return out


def trajectory(trajectory_id: str) -> Trajectory:
    return Trajectory(
        task_id="task",
        turns=[Turn("user", "do it"), Turn("assistant", "done", True)],
        outcome=0.0,
        trajectory_id=trajectory_id,
    )
