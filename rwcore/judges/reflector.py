"""`OpenAIReflector`: Arise's reflection model and RewardWeaver's attribution / expansion model.

One object implements `RubricReflector` (propose_rubric_skills, refine_skill), `Attributor`
(attribute), `CapabilityProposer` (propose_capabilities), `EvaluatorReviser` (revise_evaluator)
and `InstanceRubricWriter` (instance_rubrics), plus Arise's initial trajectory analysis
(`analyze_trajectories`), over the same chat client as `OpenAIJudge` (limits, time-outs,
retries, key handling: `rwcore.judges.client`). Prompts are the files in `prompts/`.

Every request follows the judge's rules: instructions and operator data (rubrics, skills, the
library) in the system message; trajectories, and diagnostics derived from them, only as
untrusted JSON data in the user message; answers accepted only with the request's random id.

Output contract: a reply is either fully valid or not used. A reply that cannot be read, or any of
whose items breaks the schema (missing field, unknown capability category, duplicate or existing
id, support citing unknown trajectories), is asked again up to `max_reasks` times; then the
method raises `ReflectionError` — it never returns half-parsed output, and no other exception
escapes a request or the reading of an answer (anything unexpected is re-asked, then becomes a
`ReflectionError`, which `AdaptiveMethod` logs and skips). Two documented
exceptions, where items are independent: `attribute` returns the records of the candidates that
were answered validly and omits (with a warning) the ones that were not; `analyze_trajectories`
leaves out (with a warning) trajectories whose analysis failed. Both raise `ReflectionError` when
nothing at all could be obtained. Proposals beyond `max_new` are dropped (the first ones are kept),
and `propose_capabilities` drops proposals supported by fewer than `min_support` trajectories.
"""

from __future__ import annotations

from rwcore.judges.arise_reflection import AriseReflection
from rwcore.judges.reflection import ReflectionError
from rwcore.judges.rewardweaver_reflection import RewardWeaverReflection

__all__ = ["OpenAIReflector", "ReflectionError"]


class OpenAIReflector(AriseReflection, RewardWeaverReflection):
    """Reflection over an OpenAI-compatible chat-completions server (see the module docstring).

    Client options as `OpenAIJudge` (timeout defaults to 120 s and max_tokens to 4096: these
    answers are longer). Also:
    capabilities: the allowed capability categories of Arise rubrics (table 3 by default).
    max_reasks: follow-up requests after an unusable answer.
    require_request_id: accept only answer objects carrying the request's random id.
    max_transcript_chars: per-trajectory transcript budget (long turns are cut in the middle).
    max_trajectories_per_request: trajectories shown in one skill-refinement or capability-
        proposal request (the first ones given).
    candidates_per_request: candidate capabilities attributed in one request.
    min_support: trajectories a proposed capability must cite (capped at the number given).
    structured_outputs: "auto" | "always" | "never", as the judge's: each role's request carries its answer's
        JSON schema (rwcore.judges.structured), with the request id pinned.
    max_field_chars: the longest free-text field those schemas allow (criteria, skills, evidence) [400].
    """

    def __repr__(self) -> str:
        o = self.client.options
        return f"OpenAIReflector(model={o.model!r}, base_url={o.base_url!r}, api_key_env={o.api_key_env!r})"
