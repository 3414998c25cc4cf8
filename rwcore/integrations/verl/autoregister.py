"""Importing this module registers rwcore's loss and advantage estimators with verl (`register()`).

For the places where verl imports a module by name and calls nothing: its Ray workers and trainer process
(`actor_rollout_ref.model.external_lib=rwcore.integrations.verl.autoregister`, `VERL_USE_EXTERNAL_MODULES`).
With verl >= 0.9 its plugin entry point (`rwcore.integrations.verl.plugin`) already does this.
"""

import sys

from rwcore.integrations.verl.registration import register

register(forward_non_tensor_batch="verl.trainer.ppo.ray_trainer" in sys.modules)
