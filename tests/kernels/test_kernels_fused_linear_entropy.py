"""rwcore.kernels.fused_linear_entropy vs a float64 reference on materialized logits: the entropy of
softmax((h W^T + b) / T) and its gradients with respect to hidden, weight and bias, for odd sizes,
chunkings, dtypes and both backends; and the peak memory stays at one chunk of logits."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # E402

from rwcore.kernels import fused_linear_entropy  # E402

CONFIGS = [(1, 8, 5, 1.0, False), (7, 24, 131, 0.7, True), (13, 8, 257, 1.9, True), (3, 8, 4099, 0.7, True)]
CONFIG_IDS = [f"N{c[0]}-H{c[1]}-V{c[2]}-T{c[3]}-{'bias' if c[4] else 'nobias'}" for c in CONFIGS]
FP32_TOLERANCE = 2e-5


def reference_entropy(hidden, weight, bias, temperature):
    """-sum_v p_v log p_v in float64, written out from the definition."""
    logits = hidden.double() @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def lowp_entropy(hidden, weight, bias, temperature):
    """The low-precision reference: logits materialized in the input dtype, then fp32 softmax."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def make(N, H, V, dtype, with_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 0.5).to(dtype).requires_grad_()
    bias = (torch.randn(V, generator=gen) * 0.5).to(dtype).requires_grad_() if with_bias else None
    return hidden, weight, bias


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("chunk_size", [1, 3, None], ids=["chunk1", "chunk3", "chunkNone"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("N,H,V,T,with_bias", CONFIGS, ids=CONFIG_IDS)
def test_entropy_and_every_gradient_match_the_float64_reference(N, H, V, T, with_bias, dtype, chunk_size, backend):
    hidden, weight, bias = make(N, H, V, dtype, with_bias)
    entropy = fused_linear_entropy(hidden, weight, bias, temperature=T, chunk_size=chunk_size, backend=backend)
    assert entropy.dtype == torch.float32 and entropy.shape == (N,)
    gen = torch.Generator().manual_seed(1)
    upstream = torch.randn(N, generator=gen)
    grads = torch.autograd.grad((entropy * upstream).sum(), [t for t in (hidden, weight, bias) if t is not None])
    leaves = [t.detach().double().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    expected = reference_entropy(leaves[0], leaves[1], leaves[2] if with_bias else None, T)
    expected_grads = torch.autograd.grad((expected * upstream.double()).sum(), leaves)
    expected = expected.detach()
    errors = [float((entropy.detach().double() - expected).abs().max())]
    errors += [float((got.double() - want).abs().max()) for got, want in zip(grads, expected_grads)]
    if dtype == torch.float32:
        scales = [1.0] + [max(1.0, float(want.abs().max())) for want in expected_grads]
        assert all(error <= FP32_TOLERANCE * scale for error, scale in zip(errors, scales)), errors
        return
    # bf16 / fp16: at most twice the error of the materialized low-precision reference (plus one ulp of slack)
    lowp_leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    lowp = lowp_entropy(lowp_leaves[0], lowp_leaves[1], lowp_leaves[2] if with_bias else None, T)
    lowp_grads = torch.autograd.grad((lowp * upstream).sum(), lowp_leaves)
    lowp_errors = [float((lowp.detach().double() - expected).abs().max())]
    lowp_errors += [float((got.double() - want).abs().max()) for got, want in zip(lowp_grads, expected_grads)]
    ulp = torch.finfo(dtype).eps
    for error, reference, want in zip(errors, lowp_errors, [expected, *expected_grads]):
        assert error <= 2 * reference + ulp * max(1.0, float(want.detach().abs().max())), (errors, lowp_errors)
    for got in grads:
        assert got.dtype == dtype


def test_no_gradient_needed_and_empty_input():
    hidden, weight, _ = make(5, 8, 33, torch.float32, False)
    with torch.no_grad():
        entropy = fused_linear_entropy(hidden, weight, chunk_size=2)
    assert not entropy.requires_grad
    assert torch.allclose(entropy.double(), reference_entropy(hidden.detach(), weight.detach(), None, 1.0), atol=1e-5)
    assert fused_linear_entropy(hidden[:0], weight).shape == (0,)


def test_bad_input_names_the_argument():
    hidden, weight, _ = make(5, 8, 33, torch.float32, False)
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_entropy(hidden, weight, temperature=0.0)
    with pytest.raises(ValueError, match="weight"):
        fused_linear_entropy(hidden, weight[:, :4])
