"""rwcore.length_regularize -- Arise eq. 17 (appendix B.4; docs/math.md, the eq. 17 row).

R = R_raw * (1 + alpha * (1 - 2 * (l - l_min) / (l_max - l_min + eps))) for
R_raw > 0, only in groups that (a) have both positive and non-positive raw
rewards, (b) have max length > threshold (strict) and (c) have lengths that are
not all equal; R = R_raw otherwise.  Defaults alpha=0.5, threshold=16384,
eps=1e-9.

Hand-worked cases are run against both the implementation and the independent
reference in advantage_reference.py (so the reference is itself checked
against the arithmetic written here); random cases compare the implementation
with the reference.
"""

import numpy as np
import pytest
import torch
from advantage_reference import ref_length_regularize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EPS = 1e-9
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
RTOL64, ATOL64 = 1e-9, 1e-12
RTOL32, ATOL32 = 1e-5, 1e-6


def _impl():
    import rwcore

    return rwcore.length_regularize


@pytest.fixture(params=["rwcore", "reference"])
def lreg(request):
    """The function under test, and the reference checked against the same hand values."""
    return _impl() if request.param == "rwcore" else ref_length_regularize


def np_case(rewards, lengths, gids, dtype=np.float64):
    return (np.asarray(rewards, dtype=dtype), np.asarray(lengths, dtype=np.int64), np.asarray(gids, dtype=np.int64))


def check(got, expected, rtol=1e-12, atol=1e-12):
    got = got.detach().cpu().double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got, dtype=np.float64)
    np.testing.assert_allclose(got, np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------
# Hand-worked
# ----------------------------------------------------------------------------
def test_hand_two_interleaved_groups(lreg):
    # Group 3 (positions 0, 2, 4, 6, 7): rewards [1, 0, 1, 0.5, -1],
    #   lengths [20000, 17000, 18000, 10000, 12000].
    #   Active: has R>0 and R<=0; max length 20000 > 16384; lengths differ.
    #   l_min = 10000, l_max = 20000, l_max - l_min + eps = 10000 + 1e-9.
    #   pos0: 1   * (1 + 0.5*(1 - 2*10000/(10000+eps))) = 0.5 (+1e-13)
    #   pos2: 0   (non-positive: unchanged)
    #   pos4: 1   * (1 + 0.5*(1 - 2*8000/(10000+eps)))  = 1 - 0.3 = 0.7
    #   pos6: 0.5 * (1 + 0.5*(1 - 0))                   = 0.75
    #   pos7: -1  (non-positive: unchanged)
    # Group 9 (positions 1, 3, 5): rewards [2, 3, 0.25], lengths [30000, 100, 5]:
    #   all positive -> inactive -> unchanged [2, 3, 0.25].
    rewards = [1.0, 2.0, 0.0, 3.0, 1.0, 0.25, 0.5, -1.0]
    lengths = [20000, 30000, 17000, 100, 18000, 5, 10000, 12000]
    gids = [3, 9, 3, 9, 3, 9, 3, 3]
    d = 10000 + EPS
    expected = [
        1 * (1 + 0.5 * (1 - 2 * 10000 / d)),
        2.0,
        0.0,
        3.0,
        1 * (1 + 0.5 * (1 - 2 * 8000 / d)),
        0.25,
        0.5 * 1.5,
        -1.0,
    ]
    got = lreg(*np_case(rewards, lengths, gids))
    check(got, expected)
    check(got, [0.5, 2.0, 0.0, 3.0, 0.7, 0.25, 0.75, -1.0], rtol=0, atol=1e-12)


# Base group: rewards [1, 0, 2], lengths [20000, 17000, 16000] -> active;
# l_min=16000, l_max=20000: pos0 1*(1+0.5*(1-2*4000/(4000+eps))) = 0.5,
# pos1 0, pos2 2*(1+0.5*(1-0)) = 3.0.
BASE_R, BASE_L = [1.0, 0.0, 2.0], [20000, 17000, 16000]


def test_hand_base_group_active(lreg):
    d = 4000 + EPS
    got = lreg(*np_case(BASE_R, BASE_L, [5, 5, 5]))
    check(got, [1 * (1 + 0.5 * (1 - 2 * 4000 / d)), 0.0, 2 * 1.5])
    check(got, [0.5, 0.0, 3.0], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "rewards,lengths,kw,why",
    [
        ([1.0, 0.5, 2.0], BASE_L, {}, "all rewards positive"),
        ([-1.0, 0.0, -2.0], BASE_L, {}, "no positive reward"),
        ([0.0, 0.0, 0.0], BASE_L, {}, "all zero"),
        (BASE_R, [16384, 16000, 15000], {}, "max length == threshold (strict >)"),
        (BASE_R, [9000, 16000, 15000], {}, "max length < threshold"),
        (BASE_R, [20000, 20000, 20000], {}, "lengths all equal"),
        (BASE_R, BASE_L, dict(threshold=20000), "max length == custom threshold"),
        (BASE_R, BASE_L, dict(threshold=10**6), "custom threshold above max"),
    ],
)
def test_single_condition_failing_leaves_rewards_unchanged(lreg, rewards, lengths, kw, why):
    r, l, g = np_case(rewards, lengths, [5, 5, 5])
    got = lreg(r, l, g, **kw)
    # Unchanged means bit-identical: R = R_raw.
    check(got, rewards, rtol=0, atol=0)


def test_threshold_strictness_one_above(lreg):
    # lengths [16385, 16000, 15000]: max 16385 > 16384 -> active.
    # l_min=15000, l_max=16385, range 1385: pos0 t=1 -> 1*0.5; pos2 t=0 -> 2*1.5 = 3.
    d = 1385 + EPS
    got = lreg(*np_case(BASE_R, [16385, 16000, 15000], [1, 1, 1]))
    check(got, [1 + 0.5 * (1 - 2 * 1385 / d), 0.0, 3.0])
    # Custom threshold 19999 (< 20000) -> active; 20000 -> inactive (tested above).
    got = lreg(*np_case(BASE_R, BASE_L, [1, 1, 1]), threshold=19999)
    check(got, [0.5, 0.0, 3.0], rtol=0, atol=1e-12)


def test_zero_counts_as_non_positive(lreg):
    # rewards [2, 0] (only zero as the non-positive one), lengths [20000, 30000]:
    # active. l_min=20000, l_max=30000. pos0 t=0 -> 2*1.5 = 3; pos1 stays 0.
    got = lreg(*np_case([2.0, 0.0], [20000, 30000], [0, 0]))
    check(got, [3.0, 0.0])


def test_eps_is_used(lreg):
    # rewards [1, 1, 0], lengths [20100, 20000, 20050]; l_min=20000, l_max=20100.
    # eps=100: denominator 100+100 = 200.
    #   pos0 t=100/200=0.5 -> 1*(1+0.5*(1-1)) = 1.0
    #   pos1 t=0           -> 1*(1+0.5)       = 1.5
    #   pos2 R=0           -> 0
    r, l, g = np_case([1.0, 1.0, 0.0], [20100, 20000, 20050], [4, 4, 4])
    check(lreg(r, l, g, eps=100.0), [1.0, 1.5, 0.0])
    # default eps=1e-9: pos0 1*(1+0.5*(1-2*100/(100+1e-9))) ~ 0.5
    check(lreg(r, l, g), [1 + 0.5 * (1 - 2 * 100 / (100 + EPS)), 1.5, 0.0])


def test_alpha(lreg):
    # base group, alpha=0.2: pos0 1*(1+0.2*(1-2)) = 0.8; pos2 2*(1+0.2) = 2.4
    check(lreg(*np_case(BASE_R, BASE_L, [0, 0, 0]), alpha=0.2), [0.8, 0.0, 2.4], rtol=1e-12, atol=1e-12)
    # alpha=0 is the identity
    check(lreg(*np_case(BASE_R, BASE_L, [0, 0, 0]), alpha=0.0), BASE_R, rtol=0, atol=0)


def test_group_of_one_is_never_regularized(lreg):
    # A single trajectory can't have both signs nor differing lengths.
    check(lreg(*np_case([1.0, 0.5], [40000, 30000], [0, 1])), [1.0, 0.5], rtol=0, atol=0)


def test_float32_hand(lreg):
    got = lreg(*np_case(BASE_R, BASE_L, [5, 5, 5], dtype=np.float32))
    check(got, [0.5, 0.0, 3.0], rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------
# Types, dtypes, devices
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_in_numpy_out(dtype):
    r, l, g = np_case(BASE_R + [1.0], BASE_L + [3], [5, 5, 5, 6], dtype=dtype)
    r0, l0, g0 = r.copy(), l.copy(), g.copy()
    got = _impl()(r, l, g)
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == (4,)
    check(got, [0.5, 0.0, 3.0, 1.0], rtol=1e-6, atol=1e-6)
    # inputs are not modified
    assert np.array_equal(r, r0) and np.array_equal(l, l0) and np.array_equal(g, g0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_in_torch_out(dtype, device):
    r = torch.tensor(BASE_R + [1.0], dtype=dtype, device=device)
    l = torch.tensor(BASE_L + [3], dtype=torch.int64, device=device)
    g = torch.tensor([5, 5, 5, 6], dtype=torch.int64, device=device)
    r0, l0, g0 = r.clone(), l.clone(), g.clone()
    got = _impl()(r, l, g)
    assert isinstance(got, torch.Tensor)
    assert got.dtype == dtype and got.device == r.device and tuple(got.shape) == (4,)
    check(got, [0.5, 0.0, 3.0, 1.0], rtol=1e-6, atol=1e-6)
    assert torch.equal(r, r0) and torch.equal(l, l0) and torch.equal(g, g0)


# ----------------------------------------------------------------------------
# Random groups vs the reference
# ----------------------------------------------------------------------------
@st.composite
def length_batches(draw):
    """Several groups of 1..8 trajectories, arbitrary distinct int ids, interleaved."""
    n_groups = draw(st.integers(1, 5))
    sizes = [draw(st.integers(1, 8)) for _ in range(n_groups)]
    ids = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n_groups, max_size=n_groups, unique=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rewards, lengths, gids = [], [], []
    for gid, size in zip(ids, sizes):
        rmode = draw(st.sampled_from(["mixed", "binary", "positive", "nonpositive", "grid"]))
        if rmode == "mixed":
            r = rng.choice([-1.0, 0.0, 0.25, 0.5, 1.0, 2.0], size=size)
        elif rmode == "binary":
            r = rng.choice([0.0, 1.0], size=size)
        elif rmode == "positive":
            r = rng.integers(1, 129, size=size) / 64.0
        elif rmode == "nonpositive":
            r = -rng.integers(0, 129, size=size) / 64.0
        else:
            r = rng.integers(-128, 129, size=size) / 64.0
        lmode = draw(st.sampled_from(["wide", "around", "equal", "short"]))
        if lmode == "wide":
            l = rng.integers(0, 40001, size=size)
        elif lmode == "around":
            l = rng.choice([16000, 16383, 16384, 16385, 16386], size=size)
        elif lmode == "equal":
            l = np.full(size, rng.choice([100, 16384, 16385, 30000]))
        else:
            l = rng.integers(0, 16385, size=size)
        rewards.append(r)
        lengths.append(l)
        gids.append(np.full(size, gid))
    rewards, lengths, gids = (np.concatenate(x) for x in (rewards, lengths, gids))
    perm = rng.permutation(len(rewards))
    return rewards[perm].astype(np.float64), lengths[perm].astype(np.int64), gids[perm].astype(np.int64)


PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "alpha": st.sampled_from([0.0, 0.25, 0.5, 1.0]),
        "threshold": st.sampled_from([0, 100, 16384, 16385, 30000]),
        "eps": st.sampled_from([1e-9, 1e-3, 1.0, 50.0]),
    },
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=length_batches(), kw=PARAMS)
def test_random_vs_reference_float64(batch, kw):
    r, l, g = batch
    got = _impl()(r, l, g, **kw)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    exp = ref_length_regularize(r, l, g, **kw)
    np.testing.assert_allclose(got, exp, rtol=RTOL64, atol=ATOL64)
    # non-positive rewards are never changed, bit for bit
    assert np.array_equal(got[r <= 0], r[r <= 0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=length_batches(), kw=PARAMS)
def test_random_torch_matches_numpy_and_reference(batch, kw):
    r, l, g = batch
    got_np = _impl()(r, l, g, **kw)
    for dtype in (torch.float64, torch.float32):
        got_t = _impl()(torch.tensor(r, dtype=dtype), torch.tensor(l), torch.tensor(g), **kw)
        assert isinstance(got_t, torch.Tensor) and got_t.dtype == dtype
        if dtype == torch.float64:
            np.testing.assert_allclose(got_t.numpy(), got_np, rtol=1e-12, atol=1e-12)
        else:
            exp32 = ref_length_regularize(r.astype(np.float32), l, g, **kw)
            np.testing.assert_allclose(got_t.double().numpy(), exp32, rtol=RTOL32, atol=ATOL32)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=length_batches())
def test_random_float32_numpy(batch):
    r, l, g = batch
    r32 = r.astype(np.float32)
    got = _impl()(r32, l, g)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got.astype(np.float64), ref_length_regularize(r32, l, g), rtol=RTOL32, atol=ATOL32)


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------
def _raises_naming(name, fn, *args, **kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), f"error message {str(info.value)!r} does not name {name!r}"


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_length_mismatch(lib):
    conv = (
        (lambda x, dt=None: np.asarray(x, dtype=dt))
        if lib == "numpy"
        else (lambda x, dt=None: torch.tensor(x, dtype=dt))
    )
    fdt, idt = (np.float64, np.int64) if lib == "numpy" else (torch.float64, torch.int64)
    r = conv([1.0, 0.0, 2.0], fdt)
    _raises_naming("lengths", _impl(), r, conv([20000, 17000], idt), conv([1, 1, 1], idt))
    _raises_naming("lengths", _impl(), r, conv([20000, 17000, 1, 2], idt), conv([1, 1, 1], idt))
    _raises_naming("group_ids", _impl(), r, conv([20000, 17000, 16000], idt), conv([1, 1, 1, 1], idt))
    _raises_naming("group_ids", _impl(), r, conv([20000, 17000, 16000], idt), conv([1, 1], idt))
