"""rwcore.integrations.openrlhf.RwcorePolicyLoss against OpenRLHF's REAL `PolicyLoss` (openrlhf 0.11.2).

OpenRLHF is installed with --no-deps (scripts/upstream-requirements.txt; `RWCORE_EXTRAS=...,upstream`).
`openrlhf.models.__init__` imports the actor, which needs flash-attn, so `openrlhf.models.loss` is loaded
directly: `openrlhf.models` is registered as a bare package (its __path__ only, its __init__ not run)
and `openrlhf.models.loss` -- with its `from .utils import masked_mean` -- is imported normally. The
classes, signatures and arithmetic compared below are OpenRLHF's own.
"""

import importlib
import importlib.util
import inspect
import math

import pytest
import torch
from _util import openrlhf_loss_module

from rwcore.integrations.openrlhf import RwcorePolicyLoss
from rwcore.kernels import filtered_dual_clip_loss

openrlhf_loss = openrlhf_loss_module()
PolicyLoss = openrlhf_loss.PolicyLoss
assert importlib.metadata.version("openrlhf") == "0.11.2"


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_forward_has_policy_loss_forward_signature():
    assert _params(RwcorePolicyLoss.forward) == _params(PolicyLoss.forward)


def test_constructor_takes_policy_loss_keywords():
    ours = [(n, k) for n, k, _ in _params(RwcorePolicyLoss.__init__)]
    ref = [(n, k) for n, k, _ in _params(PolicyLoss.__init__)]
    assert ours[: len(ref)] == ref  # same names, order and kinds; then keyword-only `backend`
    assert ours[len(ref) :] == [("backend", inspect.Parameter.KEYWORD_ONLY)]
    # Every keyword OpenRLHF's PolicyLoss takes, as ppo_actor.py passes them (with --actor.dual_clip set):
    kwargs = dict(
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        dual_clip=3.0,
        token_level_loss=True,
        policy_loss_type="ppo",
        is_correction_level="off",
        is_correction_mode="mask",
        is_correction_gating="ratio",
        is_correction_threshold=(0.5, 5.0),
    )
    PolicyLoss(**kwargs)  # OpenRLHF's own class accepts them ...
    module = RwcorePolicyLoss(**kwargs)  # ... and so does ours
    assert (module.ratio_low, module.ratio_high, module.clip_c) == pytest.approx((0.8, 1.28, 3.0))
    assert isinstance(module, torch.nn.Module)
    default = RwcorePolicyLoss()
    assert (default.ratio_low, default.ratio_high, default.clip_c) == (0.5, 5.0, 3.0)  # Arise's


def test_refuses_what_it_does_not_reproduce():
    with pytest.raises(ValueError, match="dual_clip"):
        RwcorePolicyLoss(dual_clip=None)
    # is_correction_level token / seq are supported (tests/rwcore/integrations/test_rollout_correction_openrlhf.py);
    # what OpenRLHF's own PolicyLoss refuses is refused too
    with pytest.raises(ValueError, match="is_correction_level"):
        RwcorePolicyLoss(is_correction_level="sequence")
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
    loss_dp, *_ = module(
        log_probs, old, advantages, action_mask=mask, dp_size=4, batch_num_tokens=123.0, global_batch_size=17.0
    )
    ref_dp, _ = filtered_dual_clip_loss(
        log_probs, old, advantages, mask, 0.5, 5.0, 3.0, num_model_tokens=torch.tensor(123.0 / 4)
    )
    torch.testing.assert_close(loss_dp, ref_dp, rtol=1e-6, atol=0)
    torch.testing.assert_close(_grad(loss_dp, log_probs), _grad(ref_dp, log_probs), rtol=1e-6, atol=0)


@pytest.mark.parametrize("global_batch_size", [None, 9.0])
def test_sequence_level_is_the_mean_of_per_sequence_token_means(global_batch_size):
    log_probs, old, advantages, mask = _case(3)
    module = RwcorePolicyLoss.arise(token_level_loss=False)
    loss, *_ = module(
        log_probs,
        old,
        advantages,
        action_mask=mask,
        dp_size=3 if global_batch_size else 1,
        global_batch_size=global_batch_size,
    )
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


# ---------------------------------------------------------------------------- vs OpenRLHF's own PolicyLoss


@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("dp", [None, (2, 70.0, 7.0)])
def test_equals_openrlhfs_dual_clip_ppo_when_no_ratio_leaves_the_bounds(token_level_loss, dp):
    # Ratios in (0.25, 5.5) inside the bounds (0.2, 6.0): OpenRLHF's PPO clip never engages, its dual
    # clip (3.0) does, and rwcore's filter keeps every token -- the losses are the same function.
    log_probs, old, advantages, mask = _case(11, B=6, T=13, low=0.25, high=5.5)
    kwargs = {} if dp is None else dict(dp_size=dp[0], batch_num_tokens=dp[1], global_batch_size=dp[2])
    ours = RwcorePolicyLoss(clip_eps_low=0.8, clip_eps_high=5.0, dual_clip=3.0, token_level_loss=token_level_loss)
    loss, clip_ratio, ppo_kl, _, _ = ours(log_probs, old, advantages, action_mask=mask, **kwargs)
    lp_ref = log_probs.detach().clone().requires_grad_(True)
    openrlhf = PolicyLoss(clip_eps_low=0.8, clip_eps_high=5.0, dual_clip=3.0, token_level_loss=token_level_loss)
    ref, ref_clip_ratio, ref_kl, _, _ = openrlhf(lp_ref, old, advantages, action_mask=mask, **kwargs)
    assert ref_clip_ratio == 0 and clip_ratio == 0
    dual_clipped = ((advantages < 0) & (torch.exp(log_probs.detach() - old) > 3.0) & mask).sum()
    assert dual_clipped > 0
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(_grad(loss, log_probs), _grad(ref, lp_ref), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(ppo_kl, ref_kl)
