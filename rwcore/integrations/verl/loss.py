"""The filtered dual-clip loss as a verl `PolicyLossFn` ("rwcore_filtered_dual_clip")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rwcore.kernels import filtered_dual_clip_loss
from rwcore.kernels.loss_settings import LOSS_DEFAULTS, LossSettings, loss_setting_names, resolve_loss_settings
from rwcore.kernels.rollout_correction import PREFIX, RolloutCorrection, correction_weights
from rwcore.settings import SettingError

from .config import LOSS_AGG_MODES, _get, _plain

# verl's seq-mean-token-mean divides each sequence's token sum by (count + 1e-8).
_SEQ_MEAN_EPS = 1e-8
_LOG_RATIO_CLAMP = 20.0  # verl's clamp of log_prob - old_log_prob (ours is the same: LOG_RATIO_BOUND)


# rwcore's loss settings that verl's actor config sets, and how; every other one is read under its own name from
# the actor config's policy_loss section (+actor_rollout_ref.actor.policy_loss.<name>=...)
VERL_KEYS = {
    "ratio_low": "ratio_low = max(0, 1 - clip_ratio_low)",
    "ratio_high": "ratio_high = 1 + clip_ratio_high",
    "clip_c": "clip_c = clip_ratio_c",
}
VERL_CLIP_RATIO = 0.2  # verl's default clip_ratio, which clip_ratio_low / clip_ratio_high default to


def loss_params_from_config(config) -> LossSettings:
    """verl's actor config -> the `LossSettings` of the filtered dual-clip loss.

    ratio_low = max(0, 1 - clip_ratio_low), ratio_high = 1 + clip_ratio_high, clip_c = clip_ratio_c,
    with verl's rules: clip_ratio_low / clip_ratio_high default to clip_ratio (0.2), clip_ratio_c to the
    declared clip_c (verl's default too). Any other declared loss setting comes from `policy_loss.<name>` (its
    declared default when absent). verl *clips* the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high]; rwcore
    *drops* tokens whose ratio leaves (ratio_low, ratio_high): Arise's filter (`LossSettings()`) is
    clip_ratio_low = 1 - ratio_low, clip_ratio_high = ratio_high - 1. ValueError naming verl's keys when the
    settings leave their declared ranges (an empty filter, a dual clip <= 1).
    """
    clip_ratio = _get(config, "clip_ratio", VERL_CLIP_RATIO)
    low = _get(config, "clip_ratio_low", clip_ratio)
    high = _get(config, "clip_ratio_high", clip_ratio)
    clip_c = _get(config, "clip_ratio_c", LOSS_DEFAULTS.clip_c)
    try:
        low, high, clip_c = float(low), float(high), float(clip_c)
    except (TypeError, ValueError):
        raise ValueError(
            f"verl actor config: clip_ratio_low={low!r}, clip_ratio_high={high!r}, "
            f"clip_ratio_c={clip_c!r} must be numbers"
        ) from None
    policy_loss = _plain(_get(config, "policy_loss", None))
    others = {
        name: _get(policy_loss, name)
        for name in loss_setting_names()
        if name not in VERL_KEYS and _get(policy_loss, name) is not None
    }
    # max(0, 1 - clip_ratio_low), a non-finite clip_ratio_low kept non-finite: refused below, naming it
    ratio_low = max(0.0, 1.0 - low) if math.isfinite(low) else math.nan
    try:
        return resolve_loss_settings(ratio_low=ratio_low, ratio_high=1.0 + high, clip_c=clip_c, **others)
    except SettingError as error:
        given = f"clip_ratio_low={low!r}, clip_ratio_high={high!r}, clip_ratio_c={clip_c!r}"
        mapping = "; ".join(VERL_KEYS.get(name, f"{name} = policy_loss.{name}") for name in error.names)
        raise ValueError(f"verl actor config ({given}): {error} ({mapping})") from None


def _global_batch_info(config) -> dict:
    """verl's `config.global_batch_info` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)."""
    info = _plain(_get(config, "global_batch_info", None)) or {}
    out = {
        "dp_size": info.get("dp_size", 1) if isinstance(info, Mapping) else 1,
        "batch_num_tokens": info.get("batch_num_tokens") if isinstance(info, Mapping) else None,
        "global_batch_size": info.get("global_batch_size") if isinstance(info, Mapping) else None,
        "loss_scale_factor": info.get("loss_scale_factor") if isinstance(info, Mapping) else None,
    }
    if out["loss_scale_factor"] is None:
        out["loss_scale_factor"] = _get(config, "loss_scale_factor", None)
    if out["dp_size"] is None:
        out["dp_size"] = 1
    return out


def _scalar(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32, device=device)


def aggregation(
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
):
    """verl's `agg_loss` as (per-sequence advantage scale [B] or None, denominator D, 0-dim tensor).

    rwcore's loss is sum(kept token terms) / D, and each token term min(-w A, c |A|) is positively
    homogeneous in A, so verl's per-sequence weights fold into the advantages:

        token-mean               D = batch_num_tokens / dp_size  (default: this call's response tokens)
        token-sum                D = 1 / dp_size
        seq-mean-token-sum       D = global_batch_size / dp_size (default: non-empty sequences here)
        seq-mean-token-mean      as seq-mean-token-sum, advantages of sequence b times 1 / (n_b + 1e-8)
        seq-mean-token-sum-norm  as seq-mean-token-sum, D times loss_scale_factor (default: T)

    exactly as verl 0.7.1-0.9.1 aggregate (including their ValueError when a global count is missing
    with dp_size > 1).
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, (int, np.integer)) or dp_size < 1:
        raise ValueError(f"global_batch_info['dp_size'] must be a positive int, got {dp_size!r}")
    device = response_mask.device
    mask = response_mask != 0
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = mask.sum()
        return None, _scalar(batch_num_tokens, device) / dp_size
    if loss_agg_mode == "token-sum":
        return None, torch.tensor(1.0 / dp_size, dtype=torch.float32, device=device)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        counts = mask.sum(dim=-1)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = (counts > 0).sum()
        denominator = _scalar(global_batch_size, device) / dp_size
        scale = None
        if loss_agg_mode == "seq-mean-token-mean":
            scale = 1.0 / (counts.to(torch.float32) + _SEQ_MEAN_EPS)
        elif loss_agg_mode == "seq-mean-token-sum-norm":
            factor = response_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
            denominator = denominator * _scalar(factor, device)
        return scale, denominator
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode!r}; verl's modes are {list(LOSS_AGG_MODES)}")


def bypass_correction(config) -> RolloutCorrection | None:
    """The rollout correction of verl's bypass mode, from `config.policy_loss.rollout_correction`, or None.

    verl's bypass mode (`algorithm.rollout_correction.bypass_mode=true`) passes the rollout log-probs as
    old_log_prob and reads the correction from the actor's `policy_loss.rollout_correction` (verl's
    `apply_bypass_mode` writes it there in the trainer process; the workers see it when the actor config sets
    it, e.g. `+actor_rollout_ref.actor.policy_loss.rollout_correction='${algorithm.rollout_correction}'`).
    None when that config is absent or its bypass_mode is false: in verl's decoupled mode the trainer has
    already computed the weights (`rollout_is_weights`) and the rejection (the response mask).

    Raises:
        ValueError: a correction rwcore cannot reproduce (rollout_is_batch_normalize=True, an unknown
            criterion, a bad threshold), naming the field.
    """
    policy_loss = _get(config, "policy_loss", None)
    settings = _get(policy_loss, "rollout_correction", None)
    if settings is None or not bool(_get(settings, "bypass_mode", False)):
        return None
    try:
        return RolloutCorrection.from_config(settings)
    except ValueError as error:
        raise ValueError(f"verl actor config policy_loss.rollout_correction (bypass mode): {error}") from None


def compute_policy_loss_rwcore(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Arise's filtered dual-clip loss as a verl policy loss (registered as "rwcore_filtered_dual_clip").

    Same signature, argument meaning and return convention as verl's `compute_policy_loss_vanilla`
    (verl/trainer/ppo/core_algos.py, verl 0.7.1-0.9.1); verl calls it with keywords.

    Semantics, with w = exp(clamp(log_prob - old_log_prob, -20, 20)) as in verl:
        rwcore: keep = response_mask & (1 - clip_ratio_low < w < 1 + clip_ratio_high)
                loss = agg(keep * rho * min(-w A, clip_ratio_c |A|))
        verl vanilla: loss = agg(rho * where(A < 0, min(max(-w A, -clip(w) A), clip_ratio_c |A|),
                                             max(-w A, -clip(w) A)))
    with rho the rollout-correction weight (1 without one). Inside the bounds the two are equal (the PPO clip
    is inactive there and both dual-clip negative advantages at clip_ratio_c |A|). Outside them verl clips
    the ratio -- the token keeps a constant, gradient-free contribution on one side and full gradient on the
    other -- while rwcore drops the token from the numerator (no loss, no gradient); it still counts in the
    denominator. Use wide bounds (Arise's filter, `LossSettings()`: clip_ratio_low = 1 - ratio_low,
    clip_ratio_high = ratio_high - 1).

    Rollout correction (verl's `algorithm.rollout_correction`), both of verl's forms:
        decoupled (bypass_mode=false): verl's trainer computes the weights from the proximal log-probs
            (old_log_prob) and the rollout's, passes them as `rollout_is_weights` and applies the rejection to
            `response_mask`; they go to `filtered_dual_clip_loss(..., rollout_is_weights=...)`, the loss is
            verl's vanilla with the same weights and mask (inside the bounds). verl logs its rollout_corr/*
            metrics itself there; this loss adds none.
        bypass (bypass_mode=true, `config.policy_loss.rollout_correction` with bypass_mode: see
            `bypass_correction`): old_log_prob is the rollout's; the correction goes to
            `filtered_dual_clip_loss(..., rollout_correction=RolloutCorrection.from_config(...))`, which computes
            the weights and rejection from the current log-probs as verl's `compute_policy_loss_bypass_mode`
            does. loss_type "ppo_clip": the rejection masks, the ratio against the rollout policy is the
            importance weight (verl's loss inside the bounds). loss_type "reinforce": the same gradient as
            verl's REINFORCE bypass, -A rho grad log pi / D per token; the loss VALUE is sum(-A rho) / D where
            verl's is sum(-A rho log pi) / D. The aggregation uses the response mask after the rejection, as
            verl's does, and `rollout_is_weights` is ignored, as by verl's bypass loss (the trainer computes
            none in bypass mode). To keep this loss in bypass mode rather than verl's "bypass_mode" loss, see
            `registration.install_bypass_mode_keeping`.

    Args:
        old_log_prob, log_prob, advantages, response_mask: [B, T] as verl passes them.
        loss_agg_mode: verl's aggregation; every mode of `LOSS_AGG_MODES` is reproduced exactly,
            with `config.global_batch_info` (dp_size, batch_num_tokens, global_batch_size,
            loss_scale_factor) as verl's `agg_loss` uses it -- see `aggregation`.
        config: verl's ActorConfig (or a DictConfig / dict / object with the same fields):
            clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, global_batch_info,
            policy_loss.rollout_correction and policy_loss.<name> for any other loss setting
            (`loss_params_from_config`). None uses verl's defaults (clip_ratio 0.2: the filter (0.8, 1.2)).
        rollout_is_weights: optional [B, T] non-negative rollout-correction weights (verl's decoupled mode);
            like verl, they multiply the per-token losses.

    Returns:
        (loss, metrics): metrics holds verl's keys -- "actor/pg_clipfrac" (here: the fraction of
        response tokens filtered out), "actor/ppo_kl" (masked mean of -log ratio, as verl),
        "actor/pg_clipfrac_lower" (fraction dual-clipped, verl's meaning) -- rwcore's statistics
        under "actor/rwcore/<name>", and in bypass mode the `rollout_corr/*` mismatch metrics of the current
        vs the rollout log-probs (verl's names, as its bypass loss returns them), all Python floats.

    Raises:
        ValueError: bad clip settings, an unknown loss_agg_mode, negative rollout_is_weights, or a bypass
            correction rwcore cannot reproduce (e.g. rollout_is_batch_normalize=True), naming the field.
    """
    params = loss_params_from_config(config)
    correction = bypass_correction(config)
    model = response_mask != 0
    effective = model
    if correction is not None and correction.rollout_rs:
        # verl's bypass loss aggregates over the response mask after its rejection
        B, T = model.shape
        with torch.no_grad():
            _, parts = correction_weights(
                (log_prob.detach().float() - old_log_prob.float()).reshape(-1),
                model.reshape(-1),
                correction,
                torch.arange(B, device=model.device).repeat_interleave(T),
                B,
            )
        effective = model & parts["keep"].reshape(B, T)
    scale, denominator = aggregation(effective, loss_agg_mode, **_global_batch_info(config))
    if correction is not None:
        # everything rejected: verl's 0 / 0; every term is 0 here, so any D gives the loss 0
        denominator = torch.where((denominator == 0) & ~effective.any(), torch.ones_like(denominator), denominator)
    adv = advantages
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand(log_prob.shape)
    if scale is not None:
        adv = adv.to(torch.float32) * scale.unsqueeze(-1)
    weights = None
    if correction is None and rollout_is_weights is not None:
        weights = rollout_is_weights.detach()
    loss, stats = filtered_dual_clip_loss(
        log_prob,
        old_log_prob,
        adv.detach(),
        response_mask,
        num_model_tokens=denominator,
        rollout_correction=correction,
        rollout_is_weights=weights,
        mismatch_metrics=correction is not None,
        **params.to_dict(),
    )
    mismatch = {k: v for k, v in stats.items() if k.startswith(PREFIX)}
    stats = {k: v for k, v in stats.items() if not k.startswith(PREFIX)}
    with torch.no_grad():
        mask = effective.to(torch.float32)
        log_ratio = (log_prob.detach().float() - old_log_prob.float()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        ppo_kl = (torch.where(effective, -log_ratio, 0.0) * mask).sum() / (mask.sum() + 1e-8)
        values = torch.stack(
            [
                stats["filtered_low_fraction"] + stats["filtered_high_fraction"],
                ppo_kl,
                stats["dual_clipped_fraction"],
                *stats.values(),
                *mismatch.values(),
            ]
        ).tolist()  # one host sync for all metrics
    names = [
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_clipfrac_lower",
        *(f"actor/rwcore/{k}" for k in stats),
        *mismatch,
    ]
    return loss, dict(zip(names, values))
