"""rwcore: adaptive rewards and task sampling for RL of LLM agents (RewardWeaver, Arise).

Public surface of this package:

- `AdaptiveMethod`: the two papers' pieces composed into one method, with every ablation row
  as a named variant (`AdaptiveMethod.variants()`); `JudgedBatch`: one step's verdicts `[N, R]`.
- `EvidenceStore`: decayed Beta evidence per (task-type tag, rubric), C++ core.
- `CapabilitySampler`: Arise's capability-based adaptive task sampler.
- `UniformSampler`, `OutcomeSampler`: the ablations' baselines, same interface.
- `AdaptiveBatchSampler`: any of them as a `torch.utils.data` batch sampler.
- `Verdict`: PASS / FAIL / NA / INVALID.
- `RubricSkillPool` (with `Rubric`, `Skill`): Arise's evolving rubric-skill pool (eq. 4-8).
- `RewardWeaver`, `CapabilityLibrary`, `Capability`: RewardWeaver's validated capability library,
  failure attribution, budgeted active set and process reward (rwcore.rewardweaver has the rest).
- `length_regularize`, `compute_advantages`: Arise's advantages (eq. 15-17), vectorized over groups.
- `Trajectory`, `Turn`, `RubricSpec`, `RubricJudgment`, `JudgeReport`: the records a judge, a reward function
  or an environment of your own exchanges with the method (rwcore.types, with the provider protocols).
"""

from rwcore._checkout import move_root_last as _move_root_last

_move_root_last()  # run from a checkout, its kernels/ and trainer/ folders must not hide installed packages

# Every public name is imported on first use (PEP 562), so `import rwcore.kernels` loads neither
# the C++ extension nor the algorithms, and `import rwcore` does not pay for importing torch.
_LAZY = {
    "AdaptiveBatchSampler": "rwcore.sampling.batch",
    "AdaptiveMethod": "rwcore.method",
    "MethodLoop": "rwcore.method",
    "JudgedBatch": "rwcore.judged",
    "MethodSettings": "rwcore.method",
    "Variant": "rwcore.method",
    "AdmissionConfig": "rwcore.rewardweaver",
    "Capability": "rwcore.rewardweaver",
    "CapabilityLibrary": "rwcore.rewardweaver",
    "LabelledCase": "rwcore.rewardweaver",
    "RewardWeaver": "rwcore.rewardweaver",
    "judgment_matrix": "rwcore.rewardweaver",
    "process_reward": "rwcore.rewardweaver",
    "CapabilitySampler": "rwcore.arise.sampler",
    "DEFAULT_CAPABILITIES": "rwcore.tasks",
    "EvidenceStore": "rwcore.arise.evidence",
    "OutcomeSampler": "rwcore.sampling.baselines",
    "UniformSampler": "rwcore.sampling.baselines",
    "PoolEvent": "rwcore.arise.pool",
    "PoolUpdate": "rwcore.arise.pool",
    "Rubric": "rwcore.arise.pool",
    "RubricSkillPair": "rwcore.arise.pool",
    "RubricSkillPool": "rwcore.arise.pool",
    "Skill": "rwcore.arise.pool",
    "SkillStatus": "rwcore.arise.pool",
    "Verdict": "rwcore.verdict",
    "JudgeReport": "rwcore.types",
    "RubricJudgment": "rwcore.types",
    "RubricSpec": "rwcore.types",
    "Trajectory": "rwcore.types",
    "Turn": "rwcore.types",
    "compute_advantages": "rwcore.arise.advantages",
    "length_regularize": "rwcore.arise.advantages",
}

__version__ = "0.1.0"

__all__ = [
    "AdaptiveMethod",
    "MethodLoop",
    "JudgedBatch",
    "MethodSettings",
    "Variant",
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
    "JudgeReport",
    "RubricJudgment",
    "RubricSpec",
    "Trajectory",
    "Turn",
    "compute_advantages",
    "length_regularize",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rwcore' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
