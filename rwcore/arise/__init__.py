"""Arise: rubric-skill co-evolution, read beside the paper.

| paper | module |
|---|---|
| §3.2.1, eq. 4-8, appendices B.3 and F: the evolving rubric-skill pool, its lifecycle and history | `pool` |
| §3.2.2, appendix B.5: the capability-based adaptive task sampler | `sampler` |
| the sampler's decayed Beta evidence per (task-type tag, rubric), C++ core | `evidence` |
| eq. 15-17, appendix B.4: length regularization and rubric-mixed group advantages | `advantages` |
| eq. 18-19: the importance-ratio filter and dual clip of the loss | `rwcore.kernels` (fused, any trainer) |
| the reflection model's prompts and parsing (rubric-skill proposals, refinement) | `rwcore.judges.arise_reflection` |

How the pieces meet RewardWeaver's in one step: `rwcore.method.AdaptiveMethod`.
"""

_LAZY = {
    "CapabilitySampler": "rwcore.arise.sampler",
    "EvidenceStore": "rwcore.arise.evidence",
    "compute_advantages": "rwcore.arise.advantages",
    "length_regularize": "rwcore.arise.advantages",
    "RubricSkillPool": "rwcore.arise.pool",
    "Rubric": "rwcore.arise.pool",
    "Skill": "rwcore.arise.pool",
    "SkillStatus": "rwcore.arise.pool",
    "RubricSkillPair": "rwcore.arise.pool",
    "PoolEvent": "rwcore.arise.pool",
    "PoolUpdate": "rwcore.arise.pool",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
