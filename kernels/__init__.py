"""Fused kernels for the policy update (rwcore.kernels).

- `token_logprobs`: log-probs (and entropies) of labels from logits.
- `filtered_dual_clip_loss`: Arise's ratio-filtered, dual-clipped policy loss from log-probs.
- `fused_linear_logprobs`, `fused_linear_policy_loss`, `fused_linear_entropy`: the same from
  hidden states and the LM head, never holding more than one chunk of logits.
- `TokenLogProbs`, `FilteredDualClipLoss`, `FusedLinearPolicyLoss`: nn.Module wrappers.
- `LossSettings`: the policy loss's settings (filter band, dual clip), each declared once with its default,
  range, help and `rw train` config key; every entry point of the loss takes its defaults from it. The
  declaration helper (`settings.setting`) is the one `rwcore.method.MethodSettings` uses too.
- `RolloutCorrection`: the train-inference mismatch / staleness corrections the two policy losses take
  (`rollout_correction=`), with verl's presets.

Every function takes `backend="auto" | "torch" | "triton"`: Triton on CUDA, a
chunked PyTorch implementation (same memory bound) on the CPU; Triton kernels
also run on CPU tensors in the Triton interpreter (TRITON_INTERPRET=1, set
before import) for tests. Nothing here imports from rwcore above it.
"""

from rwcore.kernels.fused_linear_entropy import fused_linear_entropy
from rwcore.kernels.fused_linear_logprobs import fused_linear_logprobs
from rwcore.kernels.fused_linear_policy_loss import fused_linear_policy_loss
from rwcore.kernels.loss_settings import LossSettings
from rwcore.kernels.modules import FilteredDualClipLoss, FusedLinearPolicyLoss, TokenLogProbs
from rwcore.kernels.policy_loss import filtered_dual_clip_loss
from rwcore.kernels.rollout_correction import RolloutCorrection
from rwcore.kernels.token_logprobs import token_logprobs

__all__ = [
    "FilteredDualClipLoss",
    "FusedLinearPolicyLoss",
    "LossSettings",
    "RolloutCorrection",
    "TokenLogProbs",
    "filtered_dual_clip_loss",
    "fused_linear_entropy",
    "fused_linear_logprobs",
    "fused_linear_policy_loss",
    "token_logprobs",
]
