"""RwcorePolicyLoss's vLLM-mismatch correction (is_correction_*) against OpenRLHF's REAL `PolicyLoss` (0.11.2).

Every is_correction level / mode / gating combination OpenRLHF's constructor accepts is compared -- loss,
gradient w.r.t. log_probs, and the rest of the returned tuple (clip_ratio, ppo_kl, vllm_kl,
is_filter_ratio) -- at token- and sequence-level aggregation, on both rwcore backends, on random and on
adversarial inputs (proximal-vs-rollout log ratios near +-30, all-masked and length-1 sequences, a token
whose two probabilities are below binary_kl's 1e-6 clamp, bf16). The combinations OpenRLHF refuses are
refused by both.

OpenRLHF's package is loaded as in tests/rwcore/integrations/test_integration_openrlhf.py
(its `openrlhf.models.__init__` imports the actor, which needs flash-attn).

The PPO ratio log_probs - old_log_probs is kept inside the clip band everywhere: OpenRLHF *clips* the
ratio to [1 - clip_eps_low, 1 + clip_eps_high] while rwcore *drops* tokens outside (ratio_low, ratio_high)
-- the two losses are the same function only where no ratio leaves the band (there both give -w A, capped
at dual_clip |A| for A < 0; tests/rwcore/integrations/test_integration_openrlhf.py shows that part). What is compared
here is the correction, which is independent of the PPO ratio: it reads old_log_probs vs rollout_log_probs only.
The ratios do reach the dual clip (w > 3 with A < 0), so that path is covered too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import math

import pytest
import torch
from _util import openrlhf_loss_module

from rwcore.integrations.openrlhf import RwcorePolicyLoss
from rwcore.kernels._backend import interpreter_enabled
from rwcore.kernels.rollout_correction import RolloutCorrection, correction_weights

PolicyLoss = openrlhf_loss_module().PolicyLoss
assert importlib.metadata.version("openrlhf") == "0.11.2"

# The "triton" backend runs the real kernel: compiled on a GPU (the tensors are on DEVICE), else in Triton's
# interpreter on CPU tensors, which tests/conftest.py enables (TRITON_INTERPRET=1) before rwcore.kernels is
# imported.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = ["torch", "triton"]


def test_triton_backend_really_runs_here():
    assert torch.cuda.is_available() or interpreter_enabled(), "tests/conftest.py should set TRITON_INTERPRET=1"


# PPO settings shared by both classes: clip range [0.2, 6.0] (= rwcore's filter (0.2, 6.0)), dual clip 3.
PPO = dict(clip_eps_low=0.8, clip_eps_high=5.0, dual_clip=3.0)
PPO_LOG_RATIO = (math.log(0.3), math.log(5.0))  # inside the band, and beyond the dual clip's w = 3

# (level, mode, gating, threshold): every combination OpenRLHF's PolicyLoss accepts, with thresholds that
# keep some units and drop others on the inputs below (checked in the test). (0.0, HIGH) is what OpenRLHF's
# CLI makes of a single HIGH; the divergences take only that form.
ACCEPTED = [
    ("token", "clip", "ratio", (0.5, 2.0)),  # TIS
    ("token", "mask", "ratio", (0.5, 2.0)),  # ICEPOP
    ("token", "mask", "ratio", (0.0, 2.0)),  # ICEPOP, upper bound only
    ("token", "mask", "binary_kl", (0.0, 0.05)),
    ("token", "mask", "tv", (0.0, 0.1)),
    ("seq", "mask", "ratio", (0.7, 1.4)),  # seq-mask-tis: geometric-mean gate
    ("seq", "mask", "binary_kl", (0.0, 0.05)),  # FlashREINFORCE's trust region
    ("seq", "mask", "tv", (0.0, 0.1)),
]
CONFIG_IDS = [f"{lvl}-{mode}-{gate}-{lo}-{hi}" for lvl, mode, gate, (lo, hi) in ACCEPTED]


def _case(seed, adversarial=False, B=7, T=9):
    """(log_probs leaf, old, rollout, advantages, mask) in fp32."""
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(B, T, generator=g) * 3.0 - 0.05
    is_log_ratio = torch.randn(B, T, generator=g) * 0.6  # log(pi_train / pi_rollout)
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[0] = False  # an all-masked sequence
    mask[4] = False
    mask[4, 0] = True  # a length-1 sequence
    if adversarial:
        is_log_ratio[1, 2], is_log_ratio[1, 3] = 30.0, -30.0  # mean ~ 0: the seq gate keeps exp(+-30)
        mask[1, 2] = mask[1, 3] = True
        is_log_ratio[2] = 29.5  # a whole sequence far off
        is_log_ratio[3, :4] = -30.0
        is_log_ratio[4, 0] = 30.0  # the length-1 sequence
        rollout[5, 1], is_log_ratio[5, 1] = -40.0, 30.0  # both probabilities < 1e-6: binary_kl / tv see 0
        mask[5, 1] = True
    old = rollout + is_log_ratio
    ppo_log_ratio = torch.empty(B, T).uniform_(*PPO_LOG_RATIO, generator=g)
    log_probs = old + ppo_log_ratio
    advantages = torch.randn(B, T, generator=g)
    log_probs, old, rollout, advantages, mask = (x.to(DEVICE) for x in (log_probs, old, rollout, advantages, mask))
    return log_probs.requires_grad_(True), old, rollout, advantages, mask


def _pair(config, token_level_loss, backend="torch"):
    level, mode, gating, threshold = config
    kwargs = dict(
        **PPO,
        token_level_loss=token_level_loss,
        is_correction_level=level,
        is_correction_mode=mode,
        is_correction_gating=gating,
        is_correction_threshold=threshold,
    )
    return RwcorePolicyLoss(**kwargs, backend=backend), PolicyLoss(**kwargs)


def _run(module, log_probs, old, rollout, advantages, mask, **kwargs):
    x = log_probs.detach().clone().requires_grad_(True)
    out = module(x, old, advantages, action_mask=mask, rollout_log_probs=rollout, **kwargs)
    (grad,) = torch.autograd.grad(out[0], x)
    return out, grad


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float(((a - b).abs() / b.abs().clamp(min=1e-30)).max())


def assert_matches_openrlhf(ours, theirs, rtol=1e-5):
    (loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio), grad = ours
    (ref, ref_clip_ratio, ref_kl, ref_vllm_kl, ref_filter), ref_grad = theirs
    assert torch.isfinite(loss) and torch.isfinite(ref)
    assert _rel(loss, ref) <= rtol, (float(loss), float(ref))
    # every element, relatively: the weights span e^-30 .. e^30 in the adversarial cases
    torch.testing.assert_close(grad, ref_grad, rtol=rtol, atol=1e-30)
    assert float(ref_clip_ratio) == 0.0 and float(clip_ratio) == 0.0  # the PPO ratio stays in the band
    torch.testing.assert_close(ppo_kl, ref_kl, rtol=1e-6, atol=0)
    torch.testing.assert_close(vllm_kl, ref_vllm_kl.float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(is_filter_ratio, ref_filter.float(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("config", ACCEPTED, ids=CONFIG_IDS)
def test_equals_openrlhf_on_random_inputs(config, token_level_loss, backend):
    inputs = _case(1)
    ours, theirs = _pair(config, token_level_loss, backend)
    result, expected = _run(ours, *inputs), _run(theirs, *inputs)
    assert_matches_openrlhf(result, expected)
    # the thresholds make the correction act without removing everything
    assert 0.0 < float(expected[0][4]) < 1.0
    log_probs, old, rollout, advantages, mask = inputs
    dual_clipped = ((advantages < 0) & (torch.exp(log_probs.detach() - old) > 3.0) & mask).any()
    assert dual_clipped
    # the fused loss's mismatch metric is OpenRLHF's vllm_kl (old vs rollout, verl's k1 sign)
    torch.testing.assert_close(ours.last_stats["rollout_corr/kl"], result[0][3], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("token_level_loss", [True, False])
@pytest.mark.parametrize("config", ACCEPTED, ids=CONFIG_IDS)
def test_equals_openrlhf_on_adversarial_inputs(config, token_level_loss, backend):
    """Log ratios near +-30, an all-masked and a length-1 sequence, OpenRLHF's data-parallel normalizers."""
    inputs = _case(2, adversarial=True)
    ours, theirs = _pair(config, token_level_loss, backend)
    dp = dict(dp_size=2, batch_num_tokens=70.0, global_batch_size=7.0)
    assert_matches_openrlhf(_run(ours, *inputs, **dp), _run(theirs, *inputs, **dp))
    assert_matches_openrlhf(_run(ours, *inputs), _run(theirs, *inputs))


def test_seq_mask_keeps_untruncated_weights_of_a_surviving_sequence():
    """seq-mask-tis: sequence 1's geometric mean is ~1 (lr +30 and -30 cancel), so it survives and its tokens
    keep exp(+30) and exp(-30) -- beyond rwcore's RolloutCorrection's +-20 clamp, hence a precomputed weight."""
    log_probs, old, rollout, advantages, mask = _case(2, adversarial=True)
    ours, theirs = _pair(("seq", "mask", "ratio", (0.7, 1.4)), True)
    (loss, *_), _ = _run(ours, log_probs, old, rollout, advantages, mask)
    (ref, *_), _ = _run(theirs, log_probs, old, rollout, advantages, mask)
    ratio = torch.exp(log_probs.detach() - old)
    term = torch.minimum(-ratio * advantages, 3.0 * advantages.abs())[1, 2]
    assert abs(float(term)) * math.exp(30.0) / float(mask.sum()) > 1e9  # the e^30 token dominates
    assert _rel(loss, ref) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", ACCEPTED, ids=CONFIG_IDS)
@pytest.mark.parametrize("adversarial", [False, True])
def test_bf16_inputs(config, adversarial, backend):
    """bf16 log-probs: rwcore computes the weights and the loss in fp32 from the bf16 values, i.e. OpenRLHF's
    arithmetic on the fp32 copies of the same numbers (OpenRLHF run in bf16 itself would round lr to 8 bits
    before gating). The gradient comes back in bf16: equal to OpenRLHF's fp32 one rounded to bf16 (1 ulp)."""
    log_probs, old, rollout, advantages, mask = _case(3, adversarial=adversarial)
    lp16, old16, ro16, adv16 = (t.detach().to(torch.bfloat16) for t in (log_probs, old, rollout, advantages))
    for token_level_loss in (True, False):
        ours, theirs = _pair(config, token_level_loss, backend)
        result, grad = _run(ours, lp16, old16, ro16, adv16, mask)
        expected, ref_grad = _run(theirs, lp16.float(), old16.float(), ro16.float(), adv16.float(), mask)
        assert grad.dtype == torch.bfloat16 and result[0].dtype == torch.float32
        assert _rel(result[0], expected[0]) < 1e-5
        torch.testing.assert_close(grad.float(), ref_grad.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-30)
        torch.testing.assert_close(result[3], expected[3], rtol=1e-6, atol=0)
        torch.testing.assert_close(result[4], expected[4], rtol=0, atol=0)


@pytest.mark.parametrize("config", ACCEPTED, ids=CONFIG_IDS)
def test_action_mask_none_at_token_level(config):
    """No action mask: OpenRLHF's masked means become plain means (its sequence-level aggregate_loss needs a
    mask, so token level only)."""
    log_probs, old, rollout, advantages, _ = _case(7)
    ours, theirs = _pair(config, True)
    assert_matches_openrlhf(
        _run(ours, log_probs, old, rollout, advantages, None), _run(theirs, log_probs, old, rollout, advantages, None)
    )


# ---------------------------------------------------------------------------- what OpenRLHF refuses


@pytest.mark.parametrize(
    "level, mode, gating, threshold",
    [
        ("seq", "clip", "ratio", (0.5, 2.0)),
        ("token", "clip", "binary_kl", (0.0, 0.1)),
        ("token", "clip", "tv", (0.0, 0.1)),
        ("seq", "clip", "tv", (0.0, 0.1)),
        ("off", "clip", "tv", (0.0, 0.1)),  # OpenRLHF checks mode x gating even with the correction off
        ("token", "mask", "binary_kl", (0.5, 5.0)),  # a divergence takes an upper bound only
        ("seq", "mask", "tv", (0.01, 0.1)),
        ("sequence", "mask", "ratio", (0.5, 2.0)),
        ("token", "truncate", "ratio", (0.5, 2.0)),
        ("token", "mask", "k3", (0.5, 2.0)),
    ],
)
def test_refuses_what_openrlhf_refuses(level, mode, gating, threshold):
    kwargs = dict(
        **PPO,
        is_correction_level=level,
        is_correction_mode=mode,
        is_correction_gating=gating,
        is_correction_threshold=threshold,
    )
    with pytest.raises(ValueError):
        PolicyLoss(**kwargs)
    with pytest.raises(ValueError, match="is_correction"):
        RwcorePolicyLoss(**kwargs)


def test_missing_rollout_log_probs_is_a_clear_error():
    log_probs, old, _, advantages, mask = _case(4)
    module = RwcorePolicyLoss(**PPO, is_correction_level="token", is_correction_mode="clip")
    with pytest.raises(ValueError, match="rollout_log_probs"):
        module(log_probs, old, advantages, action_mask=mask)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        module(log_probs, old, advantages, action_mask=mask, rollout_log_probs=old[:, :3])
    with pytest.raises(ValueError, match="is_correction_threshold"):
        RwcorePolicyLoss(**PPO, is_correction_level="token", is_correction_threshold=(5.0,))


def test_correction_off_ignores_rollout_log_probs_as_before():
    log_probs, old, rollout, advantages, mask = _case(5)
    module = RwcorePolicyLoss(**PPO)
    (loss, _, _, vllm_kl, is_filter_ratio), _ = _run(module, log_probs, old, rollout, advantages, mask)
    (ref, *_), _ = _run(module, log_probs, old, None, advantages, mask)
    assert torch.equal(loss, ref) and vllm_kl is None and is_filter_ratio is None


# ---------------------------------------------------------------------------- why precomputed weights


def test_token_ratio_modes_are_rwcore_rollout_corrections_away_from_the_edges():
    """Where OpenRLHF's ratio gating maps onto rwcore's RolloutCorrection -- token TIS (truncate), token ICEPOP
    (mask) and seq-mask-tis (token weights, open bounds, + verl's seq_mean_k1 rejection with bounds
    (1 / high, 1 / low)) -- the weights agree on moderate log ratios; with log ratios beyond +-20 the
    seq-mask ones do not (rwcore clamps the log ratio at +-20 and adds 1e-8 to the sequence's count),
    which is why RwcorePolicyLoss computes OpenRLHF's weights itself."""
    from rwcore.integrations.openrlhf.loss import openrlhf_is_correction

    mappings = [
        (("token", "clip", "ratio", (0.5, 2.0)), RolloutCorrection("token", "truncate", 2.0, 0.5)),
        (("token", "mask", "ratio", (0.5, 2.0)), RolloutCorrection("token", "mask", 2.0, 0.5)),
        (
            ("seq", "mask", "ratio", (0.7, 1.4)),
            # is_threshold=1e30 stands for an open bound (truncate with both bounds None is refused by
            # torch.clamp, see the report)
            RolloutCorrection("token", "truncate", 1e30, None, ("seq_mean_k1",), ((1 / 1.4, 1 / 0.7),)),
        ),
    ]
    for adversarial in (False, True):
        _, old, rollout, _, mask = _case(6, adversarial=adversarial)
        B, T = mask.shape
        seq = torch.arange(B, device=DEVICE).repeat_interleave(T)
        for (level, mode, gating, (low, high)), correction in mappings:
            ours, _, _ = openrlhf_is_correction(old, rollout, mask, level, mode, gating, low, high)
            rw, _ = correction_weights((old - rollout).reshape(-1), mask.reshape(-1), correction, seq, B)
            rw = rw.reshape(B, T)
            if not adversarial:
                torch.testing.assert_close(ours, rw, rtol=1e-6, atol=0)
            elif level == "seq":
                assert not torch.allclose(ours, rw)  # exp(30) vs exp(20)
