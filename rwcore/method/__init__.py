"""`rwcore.AdaptiveMethod`: the one place where RewardWeaver's and Arise's pieces meet.

- `AdaptiveMethod`: sampler, rubric-skill pool, capability library and active set, and the routing
  of one step's verdicts, for any named variant (`AdaptiveMethod.variants()`).
- `Variant`, `VARIANTS`: each paper's full method and ablation rows, as four components.
- `MethodSettings`: every number it uses; `Providers`: what it calls out to (reflector,
  attributor, library, proposer, ...); `Scored`, `AdaptReport`: what `score` / `adapt` return.
- `ReflectionWindow`: Arise's evidence between pool updates (appendix B.3).

Modules: `variants` (the catalogue), `window` (B.3 evidence), `method` (the object).
"""

from rwcore.judged import JudgedBatch
from rwcore.method.method import AdaptiveMethod, AdaptReport, MethodSettings, Providers, Scored
from rwcore.method.variants import COMPONENTS, VARIANTS, Variant, differing_components, get_variant
from rwcore.method.window import ReflectionWindow

__all__ = [
    "COMPONENTS",
    "VARIANTS",
    "AdaptReport",
    "AdaptiveMethod",
    "JudgedBatch",
    "MethodSettings",
    "Providers",
    "ReflectionWindow",
    "Scored",
    "Variant",
    "differing_components",
    "get_variant",
]
