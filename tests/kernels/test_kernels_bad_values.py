"""Inputs that used to pass the kernels' validation and then gave NaN, inf, silent zeros
or a raw RuntimeError: now a ValueError naming the argument.

- a temperature at which the scaled logits leave the float32 range;
- a `num_model_tokens` that is NaN, infinite, negative, beyond float32, zero while the
  call has model tokens, or a tensor of the wrong shape or dtype;
- an empty vocabulary (V = 0);
- with validate=False, the cheap checks (shapes, V = 0, Python numbers) still run, so
  a wrong shape cannot read memory out of bounds in a kernel.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # E402

from rwcore.kernels import (  # E402
    FilteredDualClipLoss,
    FusedLinearPolicyLoss,
    TokenLogProbs,
    filtered_dual_clip_loss,
    fused_linear_entropy,
    fused_linear_logprobs,
    fused_linear_policy_loss,
    token_logprobs,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = ["torch", "triton"]
NAN, INF = float("nan"), float("inf")
N, V, H = 6, 11, 8


def raises_naming(name, fn, *args, **kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), f"{str(info.value)!r} does not name {name!r}"
    return str(info.value)


def logits_inputs():
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(N, V, generator=gen) * 3).to(DEVICE)
    labels = torch.randint(0, V, (N,), generator=gen).to(DEVICE)
    return logits, labels


def linear_inputs():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(N, H, generator=gen).to(DEVICE)
    weight = torch.randn(V, H, generator=gen).to(DEVICE)
    labels = torch.randint(0, V, (N,), generator=gen).to(DEVICE)
    behavior = (-torch.rand(N, generator=gen) * 3 - 0.5).to(DEVICE)
    advantages = torch.randn(N, generator=gen).to(DEVICE)
    mask = torch.ones(N, dtype=torch.bool, device=DEVICE)
    return hidden, weight, labels, behavior, advantages, mask


def loss_inputs():
    gen = torch.Generator().manual_seed(2)
    behavior = (-torch.rand(2, 5, generator=gen) * 3 - 0.5).to(DEVICE)
    logp = (behavior + 0.1 * torch.randn(2, 5, generator=gen).to(DEVICE)).requires_grad_(True)
    advantages = torch.randn(2, generator=gen).to(DEVICE)
    mask = torch.ones(2, 5, dtype=torch.bool, device=DEVICE)
    return logp, behavior, advantages, mask


# ----------------------------------------------------------------------------- temperature overflow

# |logits| is about 1..10 here: divided by 1e-38 they are ~1e38..1e39, beyond what the
# float32 softmax can hold (the result was -inf / NaN / -0 entropies before).
OVERFLOWING_TEMPERATURES = [1e-38, 1e-37 / 4]
# 1 / T itself is beyond float32 (and beyond float64 for 1e-320): refused without reading any value.
UNREPRESENTABLE_TEMPERATURES = [1e-39, 1e-320]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", OVERFLOWING_TEMPERATURES + UNREPRESENTABLE_TEMPERATURES)
def test_token_logprobs_overflowing_temperature(backend, temperature):
    logits, labels = logits_inputs()
    raises_naming("temperature", token_logprobs, logits, labels, temperature=temperature, backend=backend)
    raises_naming(
        "temperature", token_logprobs, logits, labels, temperature=temperature, return_entropy=True, backend=backend
    )
    raises_naming("temperature", TokenLogProbs(temperature=temperature, backend=backend), logits, labels)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", UNREPRESENTABLE_TEMPERATURES)
def test_unrepresentable_temperature_refused_without_validation(backend, temperature):
    logits, labels = logits_inputs()
    raises_naming(
        "temperature", token_logprobs, logits, labels, temperature=temperature, backend=backend, validate=False
    )
    hidden, weight, labels, behavior, advantages, mask = linear_inputs()
    raises_naming(
        "temperature",
        fused_linear_logprobs,
        hidden,
        weight,
        labels,
        temperature=temperature,
        backend=backend,
        validate=False,
    )
    raises_naming(
        "temperature", fused_linear_entropy, hidden, weight, temperature=temperature, backend=backend, validate=False
    )
    raises_naming(
        "temperature",
        fused_linear_policy_loss,
        hidden,
        weight,
        labels,
        behavior,
        advantages,
        mask,
        temperature=temperature,
        backend=backend,
        validate=False,
    )


def refused_or_finite(fn, hidden, weight, *rest, **kwargs):
    """The fused ops never hold all logits, so they judge the range by the result: either a
    ValueError naming the temperature, or finite outputs whose gradients are finite too."""
    leaves = [hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)]
    args = [*leaves, *rest]
    try:
        out = fn(*args, **kwargs)
    except ValueError as error:
        assert "temperature" in str(error), str(error)
        return "refused"
    value = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(value).all(), f"{fn.__name__} gave non-finite {value}"
    value.sum().backward()
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all(), f"{fn.__name__} gave a non-finite gradient"
    return "finite"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", OVERFLOWING_TEMPERATURES + UNREPRESENTABLE_TEMPERATURES)
def test_fused_overflowing_temperature(backend, temperature):
    hidden, weight, labels, behavior, advantages, mask = linear_inputs()
    outcomes = [
        refused_or_finite(fused_linear_logprobs, hidden, weight, labels, temperature=temperature, backend=backend),
        refused_or_finite(fused_linear_entropy, hidden, weight, temperature=temperature, backend=backend),
        refused_or_finite(
            fused_linear_policy_loss,
            hidden,
            weight,
            labels,
            behavior,
            advantages,
            mask,
            temperature=temperature,
            backend=backend,
        ),
    ]
    if temperature <= 1e-38:  # |logits| up to ~10: the scaled logits are beyond float32 for certain
        assert outcomes == ["refused"] * 3
        module = FusedLinearPolicyLoss(temperature=temperature, backend=backend)
        raises_naming("temperature", module, hidden, weight, labels, behavior, advantages, mask)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_logits_beyond_float32_refused(backend):
    """Finite hidden and weight whose product overflows: the logits are infinite, so is the result."""
    hidden, weight, labels, behavior, advantages, mask = linear_inputs()
    hidden = hidden * 1e20
    weight = weight * 1e20
    raises_naming("hidden", fused_linear_logprobs, hidden, weight, labels, backend=backend)
    raises_naming(
        "hidden", fused_linear_policy_loss, hidden, weight, labels, behavior, advantages, mask, backend=backend
    )
    raises_naming("hidden", fused_linear_entropy, hidden, weight, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_but_safe_temperature_is_finite_and_correct(backend):
    """No false alarm: T = 1e-3 keeps |z| / T ~ 1e4, and the result matches float64 by hand."""
    logits, labels = logits_inputs()
    temperature = 1e-3
    logp, entropy = token_logprobs(logits, labels, temperature=temperature, return_entropy=True, backend=backend)
    s = logits.double() / temperature
    expected = s.gather(1, labels.unsqueeze(1)).squeeze(1) - torch.logsumexp(s, dim=1)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    torch.testing.assert_close(logp.double(), expected, rtol=1e-4, atol=1e-2)
    hidden, weight, labels, *_ = linear_inputs()
    assert torch.isfinite(fused_linear_logprobs(hidden, weight, labels, temperature=temperature, backend=backend)).all()
    assert torch.isfinite(fused_linear_entropy(hidden, weight, temperature=temperature, backend=backend)).all()


# ----------------------------------------------------------------------------- num_model_tokens

BAD_DENOMINATORS = {
    "nan": NAN,
    "inf": INF,
    "minus_inf": -INF,
    "negative": -1.0,
    "negative_int": -4,
    "beyond_float32": 1e39,
    "zero_with_model_tokens": 0,
    "tensor_nan": torch.tensor(NAN),
    "tensor_inf": torch.tensor(INF),
    "tensor_negative": torch.tensor(-3.0),
    "tensor_zero_with_model_tokens": torch.tensor(0.0),
    "tensor_two_elements": torch.ones(2),
    "tensor_empty": torch.ones(0),
    "tensor_bool": torch.tensor(True),
    "tensor_complex": torch.tensor(1 + 1j),
    "string": "10",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(BAD_DENOMINATORS))
def test_bad_num_model_tokens(case, backend):
    value = BAD_DENOMINATORS[case]
    logp, behavior, advantages, mask = loss_inputs()
    raises_naming(
        "num_model_tokens",
        filtered_dual_clip_loss,
        logp,
        behavior,
        advantages,
        mask,
        num_model_tokens=value,
        backend=backend,
    )
    raises_naming(
        "num_model_tokens",
        FilteredDualClipLoss(backend=backend),
        logp,
        behavior,
        advantages,
        mask,
        num_model_tokens=value,
    )
    hidden, weight, labels, behavior, advantages, mask = linear_inputs()
    raises_naming(
        "num_model_tokens",
        fused_linear_policy_loss,
        hidden,
        weight,
        labels,
        behavior,
        advantages,
        mask,
        num_model_tokens=value,
        backend=backend,
    )


# Refused even with validate=False: Python numbers and shapes are checked for free.
CHEAP_BAD_DENOMINATORS = [
    "nan",
    "inf",
    "minus_inf",
    "negative",
    "negative_int",
    "beyond_float32",
    "tensor_two_elements",
    "tensor_empty",
    "tensor_bool",
    "tensor_complex",
    "string",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CHEAP_BAD_DENOMINATORS)
def test_bad_num_model_tokens_without_validation(case, backend):
    value = BAD_DENOMINATORS[case]
    logp, behavior, advantages, mask = loss_inputs()
    raises_naming(
        "num_model_tokens",
        filtered_dual_clip_loss,
        logp,
        behavior,
        advantages,
        mask,
        num_model_tokens=value,
        backend=backend,
        validate=False,
    )
    hidden, weight, labels, behavior, advantages, mask = linear_inputs()
    raises_naming(
        "num_model_tokens",
        fused_linear_policy_loss,
        hidden,
        weight,
        labels,
        behavior,
        advantages,
        mask,
        num_model_tokens=value,
        backend=backend,
        validate=False,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_good_num_model_tokens_still_accepted(backend):
    """The documented contract holds: D = 0 with no model tokens gives loss 0 and zero gradients;
    a fractional or one-element-tensor D divides the numerator (checked against D = default)."""
    logp, behavior, advantages, mask = loss_inputs()
    none = torch.zeros_like(mask)
    for zero in (0, 0.0, torch.tensor(0.0)):
        loss, _ = filtered_dual_clip_loss(logp, behavior, advantages, none, num_model_tokens=zero, backend=backend)
        loss.backward()
        assert float(loss) == 0.0 and torch.equal(logp.grad, torch.zeros_like(logp.grad))
        logp.grad = None
    reference, _ = filtered_dual_clip_loss(logp, behavior, advantages, mask, backend=backend)  # D = 10
    for d in (2.5, torch.tensor(2.5), torch.tensor([2.5]), torch.tensor(5, dtype=torch.int64)):
        loss, _ = filtered_dual_clip_loss(logp, behavior, advantages, mask, num_model_tokens=d, backend=backend)
        torch.testing.assert_close(loss, reference * 10 / float(d))


# ----------------------------------------------------------------------------- V = 0 and cheap shape checks


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_vocabulary(backend, validate):
    labels = torch.zeros(3, dtype=torch.long, device=DEVICE)
    message = raises_naming(
        "logits", token_logprobs, torch.zeros(3, 0, device=DEVICE), labels, backend=backend, validate=validate
    )
    assert "V = 0" in message or "vocabulary" in message
    hidden = torch.randn(3, H, device=DEVICE)
    empty_head = torch.zeros(0, H, device=DEVICE)
    raises_naming("weight", fused_linear_logprobs, hidden, empty_head, labels, backend=backend, validate=validate)
    raises_naming("weight", fused_linear_entropy, hidden, empty_head, backend=backend, validate=validate)
    raises_naming(
        "weight",
        fused_linear_policy_loss,
        hidden,
        empty_head,
        labels,
        torch.zeros(3, device=DEVICE),
        torch.ones(3, device=DEVICE),
        torch.ones(3, device=DEVICE),
        backend=backend,
        validate=validate,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_shapes_checked_without_validation(backend):
    """A wrong shape with validate=False used to reach the kernel (out-of-bounds reads)."""
    logits, labels = logits_inputs()
    raises_naming("labels", token_logprobs, logits, labels[:-2], backend=backend, validate=False)
    hidden, weight, labels, behavior, advantages, mask = linear_inputs()
    raises_naming("labels", fused_linear_logprobs, hidden, weight, labels[:-1], backend=backend, validate=False)
    raises_naming("weight", fused_linear_logprobs, hidden, weight[:, :-1], labels, backend=backend, validate=False)
    raises_naming(
        "behavior_logprobs",
        fused_linear_policy_loss,
        hidden,
        weight,
        labels,
        behavior[:-1],
        advantages,
        mask,
        backend=backend,
        validate=False,
    )
    raises_naming(
        "advantages",
        fused_linear_policy_loss,
        hidden,
        weight,
        labels,
        behavior,
        advantages[:-1],
        mask,
        backend=backend,
        validate=False,
    )
    logp, behavior, advantages, mask = loss_inputs()
    raises_naming(
        "model_mask", filtered_dual_clip_loss, logp, behavior, advantages, mask[:, :-1], backend=backend, validate=False
    )
    raises_naming(
        "advantages", filtered_dual_clip_loss, logp, behavior, advantages[:-1], mask, backend=backend, validate=False
    )
