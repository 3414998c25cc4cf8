"""Arise's rubric-skill pool (§3.2.1, eq. 4-8; appendices B.3 and F).

- `RubricSkillPool`: the pool, its evidence windows, lifecycle updates, event history and state.
- `Rubric`, `Skill`, `SkillStatus`, `RubricSkillPair`: typed snapshots of its pairs.
- `PoolEvent`, `PoolUpdate`, `EVENT_KINDS`: the lifecycle history (appendix F, figure 4a).
- `render_system_prompt`: the prompt format the pool injects active skills with.

Modules: `records` (types), `window` (evidence windows), `lifecycle` (the per-pair
decision and the contents an update leaves), `state` (the stored pairs and the state for
resume), `prompt` (rendering), `pool` (the pool itself).
"""

from rwcore.arise.pool.lifecycle import transition
from rwcore.arise.pool.pool import RubricSkillPool
from rwcore.arise.pool.prompt import (
    SKILLS_BEGIN,
    SKILLS_END,
    SKILLS_PREAMBLE,
    render_skills_section,
    render_system_prompt,
)
from rwcore.arise.pool.records import EVENT_KINDS, PoolEvent, PoolUpdate, Rubric, RubricSkillPair, Skill, SkillStatus

__all__ = [
    "EVENT_KINDS",
    "PoolEvent",
    "PoolUpdate",
    "Rubric",
    "RubricSkillPair",
    "RubricSkillPool",
    "SKILLS_BEGIN",
    "SKILLS_END",
    "SKILLS_PREAMBLE",
    "Skill",
    "SkillStatus",
    "render_skills_section",
    "render_system_prompt",
    "transition",
]
