"""Judges and reflection models: verdicts on rubrics, and the models that write and refine them.

- `RuleJudge`: rubrics as Python callables (programmatic checks, tests).
- `OpenAIJudge`: rubric verdicts from any OpenAI-compatible chat-completions server.
- `OpenAIReflector`: Arise's reflection model (trajectory analysis, rubric–skill generation, skill
  refinement) and RewardWeaver's failure attribution and capability proposal, same server kind.
- `ClientOptions`, `ChatError`, `MissingAPIKeyError`, `ReflectionError`, `JudgmentCache`,
  `SlidingWindowLimiter`: the machinery they share.

All of them follow the protocols in `rwcore.types`. Trajectory text reaches a model only as
delimited, JSON-encoded, untrusted data; a failed or unreadable judgment is `Verdict.INVALID`.
The `openai` package is imported on first use of the OpenAI-backed classes.
"""

from rwcore.judges.rule import RuleJudge

__all__ = [
    "ChatError",
    "ClientOptions",
    "JudgmentCache",
    "MissingAPIKeyError",
    "OpenAIJudge",
    "OpenAIReflector",
    "ReflectionError",
    "RuleJudge",
    "SlidingWindowLimiter",
]

_LAZY = {
    "ChatError": "rwcore.judges.client",
    "ClientOptions": "rwcore.judges.client",
    "MissingAPIKeyError": "rwcore.judges.client",
    "JudgmentCache": "rwcore.judges.cache",
    "OpenAIJudge": "rwcore.judges.openai_judge",
    "OpenAIReflector": "rwcore.judges.reflector",
    "ReflectionError": "rwcore.judges.reflector",
    "SlidingWindowLimiter": "rwcore.judges.ratelimit",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rwcore.judges' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
