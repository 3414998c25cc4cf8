"""Rollout correction in the fused loss: an independent reference written from the formulas, both backends,
the fused path against the token-level one, chunking, the default left untouched, and bad input.

The comparison with verl's, TRL's and OpenRLHF's own functions lives in
tests/rwcore/integrations/test_rollout_correction_verl.py, tests/rwcore/integrations/test_rollout_correction_trl.py
and tests/rwcore/integrations/test_rollout_correction_openrlhf.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from rwcore.kernels import filtered_dual_clip_loss, fused_linear_policy_loss
from rwcore.kernels.fused_linear_policy_loss import _chunks
from rwcore.kernels.rollout_correction import PRESETS, RolloutCorrection, correction_weights, merge_metrics

BACKENDS = ("torch", "triton")
CORRECTIONS = [name for name in PRESETS if name != "off"]


# --------------------------------------------------------------------------- independent reference


def ref_weights(train, behavior, mask, c: RolloutCorrection):
    """Per-token loss weights by plain Python loops over [B][T] lists, from the formulas of the docstring."""
    out = []
    for b in range(len(mask)):
        lr = [(t - u) if m else 0.0 for t, u, m in zip(train[b], behavior[b], mask[b])]
        n = sum(mask[b])
        clamp = lambda x: min(max(x, -20.0), 20.0)  # noqa: E731
        row = []
        for t in range(len(lr)):
            if not mask[b][t]:
                row.append(0.0)
                continue
            w = 1.0
            if c.rollout_is is not None and c.applies_weights:
                log_w = lr[t] if c.rollout_is == "token" else sum(lr)
                rho = math.exp(clamp(log_w))
                low, high = c.is_threshold_lower, c.is_threshold
                if c.is_mode == "truncate":
                    w = min(max(rho, low if low is not None else -math.inf), high if high is not None else math.inf)
                else:
                    inside = (low is None or rho >= low) and (high is None or rho <= high)
                    w = rho if inside else 0.0
            for option, (low, high) in zip(c.rollout_rs, c.rs_bounds):
                k = option[-2:]

                def stat(x):
                    x = clamp(x)
                    return {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[k]

                token_stats = [stat(lr[s]) for s in range(len(lr)) if mask[b][s]]
                if option.startswith("token"):
                    value = stat(lr[t])
                elif option.startswith("seq_sum"):
                    value = sum(token_stats)
                elif option.startswith("seq_mean"):
                    value = sum(token_stats) / (n + 1e-8)
                else:
                    value = max(token_stats)
                keep = (math.log(low) <= value <= math.log(high)) if k == "k1" else value <= high
                w = w if keep else 0.0
            row.append(w)
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def ref_loss(logp, anchor, adv, mask, weight, denominator, low=0.5, high=5.0, c=3.0):
    """float64 autograd reference: sum(keep * weight * min(-r A, c |A|)) / D."""
    r = torch.exp((logp - anchor).clamp(-20, 20))
    keep = mask & (r > low) & (r < high)
    term = torch.minimum(-r * adv, c * adv.abs())
    return torch.where(keep, weight * term, torch.zeros_like(term)).sum() / denominator


def batch(B=5, T=7, spread=0.3, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    proximal = logp + spread * torch.randn(B, T, generator=g) * 0.3
    behavior = proximal + spread * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[0] = False  # an all-masked sequence
    mask[1, 1:] = False  # a length-1 sequence
    return logp.to(dtype), proximal.to(dtype), behavior.to(dtype), adv, mask


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CORRECTIONS)
def test_loss_and_gradient_match_an_independent_reference(name, backend):
    c = RolloutCorrection.preset(name)
    if c is not None and c.rollout_rs and c.rs_bounds[0][0] is not None:
        # verl's geometric default (0.999_1.001) rejects everything at this spread: widen it so both branches run
        c = RolloutCorrection.preset(name, rs_threshold="0.7_1.4" if "k1" in c.rollout_rs[0] else None)
    logp, proximal, behavior, adv, mask = batch(spread=0.4)
    decoupled = not c.bypass
    leaf = logp.clone().requires_grad_()
    loss, stats = filtered_dual_clip_loss(
        leaf,
        behavior,
        adv,
        mask,
        proximal_logprobs=proximal if decoupled else None,
        rollout_correction=c,
        backend=backend,
    )
    loss.backward()
    train = proximal if decoupled else logp
    weight = ref_weights(train.double().tolist(), behavior.double().tolist(), mask.tolist(), c)
    if c.bypass and c.loss_type == "reinforce":
        anchor = logp.double()  # the current policy: ratio 1
    else:
        anchor = proximal.double() if decoupled else behavior.double()
    ref_leaf = logp.double().clone().requires_grad_()
    if c.bypass and c.loss_type == "reinforce":
        anchor = ref_leaf.detach()
    ref = ref_loss(ref_leaf, anchor, adv.double()[:, None].expand_as(mask), mask, weight, mask.sum().double())
    ref.backward()
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(leaf.grad.double(), ref_leaf.grad, rtol=1e-5, atol=1e-6)
    assert 0.0 <= float(stats["rollout_corr/masked_fraction"]) <= 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_correction_is_the_unweighted_kernel_bit_for_bit(backend):
    """rollout_correction=None runs the kernel variant without a weight; a weight of exactly 1 gives the same
    bits, and so does the "off" preset: the Arise loss is untouched."""
    logp, _, behavior, adv, mask = batch(seed=3)
    results = []
    for kwargs in ({}, {"rollout_correction": "off"}, {"rollout_is_weights": torch.ones_like(logp)}):
        leaf = logp.clone().requires_grad_()
        loss, _ = filtered_dual_clip_loss(leaf, behavior, adv, mask, backend=backend, **kwargs)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "name",
    [
        "off",
        "decoupled_seq_is",
        "decoupled_token_icepop",
        "decoupled_k3_rs_token_tis",
        "bypass_ppo_clip_k3_rs",
        "bypass_pg_geo_rs_seq_tis",
        "bypass_pg_token_icepop",
    ],
)
@pytest.mark.parametrize("chunk_size", [3, 7, 64])
def test_fused_path_equals_the_token_level_loss(name, chunk_size, dtype, backend):
    """hidden -> loss in chunks (chunks that split sequences: the bypass form's sequence factors are applied when
    the sequence closes) equals token_logprobs + filtered_dual_clip_loss: loss, every gradient and every metric."""
    B, T, H, V = 4, 7, 12, 37
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(B * T, H, generator=g).to(dtype).requires_grad_()
    head = (torch.randn(V, H, generator=g) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B * T,), generator=g)
    with torch.no_grad():
        base = torch.log_softmax(hidden.float() @ head.float().T, -1).gather(1, labels[:, None])[:, 0]
    proximal = base + 0.05 * torch.randn(B * T, generator=g)
    behavior = (base + 0.2 * torch.randn(B * T, generator=g)).to(dtype)
    adv = torch.randn(B, generator=g).repeat_interleave(T)
    mask = torch.rand(B * T, generator=g) > 0.2
    c = RolloutCorrection.preset(name)
    if c is not None and c.rollout_rs and c.rollout_rs[0].endswith("k1"):
        c = RolloutCorrection.preset(name, rs_threshold="0.8_1.25")
    prox = proximal if c is not None and not c.bypass else None
    cu = torch.arange(0, B * T + 1, T)
    bias = (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_()
    loss, stats = fused_linear_policy_loss(
        hidden,
        head,
        labels,
        behavior,
        adv,
        mask,
        bias=bias,
        proximal_logprobs=prox,
        rollout_correction=c,
        cu_seqlens=cu,
        chunk_size=chunk_size,
        backend=backend,
    )
    loss.backward()
    got = (hidden.grad.float().clone(), head.grad.float().clone(), bias.grad.float().clone())
    hidden.grad = head.grad = bias.grad = None
    logits = hidden.float() @ head.float().T + bias.float()
    logp = torch.log_softmax(logits, -1).gather(1, labels[:, None])[:, 0]
    ref, ref_stats = filtered_dual_clip_loss(
        logp.view(B, T),
        behavior.view(B, T),
        adv.view(B, T),
        mask.view(B, T),
        proximal_logprobs=None if prox is None else prox.view(B, T),
        rollout_correction=c,
        backend="torch",
    )
    ref.backward()
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, ref, **tol)
    torch.testing.assert_close(got[0], hidden.grad.float(), **tol)
    torch.testing.assert_close(got[1], head.grad.float(), **tol)
    torch.testing.assert_close(got[2], bias.grad.float(), **tol)
    assert set(stats) == set(ref_stats)
    for key in stats:
        torch.testing.assert_close(stats[key], ref_stats[key], rtol=1e-3, atol=1e-3, msg=key)


def test_metrics_do_not_depend_on_the_chunking():
    """The metrics are additive partial sums: any chunk size gives the figures of one pass."""
    B, T, H, V = 3, 9, 8, 21
    g = torch.Generator().manual_seed(5)
    hidden, head = torch.randn(B * T, H, generator=g), torch.randn(V, H, generator=g)
    labels = torch.randint(0, V, (B * T,), generator=g)
    behavior = -torch.rand(B * T, generator=g) * 4
    adv, mask = torch.randn(B * T, generator=g), torch.rand(B * T, generator=g) > 0.3
    cu = torch.arange(0, B * T + 1, T)
    runs = [
        fused_linear_policy_loss(hidden, head, labels, behavior, adv, mask, cu_seqlens=cu, chunk_size=size)[1]
        for size in (1, 4, 27)
    ]
    for stats in runs[1:]:
        for key, value in runs[0].items():
            torch.testing.assert_close(stats[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_hand_worked_weights_and_metrics():
    """Two sequences worked out by hand: lr = [ln 2, ln 3] and [ln 0.25]; sequence TIS at 2.0, token IcePop."""
    train = torch.tensor([[math.log(2), math.log(3)], [math.log(0.25), 0.0]])
    behavior = torch.zeros(2, 2)
    mask = torch.tensor([[True, True], [True, False]])
    seq = torch.tensor([0, 0, 1, 1])
    seq_tis = RolloutCorrection.preset("decoupled_seq_is")  # product 6 -> 2.0; 0.25 stays
    weight, _ = correction_weights((train - behavior).reshape(-1), mask.reshape(-1), seq_tis, seq, 2)
    torch.testing.assert_close(weight, torch.tensor([2.0, 2.0, 0.25, 0.0]))
    icepop = RolloutCorrection.preset("decoupled_token_icepop")  # band [0.5, 5]: 2, 3 kept, 0.25 zeroed
    weight, _ = correction_weights((train - behavior).reshape(-1), mask.reshape(-1), icepop, seq, 2)
    torch.testing.assert_close(weight, torch.tensor([2.0, 3.0, 0.0, 0.0]))
    logp = train.clone().requires_grad_()
    _, stats = filtered_dual_clip_loss(logp, behavior, torch.ones(2), mask, rollout_correction="bypass_pg_is")
    # kl = mean(behavior - train) over 3 tokens = -(ln 2 + ln 3 + ln 0.25) / 3 = -ln(1.5) / 3
    torch.testing.assert_close(stats["rollout_corr/kl"], torch.tensor(-math.log(1.5) / 3), rtol=1e-6, atol=1e-6)
    # ratio min / max / mean over tokens: 0.25, 3, (2 + 3 + 0.25) / 3
    torch.testing.assert_close(stats["rollout_corr/ratio_min"], torch.tensor(0.25))
    torch.testing.assert_close(stats["rollout_corr/ratio_max"], torch.tensor(3.0))
    torch.testing.assert_close(stats["rollout_corr/ratio_mean"], torch.tensor(1.75), rtol=1e-6, atol=1e-6)
    # sequence IS weights 6 -> 2 (truncated), 0.25: the weight mean over 3 tokens is (2 + 2 + 0.25) / 3
    torch.testing.assert_close(stats["rollout_corr/rollout_is_mean"], torch.tensor(4.25 / 3), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(stats["rollout_corr/truncated_fraction"], torch.tensor(2 / 3), rtol=1e-6, atol=1e-6)
    # chi2_seq = mean over sequences of (prod rho)^2 - 1 = (36 + 0.0625) / 2 - 1
    torch.testing.assert_close(stats["rollout_corr/chi2_seq"], torch.tensor(36.0625 / 2 - 1), rtol=1e-5, atol=1e-5)


def test_chunks_and_the_sequences_that_close_in_them_hand_worked():
    from rwcore.kernels.fused_linear_policy_loss import _OpenSequence

    assert [(s.start, s.stop) for s in _chunks(10, 4)] == [(0, 4), (4, 8), (8, 10)]
    # sequences of 3, 5, 1, 1 rows: chunk [0, 4) closes the first (ends at 3), [4, 8) closes none (the second ends
    # at 8 = its end: closes), [8, 10) closes both short ones
    boundaries = [0, 3, 8, 9, 10]
    assert [_OpenSequence.closed_end(boundaries, s) for s in _chunks(10, 4)] == [3, 8, 10]
    # one long sequence across three chunks closes only in the last
    assert [_OpenSequence.closed_end([0, 10], s) for s in _chunks(10, 4)] == [0, 4, 10]


def test_merge_metrics_takes_extremes_and_weighted_means():
    merged = merge_metrics(
        [{"a_min": 1.0, "a_max": 2.0, "kl": 1.0}, {"a_min": 0.5, "a_max": 3.0, "kl": 4.0}], [1.0, 2.0]
    )
    assert merged == {"a_min": 0.5, "a_max": 3.0, "kl": 3.0}


# --------------------------------------------------------------------------- bad input


def test_bad_corrections_name_the_argument():
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        RolloutCorrection.from_verl(rollout_is="token", rollout_is_threshold=-1.0)
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        RolloutCorrection.from_verl(rollout_is="token", rollout_is_threshold="2_0.5")
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        RolloutCorrection.from_verl(rollout_is="token", rollout_is_threshold="abc")
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        RolloutCorrection.from_verl(rollout_rs="seq_mean_k3")
    with pytest.raises(ValueError, match="rollout_rs_threshold for seq_mean_k3"):
        RolloutCorrection.from_verl(rollout_rs="seq_mean_k3", rollout_rs_threshold="0.1_0.2")
    with pytest.raises(ValueError, match="rollout_rs has unknown"):
        RolloutCorrection.from_verl(rollout_rs="seq_median_k3", rollout_rs_threshold=0.1)
    with pytest.raises(ValueError, match="rollout_is must be"):
        RolloutCorrection(rollout_is="batch")
    with pytest.raises(ValueError, match="rollout_is_batch_normalize"):
        RolloutCorrection.from_verl(rollout_is="token", rollout_is_batch_normalize=True)
    with pytest.raises(ValueError, match="unknown rollout correction"):
        RolloutCorrection.preset("decoupled_everything")
    with pytest.raises(ValueError, match="reinforce"):
        RolloutCorrection(loss_type="reinforce")


def test_bad_calls_name_the_argument_and_compute_nothing():
    logp, proximal, behavior, adv, mask = batch()
    leaf = logp.clone().requires_grad_()
    cases = [
        (dict(rollout_correction="decoupled_token_is"), "proximal_logprobs"),
        (dict(rollout_correction="bypass_pg_is", proximal_logprobs=proximal), "drop proximal_logprobs"),
        (dict(rollout_correction="decoupled_token_is", proximal_logprobs=proximal[:, :3]), "proximal_logprobs"),
        (dict(rollout_is_weights=-torch.ones_like(logp)), "rollout_is_weights"),
        (dict(rollout_correction=3), "rollout_correction"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            filtered_dual_clip_loss(leaf, behavior, adv, mask, **kwargs)
    nan_behavior = behavior.clone()
    nan_behavior[2, 3] = float("nan")
    with pytest.raises(ValueError, match="behavior_logprobs"):
        filtered_dual_clip_loss(leaf, nan_behavior, adv, mask, rollout_correction="bypass_ppo_clip_k3_rs")
    inf_behavior = behavior.clone()
    inf_behavior[1, 0] = float("-inf")
    with pytest.raises(ValueError, match="behavior_logprobs"):
        filtered_dual_clip_loss(leaf, inf_behavior, adv, mask)
    assert leaf.grad is None

    N, H, V = 12, 4, 9
    hidden, head = torch.randn(N, H, requires_grad=True), torch.randn(V, H, requires_grad=True)
    labels, flat = torch.randint(0, V, (N,)), torch.zeros(N)
    args = (hidden, head, labels, flat - 1.0, flat, torch.ones(N, dtype=torch.bool))
    with pytest.raises(ValueError, match="cu_seqlens"):
        fused_linear_policy_loss(*args, rollout_correction="bypass_pg_is")
    with pytest.raises(ValueError, match="cu_seqlens"):
        fused_linear_policy_loss(*args, rollout_correction="bypass_pg_is", cu_seqlens=torch.tensor([0, 5, 11]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        fused_linear_policy_loss(*args, cu_seqlens=torch.tensor([0, 7, 5, 12]))
    with pytest.raises(ValueError, match="proximal_logprobs"):
        fused_linear_policy_loss(*args, rollout_correction="decoupled_token_is")
    assert hidden.grad is None and head.grad is None


def test_all_masked_batch_gives_zero_loss_and_finite_metrics():
    logp, proximal, behavior, adv, _ = batch()
    mask = torch.zeros_like(logp, dtype=torch.bool)
    leaf = logp.clone().requires_grad_()
    loss, stats = filtered_dual_clip_loss(
        leaf, behavior, adv, mask, proximal_logprobs=proximal, rollout_correction="decoupled_geo_rs_seq_tis"
    )
    loss.backward()
    assert float(loss) == 0.0 and torch.equal(leaf.grad, torch.zeros_like(leaf.grad))
    assert all(math.isfinite(float(v)) for v in stats.values())


def test_module_wrappers_take_the_correction():
    from rwcore.kernels import FilteredDualClipLoss, FusedLinearPolicyLoss

    with pytest.raises(ValueError, match="unknown rollout correction"):
        FilteredDualClipLoss(rollout_correction="decoupled_everything")
    logp, proximal, behavior, adv, mask = batch(seed=9)
    module = FilteredDualClipLoss(rollout_correction="decoupled_seq_is")
    got, stats = module(logp, behavior, adv, mask, proximal_logprobs=proximal)
    want, _ = filtered_dual_clip_loss(
        logp, behavior, adv, mask, proximal_logprobs=proximal, rollout_correction="decoupled_seq_is"
    )
    assert torch.equal(got, want) and "rollout_corr/rollout_is_mean" in stats
    B, T, H, V = 2, 5, 4, 11
    hidden, head = torch.randn(B * T, H), torch.randn(V, H)
    labels = torch.randint(0, V, (B * T,))
    args = (hidden, head, labels, -torch.rand(B * T), torch.randn(B * T), torch.ones(B * T, dtype=torch.bool))
    cu = torch.tensor([0, T, 2 * T])
    fused = FusedLinearPolicyLoss(rollout_correction="bypass_pg_is")
    got, _ = fused(*args, cu_seqlens=cu)
    want, _ = fused_linear_policy_loss(*args, rollout_correction="bypass_pg_is", cu_seqlens=cu)
    assert torch.equal(got, want)


def test_truncation_without_bounds_is_the_raw_ratio():
    c = RolloutCorrection(rollout_is="token", is_threshold=None)
    weight, _ = correction_weights(
        torch.tensor([0.1, -0.2, 30.0]), torch.tensor([True, True, True]), c, torch.tensor([0, 0, 0]), 1
    )
    torch.testing.assert_close(weight, torch.exp(torch.tensor([0.1, -0.2, 20.0])))


@pytest.mark.parametrize("bounds", [(1.0, 5.0), (0.5, 1.0), (0.5, 5.0)])
def test_the_reinforce_form_keeps_every_token_whatever_the_filter_bounds(bounds):
    """Ratio 1 by construction: the REINFORCE form's gradient is -A w / D on every model token, with filter bounds
    that would drop a ratio of exactly 1 too (verl's clip_ratio_low=0 gives ratio_low=1)."""
    logp, _, behavior, adv, mask = batch(seed=4)
    leaf = logp.clone().requires_grad_()
    loss, stats = filtered_dual_clip_loss(leaf, behavior, adv, mask, *bounds, 3.0, rollout_correction="bypass_pg_is")
    loss.backward()
    c = RolloutCorrection.preset("bypass_pg_is")
    weight = ref_weights(logp.double().tolist(), behavior.double().tolist(), mask.tolist(), c)
    expected = -adv.double()[:, None] * weight / mask.sum()
    torch.testing.assert_close(leaf.grad.double(), torch.where(mask, expected, 0.0), rtol=1e-5, atol=1e-7)
    assert float(stats["kept_fraction"]) == 1.0
