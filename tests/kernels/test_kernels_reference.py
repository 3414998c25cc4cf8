"""Sanity checks of the float64 references in kernel_reference.py (they do not
touch rwcore.kernels): hand-worked values, torch.log_softmax, float64 autograd."""

import math

import pytest
import torch
from kernel_reference import (
    STAT_KEYS,
    ref_dual_clip,
    ref_fused_linear_logprobs,
    ref_fused_linear_policy_loss,
    ref_token_logprobs,
    ref_token_logprobs_grad,
)

F64 = torch.float64


# ----------------------------------------------------------------------------
# token log-probs
# ----------------------------------------------------------------------------
def test_token_logprobs_hand_values():
    # z = [0, ln2, ln3] -> p = [1/6, 2/6, 3/6]
    z = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]] * 2, dtype=F64)
    labels = torch.tensor([2, -100])
    logp, ent = ref_token_logprobs(z, labels)
    H = -(1 / 6 * math.log(1 / 6) + 2 / 6 * math.log(2 / 6) + 3 / 6 * math.log(3 / 6))
    assert logp[0].item() == pytest.approx(math.log(0.5), abs=1e-15)
    assert logp[1].item() == 0.0
    assert ent.tolist() == pytest.approx([H, H], abs=1e-15)

    # temperature 2: exp(z/2) = [1, sqrt2, sqrt3]
    logp, ent = ref_token_logprobs(z, torch.tensor([0, 1]), temperature=2.0)
    zs = 1 + math.sqrt(2) + math.sqrt(3)
    p = [1 / zs, math.sqrt(2) / zs, math.sqrt(3) / zs]
    assert logp.tolist() == pytest.approx([math.log(p[0]), math.log(p[1])], abs=1e-15)
    assert ent[0].item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-15)

    # uniform row: logp = -log V, entropy = log V; huge shift does not matter
    z = torch.full((1, 7), 1234.5, dtype=F64)
    logp, ent = ref_token_logprobs(z, torch.tensor([3]))
    assert logp.item() == pytest.approx(-math.log(7), abs=1e-13)
    assert ent.item() == pytest.approx(math.log(7), abs=1e-13)

    # hand-worked gradient for p = [1/6, 2/6, 3/6], label 2, upstream 1:
    # d logp / d z = onehot - p
    z = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]], dtype=F64)
    g = ref_token_logprobs_grad(z, torch.tensor([2]), 1.0, torch.ones(1, dtype=F64))
    assert g[0].tolist() == pytest.approx([-1 / 6, -2 / 6, 1 - 3 / 6], abs=1e-15)


@pytest.mark.parametrize("shape,V,T", [((7,), 33, 1.0), ((3, 5), 131, 0.7), ((1,), 5, 1.9)])
def test_token_logprobs_matches_torch_and_autograd(shape, V, T):
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(*shape, V, generator=gen, dtype=F64) * 4
    labels = torch.randint(0, V, shape, generator=gen)
    labels.view(-1)[::3] = -100
    logp, ent = ref_token_logprobs(z, labels, T)

    x = z.clone().requires_grad_(True)
    lsm = torch.log_softmax(x / T, -1)
    valid = labels != -100
    tl = torch.where(valid, lsm.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1), 0.0)
    te = -(lsm.exp() * lsm).sum(-1)
    torch.testing.assert_close(logp, tl.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, te.detach(), rtol=0, atol=1e-12)

    g1 = torch.randn(shape, generator=gen, dtype=F64)
    g2 = torch.randn(shape, generator=gen, dtype=F64)
    (ga,) = torch.autograd.grad([tl, te], [x], [g1, g2], retain_graph=True)
    gr = ref_token_logprobs_grad(z, labels, T, g1, g2)
    torch.testing.assert_close(gr, ga, rtol=0, atol=1e-12)
    (ga1,) = torch.autograd.grad([tl], [x], [g1])
    gr1 = ref_token_logprobs_grad(z, labels, T, g1)
    torch.testing.assert_close(gr1, ga1, rtol=0, atol=1e-12)
    assert (gr1[~valid] == 0).all()


# ----------------------------------------------------------------------------
# filtered dual-clip loss
# ----------------------------------------------------------------------------
def test_dual_clip_hand_values():
    # w = [1, 2, 4, 10]  -> 10 filtered high; D = 4
    lr = torch.tensor([[0.0, math.log(2), math.log(4), math.log(10)]], dtype=F64)
    beh = torch.full_like(lr, -2.0)
    logp = beh + lr
    m = torch.ones_like(lr, dtype=torch.bool)

    r = ref_dual_clip(logp, beh, torch.tensor([1.0], dtype=F64), m)
    assert r["loss"] == pytest.approx(-(1 + 2 + 4) / 4, abs=1e-14)
    assert r["grad"][0].tolist() == pytest.approx([-1 / 4, -2 / 4, -4 / 4, 0.0], abs=1e-14)
    assert r["stats"] == pytest.approx(
        dict(
            kept_fraction=0.75,
            filtered_low_fraction=0.0,
            filtered_high_fraction=0.25,
            dual_clipped_fraction=0.0,
            mean_ratio=17 / 4,
        ),
        abs=1e-14,
    )

    # A = -1: min(w, 3|A|) = [1, 2, 3 (clipped), -] ; clipped token has zero gradient
    r = ref_dual_clip(logp, beh, torch.tensor([-1.0], dtype=F64), m)
    assert r["loss"] == pytest.approx((1 + 2 + 3) / 4, abs=1e-14)
    assert r["grad"][0].tolist() == pytest.approx([1 / 4, 2 / 4, 0.0, 0.0], abs=1e-14)
    assert r["stats"]["dual_clipped_fraction"] == 0.25

    # A = -2, w = 0.25 (filtered low), per-token advantages, mask drops token 1
    lr2 = torch.tensor([[math.log(0.25), 0.0, math.log(2)]], dtype=F64)
    A2 = torch.tensor([[-2.0, 5.0, -2.0]], dtype=F64)
    m2 = torch.tensor([[1, 0, 1]])
    r = ref_dual_clip(lr2, torch.zeros_like(lr2), A2, m2, num_model_tokens=8)
    assert r["loss"] == pytest.approx(2 * 2 / 8, abs=1e-14)
    assert r["grad"][0].tolist() == pytest.approx([0.0, 0.0, 2 * 2 / 8], abs=1e-14)
    assert r["stats"] == pytest.approx(
        dict(
            kept_fraction=0.5,
            filtered_low_fraction=0.5,
            filtered_high_fraction=0.0,
            dual_clipped_fraction=0.0,
            mean_ratio=(0.25 + 2) / 2,
        ),
        abs=1e-14,
    )


def test_dual_clip_degenerate_and_extreme():
    lr = torch.tensor([[3.0, -3.0, 100.0, -100.0]], dtype=F64)
    m = torch.ones_like(lr, dtype=torch.bool)
    r = ref_dual_clip(lr, torch.zeros_like(lr), torch.tensor([1.0], dtype=F64), m)
    assert r["loss"] == 0.0 and (r["grad"] == 0).all()
    assert r["stats"]["kept_fraction"] == 0.0
    assert r["stats"]["filtered_high_fraction"] == 0.5 and r["stats"]["filtered_low_fraction"] == 0.5
    assert r["stats"]["mean_ratio"] == pytest.approx((math.e**3 + math.e**-3 + math.e**20 + math.e**-20) / 4)
    r = ref_dual_clip(lr, torch.zeros_like(lr), torch.tensor([1.0], dtype=F64), ~m)
    assert r["loss"] == 0.0 and (r["grad"] == 0).all()
    assert all(r["stats"][k] == 0.0 for k in STAT_KEYS)


def test_dual_clip_grad_matches_autograd():
    gen = torch.Generator().manual_seed(5)
    B, T = 3, 13
    beh = -torch.rand(B, T, generator=gen, dtype=F64) * 3
    lr = torch.rand(B, T, generator=gen, dtype=F64) * 4 - 1.5
    A = torch.randn(B, generator=gen, dtype=F64)
    m = torch.rand(B, T, generator=gen) < 0.7
    logp = (beh + lr).requires_grad_(True)
    r = ref_dual_clip(logp, beh, A, m, num_model_tokens=50)
    # autograd of the literal eq. 19 with the mask held fixed
    w = torch.exp(logp - beh)
    keep = (m & (w > 0.5) & (w < 5.0)).detach()
    loss = (keep * torch.minimum(-w * A[:, None], 3.0 * A.abs()[:, None])).sum() / 50
    (g,) = torch.autograd.grad(loss, logp)
    assert r["loss"] == pytest.approx(loss.item(), abs=1e-14)
    torch.testing.assert_close(r["grad"], g, rtol=0, atol=1e-14)


# ----------------------------------------------------------------------------
# fused linear
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_linear_refs_match_autograd(with_bias):
    gen = torch.Generator().manual_seed(11)
    N, H, V, Tmp = 7, 8, 33, 0.7
    h = torch.randn(N, H, generator=gen, dtype=F64).requires_grad_(True)
    W = torch.randn(V, H, generator=gen, dtype=F64).requires_grad_(True)
    b = torch.randn(V, generator=gen, dtype=F64).requires_grad_(True) if with_bias else None
    labels = torch.randint(0, V, (N,), generator=gen)
    labels[2] = -100
    g = torch.randn(N, generator=gen, dtype=F64)
    leaves = [h, W] + ([b] if with_bias else [])

    z = h @ W.T + (b if with_bias else 0)
    lsm = torch.log_softmax(z / Tmp, -1)
    valid = labels != -100
    logp_t = torch.where(valid, lsm.gather(-1, labels.clamp_min(0)[:, None])[:, 0], 0.0)
    ga = torch.autograd.grad(logp_t, leaves, g, retain_graph=True)
    logp, grads = ref_fused_linear_logprobs(h, W, labels, g, b, Tmp)
    torch.testing.assert_close(logp, logp_t.detach(), rtol=0, atol=1e-12)
    for a, r in zip(ga, grads):
        torch.testing.assert_close(r, a, rtol=0, atol=1e-12)

    # policy loss: autograd through logits
    beh = logp_t.detach() + torch.tensor([0.1, -0.2, 0.0, 1.3, -1.0, 0.5, 2.0], dtype=F64)
    A = torch.randn(N, generator=gen, dtype=F64)
    m = valid.clone()
    m[0] = False
    w = torch.exp(logp_t - beh)
    keep = (m & (w > 0.5) & (w < 5.0)).detach()
    loss = (keep * torch.minimum(-w * A, 3.0 * A.abs())).sum() / m.sum()
    ga = torch.autograd.grad(loss, leaves)
    r, grads = ref_fused_linear_policy_loss(h, W, labels, beh, A, m, b, Tmp)
    assert r["loss"] == pytest.approx(loss.item(), abs=1e-13)
    for a, rr in zip(ga, grads):
        torch.testing.assert_close(rr, a, rtol=0, atol=1e-12)
