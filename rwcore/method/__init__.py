"""`rwcore.AdaptiveMethod`: the one place where RewardWeaver's and Arise's pieces meet.

- `AdaptiveMethod`: sampler, rubric-skill pool, capability library and active set, and the routing
  of one step's verdicts, for any named variant (`AdaptiveMethod.variants()`).
- `MethodLoop` (`StepPlan`, `StepResult`): the one order every trainer drives it in — plan, finish (judge,
  score, observe), the trainer's update, end_step (pool update, stage boundary on the updated policy).
- `Variant`, `VARIANTS`: each paper's full method and ablation rows, as four components (samplers and
  process rewards come from their registries: `rwcore.sampling`, `rwcore.rewardweaver.process_rewards`).
- `MethodSettings`: every number it uses, each declared once with its help and config key (`setting`);
  `inapplicable_settings(variant, settings)`: the config keys a variant cannot apply;
  `Providers`: what it calls out to (reflector, attributor, library, proposer, ...); `Scored`,
  `AdaptReport`: what `score` / `adapt` return.
- `ReflectionWindow`: Arise's evidence between pool updates (appendix B.3).

Modules: `variants` (the catalogue), `settings` (`MethodSettings`), `records` (`Providers`, `Scored`,
`AdaptReport`), `window` (B.3 evidence), `method` (the object), with `state` (its checkpoint state) and
`run_views` (what the run folder shows), `judging` (`judge_groups`, `safe_evaluate`), `loop` (the step).
"""

from rwcore.judged import JudgedBatch
from rwcore.method.judging import judge_groups, safe_evaluate
from rwcore.method.loop import MethodLoop, StepPlan, StepResult
from rwcore.method.method import AdaptiveMethod
from rwcore.method.records import AdaptReport, Providers, Scored
from rwcore.method.settings import CREDIT_SETTINGS, MethodSettings, inapplicable_settings, pin_settings, setting
from rwcore.method.variants import COMPONENTS, VARIANTS, Variant, differing_components, differing_pins, get_variant
from rwcore.method.window import ReflectionWindow

__all__ = [
    "COMPONENTS",
    "CREDIT_SETTINGS",
    "VARIANTS",
    "AdaptReport",
    "AdaptiveMethod",
    "JudgedBatch",
    "MethodLoop",
    "MethodSettings",
    "Providers",
    "ReflectionWindow",
    "Scored",
    "StepPlan",
    "StepResult",
    "Variant",
    "differing_components",
    "differing_pins",
    "get_variant",
    "inapplicable_settings",
    "judge_groups",
    "pin_settings",
    "safe_evaluate",
    "setting",
]
