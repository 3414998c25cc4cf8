"""Rollout correction: importance weights, rejection masks and train-inference mismatch metrics.

The rollout engine samples from its own distribution mu (vLLM in bf16, a stale policy under
`rollout.max_lag`, ...), the loss trains pi_theta. Peers correct the gap with a per-token weight on
the policy loss; this module computes that weight from log-probs in O(tokens), never touching the
vocabulary, so the policy-loss kernels take it as one more per-token input.

With lr = log pi_train - log mu per model token (pi_train: the proximal policy in the decoupled form,
the current policy, detached, in the bypass form):

    importance weight   token:    rho_t = exp(clamp(lr_t, -20, 20))
                        sequence: rho_t = exp(clamp(sum_{s in seq} lr_s, -20, 20))
        truncate (TIS): w_t = clamp(rho_t, is_threshold_lower, is_threshold)
        mask (MIS / IcePop): w_t = rho_t if is_threshold_lower <= rho_t <= is_threshold else 0
    rejection (RS), verl's criteria, each keeps a token or its whole sequence:
        token_k1: log(lower) <= -lr_t <= log(upper);  token_k2: lr_t^2 / 2 <= upper;
        token_k3: exp(lr_t) - 1 - lr_t <= upper;  seq_{sum,mean}_k*: the sum / mean over the sequence
        of the token statistic, seq_max_k{2,3}: its maximum (seq_mean_k1 is the geometric rejection)
    weight on the loss  w_t * prod(keep_t)

Forms (verl's `algorithm.rollout_correction`):
- decoupled (`bypass=False`): pi_train = the proximal log-probs (the training model before this
  update). The loss filters / clips pi_theta / pi_prox as without correction and multiplies each
  token by the weight above (AReaL's decoupled PPO; verl's, TRL's and OpenRLHF's correction).
- bypass, `loss_type="ppo_clip"`: there is no proximal policy. The loss filters pi_theta / mu, the
  rejection masks apply, importance weights are computed for the metrics only (the ratio already is
  the importance weight; verl's `bypass_ppo_clip*`).
- bypass, `loss_type="reinforce"`: the ratio's anchor is the current policy itself (ratio 1; the filter
  bounds and the dual clip are not applied, as verl's REINFORCE loss has none), so each token's
  gradient is -A w_t grad log pi_theta / D: verl's REINFORCE bypass (`bypass_pg_*`). The loss value is
  sum(-A w) / D (verl's is sum(-A w log pi) / D); the gradients are the same.

`mismatch metrics` are logged for every call, correction or not: verl's names under `rollout_corr/`
(kl, k3_kl, chi2_token, and with sequences training_ppl, rollout_ppl, log_ppl_diff, chi2_seq, ...),
the raw ratio's min / max / mean and effective sample size, and with a correction verl's
`rollout_is_*` / `rollout_rs_*` figures. They come from additive per-token and per-sequence partial
sums, so a chunked pass gives the same figures as one call over the batch.

The correction's settings (dataclass, presets, verl's threshold syntax) are declared in
rwcore.kernels.rollout_correction_settings and importable from here as well; this module holds the weights,
then the metrics. The PyTorch code is the implementation on every backend: it is O(tokens) and never needs
the logits.
"""

from __future__ import annotations

import math

import torch

from rwcore.kernels.rollout_correction_settings import (
    IS_LEVELS,
    IS_MODES,
    LOSS_TYPES,
    PRESETS,
    REINFORCE_BOUNDS,
    RS_OPTIONS,
    TOKEN_RS_OPTIONS,
    RolloutCorrection,
    check_forms,
    parse_is_threshold,
    parse_rs_thresholds,
    ratio_bounds,
    resolve,
)

__all__ = [
    "IS_LEVELS",
    "IS_MODES",
    "LOG_RATIO_BOUND",
    "LOSS_TYPES",
    "PREFIX",
    "PRESETS",
    "REINFORCE_BOUNDS",
    "RS_OPTIONS",
    "TOKEN_RS_OPTIONS",
    "MismatchMetrics",
    "RolloutCorrection",
    "check_cu_seqlens",
    "check_forms",
    "correction_factors",
    "correction_weights",
    "merge_metrics",
    "parse_is_threshold",
    "parse_rs_thresholds",
    "ratio_bounds",
    "resolve",
    "sequence_index",
]

LOG_RATIO_BOUND = 20.0  # verl's SAFETY_BOUND, and the policy-loss kernels' bound on the log ratio
_EPS = 1e-8  # verl's masked_mean adds it to every count
PREFIX = "rollout_corr/"


# --------------------------------------------------------------------------- weights


def sequence_index(cu_seqlens: torch.Tensor, num_tokens: int, device=None) -> torch.Tensor:
    """[S + 1] offsets (FlashAttention varlen; cu_seqlens[0] = 0, cu_seqlens[-1] = N) -> [N] int64 sequence ids
    on `device` (default: cu_seqlens')."""
    cu_seqlens = cu_seqlens.to(device or cu_seqlens.device)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    return torch.repeat_interleave(
        torch.arange(lengths.numel(), device=cu_seqlens.device), lengths, output_size=num_tokens
    )


def check_cu_seqlens(cu_seqlens, num_tokens: int) -> list[int]:
    """cu_seqlens: [S + 1] int tensor, 0 first, N last, non-decreasing -> its values (read once; a CPU tensor
    costs no device sync); ValueError naming it otherwise."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError("cu_seqlens must be an int32 or int64 tensor of sequence offsets [S + 1]")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be [S + 1] with S >= 1, got shape {tuple(cu_seqlens.shape)}")
    values = cu_seqlens.tolist()
    if values[0] != 0 or values[-1] != num_tokens or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"cu_seqlens must start at 0, end at the number of rows ({num_tokens}) and never decrease")
    return values


def _rs_keep(option: str, bounds, lr: torch.Tensor, model: torch.Tensor, seq: torch.Tensor, num_seqs: int):
    """verl's `compute_rollout_rejection_mask` for one criterion: bool [N] keep (padding rows: anything)."""
    safe = lr.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if option.endswith("k1"):
        stat = -safe
    elif option.endswith("k2"):
        stat = 0.5 * safe**2
    else:
        stat = torch.exp(safe) - 1.0 - safe
    low, high = bounds
    if option in TOKEN_RS_OPTIONS:
        values = stat
    else:
        masked = torch.where(model, stat, 0.0)
        if option.startswith("seq_max"):
            per_seq = torch.full((num_seqs,), float("-inf"), dtype=stat.dtype, device=stat.device)
            per_seq = per_seq.scatter_reduce(0, seq, torch.where(model, stat, float("-inf")), "amax")
            per_seq = torch.where(per_seq == float("-inf"), 0.0, per_seq)
        else:
            per_seq = torch.zeros(num_seqs, dtype=stat.dtype, device=stat.device).index_add_(0, seq, masked)
            if option.startswith("seq_mean"):
                counts = torch.zeros(num_seqs, dtype=stat.dtype, device=stat.device).index_add_(
                    0, seq, model.to(stat.dtype)
                )
                per_seq = per_seq / (counts + _EPS)
        values = per_seq[seq]
    if option.endswith("k1"):
        return (values >= math.log(low)) & (values <= math.log(high))
    return values <= high


def correction_factors(
    log_ratio: torch.Tensor,
    model: torch.Tensor,
    correction: RolloutCorrection,
    seq: torch.Tensor | None = None,
    num_seqs: int = 0,
):
    """A correction's per-token weight as (token factor, sequence factor): the parts that depend on the token
    alone (token-level importance weight and rejection) and on its whole sequence (sequence-level ones).
    Their product is the weight; either is None where the correction has no such part.

    Args:
        log_ratio: [N] fp32 log pi_train - log mu (any value on non-model rows).
        model: [N] bool model tokens.
        seq, num_seqs: [N] int64 sequence ids in [0, num_seqs) (needed by sequence-level criteria).

    Returns:
        (token [N] fp32 or None, sequence [N] fp32 or None, parts) where parts holds the raw weight rho, the
        importance weight w (None without rollout_is) and the rejection keep mask (None without rollout_rs),
        for `MismatchMetrics.add`.
    """
    lr = torch.where(model, log_ratio, 0.0)
    raw = weight = None
    factors = {"token": None, "sequence": None}
    if correction.rollout_is is not None:
        if correction.rollout_is == "token":
            log_w = lr
        else:
            log_w = torch.zeros(num_seqs, dtype=lr.dtype, device=lr.device).index_add_(0, seq, lr)[seq]
        raw = torch.exp(log_w.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)) * model
        low, high = correction.is_threshold_lower, correction.is_threshold
        if correction.is_mode == "truncate":
            weight = raw if low is None and high is None else raw.clamp(min=low, max=high)
        else:
            inside = torch.ones_like(model)
            if low is not None:
                inside &= raw >= low
            if high is not None:
                inside &= raw <= high
            weight = torch.where(inside, raw, 0.0)
        if correction.applies_weights:
            factors[correction.rollout_is] = weight
    keep = None
    for option, bounds in zip(correction.rollout_rs, correction.rs_bounds):
        option_keep = _rs_keep(option, bounds, lr, model, seq, num_seqs)
        keep = option_keep if keep is None else keep & option_keep
        level = "token" if option in TOKEN_RS_OPTIONS else "sequence"
        factor = factors[level]
        factors[level] = option_keep.to(torch.float32) if factor is None else torch.where(option_keep, factor, 0.0)
    return factors["token"], factors["sequence"], {"raw": raw, "weight": weight, "keep": keep}


def correction_weights(
    log_ratio: torch.Tensor,
    model: torch.Tensor,
    correction: RolloutCorrection,
    seq: torch.Tensor | None = None,
    num_seqs: int = 0,
):
    """Per-token weights of one correction: (loss_weight [N] fp32, 0 off the model tokens, or None when the
    loss is unweighted; parts) -- the product of `correction_factors`' two factors, with its parts."""
    token, sequence, parts = correction_factors(log_ratio, model, correction, seq, num_seqs)
    if token is None and sequence is None:
        return None, parts
    weight = token if sequence is None else sequence if token is None else token * sequence
    return torch.where(model, weight, 0.0).to(torch.float32).contiguous(), parts


# --------------------------------------------------------------------------- metrics

# token partial sums over model tokens
_TOKEN_SUMS = (
    "n",
    "kl",
    "k3",
    "rho2",
    "rho",
    "w",
    "w2",
    "high",
    "low",
    "rs_rejected",
    "zero_weight",
    "clipped",
)
# per-sequence partial sums
_SEQ_SUMS = ("lr", "train", "behavior", "n", "rs_rejected")


class MismatchMetrics:
    """Additive partial sums of the mismatch metrics; `add` per chunk (or once), `result` at the end.

    Names follow verl's `compute_offpolicy_metrics`, `compute_is_metrics` and `compute_rollout_rejection_mask`
    under `rollout_corr/`; rwcore adds ratio_min / ratio_max / ratio_mean / eff_sample_size (of the raw
    per-token ratio), masked_fraction (tokens the correction gives weight 0) and truncated_fraction
    (tokens whose weight TIS clamped). All values are detached 0-dim fp32 tensors (no host sync).
    """

    def __init__(self, correction: RolloutCorrection | None, num_seqs: int, device) -> None:
        self.correction = correction
        self.num_seqs = num_seqs
        self.sums = torch.zeros(len(_TOKEN_SUMS), dtype=torch.float32, device=device)
        inf = float("inf")
        # min / max of the raw ratio and of the importance weight
        self.extremes = torch.tensor([inf, -inf, inf, -inf], dtype=torch.float32, device=device)
        self.seq_sums = torch.zeros(num_seqs, len(_SEQ_SUMS), dtype=torch.float32, device=device) if num_seqs else None

    @torch.no_grad()
    def add(self, train_logp, behavior, model, seq=None, parts=None) -> None:
        """One chunk: [n] training (proximal or current, detached) and behaviour log-probs, bool model mask,
        [n] sequence ids (global), and `correction_weights`' parts for the same rows."""
        train, behavior = train_logp.detach().float(), behavior.detach().float()
        m = model.to(torch.float32)
        raw_lr = train - behavior
        lr = torch.where(model, raw_lr, 0.0)
        rho = torch.exp(lr.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        k3 = torch.where(model, torch.exp(raw_lr) - raw_lr - 1.0, 0.0)
        c = self.correction
        zeros = torch.zeros((), dtype=torch.float32, device=m.device)
        w = w_sum = w2_sum = high = low = clipped = zero_weight = rs_rejected = zeros
        if parts is not None and parts.get("raw") is not None and c is not None:
            raw, w = parts["raw"], parts["weight"]
            upper = c.is_threshold if c.is_threshold is not None else float("inf")
            lower = c.is_threshold_lower if c.is_threshold_lower is not None else 1.0 / upper
            w_ess = w.clamp(min=0.0, max=upper)
            w_sum, w2_sum = (w_ess * m).sum(), (w_ess.square() * m).sum()
            high, low = ((raw > upper) & model).sum(), ((raw < lower) & model).sum()
            if c.is_mode == "truncate":
                lo = c.is_threshold_lower if c.is_threshold_lower is not None else float("-inf")
                clipped = (((raw > upper) | (raw < lo)) & model).sum()
            else:
                clipped = (((raw > upper) | (raw < lower)) & model).sum()
        if parts is not None and parts.get("keep") is not None:
            rs_rejected = (~parts["keep"] & model).sum()
        if parts is not None and c is not None:
            final = torch.ones_like(m)
            if c.applies_weights and parts.get("weight") is not None:
                final = parts["weight"]
            if parts.get("keep") is not None:
                final = torch.where(parts["keep"], final, 0.0)
            zero_weight = ((final == 0) & model).sum()
        self.sums += torch.stack(
            [
                m.sum(),
                -(lr * m).sum(),
                k3.sum(),
                (rho.square() * m).sum(),
                (rho * m).sum(),
                w_sum,
                w2_sum,
                high,
                low,
                rs_rejected,
                zero_weight,
                clipped,
            ]
        ).float()
        inf = torch.tensor(float("inf"), device=m.device)
        chunk = [torch.where(model, rho, inf).min(), torch.where(model, rho, -inf).max()]
        if isinstance(w, torch.Tensor) and w.dim():
            chunk += [torch.where(model, w, inf).min(), torch.where(model, w, -inf).max()]
        else:
            chunk += [inf, -inf]
        chunk = torch.stack(chunk)
        self.extremes = torch.stack(
            [
                torch.minimum(self.extremes[0], chunk[0]),
                torch.maximum(self.extremes[1], chunk[1]),
                torch.minimum(self.extremes[2], chunk[2]),
                torch.maximum(self.extremes[3], chunk[3]),
            ]
        )
        if self.seq_sums is not None and seq is not None:
            rejected = (~parts["keep"] & model) if parts is not None and parts.get("keep") is not None else None
            columns = [
                lr,
                torch.where(model, train, 0.0),
                torch.where(model, behavior, 0.0),
                m,
                rejected.to(torch.float32) if rejected is not None else torch.zeros_like(m),
            ]
            self.seq_sums.index_add_(0, seq, torch.stack(columns, dim=1))

    @torch.no_grad()
    def result(self) -> dict[str, torch.Tensor]:
        s = dict(zip(_TOKEN_SUMS, self.sums.unbind(0)))
        n = s["n"] + _EPS
        zero = torch.zeros((), dtype=torch.float32, device=self.sums.device)

        def finite_or_zero(value):
            return torch.where(s["n"] > 0, value, zero)

        out = {
            "kl": s["kl"] / n,
            "k3_kl": s["k3"] / n,
            "chi2_token": s["rho2"] / n - 1.0,
            "ratio_mean": s["rho"] / n,
            "ratio_min": finite_or_zero(self.extremes[0]),
            "ratio_max": finite_or_zero(self.extremes[1]),
            "eff_sample_size": _ess(s["rho"], s["rho2"], s["n"]),
        }
        c = self.correction
        seq = None if self.seq_sums is None else dict(zip(_SEQ_SUMS, self.seq_sums.unbind(1)))
        if seq is not None:
            count = seq["n"] + _EPS
            mean_train, mean_behavior = seq["train"] / count, seq["behavior"] / count
            diff = mean_behavior - mean_train
            out.update(
                training_ppl=torch.exp(-mean_train).mean(),
                training_log_ppl=(-mean_train).mean(),
                rollout_ppl=torch.exp(-mean_behavior).mean(),
                rollout_log_ppl=(-mean_behavior).mean(),
                log_ppl_diff=diff.mean(),
                log_ppl_abs_diff=diff.abs().mean(),
                log_ppl_diff_max=diff.max(),
                log_ppl_diff_min=diff.min(),
                ppl_ratio=torch.exp(diff).mean(),
                chi2_seq=torch.exp(2.0 * seq["lr"].clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).mean() - 1.0,
            )
        if c is not None and c.rollout_is is not None:
            upper = c.is_threshold if c.is_threshold is not None else float("inf")
            lower = c.is_threshold_lower if c.is_threshold_lower is not None else 1.0 / upper
            out["rollout_is_mean"] = s["w"] / n
            out["rollout_is_eff_sample_size"] = _ess(s["w"], s["w2"], s["n"], verl=True)
            if c.rollout_is == "sequence" and seq is not None:
                log_upper = torch.log(torch.tensor(upper, device=self.sums.device))
                log_lower = torch.log(torch.tensor(lower, device=self.sums.device))
                out["rollout_is_max"] = torch.exp(seq["lr"].max().clamp(max=LOG_RATIO_BOUND))
                out["rollout_is_min"] = torch.exp(seq["lr"].min())
                out["rollout_is_ratio_fraction_high"] = (seq["lr"] > log_upper).float().mean()
                out["rollout_is_ratio_fraction_low"] = (seq["lr"] < log_lower).float().mean()
            else:
                out["rollout_is_max"] = finite_or_zero(self.extremes[3])
                out["rollout_is_min"] = finite_or_zero(self.extremes[2])
                out["rollout_is_ratio_fraction_high"] = s["high"] / n
                out["rollout_is_ratio_fraction_low"] = s["low"] / n
            if c.is_mode == "mask":
                out["rollout_is_oob_ratio"] = s["clipped"] / n
            else:
                out["truncated_fraction"] = s["clipped"] / n
        if c is not None and c.rollout_rs:
            out["rollout_rs_masked_fraction"] = s["rs_rejected"] / n
            if seq is not None:
                out["rollout_rs_seq_masked_fraction"] = (seq["rs_rejected"] > 0).float().mean()
        if c is not None:
            out["masked_fraction"] = s["zero_weight"] / n
        # no model tokens (a batch of partner failures): every figure is 0, not exp(0) or 0 / eps - 1
        return {
            PREFIX + name: torch.where(s["n"] > 0, value.detach().to(torch.float32), zero)
            for name, value in out.items()
        }


def _ess(w_sum, w2_sum, count, verl: bool = False):
    """Effective sample size fraction 1 / mean((w / mean w)^2) over model tokens (verl's formula with verl=True)."""
    n = count + _EPS
    mean = w_sum / n
    if verl:
        mean_sq = w2_sum / ((mean + _EPS) ** 2) / n
    else:
        mean_sq = w2_sum / torch.where(mean > 0, mean, 1.0) ** 2 / n
    return torch.where((count > 0) & (mean_sq > 0), 1.0 / torch.where(mean_sq > 0, mean_sq, 1.0), 0.0)


def merge_metrics(parts: list[dict], weights: list[float]) -> dict[str, float]:
    """Mismatch metrics of several calls (minibatches) as one row: min of *_min, max of *_max, else the
    weighted mean. Values are Python floats."""
    merged: dict[str, float] = {}
    total = sum(weights) or 1.0
    for name in {k for p in parts for k in p}:
        values = [(float(p[name]), w) for p, w in zip(parts, weights) if name in p]
        if name.endswith("_min"):
            merged[name] = min(v for v, _ in values)
        elif name.endswith("_max"):
            merged[name] = max(v for v, _ in values)
        else:
            merged[name] = sum(v * w for v, w in values) / (sum(w for _, w in values) or total)
    return merged
