"""Independent float64 references for the fused loss kernels (rwcore.kernels).

Written from the math in docs/kernels.md ("What the kernels compute": token
log-probs, the filtered dual-clip policy loss) and Arise eq. 18-19 / appendix B.4 -- not from the
implementation.  Everything here is computed in float64 with explicit
formulas (max-shifted softmax, closed-form gradients); the sanity tests in
test_kernels_reference.py check these formulas against hand-worked values,
torch.log_softmax and float64 autograd.

Also holds the "low-precision references" (plain eager PyTorch evaluated in
bf16/fp16) used to set the accuracy bar for low-precision kernel inputs, and
a few comparison helpers shared by the kernel test modules.
"""

import math

import torch

IGNORE_INDEX = -100
# The kernels clamp the log-ratio before exponentiating; the bound is "at
# least 20".  Only the stats' mean_ratio can see it, and tests compare
# mean_ratio exactly only when every |log-ratio| <= 20.
LOG_RATIO_CLAMP = 20.0

STAT_KEYS = (
    "kept_fraction",
    "filtered_low_fraction",
    "filtered_high_fraction",
    "dual_clipped_fraction",
    "mean_ratio",
)


# ----------------------------------------------------------------------------
# token log-probs
# ----------------------------------------------------------------------------
def _softmax_parts(logits, temperature):
    """float64 scaled logits s, log-softmax(s) and softmax(s) over the last dim,
    with an explicit max shift (no torch.log_softmax)."""
    s = logits.detach().to(torch.float64) / float(temperature)
    mx = s.max(dim=-1, keepdim=True).values
    e = torch.exp(s - mx)
    z = e.sum(dim=-1, keepdim=True)
    log_p = (s - mx) - torch.log(z)
    p = e / z
    return s, log_p, p


def _valid_and_safe(labels, ignore_index):
    labels = labels.detach().to(torch.int64)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    return valid, safe


def ref_token_logprobs(logits, labels, temperature=1.0, ignore_index=IGNORE_INDEX):
    """-> (logp [...], entropy [...]) in float64.

    logp[u] = s[u, y_u] - logsumexp_v s[u, v], s = z / T; 0 where y_u == ignore_index.
    entropy[u] = -sum_v p_v log p_v (for every row, ignored or not).
    """
    _, log_p, p = _softmax_parts(logits, temperature)
    valid, safe = _valid_and_safe(labels, ignore_index)
    logp = log_p.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    entropy = -(p * log_p).sum(dim=-1)
    return logp, entropy


def ref_token_logprobs_grad(logits, labels, temperature, grad_logp, grad_entropy=None, ignore_index=IGNORE_INDEX):
    """Closed-form d(<grad_logp, logp> + <grad_entropy, H>)/d logits, float64.

    d logp / d s = onehot(y) - p   (0 for ignored rows)
    d H / d s    = -p * (log p + H)
    d s / d z    = 1 / T
    """
    _, log_p, p = _softmax_parts(logits, temperature)
    valid, safe = _valid_and_safe(labels, ignore_index)
    onehot = torch.zeros_like(p).scatter_(-1, safe.unsqueeze(-1), 1.0)
    g = grad_logp.detach().to(torch.float64) * valid.to(torch.float64)
    ds = g.unsqueeze(-1) * (onehot - p)
    if grad_entropy is not None:
        H = -(p * log_p).sum(dim=-1, keepdim=True)
        ds = ds + grad_entropy.detach().to(torch.float64).unsqueeze(-1) * (-p * (log_p + H))
    return ds / float(temperature)


# ----------------------------------------------------------------------------
# filtered dual-clip loss (Arise eq. 18-19)
# ----------------------------------------------------------------------------
def ref_dual_clip(
    logp,
    behavior_logp,
    advantages,
    model_mask,
    ratio_low=0.5,
    ratio_high=5.0,
    clip_c=3.0,
    num_model_tokens=None,
    log_ratio_clamp=LOG_RATIO_CLAMP,
):
    """float64 reference of the filtered dual-clip loss.

    Returns a dict with
      loss      python float
      grad      d loss / d logp, float64, same shape as logp
      stats     dict of python floats (STAT_KEYS)
      keep, clipped, model   bool masks (for composing test cases)
      log_ratio float64 (unclamped)
    """
    lp = logp.detach().to(torch.float64)
    lb = behavior_logp.detach().to(torch.float64)
    A = advantages.detach().to(torch.float64)
    if A.dim() < lp.dim():
        A = A.reshape(A.shape + (1,) * (lp.dim() - A.dim()))
    A = A.expand_as(lp)
    m = model_mask.detach() != 0
    log_ratio = lp - lb
    w = torch.exp(log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp))
    keep = m & (w > ratio_low) & (w < ratio_high)
    clipped = keep & (A < 0) & (w > clip_c)
    term = torch.minimum(-w * A, clip_c * A.abs())
    per_token = torch.where(keep, term, torch.zeros_like(term))
    n_model = int(m.sum())
    denom = n_model if num_model_tokens is None else int(num_model_tokens)
    if denom == 0 or int(keep.sum()) == 0:
        loss = 0.0
        grad = torch.zeros_like(lp)
    else:
        loss = float(per_token.sum()) / denom
        grad = torch.where(keep & ~clipped, -A * w, torch.zeros_like(w)) / denom
    if n_model == 0:
        stats = {k: 0.0 for k in STAT_KEYS}
    else:
        stats = {
            "kept_fraction": int(keep.sum()) / n_model,
            "filtered_low_fraction": int((m & (w <= ratio_low)).sum()) / n_model,
            "filtered_high_fraction": int((m & (w >= ratio_high)).sum()) / n_model,
            "dual_clipped_fraction": int(clipped.sum()) / n_model,
            "mean_ratio": float(torch.where(m, w, torch.zeros_like(w)).sum()) / n_model,
        }
    return dict(loss=loss, grad=grad, stats=stats, keep=keep, clipped=clipped, model=m, log_ratio=log_ratio)


# ----------------------------------------------------------------------------
# fused linear forms (reference materializes the logits in float64)
# ----------------------------------------------------------------------------
def ref_linear_logits(hidden, weight, bias=None):
    z = hidden.detach().to(torch.float64) @ weight.detach().to(torch.float64).T
    if bias is not None:
        z = z + bias.detach().to(torch.float64)
    return z


def _chain_to_linear(dz, hidden, weight, bias):
    dh = dz @ weight.detach().to(torch.float64)
    dW = dz.T @ hidden.detach().to(torch.float64)
    db = dz.sum(dim=0) if bias is not None else None
    return dh, dW, db


def ref_fused_linear_logprobs(hidden, weight, labels, grad_logp, bias=None, temperature=1.0, ignore_index=IGNORE_INDEX):
    """-> (logp [N], (d hidden, d weight, d bias or None)) in float64 for upstream grad_logp."""
    z = ref_linear_logits(hidden, weight, bias)
    logp, _ = ref_token_logprobs(z, labels, temperature, ignore_index)
    dz = ref_token_logprobs_grad(z, labels, temperature, grad_logp, None, ignore_index)
    return logp, _chain_to_linear(dz, hidden, weight, bias)


def ref_fused_linear_policy_loss(
    hidden,
    weight,
    labels,
    behavior_logp,
    advantages,
    model_mask,
    bias=None,
    temperature=1.0,
    ratio_low=0.5,
    ratio_high=5.0,
    clip_c=3.0,
    num_model_tokens=None,
):
    """-> (dual-clip reference dict (see ref_dual_clip) with 'logp' added,
    (d hidden, d weight, d bias or None)) in float64."""
    z = ref_linear_logits(hidden, weight, bias)
    logp, _ = ref_token_logprobs(z, labels, temperature, IGNORE_INDEX)
    r = ref_dual_clip(logp, behavior_logp, advantages, model_mask, ratio_low, ratio_high, clip_c, num_model_tokens)
    dz = ref_token_logprobs_grad(z, labels, temperature, r["grad"], None, IGNORE_INDEX)
    r["logp"] = logp
    return r, _chain_to_linear(dz, hidden, weight, bias)


# ----------------------------------------------------------------------------
# low-precision references: plain eager PyTorch computed in the low dtype
# ----------------------------------------------------------------------------
def _lowp_logp_from_logits(z, labels, temperature, ignore_index):
    lsm = torch.log_softmax(z / temperature, dim=-1)  # stays in z.dtype
    valid, safe = _valid_and_safe(labels, ignore_index)
    logp = lsm.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    return lsm, logp


def lowp_token_logprobs(logits, labels, temperature, grad_logp, grad_entropy=None, ignore_index=IGNORE_INDEX):
    """Eager PyTorch in logits.dtype -> (logp, entropy or None, d logits) all in logits.dtype."""
    x = logits.detach().clone().requires_grad_(True)
    lsm, logp = _lowp_logp_from_logits(x, labels, temperature, ignore_index)
    outs, gouts = [logp], [grad_logp.detach().to(x.dtype)]
    ent = None
    if grad_entropy is not None:
        ent = -(lsm.exp() * lsm).sum(dim=-1)
        outs.append(ent)
        gouts.append(grad_entropy.detach().to(x.dtype))
    (g,) = torch.autograd.grad(outs, [x], gouts)
    return logp.detach(), (None if ent is None else ent.detach()), g


def _lowp_leaves(hidden, weight, bias):
    h = hidden.detach().clone().requires_grad_(True)
    W = weight.detach().clone().requires_grad_(True)
    b = None if bias is None else bias.detach().clone().requires_grad_(True)
    return h, W, b


def lowp_fused_linear_logprobs(
    hidden, weight, labels, grad_logp, bias=None, temperature=1.0, ignore_index=IGNORE_INDEX
):
    """Eager matmul + log_softmax in hidden.dtype -> (logp, (dh, dW, db or None))."""
    h, W, b = _lowp_leaves(hidden, weight, bias)
    z = torch.nn.functional.linear(h, W, b)
    _, logp = _lowp_logp_from_logits(z, labels, temperature, ignore_index)
    leaves = [h, W] + ([b] if b is not None else [])
    grads = torch.autograd.grad([logp], leaves, [grad_logp.detach().to(logp.dtype)])
    return logp.detach(), (grads[0], grads[1], grads[2] if b is not None else None)


def lowp_fused_linear_policy_loss(
    hidden,
    weight,
    labels,
    behavior_logp,
    advantages,
    model_mask,
    bias=None,
    temperature=1.0,
    ratio_low=0.5,
    ratio_high=5.0,
    clip_c=3.0,
    num_model_tokens=None,
):
    """Eager bf16/fp16 logits and log-probs, then the loss in float32 with autograd.
    -> (loss float32 0-dim, mean_ratio float32 0-dim, (dh, dW, db or None))."""
    h, W, b = _lowp_leaves(hidden, weight, bias)
    z = torch.nn.functional.linear(h, W, b)
    _, logp_lp = _lowp_logp_from_logits(z, labels, temperature, IGNORE_INDEX)
    logp = logp_lp.float()
    lr = (logp - behavior_logp.detach().float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = torch.exp(lr)
    A = advantages.detach().float()
    m = model_mask.detach() != 0
    keep = (m & (w > ratio_low) & (w < ratio_high)).detach()
    n_model = int(m.sum())
    denom = n_model if num_model_tokens is None else int(num_model_tokens)
    term = torch.minimum(-w * A, clip_c * A.abs())
    loss = torch.where(keep, term, torch.zeros_like(term)).sum() / max(denom, 1)
    mean_ratio = torch.where(m, w, torch.zeros_like(w)).sum().detach() / max(n_model, 1)
    leaves = [h, W] + ([b] if b is not None else [])
    grads = torch.autograd.grad([loss], leaves, allow_unused=True)
    grads = [torch.zeros_like(l) if g is None else g for l, g in zip(leaves, grads)]
    return loss.detach(), mean_ratio, (grads[0], grads[1], grads[2] if b is not None else None)


# ----------------------------------------------------------------------------
# comparison helpers
# ----------------------------------------------------------------------------
def _maxabs(t):
    t = t.detach().to(torch.float64)
    return float(t.abs().max()) if t.numel() else 0.0


def row_scale(logits, temperature):
    """Per-row magnitude of the scaled logits, max(1, max_v |z/T|).  Any fp32 computation
    of logp = s_y - logsumexp(s) (or of the entropy as logsumexp(s) - E_p[s]) carries
    rounding of order eps32 * |s|, so absolute tolerances on token log-probs and entropies
    scale with it."""
    s = logits.detach().to(torch.float64).cpu() / float(temperature)
    return s.abs().amax(dim=-1).clamp_min(1.0)


def assert_close64(got, ref, what, rtol=1e-5, atol_rel=1e-5, scale=None):
    """got (any float dtype) vs float64 ref: |got - ref| <= atol + rtol*|ref| elementwise,
    atol = atol_rel * scale, scale = max(1, max|ref|) unless given (elementwise tensor)."""
    got64 = got.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    assert got64.shape == ref.shape, f"{what}: shape {tuple(got64.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(got64).all(), f"{what}: non-finite values {got64}"
    if scale is None:
        scale = torch.full_like(ref, max(1.0, _maxabs(ref)))
    atol = atol_rel * torch.as_tensor(scale, dtype=torch.float64).cpu().expand_as(ref)
    err = (got64 - ref).abs()
    bound = atol + rtol * ref.abs()
    if not bool((err <= bound).all()):
        i = int(torch.argmax(err - bound))
        raise AssertionError(
            f"{what}: max abs err {float(err.max()):.3e}; worst flat index {i}: got "
            f"{float(got64.flatten()[i])!r} vs ref {float(ref.flatten()[i])!r} (allowed "
            f"{float(bound.flatten()[i]):.2e} = atol {float(atol.flatten()[i]):.1e} + rtol {rtol:.0e})"
        )


def assert_lowp_criterion(got, ref, lowp, what, factor=2.0, in_dtype=None):
    """Kernel error vs the float64 reference must be <= factor * (error of the eager
    low-precision reference) + a floor, all as max-abs over the tensor.

    The floor is one rounding unit (eps) of the low-precision *input* dtype `in_dtype`
    (default: got's dtype) at the reference's scale, + 1e-6.  It keeps the bound from
    collapsing when the eager reference is exact (zeros) or lucky: with one or a few
    elements its own roundings can cancel (seen: eager bf16 logp error 1.8e-4 where
    rounding the logits to bf16 alone costs 2.5e-3)."""
    got64 = got.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    lp = lowp.detach().to(torch.float64).cpu()
    assert got64.shape == ref.shape, f"{what}: shape {tuple(got64.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(got64).all(), f"{what}: non-finite values"
    err = _maxabs(got64 - ref)
    lp_err = _maxabs(lp - ref)
    floor = torch.finfo(in_dtype if in_dtype is not None else got.dtype).eps * _maxabs(ref) + 1e-6
    bound = factor * lp_err + floor
    assert err <= bound, (
        f"{what}: kernel max abs err {err:.3e} > {factor} x low-precision-reference err {lp_err:.3e}"
        f" + floor {floor:.1e} (dtype {got.dtype}, ref scale {_maxabs(ref):.3e})"
    )


def log_ratio_margin(log_ratio, ratio_low=0.5, ratio_high=5.0, clip_c=3.0):
    """Smallest distance of any log-ratio to a decision boundary (log r_low, log r_high, log c)."""
    lr = log_ratio.detach().to(torch.float64)
    bounds = torch.tensor([math.log(ratio_low), math.log(ratio_high), math.log(clip_c)], dtype=torch.float64)
    return float((lr.reshape(-1, 1) - bounds).abs().min()) if lr.numel() else math.inf
