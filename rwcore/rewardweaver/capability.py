"""Capability definitions and immutable library entries (RewardWeaver §2.2, appendix A.3).

`Capability` is a frozen, RubricSpec-compatible definition. `AdmittedCapability`
is what the library stores once a definition passed acceptance testing: the
definition, the evaluator's identity and the `AdmissionReport`, with the sha256
of all three; an entry whose hash does not match its content cannot be built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from rwcore.rewardweaver._util import digest
from rwcore.types import RubricSpec
from rwcore.validation import check_str


@dataclass(frozen=True)
class Capability:
    """A capability's frozen definition (a RubricSpec-compatible record).

    capability_id: stable id (the rubric id judges see).
    definition: what must hold for the capability to be exercised well (the rubric criterion).
    family: organizational group (paper table A1); attribution and rewards work per capability.
    applicability: when the capability applies; otherwise the evaluator answers NA.
    evaluator_prompt: p_d, the capability-specific evaluator instructions.
    scored: the evaluator returns a score J_d in [0, 1] (default) rather than only pass/fail.
    """

    capability_id: str
    definition: str
    family: str = ""
    applicability: str = ""
    evaluator_prompt: str = ""
    scored: bool = True

    def __post_init__(self) -> None:
        check_str(self.capability_id, "capability_id")
        check_str(self.definition, "definition")
        for name in ("family", "applicability", "evaluator_prompt"):
            check_str(getattr(self, name), name, allow_empty=True)
        if not isinstance(self.scored, bool):
            raise ValueError(f"scored must be a bool, got {self.scored!r}")

    @property
    def rubric(self) -> RubricSpec:
        """The RubricSpec a `Judge` evaluates (family -> RubricSpec.capability)."""
        return RubricSpec(
            rubric_id=self.capability_id,
            criterion=self.definition,
            applicability=self.applicability,
            capability=self.family,
            evaluator_prompt=self.evaluator_prompt,
            scored=self.scored,
        )

    @classmethod
    def from_rubric(cls, spec: RubricSpec, family: str | None = None) -> Capability:
        """A candidate from a RubricSpec (e.g. a CapabilityProposer's output); family defaults to spec.capability."""
        if not isinstance(spec, RubricSpec):
            raise ValueError(f"spec must be a RubricSpec, got {type(spec).__name__}")
        return cls(
            capability_id=spec.rubric_id,
            definition=spec.criterion,
            family=spec.capability if family is None else family,
            applicability=spec.applicability,
            evaluator_prompt=spec.evaluator_prompt,
            scored=spec.scored,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "capability") -> Capability:
        return cls(**_exact_fields(cls, data, argument))


@dataclass(frozen=True)
class AdmissionReport:
    """Why a candidate was admitted or rejected, with the held-out metrics.

    Counts are over the held-out partition. A judgment is *valid* unless INVALID
    (or missing from the evaluator's report); it is *applicable* when PASS or FAIL.
    validity_rate = n_agree / n_valid, where a valid judgment agrees when its
    verdict equals the reference label (an NA on a case labelled PASS/FAIL, or a
    PASS/FAIL on a case labelled NA, disagrees: applicability is part of what an
    evaluator must get right, paper A.3). applicable_pass_rate = n_pass / n_applicable
    is what the collapse check reads. score_std is the spread of the applicable
    judgments' values (scores), a D.2 diagnostic; None with fewer than two.
    """

    capability_id: str
    admitted: bool
    reasons: tuple[str, ...]
    evaluator: str = ""
    dev_sources: tuple[str, ...] = ()
    heldout_sources: tuple[str, ...] = ()
    n_dev: int = 0
    n_heldout: int = 0
    n_valid: int = 0
    n_invalid: int = 0
    n_na: int = 0
    n_pass: int = 0
    n_fail: int = 0
    n_agree: int = 0
    n_reference_pass: int = 0
    n_reference_fail: int = 0
    n_reference_na: int = 0
    validity_rate: float | None = None
    applicable_pass_rate: float | None = None
    invalid_rate: float | None = None
    score_std: float | None = None
    min_validity: float = 0.8
    min_applicable: int = 10
    collapse_tolerance: float = 0.05
    max_invalid_rate: float = 0.2
    min_each_label: int = 1

    @property
    def n_applicable(self) -> int:
        return self.n_pass + self.n_fail

    @property
    def collapsed(self) -> bool:
        rate = self.applicable_pass_rate
        return rate is not None and (rate <= self.collapse_tolerance or rate >= 1.0 - self.collapse_tolerance)

    def to_dict(self) -> dict:
        data = asdict(self)
        for name in ("reasons", "dev_sources", "heldout_sources"):
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "admission") -> AdmissionReport:
        values = _exact_fields(cls, data, argument)
        for name in ("reasons", "dev_sources", "heldout_sources"):
            if name in values:
                if isinstance(values[name], (str, bytes)) or not isinstance(values[name], Sequence):
                    raise ValueError(f"{argument}.{name} must be a list of strings")
                values[name] = tuple(values[name])
        return cls(**values)


@dataclass(frozen=True)
class AdmittedCapability:
    """An immutable library entry: definition, evaluator id, admission report and their content hash.

    evaluator: the evaluator's identity (model / judge id) frozen with the definition.
    content_hash: sha256 over capability, evaluator and admission; checked on construction,
        so a tampered entry cannot be built (and a tampered file cannot be loaded).
    """

    capability: Capability
    evaluator: str
    admission: AdmissionReport
    content_hash: str

    def __post_init__(self) -> None:
        if not isinstance(self.capability, Capability):
            raise ValueError(f"capability must be a Capability, got {type(self.capability).__name__}")
        cid = self.capability.capability_id
        if not isinstance(self.admission, AdmissionReport):
            raise ValueError(f"capability {cid!r}: admission must be an AdmissionReport")
        if not self.admission.admitted or self.admission.capability_id != cid:
            raise ValueError(f"capability {cid!r}: admission report is not an admission of this capability")
        check_str(self.evaluator, f"capability {cid!r}: evaluator", allow_empty=True)
        expected = self.compute_hash(self.capability, self.evaluator, self.admission)
        if self.content_hash != expected:
            raise ValueError(
                f"capability {cid!r}: stored content hash {self.content_hash!r} does not match its content "
                f"(expected {expected!r}); admitted entries are frozen"
            )

    @property
    def capability_id(self) -> str:
        return self.capability.capability_id

    @property
    def family(self) -> str:
        return self.capability.family

    @property
    def rubric(self) -> RubricSpec:
        return self.capability.rubric

    @staticmethod
    def compute_hash(capability: Capability, evaluator: str, admission: AdmissionReport) -> str:
        return digest({"capability": capability.to_dict(), "evaluator": evaluator, "admission": admission.to_dict()})

    @classmethod
    def create(cls, capability: Capability, evaluator: str, admission: AdmissionReport) -> AdmittedCapability:
        return cls(capability, evaluator, admission, cls.compute_hash(capability, evaluator, admission))

    def to_dict(self) -> dict:
        return {
            "capability": self.capability.to_dict(),
            "evaluator": self.evaluator,
            "admission": self.admission.to_dict(),
            "content_hash": self.content_hash,
        }

    @classmethod
    def from_dict(cls, data: Mapping, argument: str = "entry") -> AdmittedCapability:
        if not isinstance(data, Mapping):
            raise ValueError(f"{argument} must be a mapping, got {type(data).__name__}")
        missing = {"capability", "evaluator", "admission", "content_hash"} - set(data)
        if missing:
            raise ValueError(f"{argument} lacks {sorted(missing)}")
        capability = Capability.from_dict(data["capability"], f"{argument}.capability")
        where = f"{argument} (capability {capability.capability_id!r})"
        admission = AdmissionReport.from_dict(data["admission"], f"{where}.admission")
        if not isinstance(data["content_hash"], str):
            raise ValueError(f"{where}.content_hash must be a string")
        return cls(capability, data["evaluator"], admission, data["content_hash"])


def _exact_fields(cls, data, argument: str) -> dict:
    if not isinstance(data, Mapping):
        raise ValueError(f"{argument} must be a mapping, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{argument} has unknown field(s) {sorted(unknown)}")
    return dict(data)
