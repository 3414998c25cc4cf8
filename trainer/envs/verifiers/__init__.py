"""`env.name=verifiers`: a verifiers v1 environment (PrimeIntellect's library, https://github.com/PrimeIntellect-ai/verifiers)
as an `rw train` environment. Needs the verifiers package (tested with 0.4.0), installed by
`RWCORE_EXTRAS=...,verifiers bash scripts/setup.sh`; without it, building the environment raises ImportError
naming the extra. Reference: docs/environments.md (section verifiers).
"""

from rwcore.trainer.envs.base import register
from rwcore.trainer.envs.verifiers.adapter import VerifiersEnv
from rwcore.trainer.envs.verifiers.package import INSTALL_HINT, TESTED_VERSION

register("verifiers", VerifiersEnv)

__all__ = ["INSTALL_HINT", "TESTED_VERSION", "VerifiersEnv"]
