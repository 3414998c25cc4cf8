"""rwcore.kernels.token_logprobs vs the float64 reference (docs/kernels.md "What the kernels compute").

Both backends are exercised: "torch" and "triton" (on a CPU through the Triton
interpreter, on CUDA natively)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # E402
from kernel_reference import (  # E402
    assert_close64,
    assert_lowp_criterion,
    lowp_token_logprobs,
    ref_token_logprobs,
    ref_token_logprobs_grad,
    row_scale,
)

from rwcore.kernels import TokenLogProbs, token_logprobs  # E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = ["torch", "triton"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
# (leading dims, V, temperature)
CASES = [
    ((1,), 5, 1.0),
    ((7,), 33, 0.7),
    ((3, 5), 131, 1.9),
    ((13,), 257, 1.0),
]


def make_inputs(lead, V, dtype, seed=0, ignore_every=4):
    """Random logits with a few stress rows, labels with -100 sprinkled in."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(*lead, V, generator=gen) * 3.0
    flat = z.view(-1, V)
    n = flat.shape[0]
    labels = torch.randint(0, V, lead, generator=gen)
    lf = labels.view(-1)
    if n >= 3:
        flat[1] += 40.0  # large common offset (stability)
        flat[2, 0] += 25.0  # very peaked row ...
        lf[2] = 0  # ... labelled with its mode (logp ~ 0)
    if n >= 4:
        lf[3] = int(torch.argmin(flat[3]))  # very unlikely label
    if n >= 6:
        lf[5] = V - 1  # last vocabulary entry
    if n >= 2:
        lf[::ignore_every] = -100  # ignored positions (row 0, 4, 8, ...)
    return z.to(dtype).to(DEVICE), labels.to(DEVICE)


def run_kernel(z, labels, T, return_entropy, backend, g_logp, g_ent, **kw):
    x = z.detach().clone().requires_grad_(True)
    out = token_logprobs(x, labels, temperature=T, return_entropy=return_entropy, backend=backend, **kw)
    if return_entropy:
        assert isinstance(out, tuple) and len(out) == 2, "return_entropy=True must return (logp, entropy)"
        logp, ent = out
        outs, gouts = [logp, ent], [g_logp, g_ent]
    else:
        assert isinstance(out, torch.Tensor), "return_entropy=False must return a tensor"
        logp, ent = out, None
        outs, gouts = [logp], [g_logp]
    (grad,) = torch.autograd.grad(outs, [x], gouts)
    return logp.detach(), (None if ent is None else ent.detach()), grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("return_entropy", [False, True], ids=["logp", "logp+entropy"])
@pytest.mark.parametrize("lead,V,T", CASES, ids=[f"{'x'.join(map(str, c[0]))}xV{c[1]}-T{c[2]}" for c in CASES])
def test_values_and_gradients(lead, V, T, return_entropy, dtype, backend):
    z, labels = make_inputs(lead, V, dtype, seed=V + len(lead))
    gen = torch.Generator().manual_seed(1)
    g_logp = torch.randn(lead, generator=gen).to(DEVICE)
    g_ent = torch.randn(lead, generator=gen).to(DEVICE) if return_entropy else None
    z_before = z.clone()

    logp, ent, grad = run_kernel(z, labels, T, return_entropy, backend, g_logp, g_ent)

    assert torch.equal(z, z_before), "input logits were modified"
    assert logp.dtype == torch.float32 and logp.shape == labels.shape and logp.device == z.device
    assert grad.dtype == dtype and grad.shape == z.shape
    if return_entropy:
        assert ent.dtype == torch.float32 and ent.shape == labels.shape

    ref_logp, ref_ent = ref_token_logprobs(z, labels, T)
    ref_grad = ref_token_logprobs_grad(z, labels, T, g_logp, g_ent)

    ignored = labels == -100
    assert (logp[ignored] == 0).all(), "logp at ignore_index positions must be exactly 0"
    if not return_entropy:
        assert (grad[ignored] == 0).all(), "ignored positions must get exactly zero gradient"

    if dtype == torch.float32:
        assert_close64(logp, ref_logp, "logp", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
        if return_entropy:
            assert_close64(ent, ref_ent, "entropy", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
        assert_close64(grad, ref_grad, "d logits", rtol=1e-4, atol_rel=1e-5)
    else:
        # docs/kernels.md: log-probs are computed in fp32 from bf16/fp16 logits -> the fp32
        # outputs must match the float64 reference (on the same low-precision values)
        # to fp32 accuracy.
        assert_close64(
            logp,
            ref_logp,
            "logp (fp32 math from low-precision logits)",
            rtol=1e-5,
            atol_rel=1e-5,
            scale=row_scale(z, T),
        )
        if return_entropy:
            assert_close64(
                ent,
                ref_ent,
                "entropy (fp32 math from low-precision logits)",
                rtol=1e-5,
                atol_rel=1e-5,
                scale=row_scale(z, T),
            )
        # and at worst 2x the error of eager PyTorch computing in the low dtype
        lp_logp, lp_ent, lp_grad = lowp_token_logprobs(z, labels, T, g_logp, g_ent)
        assert_lowp_criterion(logp, ref_logp, lp_logp, "logp", in_dtype=dtype)
        if return_entropy:
            assert_lowp_criterion(ent, ref_ent, lp_ent, "entropy", in_dtype=dtype)
        assert_lowp_criterion(grad, ref_grad, lp_grad, "d logits")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_large_vocab_multiblock(dtype, backend):
    """A vocabulary wider than any reasonable single block: the online logsumexp
    must combine several vocabulary blocks (max in a late block, label in an early one)."""
    lead, V, T = (3,), 4099, 0.7
    z, labels = make_inputs(lead, V, dtype, seed=7, ignore_every=100)
    z = z.float()
    z[0, V - 2] = 30.0  # the row max sits in the last block
    labels[0] = 1
    z[1, 5] = 30.0  # the row max sits in the first block
    labels[1] = V - 3
    z = z.to(dtype)
    gen = torch.Generator().manual_seed(2)
    g_logp = torch.randn(lead, generator=gen).to(DEVICE)
    g_ent = torch.randn(lead, generator=gen).to(DEVICE)
    logp, ent, grad = run_kernel(z, labels, T, True, backend, g_logp, g_ent)
    ref_logp, ref_ent = ref_token_logprobs(z, labels, T)
    ref_grad = ref_token_logprobs_grad(z, labels, T, g_logp, g_ent)
    assert_close64(logp, ref_logp, "logp", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
    assert_close64(ent, ref_ent, "entropy", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
    if dtype == torch.float32:
        assert_close64(grad, ref_grad, "d logits", rtol=1e-4, atol_rel=1e-5)
    else:
        _, _, lp_grad = lowp_token_logprobs(z, labels, T, g_logp, g_ent)
        assert_lowp_criterion(grad, ref_grad, lp_grad, "d logits")


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs(backend):
    """The usual next-token slicing: logits[:, :-1] with labels[:, 1:] (non-contiguous views)."""
    B, L, V, T = 3, 6, 33, 0.7
    gen = torch.Generator().manual_seed(4)
    full = (torch.randn(B, L, V, generator=gen) * 2).to(DEVICE)
    ids = torch.randint(0, V, (B, L), generator=gen).to(DEVICE)
    ids[1, 3] = -100
    z, labels = full[:, :-1], ids[:, 1:]
    assert not z.is_contiguous() and not labels.is_contiguous()
    g = torch.randn(B, L - 1, generator=gen).to(DEVICE)
    ge = torch.randn(B, L - 1, generator=gen).to(DEVICE)
    logp, ent, grad = run_kernel(z, labels, T, True, backend, g, ge)
    ref_logp, ref_ent = ref_token_logprobs(z, labels, T)
    assert_close64(logp, ref_logp, "logp", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
    assert_close64(ent, ref_ent, "entropy", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
    assert_close64(grad, ref_token_logprobs_grad(z, labels, T, g, ge), "d logits", rtol=1e-4, atol_rel=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_labels_ignored(backend):
    lead, V, T = (2, 3), 33, 1.9
    z, _ = make_inputs(lead, V, torch.float32, seed=9)
    labels = torch.full(lead, -100, dtype=torch.int64, device=DEVICE)
    g = torch.randn(lead).to(DEVICE)
    logp, _, grad = run_kernel(z, labels, T, False, backend, g, None)
    assert (logp == 0).all() and (grad == 0).all()
    ge = torch.randn(lead).to(DEVICE)
    logp, ent, grad = run_kernel(z, labels, T, True, backend, g, ge)
    _, ref_ent = ref_token_logprobs(z, labels, T)
    assert (logp == 0).all()
    assert_close64(ent, ref_ent, "entropy of ignored rows", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
    assert_close64(
        grad, ref_token_logprobs_grad(z, labels, T, g, ge), "d logits (entropy only)", rtol=1e-4, atol_rel=1e-5
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_ignore_index(backend):
    lead, V, T = (7,), 33, 1.0
    z, labels = make_inputs(lead, V, torch.float32, seed=10)
    labels = torch.where(labels == -100, torch.full_like(labels, -1), labels)
    g = torch.randn(lead).to(DEVICE)
    x = z.clone().requires_grad_(True)
    logp = token_logprobs(x, labels, temperature=T, ignore_index=-1, backend=backend)
    (grad,) = torch.autograd.grad(logp, x, g)
    assert_close64(
        logp,
        ref_token_logprobs(z, labels, T, ignore_index=-1)[0],
        "logp",
        rtol=1e-5,
        atol_rel=1e-5,
        scale=row_scale(z, T),
    )
    assert_close64(
        grad, ref_token_logprobs_grad(z, labels, T, g, None, ignore_index=-1), "d logits", rtol=1e-4, atol_rel=1e-5
    )
    assert (grad[labels == -1] == 0).all()


def test_backward_accumulates_into_grad_and_backends_agree():
    """loss.backward() path; "auto", "torch", "triton" and validate=False agree."""
    lead, V, T = (3, 5), 131, 0.7
    z, labels = make_inputs(lead, V, torch.float32, seed=12)
    ref_logp, ref_ent = ref_token_logprobs(z, labels, T)
    g = torch.randn(lead).to(DEVICE)
    ref_grad = ref_token_logprobs_grad(z, labels, T, g)
    for backend in ["auto", "torch", "triton"]:
        for validate in [True, False]:
            x = z.clone().requires_grad_(True)
            logp, ent = token_logprobs(
                x, labels, temperature=T, return_entropy=True, backend=backend, validate=validate
            )
            (logp * g).sum().backward()
            what = f"backend={backend} validate={validate}"
            assert_close64(logp, ref_logp, f"logp {what}", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
            assert_close64(ent, ref_ent, f"entropy {what}", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T))
            assert_close64(x.grad, ref_grad, f"d logits {what}", rtol=1e-4, atol_rel=1e-5)


@pytest.mark.parametrize("return_entropy", [False, True])
def test_module_wrapper_matches_functional(return_entropy):
    lead, V, T = (7,), 33, 1.9
    z, labels = make_inputs(lead, V, torch.float32, seed=13)
    mod = TokenLogProbs(temperature=T, return_entropy=return_entropy)
    assert isinstance(mod, torch.nn.Module)
    out_m = mod(z, labels)
    out_f = token_logprobs(z, labels, temperature=T, return_entropy=return_entropy)
    if return_entropy:
        torch.testing.assert_close(out_m[0], out_f[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out_m[1], out_f[1], rtol=1e-6, atol=1e-6)
    else:
        torch.testing.assert_close(out_m, out_f, rtol=1e-6, atol=1e-6)
    ref_logp, _ = ref_token_logprobs(z, labels, T)
    assert_close64(
        out_m[0] if return_entropy else out_m, ref_logp, "module logp", rtol=1e-5, atol_rel=1e-5, scale=row_scale(z, T)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_calls_are_bitwise_identical(backend):
    lead, V, T = (13,), 257, 0.7
    z, labels = make_inputs(lead, V, torch.bfloat16, seed=14)
    g, ge = torch.randn(lead).to(DEVICE), torch.randn(lead).to(DEVICE)
    a = run_kernel(z, labels, T, True, backend, g, ge)
    b = run_kernel(z, labels, T, True, backend, g, ge)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
