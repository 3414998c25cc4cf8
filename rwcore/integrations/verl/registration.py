"""Registers the loss and the estimator with verl's registries (and the legacy trainer's non_tensor_batch
forwarding)."""

from __future__ import annotations

import functools
import importlib
import inspect
from enum import Enum
from typing import Any

from .advantage import apply_arise_advantage, compute_arise_advantage
from .config import ADV_ESTIMATOR_NAME, POLICY_LOSS_NAME, _get, _require
from .loss import compute_policy_loss_rwcore


def _estimator_name(adv_estimator) -> Any:
    return adv_estimator.value if isinstance(adv_estimator, Enum) else adv_estimator


def _forwarding(original):
    """verl's compute_advantage, with "rwcore_arise" routed to apply_arise_advantage and "rwcore_method" to the
    registered AdaptiveMethodDriver, both with the batch's non_tensor_batch."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        from .method import METHOD_ESTIMATOR_NAME, compute_method_advantage

        if _estimator_name(adv_estimator) not in (METHOD_ESTIMATOR_NAME, ADV_ESTIMATOR_NAME):
            return original(data, adv_estimator, *args, **kwargs)
        bound = signature.bind(data, adv_estimator, *args, **kwargs)
        config = bound.arguments.get("config")
        # verl's own flag, as an argument (verl's trainers also leave it in config=algorithm, which is read too)
        norm = bool(bound.arguments.get("norm_adv_by_std_in_grpo", True))
        if _estimator_name(adv_estimator) == METHOD_ESTIMATOR_NAME:
            if "response_mask" not in data.batch.keys():
                data.batch["response_mask"] = data.batch["attention_mask"][:, -data.batch["responses"].size(1) :]
            advantages, returns = compute_method_advantage(
                data.batch["token_level_rewards"],
                data.batch["response_mask"],
                index=data.non_tensor_batch.get("uid"),
                config=config,
                non_tensor_batch=data.non_tensor_batch,
                norm_adv_by_std_in_grpo=norm,
            )
            data.batch["advantages"], data.batch["returns"] = advantages, returns
            return data
        data = apply_arise_advantage(data, config=config, norm_adv_by_std_in_grpo=norm)
        if compute_advantage.rwcore_after_arise is not None:  # e.g. RwcoreTaskRunner's curriculum sampler
            compute_advantage.rwcore_after_arise(data)
        return data

    compute_advantage.__rwcore_forwarding__ = True
    compute_advantage.rwcore_after_arise = None  # set by set_after_arise: the state lives on what verl calls
    return compute_advantage


def set_after_arise(hook) -> None:
    """`hook(data)` runs after every "rwcore_arise" step of the forwarded `compute_advantage` (None: nothing)."""
    for module_name in _FORWARDED_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        forwarded = getattr(module, "compute_advantage", None)
        if getattr(forwarded, "__rwcore_forwarding__", False):
            forwarded.rwcore_after_arise = hook


_FORWARDED_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.utils")


def install_advantage_forwarding() -> list[str]:
    """Makes verl's `compute_advantage` pass `non_tensor_batch` to "rwcore_arise"; returns the patched modules.

    Wraps `compute_advantage` in verl.trainer.ppo.ray_trainer (and verl.trainer.ppo.v1.utils, which
    imports it by name, where it exists); every other estimator goes to verl's function unchanged.
    Idempotent.
    """
    _require("verl.trainer.ppo.ray_trainer")
    patched = []
    for module_name in _FORWARDED_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, "compute_advantage", None)
        if original is None or getattr(original, "__rwcore_forwarding__", False):
            continue
        module.compute_advantage = _forwarding(original)
        patched.append(module_name)
    return patched


_BYPASS_MODULE = "verl.trainer.ppo.rollout_corr_helper"


def _keeping_rwcore_loss(original):
    """verl's `apply_bypass_mode`, leaving loss_mode "rwcore_filtered_dual_clip" in place of "bypass_mode"."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def apply_bypass_mode(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        policy_loss = bound.arguments.get("policy_loss_config")
        ours = _get(policy_loss, "loss_mode", None) == POLICY_LOSS_NAME
        if ours:  # refuse what rwcore's loss cannot reproduce here, in the trainer, before any step
            from rwcore.kernels.rollout_correction import RolloutCorrection

            try:
                RolloutCorrection.from_config(bound.arguments.get("rollout_corr_config"))
            except ValueError as error:
                raise ValueError(f"algorithm.rollout_correction (bypass mode, rwcore's loss): {error}") from None
        result = original(*args, **kwargs)
        if ours:
            from omegaconf import OmegaConf, open_dict

            if OmegaConf.is_config(policy_loss):
                with open_dict(policy_loss):
                    policy_loss["loss_mode"] = POLICY_LOSS_NAME
            else:
                policy_loss["loss_mode"] = POLICY_LOSS_NAME
        return result

    apply_bypass_mode.__rwcore_keeps_loss__ = True
    return apply_bypass_mode


def install_bypass_mode_keeping() -> bool:
    """Makes verl's `apply_bypass_mode` keep rwcore's loss; True if it patched (False: already, or no such verl).

    verl's bypass mode (`algorithm.rollout_correction.bypass_mode=true`) calls `apply_bypass_mode` in the
    trainer process: old_log_probs = rollout_log_probs, `policy_loss.rollout_correction` = the correction, and
    `policy_loss.loss_mode` = "bypass_mode" (verl's own loss), whatever loss was configured. Wrapped, a policy
    loss config whose loss_mode is "rwcore_filtered_dual_clip" keeps it (every other loss_mode is switched as
    by verl), and a correction rwcore's loss cannot reproduce is refused there, naming the field. verl's
    trainers import the function from verl.trainer.ppo.rollout_corr_helper when they call it, so replacing the
    module attribute reaches them. Idempotent.

    The switch only happens in the trainer process: verl 0.9.1's actor workers got their config when they
    started and never see it (a known verl bug), and its V1 trainer does not call `apply_bypass_mode` at all.
    What the workers' loss sees is the actor config, so give it the correction there as well:
    `+actor_rollout_ref.actor.policy_loss.rollout_correction='${algorithm.rollout_correction}'` (with
    loss_mode=rwcore_filtered_dual_clip; verl resolves the interpolation before it starts the workers).
    """
    try:
        helper = importlib.import_module(_BYPASS_MODULE)
    except ImportError:
        return False
    original = getattr(helper, "apply_bypass_mode", None)
    if original is None or getattr(original, "__rwcore_keeps_loss__", False):
        return False
    helper.apply_bypass_mode = _keeping_rwcore_loss(original)
    return True


def register(*, forward_non_tensor_batch: bool = True) -> None:
    """Registers "rwcore_filtered_dual_clip" (policy loss) and "rwcore_arise" (advantage estimator) with verl.

    Through verl's own `register_policy_loss` and `register_adv_est`; idempotent (re-registering this
    module's functions, e.g. after a reload, replaces them). It also calls `install_bypass_mode_keeping()`
    (verl's bypass mode keeps rwcore's loss when it is the configured one), and with
    `forward_non_tensor_batch` `install_advantage_forwarding()` (that imports verl's trainer module). Call it in every
    process that looks them up: the trainer process (estimator) and the actor workers (loss) --
    verl's plugin discovery (the `verl.plugins` entry point) does it in every process that imports verl.

    Raises:
        ImportError: verl is not installed (the message says `pip install verl`).
    """
    core_algos = _require("verl.trainer.ppo.core_algos")
    core_algos.register_policy_loss(POLICY_LOSS_NAME)(compute_policy_loss_rwcore)
    try:
        core_algos.register_adv_est(ADV_ESTIMATOR_NAME)(compute_arise_advantage)
    except ValueError:
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(ADV_ESTIMATOR_NAME)
        if (
            getattr(existing, "__qualname__", None) != compute_arise_advantage.__qualname__
            or getattr(existing, "__module__", None) != compute_arise_advantage.__module__
        ):
            raise
        core_algos.ADV_ESTIMATOR_REGISTRY[ADV_ESTIMATOR_NAME] = compute_arise_advantage
    install_bypass_mode_keeping()
    if forward_non_tensor_batch:
        install_advantage_forwarding()
