"""rwcore's filtered dual-clip loss as a drop-in for OpenRLHF's `PolicyLoss`.

    from rwcore.integrations.openrlhf import RwcorePolicyLoss

    loss_fn = RwcorePolicyLoss.arise(ratio_low=0.5, ratio_high=5.0, clip_c=3.0)
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = loss_fn(
        action_log_probs, old_action_log_probs, advantages, action_mask=action_mask, **loss_batch_info)

    # or in place of OpenRLHF's class, before the actor is built (in the actor's Ray process):
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    ppo_actor.PolicyLoss = RwcorePolicyLoss   # constructed with --actor.eps_clip_low_high / --actor.dual_clip

`RwcorePolicyLoss` is an `nn.Module` whose constructor takes `openrlhf.models.loss.PolicyLoss`'s
keyword arguments and whose `forward` has `PolicyLoss.forward`'s signature and return tuple
(OpenRLHF 0.11.2, openrlhf/models/loss.py; tests/test_integration_openrlhf.py compares the two with
OpenRLHF's real class). It delegates to `rwcore.kernels.filtered_dual_clip_loss`; nothing here imports
OpenRLHF.

Mapping: ratio_low = max(0, 1 - clip_eps_low), ratio_high = 1 + clip_eps_high, clip_c = dual_clip.
OpenRLHF *clips* the ratio to [1 - clip_eps_low, 1 + clip_eps_high]; rwcore *drops* tokens whose
ratio leaves (ratio_low, ratio_high) (no loss, no gradient; they still count in the denominator),
and always dual-clips negative advantages at clip_c |A| (so `dual_clip=None` is refused). Inside
the bounds both give -w A, capped at clip_c |A| for A < 0. The defaults are Arise's: (0.5, 5.0), 3.0.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from rwcore.kernels import filtered_dual_clip_loss

__all__ = ["RwcorePolicyLoss"]

TESTED_OPENRLHF_VERSION = "0.11.2"
_SEQ_MEAN_EPS = 1e-8  # OpenRLHF's aggregate_loss divides a sequence's token sum by (count + 1e-8)


class RwcorePolicyLoss(nn.Module):
    """`openrlhf.models.loss.PolicyLoss`-compatible module computing Arise's filtered dual-clip loss.

    Args (PolicyLoss's, with Arise's defaults):
        clip_eps_low, clip_eps_high: the filter is (max(0, 1 - clip_eps_low), 1 + clip_eps_high).
        dual_clip: clip_c, > 1 (required: rwcore's loss always dual-clips).
        token_level_loss: True: token mean (OpenRLHF's "token-mean"); False: mean over sequences of
            each sequence's token mean.
        policy_loss_type: only "ppo" (GSPO's sequence ratio is not this loss).
        is_correction_level: only "off" (OpenRLHF's vLLM-mismatch correction is not reproduced; the
            filter on w = pi / pi_old plays that role in Arise). The other is_correction_* arguments
            are accepted for signature compatibility and unused.
        backend: rwcore kernel backend ("auto", "torch", "triton").

    After each call `last_stats` holds rwcore's statistics (kept_fraction, filtered_low_fraction,
    filtered_high_fraction, dual_clipped_fraction, mean_ratio) as detached 0-dim tensors.
    """

    def __init__(
        self,
        clip_eps_low: float = 0.5,
        clip_eps_high: float = 4.0,
        dual_clip: float = 3.0,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold: list = (0.5, 5.0),
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if policy_loss_type != "ppo":
            raise ValueError(
                f"RwcorePolicyLoss implements the token-level ratio loss (policy_loss_type='ppo'), "
                f"got {policy_loss_type!r}"
            )
        if is_correction_level != "off":
            raise ValueError(
                "RwcorePolicyLoss does not reproduce OpenRLHF's is_correction_* (vLLM mismatch) "
                f"weighting; use is_correction_level='off', got {is_correction_level!r}"
            )
        if dual_clip is None:
            raise ValueError(
                "rwcore's loss always dual-clips: pass dual_clip > 1 (Arise uses 3.0; OpenRLHF: --actor.dual_clip 3)"
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
        self.ratio_low = max(0.0, 1.0 - self.clip_eps_low)
        self.ratio_high = 1.0 + self.clip_eps_high
        self.clip_c = self.dual_clip
        self.backend = backend
        self.last_stats: dict = {}
        # Checks the bounds now (ValueError naming them) rather than at the first forward.
        from rwcore.kernels._checks import check_loss_bounds

        check_loss_bounds(self.ratio_low, self.ratio_high, self.clip_c)

    @classmethod
    def arise(
        cls,
        ratio_low: float = 0.5,
        ratio_high: float = 5.0,
        clip_c: float = 3.0,
        token_level_loss: bool = True,
        backend: str = "auto",
    ) -> "RwcorePolicyLoss":
        """The module from rwcore's own parameters (the filter bounds and the dual-clip constant)."""
        module = cls(
            clip_eps_low=1.0 - ratio_low,
            clip_eps_high=ratio_high - 1.0,
            dual_clip=clip_c,
            token_level_loss=token_level_loss,
            backend=backend,
        )
        module.ratio_low, module.ratio_high = float(ratio_low), float(ratio_high)  # exact, no 1 - (1 - x) round-off
        return module

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: Optional[torch.Tensor] = None,
        rollout_log_probs: Optional[torch.Tensor] = None,
        dp_size: int = 1,
        batch_num_tokens: Optional[float] = None,
        global_batch_size: Optional[float] = None,
    ) -> tuple:
        """(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio), as OpenRLHF's PolicyLoss.forward.

        Aggregation is OpenRLHF's `aggregate_loss`: token level, sum / batch_num_tokens * dp_size
        (masked mean when batch_num_tokens is None); sequence level, sum of per-sequence token means
        / global_batch_size * dp_size (mean over non-empty sequences when None). `clip_ratio` is the
        fraction of action tokens the filter dropped (OpenRLHF: the fraction PPO-clipped), `ppo_kl`
        the masked mean of old - new log-prob (as OpenRLHF); `vllm_kl` and `is_filter_ratio` are
        None (no is_correction). `rollout_log_probs` is accepted and unused.
        """
        mask = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask != 0
        device = log_probs.device
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
            old_log_probs,
            adv.detach(),
            mask,
            self.ratio_low,
            self.ratio_high,
            self.clip_c,
            num_model_tokens=denominator,
            backend=self.backend,
        )
        self.last_stats = stats
        with torch.no_grad():
            mask_f = mask.to(torch.float32)
            ppo_kl = (-(log_probs.detach().float() - old_log_probs.float()) * mask_f).sum() / mask_f.sum()
        clip_ratio = stats["filtered_low_fraction"] + stats["filtered_high_fraction"]
        return loss, clip_ratio, ppo_kl, None, None


def _scalar(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32, device=device)
