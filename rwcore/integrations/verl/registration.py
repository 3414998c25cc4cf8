"""Registers the loss and the estimator with verl's registries (and the legacy trainer's non_tensor_batch
forwarding)."""

from __future__ import annotations

import functools
import importlib
import inspect
from enum import Enum
from typing import Any

from .advantage import apply_arise_advantage, compute_arise_advantage
from .config import ADV_ESTIMATOR_NAME, POLICY_LOSS_NAME, _require
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

        if _estimator_name(adv_estimator) == METHOD_ESTIMATOR_NAME:
            if "response_mask" not in data.batch.keys():
                data.batch["response_mask"] = data.batch["attention_mask"][:, -data.batch["responses"].size(1) :]
            advantages, returns = compute_method_advantage(
                data.batch["token_level_rewards"],
                data.batch["response_mask"],
                index=data.non_tensor_batch.get("uid"),
                non_tensor_batch=data.non_tensor_batch,
            )
            data.batch["advantages"], data.batch["returns"] = advantages, returns
            return data
        if _estimator_name(adv_estimator) != ADV_ESTIMATOR_NAME:
            return original(data, adv_estimator, *args, **kwargs)
        bound = signature.bind(data, adv_estimator, *args, **kwargs)
        data = apply_arise_advantage(data, config=bound.arguments.get("config"))
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


def register(*, forward_non_tensor_batch: bool = True) -> None:
    """Registers "rwcore_filtered_dual_clip" (policy loss) and "rwcore_arise" (advantage estimator) with verl.

    Through verl's own `register_policy_loss` and `register_adv_est`; idempotent (re-registering this
    module's functions, e.g. after a reload, replaces them). With `forward_non_tensor_batch` it also
    calls `install_advantage_forwarding()` (that imports verl's trainer module). Call it in every
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
    if forward_non_tensor_batch:
        install_advantage_forwarding()
