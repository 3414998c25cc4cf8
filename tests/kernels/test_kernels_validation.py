"""Bad input to rwcore.kernels with validate=True: a ValueError naming the argument
(docs/design.md "Bad input is an error that names the argument")."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # E402

from rwcore.kernels import (  # E402
    filtered_dual_clip_loss,
    fused_linear_logprobs,
    fused_linear_policy_loss,
    token_logprobs,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# a second device for the mismatched-device case: CPU when the tensors live on CUDA,
# otherwise the "meta" device
OTHER_DEVICE = torch.device("cpu") if DEVICE.type == "cuda" else torch.device("meta")
BACKENDS = ["torch", "triton"]
NAN, INF = float("nan"), float("inf")

N, V, H, B, T = 6, 11, 8, 2, 5


def assert_value_error_naming(names, fn, *args, **kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    names = (names,) if isinstance(names, str) else names
    assert any(n in msg for n in names), f"error message {msg!r} does not name any of {names}"


def _set(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


# ----------------------------------------------------------------------------
# token_logprobs
# ----------------------------------------------------------------------------
def tl_inputs():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(N, V, generator=gen).to(DEVICE)
    labels = torch.randint(0, V, (N,), generator=gen).to(DEVICE)
    labels[1] = -100
    return dict(logits=logits, labels=labels)


TL_BAD = {
    "labels_shape": (lambda d: d.update(labels=d["labels"][:-1]), ("labels", "logits")),
    "labels_extra_dim": (lambda d: d.update(labels=d["labels"].view(2, 3)), ("labels", "logits")),
    "logits_int": (lambda d: d.update(logits=d["logits"].round().to(torch.int64)), "logits"),
    "logits_bool": (lambda d: d.update(logits=d["logits"] > 0), "logits"),
    "labels_float": (lambda d: d.update(labels=d["labels"].float()), "labels"),
    "label_eq_V": (lambda d: d.update(labels=_set(d["labels"], 0, V)), "labels"),
    "label_gt_V": (lambda d: d.update(labels=_set(d["labels"], 2, V + 7)), "labels"),
    "label_minus1": (lambda d: d.update(labels=_set(d["labels"], 3, -1)), "labels"),
    "label_minus101": (lambda d: d.update(labels=_set(d["labels"], 4, -101)), "labels"),
    "logits_nan": (lambda d: d.update(logits=_set(d["logits"], (2, 3), NAN)), "logits"),
    "logits_inf": (lambda d: d.update(logits=_set(d["logits"], (0, 0), INF)), "logits"),
    "logits_nan_in_ignored_row_is_still_bad": (lambda d: d.update(logits=_set(d["logits"], (1, 4), NAN)), "logits"),
    "temperature_zero": (lambda d: d.update(temperature=0.0), "temperature"),
    "temperature_negative": (lambda d: d.update(temperature=-0.7), "temperature"),
    "temperature_nan": (lambda d: d.update(temperature=NAN), "temperature"),
    "temperature_inf": (lambda d: d.update(temperature=INF), "temperature"),
    "labels_other_device": (lambda d: d.update(labels=d["labels"].to(OTHER_DEVICE)), ("labels", "logits", "device")),
    "unknown_backend": (lambda d: d.update(backend="cuda-please"), "backend"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(TL_BAD))
def test_token_logprobs_bad_input(case, backend):
    d = tl_inputs()
    d["backend"] = backend
    mutate, names = TL_BAD[case]
    mutate(d)
    assert_value_error_naming(names, token_logprobs, d.pop("logits"), d.pop("labels"), validate=True, **d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_logprobs_good_input_passes(backend):
    """The baseline used by the bad-input cases is itself accepted (labels 0, V-1, -100)."""
    d = tl_inputs()
    d["labels"][0], d["labels"][2] = 0, V - 1
    out = token_logprobs(d["logits"], d["labels"], temperature=0.7, backend=backend, validate=True)
    assert out.shape == (N,) and torch.isfinite(out).all()


# ----------------------------------------------------------------------------
# filtered_dual_clip_loss
# ----------------------------------------------------------------------------
def loss_inputs():
    gen = torch.Generator().manual_seed(1)
    beh = (-torch.rand(B, T, generator=gen) * 3 - 1).to(DEVICE)
    logp = (beh + 0.1).requires_grad_(True)
    adv = torch.randn(B, generator=gen).to(DEVICE)
    mask = torch.ones(B, T, dtype=torch.bool, device=DEVICE)
    return dict(logprobs=logp, behavior_logprobs=beh, advantages=adv, model_mask=mask)


def _detached_set(t, idx, value):
    t = t.detach().clone()
    t[idx] = value
    return t


LOSS_BAD = {
    "behavior_shape": (lambda d: d.update(behavior_logprobs=d["behavior_logprobs"][:, :-1]), "behavior_logprobs"),
    "advantages_shape_B": (lambda d: d.update(advantages=torch.zeros(B + 1, device=DEVICE)), "advantages"),
    "advantages_shape_BT": (lambda d: d.update(advantages=torch.zeros(B, T + 1, device=DEVICE)), "advantages"),
    "model_mask_shape": (lambda d: d.update(model_mask=d["model_mask"][:, :-1]), "model_mask"),
    "logprobs_int": (lambda d: d.update(logprobs=d["logprobs"].detach().round().to(torch.int64)), "logprobs"),
    "logprobs_nan": (
        lambda d: d.update(logprobs=_detached_set(d["logprobs"], (0, 1), NAN).requires_grad_(True)),
        "logprobs",
    ),
    "logprobs_neg_inf": (
        lambda d: d.update(logprobs=_detached_set(d["logprobs"], (1, 2), -INF).requires_grad_(True)),
        "logprobs",
    ),
    "behavior_nan": (
        lambda d: d.update(behavior_logprobs=_set(d["behavior_logprobs"], (1, 0), NAN)),
        "behavior_logprobs",
    ),
    "behavior_inf": (
        lambda d: d.update(behavior_logprobs=_set(d["behavior_logprobs"], (0, 3), INF)),
        "behavior_logprobs",
    ),
    "advantages_nan": (lambda d: d.update(advantages=_set(d["advantages"], 0, NAN)), "advantages"),
    "advantages_inf": (lambda d: d.update(advantages=_set(d["advantages"], 1, -INF)), "advantages"),
    "ratio_low_eq_high": (lambda d: d.update(ratio_low=2.0, ratio_high=2.0), ("ratio_low", "ratio_high")),
    "ratio_low_gt_high": (lambda d: d.update(ratio_low=6.0, ratio_high=5.0), ("ratio_low", "ratio_high")),
    "clip_c_zero": (lambda d: d.update(clip_c=0.0), "clip_c"),
    "clip_c_negative": (lambda d: d.update(clip_c=-3.0), "clip_c"),
    "behavior_other_device": (
        lambda d: d.update(behavior_logprobs=d["behavior_logprobs"].to(OTHER_DEVICE)),
        ("behavior_logprobs", "device"),
    ),
    "advantages_other_device": (
        lambda d: d.update(advantages=d["advantages"].to(OTHER_DEVICE)),
        ("advantages", "device"),
    ),
    "unknown_backend": (lambda d: d.update(backend="cuda-please"), "backend"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(LOSS_BAD))
def test_filtered_dual_clip_loss_bad_input(case, backend):
    d = loss_inputs()
    d["backend"] = backend
    mutate, names = LOSS_BAD[case]
    mutate(d)
    args = [d.pop(k) for k in ("logprobs", "behavior_logprobs", "advantages", "model_mask")]
    assert_value_error_naming(names, filtered_dual_clip_loss, *args, validate=True, **d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_filtered_dual_clip_loss_good_input_passes(backend):
    d = loss_inputs()
    loss, stats = filtered_dual_clip_loss(
        d["logprobs"], d["behavior_logprobs"], d["advantages"], d["model_mask"], backend=backend, validate=True
    )
    assert torch.isfinite(loss)


# ----------------------------------------------------------------------------
# fused_linear_logprobs / fused_linear_policy_loss
# ----------------------------------------------------------------------------
def fused_inputs():
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(N, H, generator=gen).to(DEVICE)
    weight = torch.randn(V, H, generator=gen).to(DEVICE)
    bias = torch.randn(V, generator=gen).to(DEVICE)
    labels = torch.randint(0, V, (N,), generator=gen).to(DEVICE)
    labels[1] = -100
    mask = labels != -100
    beh = (-torch.rand(N, generator=gen) * 3 - 1).to(DEVICE)
    adv = torch.randn(N, generator=gen).to(DEVICE)
    return dict(
        hidden=hidden, weight=weight, labels=labels, bias=bias, behavior_logprobs=beh, advantages=adv, model_mask=mask
    )


LINEAR_BAD = {
    "weight_H_mismatch": (lambda d: d.update(weight=torch.randn(V, H + 1, device=DEVICE)), ("weight", "hidden")),
    "hidden_3d": (lambda d: d.update(hidden=d["hidden"].view(2, 3, H)), ("hidden", "labels")),
    "bias_shape": (lambda d: d.update(bias=torch.randn(V + 1, device=DEVICE)), "bias"),
    "labels_shape": (lambda d: d.update(labels=d["labels"][:-1]), ("labels", "hidden")),
    "hidden_int": (lambda d: d.update(hidden=d["hidden"].round().to(torch.int64)), "hidden"),
    "weight_int": (lambda d: d.update(weight=d["weight"].round().to(torch.int32)), "weight"),
    "labels_float": (lambda d: d.update(labels=d["labels"].float()), "labels"),
    "label_eq_V": (lambda d: d.update(labels=_set(d["labels"], 0, V)), "labels"),
    "label_minus3": (lambda d: d.update(labels=_set(d["labels"], 2, -3)), "labels"),
    "hidden_nan": (lambda d: d.update(hidden=_set(d["hidden"], (3, 1), NAN)), "hidden"),
    "weight_inf": (lambda d: d.update(weight=_set(d["weight"], (4, 0), INF)), "weight"),
    "bias_nan": (lambda d: d.update(bias=_set(d["bias"], 5, NAN)), "bias"),
    "temperature_zero": (lambda d: d.update(temperature=0.0), "temperature"),
    "temperature_negative": (lambda d: d.update(temperature=-1.0), "temperature"),
    "weight_other_device": (lambda d: d.update(weight=d["weight"].to(OTHER_DEVICE)), ("weight", "hidden", "device")),
    "labels_other_device": (lambda d: d.update(labels=d["labels"].to(OTHER_DEVICE)), ("labels", "hidden", "device")),
    "unknown_backend": (lambda d: d.update(backend="cuda-please"), "backend"),
}

POLICY_ONLY_BAD = {
    "behavior_shape": (lambda d: d.update(behavior_logprobs=d["behavior_logprobs"][:-1]), "behavior_logprobs"),
    "advantages_shape": (lambda d: d.update(advantages=torch.zeros(N + 1, device=DEVICE)), "advantages"),
    "model_mask_shape": (lambda d: d.update(model_mask=d["model_mask"][:-1]), "model_mask"),
    "unmasked_label_ignore_index": (
        lambda d: d.update(model_mask=torch.ones(N, dtype=torch.bool, device=DEVICE)),
        "labels",
    ),
    "behavior_nan": (lambda d: d.update(behavior_logprobs=_set(d["behavior_logprobs"], 0, NAN)), "behavior_logprobs"),
    "advantages_inf": (lambda d: d.update(advantages=_set(d["advantages"], 2, INF)), "advantages"),
    "ratio_low_gt_high": (lambda d: d.update(ratio_low=5.0, ratio_high=0.5), ("ratio_low", "ratio_high")),
    "clip_c_zero": (lambda d: d.update(clip_c=0.0), "clip_c"),
    "behavior_other_device": (
        lambda d: d.update(behavior_logprobs=d["behavior_logprobs"].to(OTHER_DEVICE)),
        ("behavior_logprobs", "device"),
    ),
}

_POLICY_KEYS = ("behavior_logprobs", "advantages", "model_mask")


def _call_linear(d):
    for k in _POLICY_KEYS:
        d.pop(k)
    return fused_linear_logprobs(d.pop("hidden"), d.pop("weight"), d.pop("labels"), validate=True, **d)


def _call_policy(d):
    args = [d.pop(k) for k in ("hidden", "weight", "labels") + _POLICY_KEYS]
    return fused_linear_policy_loss(*args, validate=True, **d)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(LINEAR_BAD))
def test_fused_linear_logprobs_bad_input(case, backend):
    d = fused_inputs()
    d["backend"] = backend
    mutate, names = LINEAR_BAD[case]
    mutate(d)
    assert_value_error_naming(names, _call_linear, d)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(set(LINEAR_BAD) | set(POLICY_ONLY_BAD)))
def test_fused_linear_policy_loss_bad_input(case, backend):
    d = fused_inputs()
    d["backend"] = backend
    mutate, names = {**LINEAR_BAD, **POLICY_ONLY_BAD}[case]
    mutate(d)
    if case in ("label_eq_V", "label_minus3"):
        d["model_mask"] = torch.ones(N, dtype=torch.bool, device=DEVICE) & (d["labels"] != -100)
    assert_value_error_naming(names, _call_policy, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_good_input_passes(backend):
    """Baseline accepted by both fused functions: masked rows may hold label -100."""
    d = fused_inputs()
    assert not bool(d["model_mask"][1])
    assert _call_linear(dict(d, backend=backend)).shape == (N,)
    loss, _ = _call_policy(dict(d, backend=backend))
    assert torch.isfinite(loss)
