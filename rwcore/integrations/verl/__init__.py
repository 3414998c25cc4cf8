"""rwcore inside verl: the filtered dual-clip loss, Arise's advantages, the capability sampler, the method.

With rwcore installed, verl loads it by itself: rwcore declares the entry point `verl.plugins: rwcore`
(verl's plugin discovery, run by `import verl` in every process: trainer, task runner and workers),
whose `plugin.load()` registers

    actor_rollout_ref.actor.policy_loss.loss_mode=rwcore_filtered_dual_clip   (policy loss)
    algorithm.adv_estimator=rwcore_arise                                     (advantage estimator)
    trainer.v1.trainer_mode=rwcore_sync                                      (V1 trainer: verdicts + sampler)

verl 0.8 loads no plugins and has no V1 trainer (verl>=0.8.0,<0.10 is tested): there the trainer is
`python -m rwcore.integrations.verl.legacy` (verl's legacy trainer with `RwcoreTaskRunner`, which calls
`register()` in the task runner) and the workers register through
`actor_rollout_ref.model.external_lib=rwcore.integrations.verl.autoregister`; `rwcore_sync` is refused naming
trainer.v1.trainer_mode. docs/integrations.md has the exact, tested configuration. One module per job:

- `loss`: `compute_policy_loss_rwcore`, verl's `PolicyLossFn` `(old_log_prob, log_prob, advantages,
  response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)`, delegating to
  `rwcore.kernels.filtered_dual_clip_loss`; `loss_params_from_config` reads (and validates) the clip keys.
  verl's rollout correction (`algorithm.rollout_correction`) in both of its forms: decoupled, the trainer's
  `rollout_is_weights` and rejected mask go to the kernel; bypass (`bypass_mode=true`), `bypass_correction`
  reads the actor's `policy_loss.rollout_correction` and the kernel computes the weights, the rejection and
  verl's `rollout_corr/*` metrics from the current and rollout log-probs.
- `verdicts`: rubric verdicts as a reward function returns them in its extra info -> Verdict codes.
- `advantage`: `compute_arise_advantage`, an advantage estimator with the signature of verl's estimators;
  `apply_arise_advantage(data, config)` on a `DataProto`; `verdicts_in_scope` hands it the verdicts
  where verl's `compute_advantage` passes no `non_tensor_batch` (the V1 trainer).
- `registration`: `register()` (verl's `register_policy_loss` / `register_adv_est`), with
  `install_bypass_mode_keeping()` (verl's `apply_bypass_mode` keeps loss_mode=rwcore_filtered_dual_clip
  instead of switching to its own "bypass_mode" loss) and, for the legacy trainer,
  `install_advantage_forwarding()`. In bypass mode give the workers the correction as well:
  `+actor_rollout_ref.actor.policy_loss.rollout_correction='${algorithm.rollout_correction}'` (verl switches
  the loss only in the trainer process's config, which its workers never see).
- `sampler`: `RwcoreCurriculumSampler`, a torchdata-stateful sampler wrapping `rwcore.CapabilitySampler`.
- `trainer_v1`: `trainer_class()`, verl 0.9's V1 `PPOTrainerSync` subclass registered as "rwcore_sync":
  it gives the estimator the verdicts, puts the curriculum sampler in verl's loader and feeds it;
  `check_v1_config(config)`, the configuration checks it runs first (also exported here).
- `legacy`: `task_runner_class()`, verl's legacy `TaskRunner` (verl 0.8's trainer, 0.9's
  `trainer.use_v1=false`) that registers rwcore, builds the curriculum sampler from `data.rwcore_sampler`
  through verl's `create_rl_sampler` call and feeds it after each `rwcore_arise` step; `main()`.
- `method`: `AdaptiveMethodDriver`, verl's estimator ("rwcore_method") + loader sampler driven by one
  `rwcore.AdaptiveMethod`.
- `plugin`: what the `verl.plugins` entry point loads.

Importing this package never imports verl and registers nothing: registration is always an explicit call
(`register()`, `AdaptiveMethodDriver.register()`), made for you by verl's plugin entry point and by the
module `rwcore.integrations.verl.autoregister`, whose import registers (name it where verl imports a module
and calls nothing: `external_lib`, `VERL_USE_EXTERNAL_MODULES`). `register()` and the V1 trainer import
verl (ImportError saying `pip install verl` without it).
"""

from __future__ import annotations

from .advantage import _arise_settings, _AriseSettings, apply_arise_advantage, compute_arise_advantage  # noqa: F401
from .config import (  # noqa: F401
    ADV_ESTIMATOR_NAME,
    LOSS_AGG_MODES,
    OUTCOME_KEY,
    POLICY_LOSS_NAME,
    TAGS_KEY,
    TASK_ID_KEY,
    TESTED_VERL_VERSIONS,
    UID_KEY,
    VERDICTS_KEY,
)
from .loss import aggregation, bypass_correction, compute_policy_loss_rwcore, loss_params_from_config
from .registration import _forwarding, install_advantage_forwarding, install_bypass_mode_keeping, register  # noqa: F401
from .trainer_v1 import check_v1_config
from .verdicts import _group_ids, _verdict_matrix, verdict_table, verdicts_from_batch  # noqa: F401

__all__ = [
    "ADV_ESTIMATOR_NAME",
    "AdaptiveMethodDriver",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_NAME",
    "RwcoreCurriculumSampler",
    "aggregation",
    "apply_arise_advantage",
    "bypass_correction",
    "check_v1_config",
    "compute_arise_advantage",
    "compute_policy_loss_rwcore",
    "install_advantage_forwarding",
    "install_bypass_mode_keeping",
    "loss_params_from_config",
    "register",
    "verdict_table",
    "verdicts_from_batch",
]


def __getattr__(name: str):
    if name == "AdaptiveMethodDriver":
        from .method import AdaptiveMethodDriver

        return AdaptiveMethodDriver
    if name == "RwcoreCurriculumSampler":
        from .sampler import sampler_class

        cls = sampler_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
