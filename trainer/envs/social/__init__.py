"""The social-interaction environment ("social"): two-party scenarios in the spirit of SOTOPIA.

Scenarios
---------
trainer/envs/social/scenarios.json holds 30 two-party scenarios written for this project
(env.options.scenarios: another JSON file, or a folder of them). Each gives a setting, and for both
sides a name, a background, a private goal and a secret; the agent sees only its own side (and its
partner's name), the partner only its own. Every field is required: a file with a missing field is
refused at start with an error naming the file, the scenario and the field.

    {"format": "rwcore-social-scenarios/1", "scenarios": [{
      "id", "task_type", "difficulty" (1-3), "split" ("train" | "eval"), "setting",
      "agent": {"name", "background", "goal", "secret"}, "partner": {"name", "background", "goal", "secret"},
      "goal_keywords": [...],    # words of the agent's goal (the scripted fallbacks read them)
      "secret_keywords": [...],  # words that would reveal the agent's secret (may be empty)
      "partner_lines": [...],    # the scripted partner's stalling lines
      "partner_agrees": "..."    # the scripted partner's line when it agrees
    }]}

Task types (Task.tags: the type and "difficulty<d>"), 4 train + 2 eval scenarios each:
negotiation (price, terms), persuasion (change the partner's mind), cooperation (divide work, plan
together), conflict (settle a grievance), information (learn something the partner knows).

The episode: the agent speaks first; the partner answers each message; the partner may leave; at most
max_turns (6) agent messages. The agent ends it by writing "goodbye".

Partner (env.options.partner)
-----------------------------
- "scripted" (default; the fallback that needs no server): stalls with its lines and agrees (then
  leaves) once the agent has used enough distinct goal keywords (1, 2 or 3 by difficulty).
- "llm": a fixed LLM partner (rwcore.trainer.envs.llm_partner.OpenAIPartner) role-playing the partner's
  profile: partner_model, partner_base_url, partner_api_key_env (the NAME of the variable holding the
  key), partner_max_tokens (256), partner_timeout (60 s), partner_max_concurrency (8),
  partner_reply_format ("json" structured outputs | "text"), partner_temperature (0.7), partner_max_reply_chars (600;
  with "json"
  keep it well inside partner_max_tokens, or long replies are cut off and count as partner failures).
  All episodes of a turn are answered concurrently.
- "self": self-play; the policy being trained writes the partner's turns without gradients.
A partner request that times out or answers garbage ends THAT episode as a partner failure (never
charged to the agent; see rwcore.trainer.envs.base).

Outcome: a SOTOPIA-EVAL-style rubric (env.options.evaluator)
-------------------------------------------------------------
Seven dimensions, scored over the whole conversation (SOTOPIA's ranges):
goal completion 0..10, believability 0..10, knowledge 0..10, secret -10..0, relationship -5..5,
social rules -10..0, financial and material benefits -5..5.
Reward = goal / 10; success = goal >= 7 (the agent achieved its private goal). All seven scores go
to Outcome.details (trajectory.metadata["outcome_details"]).
- "llm": an LLM outcome evaluator, DISTINCT from the process-reward judge: its own settings
  evaluator_model, evaluator_base_url, evaluator_api_key_env, evaluator_timeout (120 s),
  evaluator_max_tokens (512), evaluator_temperature (0); unset ones default to the judge's server (judge.kind=openai).
  Structured
  outputs (a JSON schema with each dimension's allowed integers and the request's random id); the
  conversation goes to it as delimited untrusted data (rwcore.judges.templates.untrusted_block), so
  nothing the agent or the partner says can change its instructions. A failed or garbage evaluation is
  a partner failure for that episode (Outcome.failure), never a zero charged to the agent.
- "heuristic" (the fallback without a server): goal 10 when the scripted partner agreed, else partial
  credit for the goal keywords used (at most 6); believability from the share of distinct words;
  knowledge 7 when the agent asked something, else 3; secret -10 when a secret keyword was said;
  relationship from polite minus rude words; social rules -5 per rude or threatening word (down to -10);
  financial +5 for an agreement in a negotiation. A keyword heuristic, not a judgment: use it to run
  without servers, not to measure social skill.
- "auto" (default): "llm" when an evaluator model is known (its own or the judge's), else "heuristic".

Rubric families (process rewards)
---------------------------------
`capability_candidates()` / `rules()`: six capabilities with keyword checks - pursues_goal
(Understanding), asks_partner (Understanding), proposes_terms (Execution), stays_polite (Execution),
keeps_secret (Verification), no_repetition (Efficiency). There are no labelled cases: with
RewardWeaver they are admitted without the acceptance test (logged). With judge.kind=openai the LLM
judge scores them from their criteria; with judge.kind=rule the keyword checks do.

Modules
-------
scenarios      the scenario file format, its loader and checks (the built-in scenarios: scenarios.json)
environment    SocialEnv: the simulator with its scripted, LLM or self-play partner
evaluator      the SOTOPIA-EVAL outcome evaluators: the LLM one and the keyword heuristic
rubrics        the keyword rubrics, and the reflector and attributor without an LLM
keywords       the word lists those read
"""

from rwcore.trainer.envs.base import register
from rwcore.trainer.envs.social.environment import ScriptedPartner, SocialEnv
from rwcore.trainer.envs.social.evaluator import DIMENSIONS, LLMEvaluator, heuristic_scores
from rwcore.trainer.envs.social.scenarios import DEFAULT_SCENARIOS, load_scenarios

register("social", SocialEnv)

__all__ = [
    "DEFAULT_SCENARIOS",
    "DIMENSIONS",
    "LLMEvaluator",
    "ScriptedPartner",
    "SocialEnv",
    "heuristic_scores",
    "load_scenarios",
]
