"""rwcore.integrations.openrlhf.RwcorePolicyLoss against OpenRLHF's documented PolicyLoss -- WITHOUT OpenRLHF.

OpenRLHF needs a CUDA stack (DeepSpeed, vLLM, Ray) and is not installed in this test environment;
nothing here imports it. Signature conformance compares with a reference pasted from its source,
and the one cross-check with OpenRLHF's own arithmetic uses an INDEPENDENT TRANSCRIPTION of
`PolicyLoss.forward` (the "ppo" path with dual clip) and `aggregate_loss`, clearly marked below.

Source (read from the PyPI wheel openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl, sha256
c969d70db03a70724c3d8a5a01186c6e0728bce624fb3dff95e39b5396acefa6): openrlhf/models/loss.py --
aggregate_loss l.11-39, PolicyLoss.__init__ l.121-132, PolicyLoss.forward l.174-259;
openrlhf/models/utils.py masked_mean l.199-202; the call site openrlhf/trainer/ray/ppo_actor.py
l.76-86 (construction) and l.304-311 (forward, keywords action_mask / rollout_log_probs / **loss_batch_info).
"""

import inspect
import math
from typing import Optional

import pytest
import torch

from rwcore.integrations.openrlhf import RwcorePolicyLoss
from rwcore.kernels import filtered_dual_clip_loss


# ---------------------------------------------------------------------------- reference signatures
# openrlhf 0.11.2, openrlhf/models/loss.py, class PolicyLoss(nn.Module) (bodies elided)
class REF_PolicyLoss:
    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold: list = (0.5, 5.0),
    ) -> None: ...

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
    ) -> torch.Tensor: ...  # actually returns (loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_forward_has_policy_loss_forward_signature():
    assert _params(RwcorePolicyLoss.forward) == _params(REF_PolicyLoss.forward)


def test_constructor_takes_policy_loss_keywords():
    ours = [(n, k) for n, k, _ in _params(RwcorePolicyLoss.__init__)]
    ref = [(n, k) for n, k, _ in _params(REF_PolicyLoss.__init__)]
    assert ours[: len(ref)] == ref  # same names, order and kinds; then keyword-only `backend`
    assert ours[len(ref):] == [("backend", inspect.Parameter.KEYWORD_ONLY)]
    # How ppo_actor.py builds it (l.76-86), with --actor.dual_clip set:
    module = RwcorePolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0, token_level_loss=True,
                              policy_loss_type="ppo", is_correction_level="off", is_correction_mode="mask",
                              is_correction_gating="ratio", is_correction_threshold=(0.5, 5.0))
    assert (module.ratio_low, module.ratio_high, module.clip_c) == pytest.approx((0.8, 1.28, 3.0))
    assert isinstance(module, torch.nn.Module)
    default = RwcorePolicyLoss()
    assert (default.ratio_low, default.ratio_high, default.clip_c) == (0.5, 5.0, 3.0)  # Arise's


def test_refuses_what_it_does_not_reproduce():
    with pytest.raises(ValueError, match="dual_clip"):
        RwcorePolicyLoss(dual_clip=None)
    with pytest.raises(ValueError, match="is_correction"):
        RwcorePolicyLoss(is_correction_level="token")
    with pytest.raises(ValueError, match="policy_loss_type"):
        RwcorePolicyLoss(policy_loss_type="gspo")
    with pytest.raises(ValueError, match="clip_c"):
        RwcorePolicyLoss(dual_clip=1.0)


# ---------------------------------------------------------------------------- equality with our kernel
def _case(seed, B=5, T=11, low=0.05, high=12.0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4.0
    log_ratio = torch.empty(B, T).uniform_(math.log(low), math.log(high), generator=g)
    log_probs = (old + log_ratio).requires_grad_(True)
    advantages = torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) < 0.75
    mask[0] = False
    return log_probs, old, advantages, mask


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


@pytest.mark.parametrize("seed", [0, 1])
def test_token_level_equals_filtered_dual_clip_loss(seed):
    log_probs, old, advantages, mask = _case(seed)
    module = RwcorePolicyLoss.arise(ratio_low=0.5, ratio_high=5.0, clip_c=3.0)
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = module(log_probs, old, advantages, action_mask=mask)
    ref, stats = filtered_dual_clip_loss(log_probs, old, advantages, mask, 0.5, 5.0, 3.0)
    assert torch.equal(loss, ref)
    assert torch.equal(_grad(loss, log_probs), _grad(ref, log_probs))
    assert vllm_kl is None and is_filter_ratio is None
    torch.testing.assert_close(clip_ratio, stats["filtered_low_fraction"] + stats["filtered_high_fraction"])
    assert 0 < clip_ratio < 1  # the case does leave the bounds
    expected_kl = ((old - log_probs.detach()) * mask).sum() / mask.sum()
    torch.testing.assert_close(ppo_kl, expected_kl)
    assert set(module.last_stats) == set(stats)

    # Data-parallel normalizer (OpenRLHF's get_loss_batch_info): sum / batch_num_tokens * dp_size.
    loss_dp, *_ = module(log_probs, old, advantages, action_mask=mask, dp_size=4, batch_num_tokens=123.0,
                         global_batch_size=17.0)
    ref_dp, _ = filtered_dual_clip_loss(log_probs, old, advantages, mask, 0.5, 5.0, 3.0,
                                        num_model_tokens=torch.tensor(123.0 / 4))
    torch.testing.assert_close(loss_dp, ref_dp, rtol=1e-6, atol=0)
    torch.testing.assert_close(_grad(loss_dp, log_probs), _grad(ref_dp, log_probs), rtol=1e-6, atol=0)


@pytest.mark.parametrize("global_batch_size", [None, 9.0])
def test_sequence_level_is_the_mean_of_per_sequence_token_means(global_batch_size):
    log_probs, old, advantages, mask = _case(3)
    module = RwcorePolicyLoss.arise(token_level_loss=False)
    loss, *_ = module(log_probs, old, advantages, action_mask=mask, dp_size=3 if global_batch_size else 1,
                      global_batch_size=global_batch_size)
    # float64 from the definition: per sequence, sum of filtered dual-clip terms / (n_b + 1e-8);
    # then / global_batch_size * dp_size (or the mean over non-empty sequences).
    w = torch.exp((log_probs.detach().double() - old.double()).clamp(-20, 20))
    a = advantages.double()
    keep = mask & (w > 0.5) & (w < 5.0)
    terms = torch.where(keep, torch.minimum(-w * a, 3.0 * a.abs()), torch.zeros_like(w))
    counts = mask.sum(-1).double()
    per_seq = terms.sum(-1) / (counts + 1e-8)
    expected = per_seq.sum() / (global_batch_size / 3 if global_batch_size else (counts > 0).sum())
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------- vs OpenRLHF's own arithmetic
# TRANSCRIPTION -- not the real OpenRLHF code. openrlhf 0.11.2 openrlhf/models/loss.py
# PolicyLoss.forward l.185-212 ("ppo" ratio, dual-clip branch), l.249-259 (aggregation, metrics),
# aggregate_loss l.29-39, and openrlhf/models/utils.py masked_mean l.199-202.
def orlhf_masked_mean(tensor, mask, dim=None):
    if mask is None:
        return tensor.mean(dim=dim)
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)


def orlhf_aggregate_loss(loss, loss_mask, token_level_loss=True, dp_size=1, batch_num_tokens=None,
                         global_batch_size=None):
    if token_level_loss:
        if batch_num_tokens is None:
            return orlhf_masked_mean(loss, loss_mask, dim=None)
        return (loss * loss_mask).sum() / batch_num_tokens * dp_size
    token_counts = loss_mask.sum(dim=-1)
    seq_loss = (loss * loss_mask).sum(dim=-1) / (token_counts + 1e-8)
    seq_mask = (token_counts > 0).float()
    if global_batch_size is None:
        return orlhf_masked_mean(seq_loss, seq_mask, dim=None)
    return (seq_loss * seq_mask).sum() / global_batch_size * dp_size


def orlhf_policy_loss(log_probs, old_log_probs, advantages, action_mask, clip_eps_low, clip_eps_high, dual_clip,
                      token_level_loss=True, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    raw_policy_log_ratio = log_probs - old_log_probs
    policy_log_ratio = raw_policy_log_ratio.clamp(min=-20.0, max=20.0)
    ratio = policy_log_ratio.exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * advantages
    clip1 = torch.min(surr1, surr2)
    clip2 = torch.max(clip1, dual_clip * advantages)
    loss = -torch.where(advantages < 0, clip2, clip1)
    loss = orlhf_aggregate_loss(loss, action_mask, token_level_loss=token_level_loss, dp_size=dp_size,
                                batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
    clip_ratio = orlhf_masked_mean(torch.lt(surr2, surr1).float(), action_mask, dim=None)
    ppo_kl = orlhf_masked_mean(-raw_policy_log_ratio.detach(), action_mask, dim=None)
    return loss, clip_ratio, ppo_kl, None, None
# ------------------------------------------------------------------------------ end of transcription


@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("dp", [None, (2, 70.0, 7.0)])
def test_equals_openrlhfs_dual_clip_ppo_when_no_ratio_leaves_the_bounds(token_level_loss, dp):
    # Ratios in (0.25, 5.5) inside the bounds (0.2, 6.0): OpenRLHF's PPO clip never engages, its dual
    # clip (3.0) does, and rwcore's filter keeps every token -- the losses are the same function.
    log_probs, old, advantages, mask = _case(11, B=6, T=13, low=0.25, high=5.5)
    kwargs = {} if dp is None else dict(dp_size=dp[0], batch_num_tokens=dp[1], global_batch_size=dp[2])
    ours = RwcorePolicyLoss(clip_eps_low=0.8, clip_eps_high=5.0, dual_clip=3.0, token_level_loss=token_level_loss)
    loss, clip_ratio, ppo_kl, _, _ = ours(log_probs, old, advantages, action_mask=mask, **kwargs)
    ref, ref_clip_ratio, ref_kl, _, _ = orlhf_policy_loss(log_probs, old, advantages, mask, 0.8, 5.0, 3.0,
                                                          token_level_loss=token_level_loss, **kwargs)
    assert ref_clip_ratio == 0 and clip_ratio == 0
    dual_clipped = ((advantages < 0) & (torch.exp(log_probs.detach() - old) > 3.0) & mask).sum()
    assert dual_clipped > 0
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(_grad(loss, log_probs), _grad(ref, log_probs), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(ppo_kl, ref_kl)
