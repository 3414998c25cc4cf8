"""Environments for `rw train`: the protocol, where a name is looked up, and the built-in environments.

An environment need not live here: `env.name` also names a factory of any importable package as
`module:factory`, or an installed distribution's entry point of the group `rwcore.environments`
(rwcore.trainer.envs.registry; docs/environments.md and examples/my_env_package/ show both). The protocol a factory
returns is rwcore.trainer.envs.base's; what a run's environment was built from is recorded in the run folder and
checked on resume (rwcore.trainer.envs.provenance).

Each built-in environment is a package `rwcore.trainer.envs.<name>` (the folder `trainer/envs/<name>/`), one idea
per module (its language, tasks, simulator, rubrics, ...), whose `__init__` registers it with
`register(name, factory)` and whose docstring states its rules: `env.name=<name>` imports the package on first use.
The reading prior's cache key hashes the code of the module that defines the environment's class and of the
package's modules that one imports at module level, so what the policy's prompt, language and observations are
built from lives there, and what the environment hands out on request (rubrics, reflector, labelled cases) in
modules it imports inside the methods that hand them out. The embedded default, `negotiation`, is imported (and so
registered) here.
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
from rwcore.trainer.envs.registry import ENTRY_POINT_GROUP, builtin_names, check_outside, installed, resolve

__all__ = [
    "ENTRY_POINT_GROUP",
    "Environment",
    "Episode",
    "HardNegotiationEnv",
    "NegotiationEnv",
    "Outcome",
    "Rule",
    "Task",
    "builtin_names",
    "check_outside",
    "failure_of",
    "installed",
    "make",
    "outcome_all",
    "partner_failed",
    "provided",
    "register",
    "resolve",
    "step_all",
]
