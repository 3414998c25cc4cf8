"""Hidden states to Arise's filtered dual-clip loss in one chunked pass, gradients written as it goes.

For each chunk of rows: fp32 logits = h W^T + b; the token_logprobs forward kernel
gives logp and the row logsumexp; the policy-loss kernel gives the loss terms,
the statistics' partial sums and d loss / d logp; the token_logprobs backward
kernel turns the logits into their gradient (in place for float32); two matmuls give the
chunk's share of the hidden, weight and bias gradients. Only one [chunk, V]
block of logits is ever alive, and nothing is recomputed in backward, which
just scales the stored gradients by the incoming one. The loss needs the
denominator D before the first chunk, which it has: D counts model tokens (or
is passed in), never kept ones.

Order (its kernels live with token_logprobs and policy_loss): autograd
Function, public function.
"""

from __future__ import annotations

import bisect

import torch

from rwcore.kernels import _checks
from rwcore.kernels import rollout_correction as correction_ops
from rwcore.kernels._backend import resolve_backend
from rwcore.kernels._fused_linear import GradAccumulator, LinearHead, check_linear_inputs, chunk_rows
from rwcore.kernels.loss_settings import LOSS_DEFAULTS, resolve_loss_settings
from rwcore.kernels.policy_loss import (
    STAT_NAMES,
    check_policy_inputs,
    denominator_tensor,
    loss_and_stats,
    policy_loss_partials,
)
from rwcore.kernels.token_logprobs import logprobs_backward, logprobs_forward

_IGNORED = -100  # label given to masked rows, whose stored label may be anything


class FusedLinearPolicyLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        labels,
        behavior,
        advantages,
        mask,
        denominator,
        inv_temperature,
        ratio_low,
        ratio_high,
        clip_c,
        chunks,
        backend,
        check_range,
        correction,
        proximal,
        extra_weight,
        seq,
        metrics,
        boundaries,
    ):
        in_range = torch.ones((), dtype=torch.bool, device=hidden.device)  # read once, after the last chunk
        grads = GradAccumulator(hidden, weight, bias, weight.requires_grad, bias is not None and bias.requires_grad)
        partials = torch.zeros(7, dtype=torch.float32, device=hidden.device)
        head = LinearHead(hidden, weight, bias)
        model = mask != 0
        num_seqs = 0 if metrics is None else metrics.num_seqs
        # The decoupled form's weights depend on the proximal and behaviour log-probs only: one O(N) pass.
        loss_weight = extra_weight
        if proximal is not None:
            parts = None
            if correction is not None:
                log_ratio = proximal.float() - behavior.float()
                loss_weight, parts = correction_ops.correction_weights(log_ratio, model, correction, seq, num_seqs)
                loss_weight = _times(loss_weight, extra_weight)
            if metrics is not None:
                metrics.add(proximal, behavior, model, seq, parts)
        bypass = proximal is None and correction is not None
        reinforce = bypass and correction.loss_type == "reinforce"
        # bypass with a sequence-level part: a sequence that crosses a chunk boundary is "open" until its last
        # chunk; its rows run with their token factor, its head gradients go to buffers of their own, and its
        # sequence factor scales them (and its rows' hidden gradients and loss terms) when it closes
        deferred = _OpenSequence(grads) if bypass and correction.needs_sequences else None
        for rows in chunks:
            logits = head.logits(rows)
            logp, lse, _ = logprobs_forward(logits, labels[rows], inv_temperature, _IGNORED, False, backend)
            if check_range:
                in_range &= torch.isfinite(lse).all() & torch.isfinite(logp).all()
            anchor = logp if reinforce else behavior[rows] if proximal is None else proximal[rows]
            chunk_weight = None if loss_weight is None else loss_weight[rows]
            split = rows.stop  # rows from here on belong to a sequence still open after this chunk
            if deferred is not None:
                split = deferred.closed_end(boundaries, rows)
                chunk_weight = _times(
                    deferred.weights(logp, behavior, model, seq, rows, split, correction, num_seqs, metrics),
                    None if extra_weight is None else extra_weight[rows],
                )
            elif proximal is None:
                # no proximal policy: the training log-probs are this chunk's
                parts = None
                chunk_seq = None if seq is None else seq[rows]
                if correction is not None:
                    log_ratio = logp.detach() - behavior[rows].float()
                    chunk_weight, parts = correction_ops.correction_weights(
                        log_ratio, model[rows], correction, chunk_seq, num_seqs
                    )
                    chunk_weight = _times(chunk_weight, None if extra_weight is None else extra_weight[rows])
                if metrics is not None:
                    metrics.add(logp, behavior[rows], model[rows], chunk_seq, parts)
            grad_parts = []
            for part in (slice(rows.start, split), slice(split, rows.stop)):
                if part.stop <= part.start:
                    continue
                local = slice(part.start - rows.start, part.stop - rows.start)
                grad_part, part_partials = policy_loss_partials(
                    logp[local].unsqueeze(0),
                    anchor[local].unsqueeze(0),
                    advantages[part].unsqueeze(0),
                    mask[part].unsqueeze(0),
                    denominator,
                    ratio_low,
                    ratio_high,
                    clip_c,
                    backend,
                    None if chunk_weight is None else chunk_weight[local].unsqueeze(0),
                )
                grad_parts.append(grad_part.squeeze(0))
                if part.start >= split:
                    deferred.add_partials(part_partials, partials)
                else:
                    partials += part_partials
            grad_logits = logprobs_backward(
                logits,
                labels[rows],
                lse,
                None,
                torch.cat(grad_parts) if len(grad_parts) > 1 else grad_parts[0],
                None,
                inv_temperature,
                _IGNORED,
                backend,
                out=head.gradient_buffer(logits),
            )
            if split > rows.start:
                closed = slice(rows.start, split)
                grads.add(closed, grad_logits[: split - rows.start], *head.operands(closed))
            if split < rows.stop:
                still_open = slice(split, rows.stop)
                grads.add(
                    still_open, grad_logits[split - rows.start :], *head.operands(still_open), into=deferred.buffers
                )
        if deferred is not None:
            partials += deferred.finish()
        if check_range and not bool(in_range):
            raise _checks.scaled_range_error(inv_temperature)
        loss, stats = loss_and_stats(partials, denominator)
        ctx.save_for_backward(*(g for g in grads.result() if g is not None))
        ctx.has_grad = tuple(g is not None for g in grads.result())
        ctx.mark_non_differentiable(*stats.values())
        return (loss, *stats.values())

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        saved = iter(ctx.saved_tensors)
        grad_hidden, grad_weight, grad_bias = (next(saved) * grad_loss if present else None for present in ctx.has_grad)
        return (grad_hidden, grad_weight, grad_bias) + (None,) * 18


def _times(weight, other):
    """The product of two optional per-token weights (None: 1)."""
    if other is None:
        return weight
    return other if weight is None else weight * other


class _OpenSequence:
    """The bypass form's sequence-level weights without whole-sequence chunks.

    A sequence's factor needs the current log-probs of all its tokens. Chunks keep their size, so one sequence
    at a time can cross a chunk boundary: until its last chunk, its rows' loss terms and gradients are computed
    with their token factor only, its contributions to the head's gradients are summed in buffers of their own
    ([V, H] and [V] fp32, the size of the weight gradient, not [T, V]), and its per-token vectors (O(L)) are
    kept. When it closes its sequence factor is known: the buffers are added to the head's gradients times the
    factor, and its rows' hidden gradients and loss terms are scaled by it."""

    def __init__(self, grads: GradAccumulator) -> None:
        self.grads = grads
        self.buffers = grads.buffers()
        self.rows: list[slice] = []  # the open sequence's rows in earlier chunks
        self.vectors: list[tuple] = []  # their (logp, behavior, model, seq)
        self.term = None  # their loss terms, with the token factor only
        self.closed_terms = torch.zeros((), dtype=torch.float32, device=grads.grad_hidden.device)

    @staticmethod
    def closed_end(boundaries: list[int], rows: slice) -> int:
        """The end of the last sequence that closes in this chunk (rows.start when none does)."""
        return max(rows.start, boundaries[bisect.bisect_right(boundaries, rows.stop) - 1])

    def weights(self, logp, behavior, model, seq, rows, split, correction, num_seqs, metrics) -> torch.Tensor:
        """[rows] fp32 weights of this chunk: the full weight of the rows whose sequence closes here (closing
        the open sequence on the way), the token factor of the rows of a sequence still open after it."""
        logp = logp.detach()
        out = torch.ones(rows.stop - rows.start, dtype=torch.float32, device=logp.device)
        if split > rows.start:
            here = slice(rows.start, split)
            vectors = [*self.vectors, (logp[: split - rows.start], behavior[here], model[here], seq[here])]
            train, behaviour, present, ids = (torch.cat(v) for v in zip(*vectors))
            token, sequence, parts = correction_ops.correction_factors(
                train - behaviour.float(), present, correction, ids, num_seqs
            )
            if metrics is not None:
                metrics.add(train, behaviour, present, ids, parts)
            full = _times(token, sequence)
            previous = len(train) - (split - rows.start)
            if full is not None:
                out[: split - rows.start] = torch.where(present, full, 0.0)[previous:]
            if self.rows:
                factor = torch.ones((), device=logp.device) if sequence is None else sequence[0].float()
                self.grads.add_scaled(self.rows, self.buffers, factor)
                for buffer in self.buffers:
                    if buffer is not None:
                        buffer.zero_()
                self.closed_terms = self.closed_terms + self.term * factor
            self.rows, self.vectors, self.term = [], [], None
        if split < rows.stop:
            tail = slice(split, rows.stop)
            local = logp[split - rows.start :]
            token, _, _ = correction_ops.correction_factors(
                local - behavior[tail].float(), model[tail], correction, torch.zeros_like(seq[tail]), 1
            )
            if token is not None:
                out[split - rows.start :] = torch.where(model[tail], token, 0.0)
            self.rows.append(tail)
            self.vectors.append((local, behavior[tail], model[tail], seq[tail]))
        return out

    def add_partials(self, part_partials: torch.Tensor, partials: torch.Tensor) -> None:
        """An open sequence's share of the loss partials: its counts now, its loss term when it closes."""
        partials[1:] += part_partials[1:]
        self.term = part_partials[0] if self.term is None else self.term + part_partials[0]

    def finish(self) -> torch.Tensor:
        """[7] partials holding the scaled loss terms of the sequences that were open across chunks."""
        assert not self.rows, "a sequence is still open after the last chunk (cu_seqlens must end at N)"
        out = torch.zeros(7, dtype=torch.float32, device=self.closed_terms.device)
        out[0] = self.closed_terms
        return out


def _chunks(num_rows: int, rows_per_chunk: int) -> list[slice]:
    """Row slices of `rows_per_chunk` rows (the last one shorter)."""
    return [slice(start, min(num_rows, start + rows_per_chunk)) for start in range(0, num_rows, rows_per_chunk)]


def fused_linear_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    model_mask: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ratio_low: float = LOSS_DEFAULTS.ratio_low,
    ratio_high: float = LOSS_DEFAULTS.ratio_high,
    clip_c: float = LOSS_DEFAULTS.clip_c,
    num_model_tokens=None,
    chunk_size: int | None = None,
    backend: str = "auto",
    validate: bool = True,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    rollout_correction=None,
    rollout_is_weights: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    mismatch_metrics: bool = True,
    **settings,
):
    """`filtered_dual_clip_loss(token_logprobs(hidden @ weight.T + bias, labels), ...)` without the logits.

    Args:
        hidden: [N, H] hidden states of every token position (float32 / bfloat16 / float16).
        weight: [V, H] LM head, same dtype; bias: [V] or None.
        labels: [N] int64 next tokens; rows outside `model_mask` may hold anything (e.g. -100).
        behavior_logprobs, advantages, model_mask: [N] each, aligned with the rows of `hidden`
            (advantages per token; broadcast per-trajectory ones before flattening).
        temperature, ratio_low, ratio_high, clip_c, num_model_tokens, settings: as in
            `token_logprobs` and `filtered_dual_clip_loss` (the loss settings' defaults and ranges:
            `rwcore.kernels.loss_settings.LossSettings`).
        chunk_size: rows per chunk of logits (default: about N * H logits per chunk).
        validate: as in `filtered_dual_clip_loss`; it also turns logits whose scale over the
            temperature leaves float32 into a ValueError naming temperature, hidden and weight.
        proximal_logprobs, rollout_correction, rollout_is_weights, mismatch_metrics: [N] / as in
            `filtered_dual_clip_loss`. The decoupled form's weights are computed once before the pass;
            the bypass form's from each chunk's log-probs inside it.
        cu_seqlens: [S + 1] int offsets of the sequences in the rows (0, ..., N; on any device, read once: pass
            a CPU tensor to avoid a device sync): needed by
            sequence-level corrections, and gives the per-sequence metrics. In the bypass form with a
            sequence-level part, a sequence that crosses a chunk boundary has its head gradients summed in
            buffers of their own until its last chunk gives its factor (one [V, H] fp32 buffer, never [T, V]).

    Returns:
        (loss, stats) as `filtered_dual_clip_loss`. Gradients flow to hidden, weight
        and bias (computed during the forward pass; weight and bias accumulated in fp32).
    """
    loss_settings = resolve_loss_settings(ratio_low=ratio_low, ratio_high=ratio_high, clip_c=clip_c, **settings)
    check_linear_inputs(hidden, weight, bias, labels, validate)
    extras = {
        name: tensor
        for name, tensor in (("proximal_logprobs", proximal_logprobs), ("rollout_is_weights", rollout_is_weights))
        if tensor is not None
    }
    for name, tensor in extras.items():
        _checks.check_float(tensor, name)
        _checks.check_shape(tensor, hidden.shape[:1], name, "hidden rows")
    check_policy_inputs(
        behavior_logprobs,
        advantages,
        model_mask,
        hidden.shape[:1],
        "hidden rows",
        advantage_shapes=(tuple(hidden.shape[:1]),),
        validate=validate,
        hidden=hidden,
        **extras,
    )
    if validate:
        _checks.check_labels(labels, weight.shape[0], "labels", mask=model_mask)
        if rollout_is_weights is not None and bool((rollout_is_weights < 0).any()):
            raise ValueError("rollout_is_weights must be non-negative")
    num_rows = hidden.shape[0]
    boundaries = None
    if cu_seqlens is not None:
        boundaries = correction_ops.check_cu_seqlens(cu_seqlens, num_rows)
    correction = correction_ops.resolve(rollout_correction)
    correction_ops.check_forms(correction, proximal_logprobs, has_sequences=cu_seqlens is not None)
    low, high = correction_ops.ratio_bounds(correction, loss_settings.ratio_low, loss_settings.ratio_high)
    inv_temperature = _checks.check_temperature(temperature)
    denominator = denominator_tensor(num_model_tokens, model_mask, validate)
    rows = chunk_rows(num_rows, weight.shape[0], hidden.shape[1], _checks.check_chunk_size(chunk_size))
    chunks = _chunks(num_rows, rows)
    seq = None if cu_seqlens is None else correction_ops.sequence_index(cu_seqlens, num_rows, hidden.device)
    num_seqs = 0 if cu_seqlens is None else cu_seqlens.numel() - 1
    metrics = correction_ops.MismatchMetrics(correction, num_seqs, hidden.device) if mismatch_metrics else None
    resolved = resolve_backend(backend, hidden)
    mask = (model_mask != 0).to(torch.int8).contiguous()
    safe_labels = torch.where(mask != 0, labels, _IGNORED).contiguous()
    loss, *stats = FusedLinearPolicyLossFunction.apply(
        hidden.contiguous(),
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        safe_labels,
        behavior_logprobs.contiguous(),
        advantages.contiguous(),
        mask,
        denominator,
        inv_temperature,
        low,
        high,
        loss_settings.clip_c,
        chunks,
        resolved,
        bool(validate),
        correction,
        None if proximal_logprobs is None else proximal_logprobs.detach().contiguous(),
        None if rollout_is_weights is None else rollout_is_weights.detach().float().contiguous(),
        seq,
        metrics,
        boundaries,
    )
    return loss, {**dict(zip(STAT_NAMES, stats)), **({} if metrics is None else metrics.result())}
