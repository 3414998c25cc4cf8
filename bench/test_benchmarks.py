"""pytest-benchmark versions of the suite's key operations, each beside its peer in one group.

    .venv/bin/python -m pytest bench/ --benchmark-only                    # about a minute
    .venv/bin/python -m pytest bench/ --benchmark-only --benchmark-group-by=group --benchmark-columns=min,median,ops

Small sizes: these compare per-call cost within a group (rwcore vs its pure-Python or eager peer);
the scripts in bench/ (and `rw bench`) measure the full-sized cases. Each rwcore test also checks,
outside the timed part, that rwcore and the peer agree on the same inputs. Not part of the normal
test suite (pytest's testpaths is tests/).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from bench_advantages import make_inputs, peer_compute_advantages, peer_length_regularize
from bench_sampler import feed, make_groups, make_tasks
from reference_sampler import RefCapabilitySampler, RefEvidenceStore

import rwcore

torch = pytest.importorskip("torch")
kernels = pytest.importorskip("rwcore.kernels")


# --------------------------------------------------------------------------- evidence store


@pytest.fixture(scope="module")
def observations():
    rng = np.random.default_rng(0)
    n = 20_000
    versions = np.arange(n) // 200
    late = rng.random(n) < 0.05
    arrays = {
        "tags": rng.integers(0, 82, n),
        "rubrics": rng.integers(0, 64, n),
        "successes": rng.random(n) * 8,
        "versions": np.where(late, np.maximum(0, versions - rng.integers(1, 4, n)), versions),
    }
    arrays["failures"] = 8 - arrays["successes"]
    order = ("tags", "rubrics", "successes", "failures", "versions")
    return [arrays[k] for k in order], [arrays[k].tolist() for k in order]


def _observe_native(arrays):
    store = rwcore.EvidenceStore()
    store.observe_many(*arrays)
    return store


def _observe_peer(lists):
    store = RefEvidenceStore()
    for tag, rubric, s, f, v in zip(*lists):
        store.observe(tag, rubric, s, f, v)
    return store


@pytest.mark.benchmark(group="evidence observe_many (20k observations)")
def test_observe_many_rwcore(benchmark, observations):
    arrays, lists = observations
    store = benchmark(_observe_native, arrays)
    peer = _observe_peer(lists)
    for tag, rubric in [(0, 0), (5, 17), (81, 63)]:
        assert store.query(tag, rubric, 120) == pytest.approx(peer.query(tag, rubric, 120), rel=1e-9, abs=1e-12)


@pytest.mark.benchmark(group="evidence observe_many (20k observations)")
def test_observe_many_python_peer(benchmark, observations):
    benchmark(_observe_peer, observations[1])


# --------------------------------------------------------------------------- sampler


@pytest.fixture(scope="module")
def samplers():
    """rwcore and the reference sampler in the adaptive phase: 2000 tasks, every one judged on 16 rubrics."""
    rng = random.Random(0)
    tasks = make_tasks(2000, 82, rng)
    rubrics = {f"rubric{i}": rwcore.DEFAULT_CAPABILITIES[i % len(rwcore.DEFAULT_CAPABILITIES)] for i in range(16)}
    pair = (
        rwcore.CapabilitySampler(tasks, batch_size=32, group_size=8, seed=0),
        RefCapabilitySampler(tasks, batch_size=32, group_size=8, seed=0),
    )
    for sampler in pair:
        sampler.set_rubrics(rubrics)
    feed(pair, make_groups(list(tasks), list(rubrics), 16, 6, 8, rng))
    assert pair[0].coverage() == pair[1].coverage() == 1.0
    return pair


@pytest.mark.benchmark(group="sampler sample() (2000 tasks, 16 rubrics, batch 32)")
def test_sample_rwcore(benchmark, samplers):
    batch = benchmark(samplers[0].sample, 41)
    assert len(batch) == 32 and len(set(batch)) == 32


@pytest.mark.benchmark(group="sampler sample() (2000 tasks, 16 rubrics, batch 32)")
def test_sample_python_peer(benchmark, samplers):
    batch = benchmark(samplers[1].sample, 41)
    assert len(batch) == 32


# --------------------------------------------------------------------------- advantages


@pytest.fixture(scope="module")
def advantage_inputs():
    return make_inputs(16_384, 16, 8, seed=0)


@pytest.mark.benchmark(group="compute_advantages (16k x 16, groups of 8)")
def test_compute_advantages_rwcore(benchmark, advantage_inputs):
    d = advantage_inputs
    out = benchmark(rwcore.compute_advantages, d["rewards"], d["verdicts"], d["group_ids"])
    np.testing.assert_allclose(out, peer_compute_advantages(d["rewards"], d["verdicts"], d["group_ids"]), atol=1e-9)


@pytest.mark.benchmark(group="compute_advantages (16k x 16, groups of 8)")
def test_compute_advantages_per_group_loop(benchmark, advantage_inputs):
    d = advantage_inputs
    benchmark(peer_compute_advantages, d["rewards"], d["verdicts"], d["group_ids"])


@pytest.mark.benchmark(group="length_regularize (16k, groups of 8)")
def test_length_regularize_rwcore(benchmark, advantage_inputs):
    d = advantage_inputs
    out = benchmark(rwcore.length_regularize, d["rewards"], d["lengths"], d["group_ids"])
    np.testing.assert_allclose(out, peer_length_regularize(d["rewards"], d["lengths"], d["group_ids"]), atol=1e-12)


@pytest.mark.benchmark(group="length_regularize (16k, groups of 8)")
def test_length_regularize_per_group_loop(benchmark, advantage_inputs):
    d = advantage_inputs
    benchmark(peer_length_regularize, d["rewards"], d["lengths"], d["group_ids"])


# --------------------------------------------------------------------------- policy-loss kernels


def _eager_policy_loss(logp, behavior, advantages, mask):
    """Arise's filtered dual-clip loss in plain PyTorch ops (ratio filter (0.5, 5), c = 3)."""
    ratio = torch.exp((logp - behavior).clamp(-20, 20))
    keep = mask & (ratio > 0.5) & (ratio < 5.0)
    term = torch.where(keep, torch.minimum(-ratio * advantages, 3.0 * advantages.abs()), 0.0)
    return term.sum() / mask.sum()


@pytest.fixture(scope="module")
def loss_inputs():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(32, 512, generator=gen) * 5
    behavior = logp + 0.3 * torch.randn(32, 512, generator=gen)
    advantages = torch.randn(32, generator=gen)
    mask = torch.rand(32, 512, generator=gen) < 0.9
    return logp, behavior, advantages, mask


def _dual_clip_rwcore(logp, behavior, advantages, mask):
    x = logp.clone().requires_grad_()
    loss, _ = kernels.filtered_dual_clip_loss(x, behavior, advantages, mask, backend="torch")
    loss.backward()
    return loss.detach(), x.grad


def _dual_clip_eager(logp, behavior, advantages, mask):
    x = logp.clone().requires_grad_()
    loss = _eager_policy_loss(x, behavior, advantages[:, None], mask)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.benchmark(group="filtered_dual_clip_loss fwd+bwd (32 x 512 tokens)")
def test_filtered_dual_clip_loss_rwcore(benchmark, loss_inputs):
    loss, grad = benchmark(_dual_clip_rwcore, *loss_inputs)
    ref_loss, ref_grad = _dual_clip_eager(*loss_inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.benchmark(group="filtered_dual_clip_loss fwd+bwd (32 x 512 tokens)")
def test_filtered_dual_clip_loss_eager(benchmark, loss_inputs):
    benchmark(_dual_clip_eager, *loss_inputs)


@pytest.fixture(scope="module")
def linear_inputs():
    n, h, v = 512, 128, 4096
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=gen) / h**0.5
    weight = torch.randn(v, h, generator=gen)
    labels = torch.randint(0, v, (n,), generator=gen)
    mask = torch.rand(n, generator=gen) < 0.9
    with torch.no_grad():
        logp = torch.log_softmax(hidden @ weight.t(), dim=-1).gather(1, labels[:, None]).squeeze(1)
    behavior = logp + 0.3 * torch.randn(n, generator=gen)
    advantages = torch.randn(n, generator=gen)
    return hidden, weight, labels, behavior, advantages, mask


def _fused_rwcore(hidden, weight, labels, behavior, advantages, mask):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, _ = kernels.fused_linear_policy_loss(h, w, labels, behavior, advantages, mask, backend="torch")
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _fused_eager(hidden, weight, labels, behavior, advantages, mask):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp = torch.log_softmax(h @ w.t(), dim=-1).gather(1, labels[:, None]).squeeze(1)
    loss = _eager_policy_loss(logp, behavior, advantages, mask)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.benchmark(group="fused_linear_policy_loss fwd+bwd (512 x 128 x 4096)")
def test_fused_linear_policy_loss_rwcore(benchmark, linear_inputs):
    result = benchmark(_fused_rwcore, *linear_inputs)
    for ours, ref in zip(result, _fused_eager(*linear_inputs)):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.benchmark(group="fused_linear_policy_loss fwd+bwd (512 x 128 x 4096)")
def test_fused_linear_policy_loss_eager(benchmark, linear_inputs):
    benchmark(_fused_eager, *linear_inputs)


# --------------------------------------------------------------------------- rollout correction

_CORRECTION_GROUP = "fused_linear_policy_loss with a rollout correction fwd+bwd (512 x 128 x 4096, 4 sequences)"


def _fused_corrected(hidden, weight, labels, behavior, advantages, mask, correction=None):
    """bench_rollout_correction.py's calls: the plain loss without metrics, a correction as the trainer calls it."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    kwargs = {"mismatch_metrics": False}
    if correction is not None:
        cu_seqlens = torch.arange(5) * (hidden.shape[0] // 4)
        proximal = {} if correction.startswith("bypass_") else {"proximal_logprobs": behavior + 0.05}
        kwargs = {"rollout_correction": correction, "cu_seqlens": cu_seqlens, **proximal}
    loss, _ = kernels.fused_linear_policy_loss(h, w, labels, behavior, advantages, mask, backend="torch", **kwargs)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.benchmark(group=_CORRECTION_GROUP)
def test_fused_linear_policy_loss_plain(benchmark, linear_inputs):
    benchmark(_fused_corrected, *linear_inputs)


@pytest.mark.benchmark(group=_CORRECTION_GROUP)
@pytest.mark.parametrize("correction", ["decoupled_geo_rs_token_tis", "bypass_pg_geo_rs_seq_tis"])
def test_fused_linear_policy_loss_with_correction(benchmark, linear_inputs, correction):
    result = benchmark(_fused_corrected, *linear_inputs, correction)
    assert all(bool(torch.isfinite(t).all()) for t in result)
