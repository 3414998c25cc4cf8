"""Active skills rendered into the policy's system prompt (Arise §3.2.1: only active skills are injected).

The format is fixed, so that the same pool always gives the same prompt:

    <base prompt, trailing whitespace removed>
    <blank line>
    <skills>
    Guidance from earlier attempts at similar tasks. Apply a skill whenever its situation arises.

    [skill 1]
    <text of the first active skill, stripped>

    [skill 2]
    <text of the second active skill, stripped>
    </skills>

Skills appear in pool order (the order their pairs were created). With no
active skill the base prompt is returned unchanged; with an empty base prompt
the section stands alone. Rubric ids and criteria are never shown to the policy.
"""

from __future__ import annotations

from collections.abc import Sequence

SKILLS_BEGIN = "<skills>"
SKILLS_END = "</skills>"
SKILLS_PREAMBLE = "Guidance from earlier attempts at similar tasks. Apply a skill whenever its situation arises."


def render_skills_section(skills: Sequence[str]) -> str:
    """The delimited section listing `skills` ("" when there are none)."""
    if isinstance(skills, str) or not all(isinstance(text, str) for text in skills):
        raise ValueError("skills must be a sequence of strings")
    if not skills:
        return ""
    blocks = "\n\n".join(f"[skill {number}]\n{text.strip()}" for number, text in enumerate(skills, 1))
    return f"{SKILLS_BEGIN}\n{SKILLS_PREAMBLE}\n\n{blocks}\n{SKILLS_END}"


def render_system_prompt(base_prompt: str, skills: Sequence[str]) -> str:
    """`base_prompt` followed by the skills section (see the module docstring for the exact format)."""
    if not isinstance(base_prompt, str):
        raise ValueError(f"base_prompt must be a string, got {type(base_prompt).__name__}")
    section = render_skills_section(skills)
    if not section:
        return base_prompt
    base = base_prompt.rstrip()
    return f"{base}\n\n{section}" if base else section
