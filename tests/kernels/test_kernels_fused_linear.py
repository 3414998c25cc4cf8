"""rwcore.kernels.fused_linear_logprobs / fused_linear_policy_loss vs float64 references
computed on materialized logits (docs/kernels.md "What the kernels compute": the fused-linear form
and the filtered dual-clip policy loss)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math  # E402

import pytest  # E402
from kernel_reference import (  # E402
    STAT_KEYS,
    assert_close64,
    assert_lowp_criterion,
    log_ratio_margin,
    lowp_fused_linear_logprobs,
    lowp_fused_linear_policy_loss,
    ref_fused_linear_logprobs,
    ref_fused_linear_policy_loss,
    ref_token_logprobs,
    row_scale,
)

from rwcore.kernels import (  # E402
    FusedLinearPolicyLoss,
    filtered_dual_clip_loss,
    fused_linear_logprobs,
    fused_linear_policy_loss,
    token_logprobs,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = ["torch", "triton"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
CHUNKS = [1, 3, 64, None]  # 64 > N: a single chunk
CHUNK_IDS = ["chunk1", "chunk3", "chunk64", "chunkNone"]
# (N, H, V, temperature, with_bias)
CONFIGS = [
    (1, 8, 5, 1.0, False),
    (7, 24, 131, 0.7, True),
    (13, 8, 257, 1.9, True),
    (3, 8, 4099, 0.7, True),  # vocabulary wider than one block
]
CONFIG_IDS = [f"N{c[0]}-H{c[1]}-V{c[2]}-T{c[3]}-{'bias' if c[4] else 'nobias'}" for c in CONFIGS]


def make_linear(N, H, V, dtype, with_bias, seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=gen)
    W = torch.randn(V, H, generator=gen) * 0.5
    b = torch.randn(V, generator=gen) * 0.5 if with_bias else None
    labels = torch.randint(0, V, (N,), generator=gen)
    if N >= 3:
        labels[2::3] = -100
    if N >= 2:
        labels[1] = V - 1
    cast = lambda t: None if t is None else t.to(dtype).to(DEVICE)  # noqa: E731
    return cast(h), cast(W), cast(b), labels.to(DEVICE), gen


def leaves_of(h, W, b):
    h = h.detach().clone().requires_grad_(True)
    W = W.detach().clone().requires_grad_(True)
    b = None if b is None else b.detach().clone().requires_grad_(True)
    return h, W, b


def grads_of(out, h, W, b, grad_out=None):
    leaves = [h, W] + ([b] if b is not None else [])
    gs = torch.autograd.grad([out], leaves, None if grad_out is None else [grad_out])
    return gs[0], gs[1], (gs[2] if b is not None else None)


def check_grads(got, ref, lowp, dtype, params, what):
    for name, g, r, lp, p in zip(("d hidden", "d weight", "d bias"), got, ref, lowp, params):
        if p is None:
            continue
        assert g is not None and g.dtype == p.dtype and g.shape == p.shape, f"{what}: {name} dtype/shape"
        if dtype == torch.float32:
            assert_close64(g, r, f"{what}: {name}", rtol=1e-4, atol_rel=1e-5)
        else:
            assert_lowp_criterion(g, r, lp, f"{what}: {name}")


# ----------------------------------------------------------------------------
# fused_linear_logprobs
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk_size", CHUNKS, ids=CHUNK_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N,H,V,T,with_bias", CONFIGS, ids=CONFIG_IDS)
def test_fused_linear_logprobs(N, H, V, T, with_bias, dtype, chunk_size, backend):
    h0, W0, b0, labels, gen = make_linear(N, H, V, dtype, with_bias, seed=N * 1000 + V)
    g = torch.randn(N, generator=gen).to(DEVICE)
    h, W, b = leaves_of(h0, W0, b0)
    logp = fused_linear_logprobs(h, W, labels, bias=b, temperature=T, chunk_size=chunk_size, backend=backend)
    assert logp.dtype == torch.float32 and logp.shape == (N,)
    got = grads_of(logp, h, W, b, g)
    ref_logp, ref = ref_fused_linear_logprobs(h0, W0, labels, g, b0, T)
    assert (logp[labels == -100] == 0).all(), "logp at ignore_index rows must be exactly 0"
    what = f"{dtype} chunk={chunk_size} backend={backend}"
    if dtype == torch.float32:
        assert_close64(
            logp, ref_logp, f"{what}: logp", rtol=1e-5, atol_rel=1e-5, scale=row_scale(ref_logits(h0, W0, b0), T)
        )
        lowp = (None, None, None)
    else:
        lp_logp, lowp = lowp_fused_linear_logprobs(h0, W0, labels, g, b0, T)
        assert_lowp_criterion(logp, ref_logp, lp_logp, f"{what}: logp", in_dtype=dtype)
    check_grads(got, ref, lowp, dtype, (h0, W0, b0), what)
    # rows with ignore_index contribute nothing: d hidden is exactly 0 there
    assert (got[0][labels == -100] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_linear_logprobs_all_ignored(backend):
    h0, W0, b0, labels, gen = make_linear(5, 8, 33, torch.float32, True, seed=5)
    labels = torch.full_like(labels, -100)
    h, W, b = leaves_of(h0, W0, b0)
    logp = fused_linear_logprobs(h, W, labels, bias=b, temperature=0.7, chunk_size=2, backend=backend)
    assert (logp == 0).all()
    for name, gr in zip(("hidden", "weight", "bias"), grads_of(logp, h, W, b, torch.randn(5).to(DEVICE))):
        assert (gr == 0).all(), f"d {name} must be exactly 0 when every label is ignored"


# ----------------------------------------------------------------------------
# fused_linear_policy_loss
# ----------------------------------------------------------------------------
def make_policy(N, H, V, dtype, with_bias, seed, margin=0.2):
    """Behaviour log-probs = reference logp - log-ratio, log-ratios at least `margin` away from
    log 0.5, log 5 and log 3 so that low-precision logits cannot flip a token's branch."""
    h, W, b, labels, gen = make_linear(N, H, V, dtype, with_bias, seed)
    mask = labels != -100
    if N >= 4:
        mask[3] = False  # a masked row with a valid label
    bounds = torch.tensor([math.log(0.5), math.log(5.0), math.log(3.0)])
    lr = torch.empty(N)
    for i in range(N):
        while True:
            v = float(torch.rand((), generator=gen) * 5 - 2.5)
            if float((v - bounds).abs().min()) > margin:
                break
        lr[i] = v
    adv = torch.randn(N, generator=gen)
    if N >= 3:
        adv[0], adv[-1] = abs(adv[0]) + 0.1, -abs(adv[-1]) - 0.1
    return h, W, b, labels, lr, adv.to(DEVICE), mask.to(DEVICE)


def ref_logits(h, W, b):
    z = h.double() @ W.double().T
    return z if b is None else z + b.double()


def behaviour_for(h, W, b, labels, lr, T):
    logp, _ = ref_token_logprobs(ref_logits(h, W, b), labels, T)
    return (logp.cpu() - lr.double()).float().to(DEVICE)


def check_policy(loss, stats, got_grads, ref, ref_grads, lowp, dtype, params, what):
    loss = loss.detach()
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.dtype == torch.float32
    assert math.isfinite(float(loss.detach()))
    if dtype == torch.float32:
        scale = max(1.0, abs(ref["loss"]))
        assert float(loss.detach()) == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6 * scale), (
            f"{what}: loss {float(loss.detach())!r} vs reference {ref['loss']!r}"
        )
    else:
        lp_loss, lp_mean_ratio, _ = lowp
        assert_lowp_criterion(
            loss, torch.tensor(ref["loss"], dtype=torch.float64), lp_loss, f"{what}: loss", in_dtype=dtype
        )
    for k in STAT_KEYS:
        assert k in stats, f"stats missing {k!r}"
        v = stats[k]
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad, f"stats[{k!r}]"
        if k != "mean_ratio":
            assert float(v) == pytest.approx(ref["stats"][k], abs=1e-6), (
                f"{what}: stats[{k!r}] {float(v)} vs {ref['stats'][k]}"
            )
        elif dtype == torch.float32:
            assert float(v) == pytest.approx(ref["stats"][k], rel=1e-5), (
                f"{what}: mean_ratio {float(v)} vs {ref['stats'][k]}"
            )
        else:
            assert_lowp_criterion(
                v, torch.tensor(ref["stats"][k], dtype=torch.float64), lowp[1], f"{what}: mean_ratio", in_dtype=dtype
            )
    check_grads(got_grads, ref_grads, lowp[2] if lowp else (None,) * 3, dtype, params, what)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk_size", CHUNKS, ids=CHUNK_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N,H,V,T,with_bias", CONFIGS, ids=CONFIG_IDS)
def test_fused_linear_policy_loss(N, H, V, T, with_bias, dtype, chunk_size, backend):
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, dtype, with_bias, seed=N * 1000 + V + 1)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    h, W, b = leaves_of(h0, W0, b0)
    loss, stats = fused_linear_policy_loss(
        h, W, labels, beh, adv, mask, bias=b, temperature=T, chunk_size=chunk_size, backend=backend
    )
    got = grads_of(loss, h, W, b)
    ref, ref_grads = ref_fused_linear_policy_loss(h0, W0, labels, beh, adv, mask, b0, T)
    assert log_ratio_margin(torch.where(ref["model"], ref["log_ratio"], torch.zeros_like(ref["log_ratio"]))) > 0.1
    assert int(ref["keep"].sum()) > 0
    lowp = None
    if dtype != torch.float32:
        lowp = lowp_fused_linear_policy_loss(h0, W0, labels, beh, adv, mask, b0, T)
    check_policy(
        loss, stats, got, ref, ref_grads, lowp, dtype, (h0, W0, b0), f"{dtype} chunk={chunk_size} backend={backend}"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_fused_equals_unfused(with_bias, backend):
    """fused_linear_policy_loss == filtered_dual_clip_loss(token_logprobs(h @ W.T + b), ...)."""
    N, H, V, T = 13, 24, 131, 0.7
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, torch.float32, with_bias, seed=77)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    kw = dict(ratio_low=0.5, ratio_high=5.0, clip_c=3.0)

    h, W, b = leaves_of(h0, W0, b0)
    loss_f, stats_f = fused_linear_policy_loss(
        h, W, labels, beh, adv, mask, bias=b, temperature=T, chunk_size=3, backend=backend, **kw
    )
    g_f = grads_of(loss_f, h, W, b)

    h, W, b = leaves_of(h0, W0, b0)
    z = h @ W.T + (b if b is not None else 0)
    logp = token_logprobs(z, labels, temperature=T, backend=backend)
    loss_u, stats_u = filtered_dual_clip_loss(
        logp.view(1, N), beh.view(1, N), adv.view(1, N), mask.view(1, N), backend=backend, **kw
    )
    g_u = grads_of(loss_u, h, W, b)

    assert float(loss_f.detach()) == pytest.approx(float(loss_u.detach()), rel=1e-5, abs=1e-7)
    for k in STAT_KEYS:
        assert float(stats_f[k]) == pytest.approx(float(stats_u[k]), rel=1e-5, abs=1e-7), k
    for name, a, c in zip(("hidden", "weight", "bias"), g_f, g_u):
        if a is not None:
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-6, msg=lambda m: f"d {name}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["nothing_kept", "no_model_tokens"])
def test_fused_policy_loss_zero_cases(case, backend):
    N, H, V, T = 7, 8, 33, 1.0
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, torch.float32, True, seed=88)
    if case == "nothing_kept":
        lr = torch.where(torch.arange(N) % 2 == 0, torch.full((N,), 2.5), torch.full((N,), -2.5))
    else:
        mask = torch.zeros_like(mask)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    h, W, b = leaves_of(h0, W0, b0)
    loss, stats = fused_linear_policy_loss(
        h, W, labels, beh, adv, mask, bias=b, temperature=T, chunk_size=3, backend=backend
    )
    assert float(loss.detach()) == 0.0 and not math.isnan(float(loss.detach()))
    assert loss.requires_grad, "loss must stay differentiable (zero gradient) when nothing is kept"
    loss.backward()
    for name, p in (("hidden", h), ("weight", W), ("bias", b)):
        assert p.grad is not None and (p.grad == 0).all() and not torch.isnan(p.grad).any(), (
            f"d {name} must be exactly 0 ({case})"
        )
    ref, _ = ref_fused_linear_policy_loss(h0, W0, labels, beh, adv, mask, b0, T)
    for k in STAT_KEYS:
        assert float(stats[k]) == pytest.approx(ref["stats"][k], rel=1e-5, abs=1e-7), k
    if case == "no_model_tokens":
        assert all(float(stats[k]) == 0.0 for k in STAT_KEYS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_policy_loss_num_model_tokens(backend):
    N, H, V, T = 13, 8, 33, 1.9
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, torch.float32, False, seed=99)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    glob = 3 * int(mask.sum()) + 1
    h, W, b = leaves_of(h0, W0, b0)
    loss, stats = fused_linear_policy_loss(
        h, W, labels, beh, adv, mask, temperature=T, num_model_tokens=glob, chunk_size=3, backend=backend
    )
    got = grads_of(loss, h, W, None)
    ref, ref_grads = ref_fused_linear_policy_loss(h0, W0, labels, beh, adv, mask, None, T, num_model_tokens=glob)
    assert ref["loss"] != 0.0
    check_policy(
        loss,
        stats,
        got,
        ref,
        ref_grads,
        None,
        torch.float32,
        (h0, W0, None),
        f"num_model_tokens={glob} backend={backend}",
    )


def test_module_wrapper_matches_functional():
    N, H, V, T = 7, 24, 131, 0.7
    kw = dict(ratio_low=0.4, ratio_high=6.0, clip_c=2.5)
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, torch.float32, True, seed=111)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    mod = FusedLinearPolicyLoss(temperature=T, **kw)
    assert isinstance(mod, torch.nn.Module)
    h, W, b = leaves_of(h0, W0, b0)
    loss_m, stats_m = mod(h, W, labels, beh, adv, mask, bias=b)
    g_m = grads_of(loss_m, h, W, b)
    h, W, b = leaves_of(h0, W0, b0)
    loss_f, stats_f = fused_linear_policy_loss(h, W, labels, beh, adv, mask, bias=b, temperature=T, **kw)
    g_f = grads_of(loss_f, h, W, b)
    assert float(loss_m.detach()) == pytest.approx(float(loss_f.detach()), rel=1e-6, abs=1e-8)
    for k in STAT_KEYS:
        assert float(stats_m[k]) == pytest.approx(float(stats_f[k]), rel=1e-6, abs=1e-8), k
    for a, c in zip(g_m, g_f):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)
    ref, _ = ref_fused_linear_policy_loss(h0, W0, labels, beh, adv, mask, b0, T, **kw)
    assert float(loss_m.detach()) == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_hidden_and_weight(backend):
    """hidden as a column slice of a wider buffer, weight stored transposed ([H, V] storage)."""
    N, H, V, T = 7, 8, 131, 0.7
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, torch.float32, True, seed=121)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    wide = torch.cat([h0, torch.randn(N, 5, device=DEVICE)], dim=1)
    h = wide[:, :H].detach().requires_grad_(True)
    W = W0.T.contiguous().T.detach().requires_grad_(True)
    b = b0.detach().clone().requires_grad_(True)
    assert not h.is_contiguous() and not W.is_contiguous()
    g = torch.randn(N).to(DEVICE)
    logp = fused_linear_logprobs(h, W, labels, bias=b, temperature=T, chunk_size=3, backend=backend)
    ref_logp, ref = ref_fused_linear_logprobs(h0, W0, labels, g, b0, T)
    assert_close64(logp, ref_logp, "logp", rtol=1e-5, atol_rel=1e-5, scale=row_scale(ref_logits(h0, W0, b0), T))
    check_grads(grads_of(logp, h, W, b, g), ref, (None,) * 3, torch.float32, (h0, W0, b0), "logprobs")
    loss, stats = fused_linear_policy_loss(
        h, W, labels, beh, adv, mask, bias=b, temperature=T, chunk_size=3, backend=backend
    )
    ref, ref_grads = ref_fused_linear_policy_loss(h0, W0, labels, beh, adv, mask, b0, T)
    check_policy(
        loss,
        stats,
        grads_of(loss, h, W, b),
        ref,
        ref_grads,
        None,
        torch.float32,
        (h0, W0, b0),
        f"non-contiguous backend={backend}",
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_repeated_calls_are_bitwise_identical(dtype, backend):
    """docs/design.md "Every run is reproducible from its seed": same inputs, same bits."""
    N, H, V, T = 13, 24, 131, 0.7
    h0, W0, b0, labels, lr, adv, mask = make_policy(N, H, V, dtype, True, seed=131)
    beh = behaviour_for(h0, W0, b0, labels, lr, T)
    outs = []
    for _ in range(2):
        h, W, b = leaves_of(h0, W0, b0)
        loss, stats = fused_linear_policy_loss(
            h, W, labels, beh, adv, mask, bias=b, temperature=T, chunk_size=3, backend=backend
        )
        outs.append([loss.detach()] + [stats[k] for k in STAT_KEYS] + list(grads_of(loss, h, W, b)))
    for a, c in zip(*outs):
        assert torch.equal(a, c)
