"""Environments for `rw train`: the protocol, a registry, and the built-in environments.

Every environment is a package `rwcore.trainer.envs.<name>` (the folder `trainer/envs/<name>/`), one idea per
module (its language, tasks, simulator, rubrics, ...), whose `__init__` registers it with `register(name, factory)`
and whose docstring states its rules: `env.name=<name>` imports the package on first use. The reading prior's
cache key hashes the code of the module that defines the environment's class and of the package's modules that
one imports at module level, so what the policy's prompt, language and observations are built from lives there,
and what the environment hands out on request (rubrics, reflector, labelled cases) in modules it imports inside
the methods that hand them out. The embedded default, `negotiation`, is imported (and so registered) here.
"""

from rwcore.trainer.envs.base import (
    Environment,
    Episode,
    Outcome,
    Rule,
    Task,
    failure_of,
    make,
    outcome_all,
    partner_failed,
    provided,
    register,
    step_all,
)
from rwcore.trainer.envs.negotiation import HardNegotiationEnv, NegotiationEnv

__all__ = [
    "Environment",
    "Episode",
    "HardNegotiationEnv",
    "NegotiationEnv",
    "Outcome",
    "Rule",
    "Task",
    "failure_of",
    "make",
    "outcome_all",
    "partner_failed",
    "provided",
    "register",
    "step_all",
]
