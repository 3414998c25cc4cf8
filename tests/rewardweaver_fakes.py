"""Small deterministic fakes for the RewardWeaver tests: trajectories, judges, attributors, proposers."""

from __future__ import annotations

from rwcore.rewardweaver import Capability, CapabilityLibrary, LabelledCase
from rwcore.types import AttributionRecord, JudgeReport, RubricJudgment, Trajectory, Turn
from rwcore.verdict import Verdict


def traj(tid: str, outcome: float = 0.0, text: str = "", task_id: str = "task", **metadata) -> Trajectory:
    """A one-turn trajectory; `text` is what fake judges and attributors read."""
    return Trajectory(
        task_id=task_id,
        turns=[Turn("assistant", text or tid, generated=True)],
        outcome=outcome,
        trajectory_id=tid,
        metadata=dict(metadata),
    )


def judgment(rubric_id: str, verdict: Verdict, score: float | None = None) -> RubricJudgment:
    return RubricJudgment(rubric_id=rubric_id, verdict=verdict, score=score)


class LabelJudge:
    """Answers from trajectory metadata: metadata["verdicts"][rubric_id] (a Verdict), else `default`.

    Counts calls, so tests can see which trajectories were judged.
    """

    evaluator_id = "fake:label-judge"

    def __init__(self, default: Verdict = Verdict.INVALID, flip: bool = False) -> None:
        self.default = default
        self.flip = flip
        self.calls: list[list[str]] = []

    def evaluate(self, trajectories, rubrics):
        self.calls.append([t.trajectory_id for t in trajectories])
        reports = []
        for t in trajectories:
            judgments = {}
            for rubric in rubrics:
                verdict = t.metadata.get("verdicts", {}).get(rubric.rubric_id, self.default)
                if self.flip and verdict in (Verdict.PASS, Verdict.FAIL):
                    verdict = Verdict.FAIL if verdict == Verdict.PASS else Verdict.PASS
                judgments[rubric.rubric_id] = judgment(rubric.rubric_id, verdict)
            reports.append(JudgeReport(t.trajectory_id, judgments, tuple(t.metadata.get("uncovered", ()))))
        return reports


class ConstantJudge:
    """A collapsed evaluator: the same verdict on everything."""

    evaluator_id = "fake:constant"

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict

    def evaluate(self, trajectories, rubrics):
        return [
            JudgeReport(t.trajectory_id, {r.rubric_id: judgment(r.rubric_id, self.verdict) for r in rubrics})
            for t in trajectories
        ]


class ScriptedAttributor:
    """Returns records from metadata["attribution"]: a list of dicts (capability_id, deficit, confidence,
    evidence, cause) — defaulting to a supported policy deficit; candidates outside the list get nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def attribute(self, trajectory, candidates):
        self.calls.append((trajectory.trajectory_id, tuple(c.rubric_id for c in candidates)))
        out = []
        for item in trajectory.metadata.get("attribution", []):
            item = dict(item)
            out.append(
                AttributionRecord(
                    trajectory_id=item.pop("trajectory_id", trajectory.trajectory_id),
                    capability_id=item.pop("capability_id"),
                    deficit=item.pop("deficit", True),
                    confidence=item.pop("confidence", 0.9),
                    evidence=item.pop("evidence", "quote"),
                    cause=item.pop("cause", "policy"),
                )
            )
        return out


def deficit(capability_id: str, **fields) -> dict:
    return {"capability_id": capability_id, **fields}


class FakeProposer:
    """Proposes the given RubricSpecs (records what it was shown)."""

    def __init__(self, proposals) -> None:
        self.proposals = list(proposals)
        self.seen: list[tuple[list[str], list[str], int]] = []

    def propose_capabilities(self, failures, library, max_new):
        self.seen.append(([t.trajectory_id for t in failures], [r.rubric_id for r in library], max_new))
        return list(self.proposals)


def labelled_cases(capability_id: str, sources=("s1", "s2", "s3", "s4"), per_source: int = 6) -> list[LabelledCase]:
    """Cases whose metadata verdict equals the reference label (so LabelJudge agrees with them):
    per source, alternating PASS / FAIL, plus one NA case."""
    cases = []
    for source in sources:
        for j in range(per_source):
            label = Verdict.PASS if j % 2 == 0 else Verdict.FAIL
            cases.append(
                LabelledCase(traj(f"{capability_id}-{source}-{j}", verdicts={capability_id: label}), label, source)
            )
        cases.append(
            LabelledCase(traj(f"{capability_id}-{source}-na", verdicts={capability_id: Verdict.NA}), Verdict.NA, source)
        )
    return cases


def build_library(ids=("c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"), families=None, **config) -> CapabilityLibrary:
    """A library with `ids` admitted through the real acceptance test (an accurate fake judge)."""
    from rwcore.rewardweaver import AdmissionConfig

    library = CapabilityLibrary(AdmissionConfig(**config) if config else None)
    judge = LabelJudge()
    for j, cid in enumerate(ids):
        family = families[j] if families else f"family-{j % 3}"
        report = library.admit(Capability(cid, f"definition of {cid}", family=family), judge, labelled_cases(cid))
        assert report.admitted, report.reasons
    return library
