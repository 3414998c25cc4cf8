"""A recording RubricReflector, trajectory and report builders, and a combined method after its first pool update,
for the tests of AdaptiveMethod and of what it makes of judgments."""

from rewardweaver_fakes import ScriptedAttributor, build_library, deficit, judgment

from rwcore import AdaptiveMethod, MethodSettings, Verdict
from rwcore.method import Providers
from rwcore.types import JudgeReport, RubricSkillProposal, RubricSpec, Trajectory, Turn

P, F = Verdict.PASS, Verdict.FAIL


class Reflector:
    """Records what reflection and refinement see; proposes the given pairs once."""

    def __init__(self, proposals=()) -> None:
        self.proposals = list(proposals)
        self.propose_calls: list[dict] = []
        self.refine_calls: list[tuple[str, list[str]]] = []

    def propose_rubric_skills(self, trajectories, existing, max_new, *, diagnostics=None):
        self.propose_calls.append(
            {
                "ids": [t.trajectory_id for t in trajectories],
                "diagnostics": diagnostics,
                "existing": [r.rubric_id for r in existing],
                "max_new": max_new,
            }
        )
        out, self.proposals = self.proposals[:max_new], self.proposals[max_new:]
        return out

    def refine_skill(self, rubric, skill, failures):
        assert failures, "refine_skill must never be asked without failures"
        self.refine_calls.append((rubric.rubric_id, [t.trajectory_id for t in failures]))
        return skill + " (refined)"


def trajectories(step: int, task_ids, group: int, outcomes=None, lengths=None) -> list[Trajectory]:
    out = []
    for i, task_id in enumerate(task_ids):
        for j in range(group):
            k = i * group + j
            out.append(
                Trajectory(
                    task_id,
                    [Turn("assistant", f"{task_id} {k}", True)],
                    0.0 if outcomes is None else float(outcomes[k]),
                    tags=("tag",),
                    trajectory_id=f"s{step}/{task_id}/{j}",
                    generated_length=0 if lengths is None else int(lengths[k]),
                )
            )
    return out


def reports_for(trajs, verdicts: dict[str, list], uncovered=None) -> list[JudgeReport]:
    """verdicts: rubric id -> one Verdict (or (Verdict, score)) per trajectory."""
    out = []
    for n, t in enumerate(trajs):
        judgments = {}
        for rid, column in verdicts.items():
            v = column[n]
            verdict, score = v if isinstance(v, tuple) else (v, None)
            judgments[rid] = judgment(rid, verdict, score)
        out.append(JudgeReport(t.trajectory_id, judgments, tuple(uncovered[n]) if uncovered else ()))
    return out


def traj_with(tid, outcome, **metadata):
    return Trajectory(
        "t0", [Turn("assistant", tid, True)], outcome, tags=("tag",), trajectory_id=tid, metadata=metadata
    )


def combined(normalization: str) -> AdaptiveMethod:
    """Process rubrics c1, c2 (RewardWeaver's active set) and pool rubric a1 (Arise's advantages)."""
    library = build_library(ids=("c1", "c2", "c3"))
    method = AdaptiveMethod(
        "combined",
        {"t0": ["tag"], "t1": ["tag"]},
        MethodSettings(
            batch_size=2,
            group_size=4,
            delta_pool=1,
            budget=2,
            length_threshold=0,
            success_sample=0,
            min_support=1,
            process_normalization=normalization,
        ),
        Providers(library=library, attributor=ScriptedAttributor(), reflector=Reflector([proposal_pair("a1")])),
    )
    diag = [traj_with(f"d{i}", 0.0, attribution=[deficit("c1"), deficit("c2")]) for i in range(3)]
    method.adapt(-1, diagnosis=(diag, reports_for(diag, {"c1": [F] * 3, "c2": [F] * 3, "c3": [P] * 3})))
    task_ids = method.sample(0)
    trajs = trajectories(0, task_ids, 4)
    ids = [spec.rubric_id for spec in method.rubrics_to_judge(0, task_ids)[0]]
    scored = method.score(trajs, reports_for(trajs, {rid: [P] * 8 for rid in ids}))
    method.observe(0, task_ids, trajs, scored.judged)
    method.adapt(0)  # the pool's first update adds a1
    assert method.pool.rubric_ids() == ["a1"] and set(method.weaver.active) == {"c1", "c2"}
    return method


def proposal_pair(rubric_id: str) -> RubricSkillProposal:
    return RubricSkillProposal(RubricSpec(rubric_id, f"criterion {rubric_id}", capability="Execution"), "a skill")
