"""rwcore: adaptive rewards and task sampling for RL of LLM agents (RewardWeaver, Arise).

Public surface of this package:

- `EvidenceStore`: decayed Beta evidence per (task-type tag, rubric), C++ core.
- `CapabilitySampler`: Arise's capability-based adaptive task sampler.
- `UniformSampler`, `OutcomeSampler`: the ablations' baselines, same interface.
- `AdaptiveBatchSampler`: any of them as a `torch.utils.data` batch sampler.
- `Verdict`: PASS / FAIL / NA / INVALID.
- `RubricSkillPool` (with `Rubric`, `Skill`): Arise's evolving rubric-skill pool (eq. 4-8).
- `RewardWeaver`, `CapabilityLibrary`, `Capability`: RewardWeaver's validated capability library,
  failure attribution, budgeted active set and process reward (rwcore.rewardweaver has the rest).
- `length_regularize`, `compute_advantages`: Arise's advantages (eq. 15-17), vectorized over groups.
"""

from rwcore.advantages import compute_advantages, length_regularize
from rwcore.baselines import OutcomeSampler, UniformSampler
from rwcore.evidence import EvidenceStore
from rwcore.pool import PoolEvent, PoolUpdate, Rubric, RubricSkillPair, RubricSkillPool, Skill, SkillStatus
from rwcore.rewardweaver import (
    AdmissionConfig,
    Capability,
    CapabilityLibrary,
    LabelledCase,
    RewardWeaver,
    judgment_matrix,
    process_reward,
)
from rwcore.sampling import CapabilitySampler
from rwcore.tasks import DEFAULT_CAPABILITIES
from rwcore.verdict import Verdict

__version__ = "0.1.0"

__all__ = [
    "AdaptiveBatchSampler",
    "AdmissionConfig",
    "Capability",
    "CapabilityLibrary",
    "LabelledCase",
    "RewardWeaver",
    "judgment_matrix",
    "process_reward",
    "CapabilitySampler",
    "DEFAULT_CAPABILITIES",
    "EvidenceStore",
    "OutcomeSampler",
    "PoolEvent",
    "PoolUpdate",
    "Rubric",
    "RubricSkillPair",
    "RubricSkillPool",
    "Skill",
    "SkillStatus",
    "UniformSampler",
    "Verdict",
    "compute_advantages",
    "length_regularize",
]


def __getattr__(name: str):
    # Imported on first use so `import rwcore` does not pay for importing torch.
    if name == "AdaptiveBatchSampler":
        from rwcore.data import AdaptiveBatchSampler

        return AdaptiveBatchSampler
    raise AttributeError(f"module 'rwcore' has no attribute {name!r}")
