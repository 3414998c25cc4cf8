"""Typed records and protocols shared by the judges, the reward adaptation and the trainer.

Everything that crosses a module boundary is one of these: a `Trajectory`
(what the policy did), a `RubricSpec` (what a judge checks), a
`RubricJudgment` / `JudgeReport` (what a judge said), an `AttributionRecord`
(why a failure happened), and the `Judge` / `Attributor` / `RubricReflector` /
`CapabilityProposer` / `EvaluatorReviser` / `InstanceRubricWriter` protocols that LLM-backed and
programmatic implementations satisfy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol, runtime_checkable

from rwcore.verdict import Verdict

Role = Literal["system", "user", "assistant", "tool", "partner"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool", "partner")
Cause = Literal["policy", "partner", "scenario", "unclear"]
CAUSES: tuple[str, ...] = ("policy", "partner", "scenario", "unclear")


def _digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class Turn:
    """One message of an episode.

    role: "system" | "user" | "assistant" | "tool" | "partner" ("partner" is the
        environment's counterpart, e.g. the scripted buyer in a negotiation).
    generated: True when the policy produced this text (its tokens get loss).
    """

    role: str
    content: str
    generated: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(f"content must be a string, got {type(self.content).__name__}")


@dataclass
class Trajectory:
    """One rollout of one task by one policy version.

    task_id: the task; tags: its task-type tags.
    turns: the episode in order.
    outcome: R_o(tau), the task's outcome reward (a float; environments here use [0, 1]).
    group_id: the rollout group (G rollouts of one task by one policy version share it).
    policy_version: version of the policy that generated it.
    generated_length: tokens the policy generated, over all its turns (length regularization).
    token_spans: [start, end) token index ranges of policy-generated tokens in the
        tokenized episode, in order; empty when the trajectory was never tokenized.
    trajectory_id: unique id; by default "<task_id>/<group_id>/<index in group>" set by the producer.
    metadata: free-form, JSON-serializable (e.g. the environment's private state for analysis).
    partner_failure: why the episode's counterpart (a simulated partner, an opponent, the tool sandbox)
        failed and ended it, or "" (the usual case). Such a trajectory is never charged to the agent: the
        method gives it no advantage and no evidence, the trainer no loss, attribution blames the partner.
        (A `metadata["partner_failure"]` from older code is moved here, with a DeprecationWarning.)
    """

    task_id: str
    turns: list[Turn]
    outcome: float
    tags: tuple[str, ...] = ()
    group_id: str = ""
    policy_version: int = 0
    generated_length: int = 0
    token_spans: tuple[tuple[int, int], ...] = ()
    trajectory_id: str = ""
    metadata: dict = field(default_factory=dict)
    partner_failure: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.metadata, dict) and "partner_failure" in self.metadata:
            import warnings

            from rwcore._deprecated import REMOVED_IN

            warnings.warn(
                f"Trajectory.metadata['partner_failure'] is deprecated and will be ignored from rwcore {REMOVED_IN}: "
                "set Trajectory.partner_failure",
                DeprecationWarning,
                stacklevel=3,
            )
            self.metadata = dict(self.metadata)  # the caller's dict stays as it was
            legacy = self.metadata.pop("partner_failure")
            if legacy and not self.partner_failure:
                self.partner_failure = str(legacy)
        if not isinstance(self.partner_failure, str):
            raise ValueError(
                f"partner_failure must be a string (the reason, or ''), got {type(self.partner_failure).__name__}"
            )

    def transcript(self) -> str:
        """The episode as plain text, one "[role] content" block per turn (what judges read)."""
        return "\n\n".join(f"[{turn.role}] {turn.content}" for turn in self.turns)

    def content_hash(self) -> str:
        """sha256 of what a judge sees (task, tags, turns, outcome); ids and metadata excluded."""
        return _digest(
            {
                "task_id": self.task_id,
                "tags": list(self.tags),
                "turns": [[t.role, t.content, t.generated] for t in self.turns],
                "outcome": self.outcome,
            }
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["tags"] = list(self.tags)
        data["token_spans"] = [list(span) for span in self.token_spans]
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> Trajectory:
        values = dict(data)
        values["turns"] = [Turn(**turn) if isinstance(turn, Mapping) else turn for turn in values.get("turns", [])]
        values["tags"] = tuple(values.get("tags", ()))
        values["token_spans"] = tuple(tuple(span) for span in values.get("token_spans", ()))
        return cls(**values)


@dataclass(frozen=True)
class RubricSpec:
    """What a judge needs to evaluate one rubric (an Arise rubric or a RewardWeaver capability).

    rubric_id: stable id. criterion: what must hold for PASS.
    applicability: when the rubric applies; otherwise the verdict is NA.
    capability: the capability category (Arise table 3) or family it belongs to.
    evaluator_prompt: rubric-specific evaluator instructions (RewardWeaver's p_d), optional.
    scored: the judge returns a score in [0, 1] (RewardWeaver's J_d) instead of only pass/fail.
    """

    rubric_id: str
    criterion: str
    applicability: str = ""
    capability: str = ""
    evaluator_prompt: str = ""
    scored: bool = False

    def content_hash(self) -> str:
        """sha256 of everything that defines the rubric's meaning; judges cache on it."""
        return _digest(asdict(self))


@dataclass(frozen=True)
class RubricJudgment:
    """A judge's result for one (trajectory, rubric).

    verdict: PASS / FAIL, NA (does not apply) or INVALID (the judge failed: error,
        time-out, unparsable output after retries — never silently a pass or fail).
    score: in [0, 1] for scored rubrics (PASS/FAIL imply 1.0/0.0 when unscored); None for NA/INVALID.
    confidence: the judge's confidence in [0, 1], when it gives one.
    evidence: a quote or pointer into the trajectory supporting the verdict.
    error: why the verdict is INVALID.
    """

    rubric_id: str
    verdict: Verdict
    score: float | None = None
    confidence: float | None = None
    evidence: str = ""
    error: str = ""

    @property
    def value(self) -> float | None:
        """The number rewards use: the score, else 1.0 for PASS and 0.0 for FAIL; None when NA or INVALID."""
        if self.verdict in (Verdict.NA, Verdict.INVALID):
            return None
        if self.score is not None:
            return self.score
        return 1.0 if self.verdict == Verdict.PASS else 0.0


@dataclass(frozen=True)
class JudgeReport:
    """All judgments on one trajectory, plus behaviours no rubric covered (Arise B.6 diagnostics)."""

    trajectory_id: str
    judgments: Mapping[str, RubricJudgment]
    uncovered: tuple[str, ...] = ()


@dataclass(frozen=True)
class AttributionRecord:
    """a_{i,d} = (s, c, e) of RewardWeaver §2.3 for one (failed trajectory, candidate capability).

    deficit: s, whether the trajectory shows a deficit in this capability.
    confidence: c in [0, 1].
    evidence: e, observable evidence from the trajectory (a quote); empty means unsupported.
    cause: who controlled the failure: the policy, the partner, the scenario, or unclear.
        Only policy-caused, evidenced, confident deficits can earn training credit.
    """

    trajectory_id: str
    capability_id: str
    deficit: bool
    confidence: float
    evidence: str = ""
    cause: str = "policy"

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.confidence) <= 1.0:
            raise ValueError(f"confidence must be in [0, 1], got {self.confidence!r}")
        if self.cause not in CAUSES:
            raise ValueError(f"cause must be one of {CAUSES}, got {self.cause!r}")


@dataclass(frozen=True)
class RubricSkillProposal:
    """A new Arise rubric with its skill (guidance text injected into the policy's prompt).

    evidence: the observed behaviour that motivated the pair (kept in the pool's history).
    """

    rubric: RubricSpec
    skill: str
    evidence: str = ""


@runtime_checkable
class Judge(Protocol):
    """Evaluates rubrics on trajectories: one JudgeReport per trajectory, in order."""

    def evaluate(self, trajectories: Sequence[Trajectory], rubrics: Sequence[RubricSpec]) -> list[JudgeReport]: ...


@runtime_checkable
class Attributor(Protocol):
    """RewardWeaver failure attribution: records for a low-outcome trajectory over candidate capabilities."""

    def attribute(self, trajectory: Trajectory, candidates: Sequence[RubricSpec]) -> list[AttributionRecord]: ...


@runtime_checkable
class RubricReflector(Protocol):
    """Arise's reflection model: proposes rubric-skill pairs and refines skills (B.6)."""

    def propose_rubric_skills(
        self, trajectories: Sequence[Trajectory], existing: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSkillProposal]: ...

    # A reflector may also take `diagnostics: str | None` as a keyword (the window's compressed
    # evidence, Arise B.3); `rwcore.AdaptiveMethod` passes it to reflectors whose signature has it.

    def refine_skill(self, rubric: RubricSpec, skill: str, failures: Sequence[Trajectory]) -> str: ...


@runtime_checkable
class EvaluatorReviser(Protocol):
    """RewardWeaver's evaluator revision (§2.2, A.3, D.2): clearer evaluator instructions for a candidate
    that failed its acceptance test, written from its *development-partition* disagreements only.

    disagreements: (trajectory, reference label, the evaluator's verdict) for each development case
    the evaluator got wrong. Returns the new evaluator prompt p_d; the definition (the rubric's
    semantics), applicability and id never change.
    """

    def revise_evaluator(
        self, rubric: RubricSpec, disagreements: Sequence[tuple[Trajectory, Verdict, Verdict]]
    ) -> str: ...


@runtime_checkable
class InstanceRubricWriter(Protocol):
    """Rubrics written for one task instance (RewardWeaver's Instance-Specific Rubrics ablation):
    `context` is the instance as the policy first sees it (system and first partner turns)."""

    def instance_rubrics(self, context: Trajectory, max_rubrics: int) -> list[RubricSpec]: ...


@runtime_checkable
class CapabilityProposer(Protocol):
    """RewardWeaver's controlled expansion: candidate capabilities for recurrent uncovered failures."""

    def propose_capabilities(
        self, failures: Sequence[Trajectory], library: Sequence[RubricSpec], max_new: int
    ) -> list[RubricSpec]: ...
