"""rwcore's filtered dual-clip loss as a drop-in for OpenRLHF's `PolicyLoss`, vLLM-mismatch correction included.

    from rwcore.integrations.openrlhf import RwcorePolicyLoss

    loss_fn = RwcorePolicyLoss.arise()    # Arise's loss: LossSettings' defaults (or ratio_low=..., clip_c=...)
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = loss_fn(
        action_log_probs, old_action_log_probs, advantages, action_mask=action_mask, **loss_batch_info)

    # or in place of OpenRLHF's class, before the actor is built (in the actor's Ray process):
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    ppo_actor.PolicyLoss = RwcorePolicyLoss   # constructed with --actor.eps_clip_low_high / --actor.dual_clip
                                              # and --algo.advantage.is_correction_*

`RwcorePolicyLoss` is an `nn.Module` whose constructor takes `openrlhf.models.loss.PolicyLoss`'s
keyword arguments and whose `forward` has `PolicyLoss.forward`'s signature and return tuple
(OpenRLHF 0.11.2, openrlhf/models/loss.py; tests/rwcore/integrations/test_integration_openrlhf.py and
tests/rwcore/integrations/test_rollout_correction_openrlhf.py compare the two with OpenRLHF's real class). It delegates
to `rwcore.kernels.filtered_dual_clip_loss`; nothing here imports OpenRLHF.

PPO mapping: ratio_low = max(0, 1 - clip_eps_low), ratio_high = 1 + clip_eps_high, clip_c = dual_clip.
OpenRLHF *clips* the ratio to [1 - clip_eps_low, 1 + clip_eps_high]; rwcore *drops* tokens whose
ratio leaves (ratio_low, ratio_high) (no loss, no gradient; they still count in the denominator),
and always dual-clips negative advantages at clip_c |A| (so `dual_clip=None` is refused). Inside
the bounds both give -w A, capped at clip_c |A| for A < 0. The defaults are Arise's, those declared in
`rwcore.kernels.LossSettings`; a loss setting OpenRLHF has no key for is an attribute of the module at its declared
default, and `RwcorePolicyLoss.arise(...)` takes every one by its rwcore name.

vLLM-mismatch correction (`is_correction_level` "token" / "seq"): every combination OpenRLHF accepts,
with OpenRLHF's arithmetic. With lr = old_log_probs - rollout_log_probs (the training model's log-prob
before the update vs vLLM's) and (low, high) = `is_correction_threshold`:

    gating "ratio":     token: s_t = exp(lr_t)            seq: s_b = exp(masked_mean_b(lr))  (no eps)
    gating "binary_kl": p = exp(rollout), q = exp(old), both clamped into [1e-6, 1 - 1e-6]:
                        s_t = p log(p / q) + (1 - p) log((1 - p) / (1 - q)), seq: its masked mean
    gating "tv":        s_t = |p - q|, seq: its masked mean
    mode "clip" (token level, ratio gating only; TIS):  c_t = clamp(s_t, low, high)
    mode "mask" (ICEPOP at token level; seq-mask-tis at sequence level; the divergence trust regions):
                        c_t = exp(lr_t) if low <= s <= high else 0   (survivors keep their untruncated
                        per-token IS weight)

The weight c_t multiplies each token's filtered dual-clip term (`rollout_is_weights` of the fused loss,
computed here from the [B, T] log-probs: O(tokens), no vocabulary), the PPO ratio is anchored at
`old_log_probs` (`proximal_logprobs`, the decoupled form) and `rollout_log_probs` is the behaviour
policy. `vllm_kl` and `is_filter_ratio` are OpenRLHF's: masked mean of rollout - old, and the fraction
of units (tokens, or sequences at "seq" level) outside the band. A precomputed weight rather than a
`rwcore.kernels.RolloutCorrection`: OpenRLHF's gate has no +1e-8 in its mean and no +-20 clamp of the
log-ratio (a seq-mask survivor keeps exp(30) for lr = 30), and its binary_kl / tv gates have no
RolloutCorrection counterpart; the weights here are OpenRLHF's, computed in fp32. One deviation: the
survivors' weight exp(lr) is computed from lr capped at +-`IS_LOG_RATIO_CAP` (80), where OpenRLHF's
overflows to inf in fp32 (lr > 88.7) and its loss becomes inf or NaN. `last_stats` then also holds the
fused loss's `rollout_corr/*` train-inference mismatch metrics (old vs rollout log-probs).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rwcore.kernels import filtered_dual_clip_loss
from rwcore.kernels.loss_settings import LOSS_DEFAULTS, loss_setting_names, resolve_loss_settings
from rwcore.settings import SettingError

__all__ = ["RwcorePolicyLoss", "openrlhf_is_correction"]

TESTED_OPENRLHF_VERSION = "0.11.2"
_SEQ_MEAN_EPS = 1e-8  # OpenRLHF's aggregate_loss divides a sequence's token sum by (count + 1e-8)
IS_LEVELS = ("off", "token", "seq")
IS_MODES = ("mask", "clip")
IS_GATINGS = ("ratio", "binary_kl", "tv")
_PROB_CLAMP = 1e-6  # OpenRLHF clamps both probabilities into [1e-6, 1 - 1e-6] for binary_kl / tv
IS_LOG_RATIO_CAP = 80.0  # exp(80) ~ 5.5e34 is finite in fp32; OpenRLHF's exp(lr) overflows beyond lr ~ 88.7
# rwcore's loss settings that OpenRLHF's PolicyLoss sets, and how (the PPO mapping of the module docstring)
OPENRLHF_KEYS = {
    "ratio_low": "ratio_low = max(0, 1 - clip_eps_low)",
    "ratio_high": "ratio_high = 1 + clip_eps_high",
    "clip_c": "clip_c = dual_clip",
}


def check_is_correction(level, mode, gating, threshold) -> tuple[float, float]:
    """OpenRLHF's PolicyLoss checks of the is_correction_* arguments (same conditions, ValueError naming
    them), plus: the threshold is two numbers (low, high). Returns (low, high) (unused when level is off)."""
    if level not in IS_LEVELS:
        raise ValueError(f"is_correction_level must be one of {IS_LEVELS}, got {level!r}")
    if mode not in IS_MODES:
        raise ValueError(f"is_correction_mode must be one of {IS_MODES}, got {mode!r}")
    if gating not in IS_GATINGS:
        raise ValueError(f"is_correction_gating must be one of {IS_GATINGS}, got {gating!r}")
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise ValueError(
            "is_correction_mode='clip' requires is_correction_level='token' and is_correction_gating='ratio' "
            f"(got level={level!r}, gating={gating!r}), as in OpenRLHF"
        )
    if level == "off":
        return (math.nan, math.nan)
    try:
        low, high = (float(v) for v in threshold)
    except (TypeError, ValueError):
        raise ValueError(
            f"is_correction_threshold must be two numbers (low, high), got {threshold!r} "
            "(OpenRLHF's CLI turns a single HIGH into (0.0, HIGH))"
        ) from None
    if math.isnan(low) or math.isnan(high):
        raise ValueError(f"is_correction_threshold must not be NaN, got {threshold!r}")
    if gating != "ratio" and low > 0:
        raise ValueError(
            f"is_correction_gating={gating!r} takes an upper bound only (a single delta): "
            f"is_correction_threshold=(0.0, delta), got {threshold!r}"
        )
    return low, high


@torch.no_grad()
def openrlhf_is_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    mode: str,
    gating: str,
    low: float,
    high: float,
):
    """OpenRLHF's vLLM-mismatch correction (PolicyLoss.forward, openrlhf 0.11.2) from [B, T] log-probs.

    Args:
        old_log_probs: [B, T] the training model's log-probs before this update (proximal).
        rollout_log_probs: [B, T] vLLM's (behaviour).
        mask: [B, T] bool action mask.

    Returns:
        (weights [B, T] fp32, 0 off the mask; is_filter_ratio 0-dim; vllm_kl 0-dim), all detached fp32.
    """
    m = mask.to(torch.float32)
    old, rollout = old_log_probs.detach().float(), rollout_log_probs.detach().float()
    lr = old - rollout  # log(pi_train / pi_rollout)
    seq_level = level == "seq"
    if gating == "ratio":
        stat = (lr * m).sum(-1) / m.sum(-1) if seq_level else lr  # OpenRLHF's masked_mean: no eps
        stat = stat.unsqueeze(-1).exp() if seq_level else stat.exp()
    else:
        p = rollout.exp().clamp(_PROB_CLAMP, 1 - _PROB_CLAMP)
        q = old.exp().clamp(_PROB_CLAMP, 1 - _PROB_CLAMP)
        if gating == "binary_kl":
            stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
        else:
            stat = (p - q).abs()
        if seq_level:
            stat = ((stat * m).sum(-1) / m.sum(-1)).unsqueeze(-1)
    if mode == "clip":
        coef = stat.clamp(min=low, max=high)
        filtered = (stat < low) | (stat > high)
    else:
        keep = (stat >= low) & (stat <= high)
        coef = torch.where(keep, lr.clamp(-IS_LOG_RATIO_CAP, IS_LOG_RATIO_CAP).exp(), 0.0)
        filtered = ~keep
    weights = torch.where(mask, coef.expand_as(lr), 0.0).contiguous()
    if seq_level:
        is_filter_ratio = filtered.float().mean()
    else:
        is_filter_ratio = (filtered.float() * m).sum() / m.sum()
    vllm_kl = ((rollout - old) * m).sum() / m.sum()
    return weights, is_filter_ratio, vllm_kl


class RwcorePolicyLoss(nn.Module):
    """`openrlhf.models.loss.PolicyLoss`-compatible module computing Arise's filtered dual-clip loss.

    Args (PolicyLoss's, with Arise's defaults: `rwcore.kernels.LossSettings` mapped as in the module docstring):
        clip_eps_low, clip_eps_high: the filter is (max(0, 1 - clip_eps_low), 1 + clip_eps_high).
        dual_clip: clip_c, > 1 (required: rwcore's loss always dual-clips).
        token_level_loss: True: token mean (OpenRLHF's "token-mean"); False: mean over sequences of
            each sequence's token mean.
        policy_loss_type: only "ppo" (GSPO's sequence ratio is not this loss).
        is_correction_level: "off", "token" or "seq": OpenRLHF's vLLM-mismatch correction (module
            docstring); "token"/"seq" need `rollout_log_probs` in `forward`.
        is_correction_mode: "mask" or "clip" (token level with ratio gating only, as in OpenRLHF).
        is_correction_gating: "ratio", "binary_kl" or "tv" (the divergences take (0.0, delta)).
        is_correction_threshold: (low, high) on the gated statistic.
        backend: rwcore kernel backend ("auto", "torch", "triton").

    Every loss setting (`LossSettings`) is an attribute of its rwcore name (ratio_low, ratio_high, clip_c, ...),
    which `forward` passes to the kernel. After each call `last_stats` holds rwcore's statistics (kept_fraction,
    filtered_low_fraction, filtered_high_fraction, dual_clipped_fraction, mean_ratio, and the `rollout_corr/*`
    mismatch metrics) as detached 0-dim tensors.
    """

    def __init__(
        self,
        clip_eps_low: float = 1.0 - LOSS_DEFAULTS.ratio_low,
        clip_eps_high: float = LOSS_DEFAULTS.ratio_high - 1.0,
        dual_clip: float = LOSS_DEFAULTS.clip_c,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold: list = (0.5, 5.0),  # OpenRLHF's own default: its correction's band, not the filter
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if policy_loss_type != "ppo":
            raise ValueError(
                f"RwcorePolicyLoss implements the token-level ratio loss (policy_loss_type='ppo'), "
                f"got {policy_loss_type!r}"
            )
        if dual_clip is None:
            raise ValueError(
                f"rwcore's loss always dual-clips: pass dual_clip > 1 (Arise uses {LOSS_DEFAULTS.clip_c}; OpenRLHF: "
                f"--actor.dual_clip {LOSS_DEFAULTS.clip_c:g})"
            )
        self.is_low, self.is_high = check_is_correction(
            is_correction_level, is_correction_mode, is_correction_gating, is_correction_threshold
        )
        self.clip_eps_low = float(clip_eps_low)
        self.clip_eps_high = float(clip_eps_high)
        self.dual_clip = float(dual_clip)
        self.token_level_loss = bool(token_level_loss)
        self.policy_loss_type = policy_loss_type
        self.is_correction_level = is_correction_level
        self.is_correction_mode = is_correction_mode
        self.is_correction_gating = is_correction_gating
        self.is_correction_threshold = is_correction_threshold
        self.backend = backend
        self.last_stats: dict = {}
        # The loss settings, checked now (ValueError naming OpenRLHF's keys) rather than at the first forward.
        values = dict(
            ratio_low=max(0.0, 1.0 - self.clip_eps_low), ratio_high=1.0 + self.clip_eps_high, clip_c=self.dual_clip
        )
        try:
            self._set_loss_settings(resolve_loss_settings(**values))
        except SettingError as error:
            mapping = "; ".join(OPENRLHF_KEYS[name] for name in error.names if name in OPENRLHF_KEYS)
            raise ValueError(f"{error} ({mapping})") from None

    def _set_loss_settings(self, settings) -> None:
        for name, value in settings.to_dict().items():
            setattr(self, name, value)

    @classmethod
    def arise(
        cls,
        ratio_low: float = LOSS_DEFAULTS.ratio_low,
        ratio_high: float = LOSS_DEFAULTS.ratio_high,
        clip_c: float = LOSS_DEFAULTS.clip_c,
        token_level_loss: bool = True,
        backend: str = "auto",
        **options,
    ) -> RwcorePolicyLoss:
        """The module from rwcore's own loss settings (the filter bounds, the dual-clip constant and any other
        `LossSettings` field, by its name; defaults and ranges are LossSettings'); the is_correction_* keywords
        as in the constructor."""
        names = loss_setting_names()
        declared = {k: v for k, v in options.items() if k in names}
        settings = resolve_loss_settings(ratio_low=ratio_low, ratio_high=ratio_high, clip_c=clip_c, **declared)
        module = cls(
            clip_eps_low=1.0 - settings.ratio_low,
            clip_eps_high=settings.ratio_high - 1.0,
            dual_clip=settings.clip_c,
            token_level_loss=token_level_loss,
            backend=backend,
            **{k: v for k, v in options.items() if k not in names},
        )
        module._set_loss_settings(settings)  # exact, no 1 - (1 - x) round-off
        return module

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | None = None,
        global_batch_size: float | None = None,
    ) -> tuple:
        """(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio), as OpenRLHF's PolicyLoss.forward.

        Aggregation is OpenRLHF's `aggregate_loss`: token level, sum / batch_num_tokens * dp_size
        (masked mean when batch_num_tokens is None); sequence level, sum of per-sequence token means
        / global_batch_size * dp_size (mean over non-empty sequences when None). `clip_ratio` is the
        fraction of action tokens the filter dropped (OpenRLHF: the fraction PPO-clipped), `ppo_kl`
        the masked mean of old - new log-prob (as OpenRLHF). With is_correction_level "off",
        `vllm_kl` and `is_filter_ratio` are None and `rollout_log_probs` is unused; otherwise they are
        OpenRLHF's (module docstring) and `rollout_log_probs` is required.
        """
        mask = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask != 0
        device = log_probs.device
        correction = {}
        vllm_kl = is_filter_ratio = None
        behavior = old_log_probs
        if self.is_correction_level != "off":
            if rollout_log_probs is None:
                raise ValueError(
                    f"is_correction_level={self.is_correction_level!r} needs rollout_log_probs (vLLM's log-probs "
                    "of the sampled tokens, [B, T]); got None. Generate with logprobs, or use is_correction_level='off'"
                )
            if rollout_log_probs.shape != log_probs.shape:
                raise ValueError(
                    f"rollout_log_probs has shape {tuple(rollout_log_probs.shape)}, expected log_probs' "
                    f"{tuple(log_probs.shape)}"
                )
            weights, is_filter_ratio, vllm_kl = openrlhf_is_correction(
                old_log_probs,
                rollout_log_probs,
                mask,
                self.is_correction_level,
                self.is_correction_mode,
                self.is_correction_gating,
                self.is_low,
                self.is_high,
            )
            behavior = rollout_log_probs
            correction = dict(proximal_logprobs=old_log_probs, rollout_is_weights=weights)
        if self.token_level_loss:
            adv = advantages
            if batch_num_tokens is None:
                denominator = mask.sum().to(torch.float32)
            else:
                denominator = _scalar(batch_num_tokens, device) / dp_size
        else:
            counts = mask.sum(dim=-1)
            scale = 1.0 / (counts.to(torch.float32) + _SEQ_MEAN_EPS)
            adv = (advantages if advantages.dim() == log_probs.dim() else advantages.unsqueeze(-1)).to(torch.float32)
            adv = adv * scale.unsqueeze(-1)
            if global_batch_size is None:
                denominator = (counts > 0).sum().to(torch.float32)
            else:
                denominator = _scalar(global_batch_size, device) / dp_size
        loss, stats = filtered_dual_clip_loss(
            log_probs,
            behavior,
            adv.detach(),
            mask,
            num_model_tokens=denominator,
            backend=self.backend,
            **correction,
            **{name: getattr(self, name) for name in loss_setting_names()},
        )
        self.last_stats = stats
        with torch.no_grad():
            mask_f = mask.to(torch.float32)
            ppo_kl = (-(log_probs.detach().float() - old_log_probs.float()) * mask_f).sum() / mask_f.sum()
        clip_ratio = stats["filtered_low_fraction"] + stats["filtered_high_fraction"]
        return loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio


def _scalar(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32, device=device)
