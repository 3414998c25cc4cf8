"""The checks that span keys, run after every key has been read: the variant's keys (`resolve_variant`), the order
the loss and method settings declare (ratio_low < ratio_high, eta_low < eta_high), verl's threshold syntax, the
negotiation environment's kind weights, and the other cross-key rules (`validate`)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from rwcore.kernels.loss_settings import LossSettings
from rwcore.method import MethodSettings
from rwcore.method.variants import VARIANTS, get_variant
from rwcore.settings import config_keys
from rwcore.trainer.config.coercion import key_label, show_value
from rwcore.trainer.config.schema import (
    Config,
    EnvConfig,
    LossConfig,
    config_value,
    declared_settings,
    rollout_correction,
)

__all__ = ["resolve_variant", "validate"]


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# config key -> (what a variant sets it to, from the variant)
def _variant_settings(variant) -> dict[str, Any]:
    strategy = variant.process_reward if variant.uses_library else None
    return {
        "rewardweaver.selection": strategy,
        "sampler.kind": variant.sampler,
        "pool.skills": ("on" if variant.skills else "off") if variant.arise_rubrics is not None else None,
    }


def resolve_variant(cfg: Config) -> Config:
    """Checks the keys that only repeat what train.method sets (sampler.kind, pool.skills,
    rewardweaver.selection; no longer config keys): one set to another value is refused, naming it and the
    variant that has that value; one set to the same value is ignored with a DeprecationWarning."""
    import warnings

    from rwcore._deprecated import REMOVED_IN

    variant = get_variant(cfg.train.method, "config key 'train.method':")
    for key, wanted in _variant_settings(variant).items():
        section, name = key.split(".")
        given = getattr(cfg, section).__dict__.get("_variant_keys", {}).get(name)
        if given is not None and given == wanted:
            warnings.warn(
                f"config key {key!r} is set by train.method and is no longer a config key; leave it out "
                f"(rwcore {REMOVED_IN} refuses it)",
                DeprecationWarning,
                stacklevel=3,
            )
        if given is not None and given != wanted:
            matches = [
                v.name
                for v in VARIANTS.values()
                if _variant_settings(v)[key] == given
                and all(_variant_settings(v)[k] == w for k, w in _variant_settings(variant).items() if k != key)
            ]
            hint = f"; train.method={matches[0]} is that variant" if matches else ""
            what = f"sets it to {wanted!r}" if wanted is not None else "does not use it"
            raise ValueError(f"config key {key!r}: train.method={variant.name} {what}, got {given!r}{hint}")
    if variant.pinned:  # the settings the variant fixes, written into the config so config.yaml shows them
        from rwcore.method import pin_settings

        # ValueError naming the key set otherwise
        pinned = pin_settings(variant, declared_settings(MethodSettings, cfg))
        keys = config_keys(MethodSettings)
        for name in variant.pinned:
            section, key = keys[name].split(".")
            setattr(getattr(cfg, section), key, getattr(pinned, name))
    if variant.arise_rubrics == "frozen" and not cfg.pool.frozen_from:
        raise ValueError(
            "config key 'pool.frozen_from': train.method=arise_frozen_rubrics needs the run folder of a "
            "previous Arise run (its pool_rubrics.json holds the rubrics to freeze)"
        )
    if variant.arise_rubrics != "frozen" and cfg.pool.frozen_from:
        raise ValueError(
            f"config key 'pool.frozen_from': only train.method=arise_frozen_rubrics uses it "
            f"(train.method={variant.name})"
        )
    return cfg


# A number in verl's threshold syntax: digits with an optional point and exponent. float() takes more (digit
# separators, so that 0.5_2_0 read as the band 0.5 to 20; spaces; digits of other scripts; inf and nan).
_VERL_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _check_verl_thresholds(loss: LossConfig) -> None:
    """loss.rollout_is_threshold is a number or 'lower_upper', loss.rollout_rs_threshold the same per criterion,
    comma-separated, each number plain decimal (`_VERL_NUMBER`); the ranges are the kernel's to check."""
    for key, text, per_criterion in (
        ("loss.rollout_is_threshold", loss.rollout_is_threshold, False),
        ("loss.rollout_rs_threshold", loss.rollout_rs_threshold, True),
    ):
        if not text.strip():
            continue
        parts = [part.strip() for part in text.split(",")] if per_criterion else [text.strip()]
        for part in parts:
            if per_criterion and not part:
                continue  # verl skips an empty entry ("0.5_2.0,")
            pieces = part.split("_")
            if len(pieces) > 2 or not all(_VERL_NUMBER.fullmatch(piece) for piece in pieces):
                each = ", comma-separated per criterion" if per_criterion else ""
                raise ValueError(
                    f"config key {key!r}: {show_value(part)} is not in verl's syntax: a number (2.0, 5e-1) or "
                    f"'lower_upper' (0.5_2.0){each}, each number plain decimal digits, without digit separators "
                    "or spaces"
                )


def _check_kind_weights(env: EnvConfig) -> None:
    """env.options.kind_weights of the negotiation environment: null (the default mix) or a mapping of task kind to a
    non-negative finite weight with a positive sum. Checked here, as the options are read, so that 5 or [1, 2] is a
    line naming the key and not a TypeError where the environment is built."""
    weights = env.options.get("kind_weights") if isinstance(env.options, Mapping) else None
    if env.name != "negotiation" or weights is None:
        return
    from rwcore.trainer.envs.negotiation import KINDS

    must = f"must be a mapping of task kind ({', '.join(KINDS)}) to a non-negative finite weight, e.g. {{standard: 2}}"
    if not isinstance(weights, Mapping):
        raise ValueError(f"config key 'env.options.kind_weights': {must}; got {show_value(weights)}")
    for kind, weight in weights.items():
        key = f"env.options.kind_weights.{key_label(kind)}"
        if kind not in KINDS:
            raise ValueError(f"config key {key!r}: not a task kind; env.options.kind_weights {must}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"config key {key!r}: must be a non-negative finite weight, got {show_value(weight)}")
    if not any(weights.values()):
        raise ValueError(
            "config key 'env.options.kind_weights': at least one weight must be positive, "
            f"got {show_value(dict(weights))}"
        )


def _check_declared_order(cfg: Config, declaration: type) -> None:
    """Every setting of `declaration` declared `above` another (`rwcore.settings.setting`) exceeds it, or a
    ValueError names both config keys."""
    keys = config_keys(declaration)
    for f in dataclasses.fields(declaration):
        low = f.metadata.get("above")
        if low is None or low not in keys or f.name not in keys:
            continue
        low_value, high_value = config_value(cfg, keys[low]), config_value(cfg, keys[f.name])
        if not low_value < high_value:
            raise ValueError(
                f"config keys {keys[low]!r} and {keys[f.name]!r}: need {low} < {f.name}, "
                f"got {low_value} and {high_value}"
            )


_TRACKER_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate(cfg: Config) -> Config:
    """Cross-field checks."""
    if len(set(cfg.train.loggers)) < len(cfg.train.loggers):
        raise ValueError(f"config key 'train.loggers': names a logger twice, got {show_value(cfg.train.loggers)}")
    if not _TRACKER_PROJECT.fullmatch(cfg.train.tracker_project):
        raise ValueError(
            "config key 'train.tracker_project': 1 to 128 letters, digits, '.', '_' or '-' (starting with a letter "
            f"or digit), which every tracker accepts as a project name; got {show_value(cfg.train.tracker_project)}"
        )
    if not _ENV_NAME.fullmatch(cfg.judge.api_key_env):
        # Do not echo the value: it may be a key pasted by mistake.
        raise ValueError(
            "config key 'judge.api_key_env': must be the NAME of an environment variable "
            "(letters, digits, underscores, e.g. OPENAI_API_KEY), never the key itself"
        )
    _check_declared_order(cfg, LossSettings)
    if cfg.loss.entropy_coef_min > cfg.loss.entropy_coef_max:
        raise ValueError(
            f"config keys 'loss.entropy_coef_min' and 'loss.entropy_coef_max': need entropy_coef_min <= "
            f"entropy_coef_max, got {cfg.loss.entropy_coef_min} and {cfg.loss.entropy_coef_max}"
        )
    _check_verl_thresholds(cfg.loss)
    _check_kind_weights(cfg.env)
    try:
        rollout_correction(cfg)
    except ValueError as error:
        raise ValueError(
            f"config keys 'loss.rollout_correction', 'loss.rollout_is_threshold', 'loss.rollout_rs_threshold': {error}"
        ) from None
    _check_declared_order(cfg, MethodSettings)
    if cfg.rollout.max_lag and cfg.rollout.behavior_logprobs == "trainer":
        raise ValueError(
            "config keys 'rollout.max_lag' and 'rollout.behavior_logprobs': asynchronous rollouts need the "
            "engine's behavior log-probs (the training model no longer holds the version that sampled them); "
            "use rollout.behavior_logprobs=engine"
        )
    if cfg.model.name is not None and cfg.model.init is not None:
        raise ValueError(
            f"config key 'model.init': {cfg.model.init!r} applies to the built-in model only; model.name="
            f"{cfg.model.name!r} starts from its own weights (leave model.init unset)"
        )
    targets = cfg.model.lora.target_modules
    if isinstance(targets, list) and (not targets or not all(targets) or len(set(targets)) < len(targets)):
        raise ValueError(
            f"config key 'model.lora.target_modules': a list of distinct, non-empty module names or all-linear, "
            f"got {show_value(targets)}"
        )
    if cfg.model.name is None and cfg.model.lora.rank > cfg.model.hidden_size:
        raise ValueError(
            f"config key 'model.lora.rank': at most model.hidden_size ({cfg.model.hidden_size}) on the built-in "
            f"model (an update B A has no more independent directions than its smaller side), got {cfg.model.lora.rank}"
        )
    if cfg.model.name is None and cfg.model.hidden_size % cfg.model.num_heads:
        raise ValueError(
            f"config keys 'model.hidden_size' and 'model.num_heads': num_heads must divide "
            f"hidden_size, got {cfg.model.hidden_size} and {cfg.model.num_heads}"
        )
    return resolve_variant(cfg)
