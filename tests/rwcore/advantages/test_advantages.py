"""rwcore.compute_advantages -- Arise eq. 15-16 (docs/math.md, the eq. 15-16 rows).

A_task = (R - mean_G R) / (std_G R + eps);  per rubric i over the group's
trajectories where i applies: A_rub[i, j] = (y_ij - mean_i) / (std_i + eps);
I = the group's rubrics whose applicable verdicts vary; a trajectory with at
least one applicable rubric in I gets
    A = (1 - lam) * A_task + lam / |I| * sum_{i in I} A_rub[i, j]
(inapplicable i contributes 0, |I| is the size of the group's set I), else
A = A_task.  Defaults lam=0.3, eps=1e-9, ddof=1 (sample std).

Hand-worked cases are run against both the implementation and the independent
reference (advantage_reference.py), which checks the reference itself; random
cases compare the implementation with the reference.
"""

import math

import numpy as np
import pytest
import torch
from advantage_reference import ref_compute_advantages, ref_length_regularize, ref_task_advantage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NAN = float("nan")
EPS = 1e-9
S2, S3 = math.sqrt(2.0), math.sqrt(3.0)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
RTOL64, ATOL64 = 1e-9, 1e-11
RTOL32, ATOL32 = 1e-4, 1e-4


def _impl():
    import rwcore

    return rwcore.compute_advantages


@pytest.fixture(params=["rwcore", "reference"])
def adv(request):
    """The function under test, and the reference checked against the same hand values."""
    return _impl() if request.param == "rwcore" else ref_compute_advantages


def as64(x):
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def check(got, expected, rtol=1e-12, atol=1e-12):
    np.testing.assert_allclose(as64(got), np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------
# Hand-worked case: three interleaved groups with ids 10, 7, -3.
#
# pos  gid  R   verdicts r0   r1   r2   r3
#  0   10   0           1    1    nan  0
#  1    7   5           0    nan  nan  nan
#  2   -3   1           1    1    nan  nan
#  3   10   1           0    1    nan  0
#  4    7   5           1    nan  nan  nan
#  5   10   2           nan  1    1    1
#  6   -3   3           0    1    nan  nan
#  7   -3   5           nan  1    nan  nan
# ----------------------------------------------------------------------------
HAND_R = [0.0, 5.0, 1.0, 1.0, 5.0, 2.0, 3.0, 5.0]
HAND_G = [10, 7, -3, 10, 7, 10, -3, -3]
HAND_V = [
    [1, 1, NAN, 0],
    [0, NAN, NAN, NAN],
    [1, 1, NAN, NAN],
    [0, 1, NAN, 0],
    [1, NAN, NAN, NAN],
    [NAN, 1, 1, 1],
    [0, 1, NAN, NAN],
    [NAN, 1, NAN, NAN],
]


def hand_inputs(dtype=np.float64):
    return (np.asarray(HAND_R, dtype=dtype), np.asarray(HAND_V, dtype=dtype), np.asarray(HAND_G, dtype=np.int64))


def hand_expected(lam=0.3, ddof=1):
    """The hand arithmetic, written out.

    ddof=1:
      group 10 (pos 0,3,5): R=[0,1,2], mean 1, std sqrt((1+0+1)/2)=1
          A_task = [-1/(1+eps), 0, 1/(1+eps)]
        r0 applies to pos 0,3: y=[1,0], mean 1/2, std sqrt((1/4+1/4)/1)=1/sqrt2
          A_rub = [+(1/2)/(1/sqrt2+eps), -(1/2)/(1/sqrt2+eps)]   (~ +-0.7071068)
        r1 = [1,1,1] does not vary; r2 applies to pos 5 only -> does not vary
        r3 y=[0,0,1], mean 1/3, std sqrt((1/9+1/9+4/9)/2)=1/sqrt3
          A_rub = [-(1/3)/(1/sqrt3+eps), same, (2/3)/(1/sqrt3+eps)]  (~ -0.5773503, -0.5773503, 1.1547005)
        I = {r0, r3}, |I| = 2
          pos0 = 0.7*(-1) + 0.3/2*(0.7071068 - 0.5773503) = -0.7 + 0.0194635 = -0.6805365
          pos3 = 0.7*0    + 0.3/2*(-0.7071068 - 0.5773503) =       -0.1926686
          pos5 = 0.7*1    + 0.3/2*(0 + 1.1547005)          = 0.7 + 0.1732051 = 0.8732051
          (r0 does not apply to pos5: it contributes 0 but still counts in |I|=2;
           dividing by the 1 applicable rubric instead would give 1.0464102)
      group 7 (pos 1,4): R=[5,5] -> A_task = 0
        r0 y=[0,1] -> A_rub = -+0.7071068; I={r0}
          pos1 = 0.3*(-0.7071068) = -0.2121320;  pos4 = +0.2121320
      group -3 (pos 2,6,7): R=[1,3,5], mean 3, std sqrt((4+0+4)/2)=2
          A_task = [-2/(2+eps), 0, 2/(2+eps)]
        r0 y=[1,0] on pos 2,6 -> +-0.7071068; r1=[1,1,1] does not vary; I={r0}
          pos2 = 0.7*(-1) + 0.3*0.7071068 = -0.4878680
          pos6 = 0        + 0.3*(-0.7071068) = -0.2121320
          pos7: r1 applies but is not in I -> A = A_task = 1
    ddof=0:
      group 10: std_R = sqrt(2/3) -> A_task = -+1/(sqrt(2/3)+eps) (~ -+1.2247449)
        r0 y=[1,0]: std 1/2 -> A_rub = +-(1/2)/(1/2+eps) (~ +-1)
        r3 y=[0,0,1]: std sqrt((2/3)/3) = sqrt2/3 -> A_rub = -(1/3)/(sqrt2/3+eps), same, (2/3)/(sqrt2/3+eps)
                                                      (~ -0.7071068, -0.7071068, 1.4142136)
          pos0 = 0.7*(-1.2247449) + 0.15*(1 - 0.7071068) = -0.8573214 + 0.0439340 = -0.8133874
          pos3 = 0.15*(-1 - 0.7071068) = -0.2560660
          pos5 = 0.8573214 + 0.15*1.4142136 = 1.0694534
      group 7: A_task 0; r0 y=[0,1] std 1/2 -> A_rub -+1 -> pos1 = -0.3, pos4 = +0.3
      group -3: std_R = sqrt(8/3) -> A_task = -+2/(sqrt(8/3)+eps) (~ -+1.2247449), 0
          pos2 = -0.8573214 + 0.3*1 = -0.5573214; pos6 = -0.3; pos7 = 1.2247449
    """
    if ddof == 1:
        sR10, sR3 = 1.0, 2.0
        r0_10 = 0.5 / (1 / S2 + EPS)  # |A_rub| for y=[1,0]
        r3_lo, r3_hi = -(1 / 3) / (1 / S3 + EPS), (2 / 3) / (1 / S3 + EPS)
        r0_7 = r0_3 = r0_10
    else:
        sR10, sR3 = math.sqrt(2 / 3), math.sqrt(8 / 3)
        r0_10 = 0.5 / (0.5 + EPS)
        r3_lo, r3_hi = -(1 / 3) / (S2 / 3 + EPS), (2 / 3) / (S2 / 3 + EPS)
        r0_7 = r0_3 = r0_10
    t10 = [-1 / (sR10 + EPS), 0.0, 1 / (sR10 + EPS)]
    t3 = [-2 / (sR3 + EPS), 0.0, 2 / (sR3 + EPS)]
    out = [0.0] * 8
    out[0] = (1 - lam) * t10[0] + lam / 2 * (r0_10 + r3_lo)
    out[3] = (1 - lam) * t10[1] + lam / 2 * (-r0_10 + r3_lo)
    out[5] = (1 - lam) * t10[2] + lam / 2 * (0.0 + r3_hi)
    out[1] = (1 - lam) * 0.0 + lam / 1 * (-r0_7)
    out[4] = (1 - lam) * 0.0 + lam / 1 * (+r0_7)
    out[2] = (1 - lam) * t3[0] + lam / 1 * r0_3
    out[6] = (1 - lam) * t3[1] + lam / 1 * (-r0_3)
    out[7] = t3[2]
    return out


def test_hand_default_params(adv):
    got = adv(*hand_inputs())  # defaults: lam=0.3, eps=1e-9, ddof=1
    check(got, hand_expected(0.3, 1))
    # rounded values from the docstring arithmetic
    check(
        got, [-0.6805365, -0.2121320, -0.4878680, -0.1926686, 0.2121320, 0.8732051, -0.2121320, 1.0], rtol=0, atol=1e-7
    )
    # |I| is the group's varying-set size (2), not the applicable count at pos 5 (1)
    assert abs(as64(got)[5] - (0.7 + 0.3 * 2 / S3)) > 0.1


def test_hand_explicit_ddof1_equals_default(adv):
    check(adv(*hand_inputs(), lam=0.3, eps=EPS, ddof=1), as64(adv(*hand_inputs())), rtol=0, atol=0)


def test_hand_ddof0(adv):
    got = adv(*hand_inputs(), ddof=0)
    check(got, hand_expected(0.3, 0))
    check(got, [-0.8133874, -0.3, -0.5573214, -0.2560660, 0.3, 1.0694534, -0.3, 1.2247449], rtol=0, atol=1e-7)


def test_hand_lam1(adv):
    # lam=1: trajectories with feedback from I get only the rubric part
    #   pos0 = 1/2*(0.7071068 - 0.5773503) = 0.0648782
    #   pos3 = 1/2*(-0.7071068 - 0.5773503) = -0.6422285
    #   pos5 = 1/2*(0 + 1.1547005) = 0.5773503
    #   pos1/pos4 = -+0.7071068; pos2 = +0.7071068; pos6 = -0.7071068
    #   pos7 has no feedback from I -> A_task = 1
    got = adv(*hand_inputs(), lam=1.0)
    check(got, hand_expected(1.0, 1))
    check(got, [0.0648782, -0.7071068, 0.7071068, -0.6422285, 0.7071068, 0.5773503, -0.7071068, 1.0], rtol=0, atol=1e-7)


def test_hand_lam0_is_task_advantage(adv):
    # lam=0: A = A_task everywhere: [-1, 0, -1, 0, 0, 1, 0, 1] (up to eps)
    r, v, g = hand_inputs()
    got = adv(r, v, g, lam=0.0)
    check(got, [-1 / (1 + EPS), 0.0, -2 / (2 + EPS), 0.0, 0.0, 1 / (1 + EPS), 0.0, 2 / (2 + EPS)])
    # exactly what the same function gives with no rubrics at all
    assert np.array_equal(as64(got), as64(adv(r, np.zeros((8, 0)), g, lam=0.0)))
    assert np.array_equal(as64(got), as64(adv(r, np.zeros((8, 0)), g)))


def test_hand_eps(adv):
    # eps=1: group [0,1,2] std 1 -> A_task = [-1/2, 0, 1/2];
    # rubric y=[1,0,nan] std 1/sqrt2 -> A_rub = +-(1/2)/(1/sqrt2 + 1) = +-0.2928932
    #   pos0 = 0.7*(-0.5) + 0.3*0.2928932 = -0.2621320; pos1 = -0.0878680; pos2 = 0.5
    got = adv(np.array([0.0, 1.0, 2.0]), np.array([[1.0], [0.0], [NAN]]), np.array([0, 0, 0]), eps=1.0)
    a = 0.5 / (1 / S2 + 1)
    check(got, [0.7 * -0.5 + 0.3 * a, -0.3 * a, 0.5])
    check(got, [-0.2621320, -0.0878680, 0.5], rtol=0, atol=1e-7)


@pytest.mark.parametrize("ddof", [0, 1])
def test_group_of_one(adv, ddof):
    # Every trajectory alone in its group: R - mean = 0 -> A_task = 0; a
    # rubric can't vary over one trajectory -> A = 0, and never NaN.
    r = np.array([3.0, -1.0, 0.5])
    v = np.array([[1.0, NAN], [0.0, 1.0], [NAN, NAN]])
    got = as64(adv(r, v, np.array([4, 8, 15]), ddof=ddof))
    assert np.all(np.isfinite(got))
    assert np.array_equal(got, np.zeros(3))


def test_group_of_one_beside_a_real_group(adv):
    # ids [2, 1, 2, 2]: group 1 = [7] alone -> 0; group 2 = [0, 1, 2] -> [-1, 0, 1]/(1+eps);
    # rubric on group 2 varies: y=[1,0,nan] -> +-0.7071068; pos3 has no feedback.
    #   pos0 = -0.7 + 0.3*0.7071068 = -0.4878680; pos2 = -0.2121320; pos3 = 1
    r = np.array([0.0, 7.0, 1.0, 2.0])
    v = np.array([[1.0], [1.0], [0.0], [NAN]])
    got = as64(adv(r, v, np.array([2, 1, 2, 2])))
    assert np.all(np.isfinite(got))
    a = 0.5 / (1 / S2 + EPS)
    check(got, [-0.7 / (1 + EPS) + 0.3 * a, 0.0, -0.3 * a, 1 / (1 + EPS)])


def test_all_equal_rewards_give_zero_task_advantage(adv):
    # R = [0.5]*4 -> A_task = 0; no rubrics -> A = 0 exactly
    got = as64(adv(np.full(4, 0.5), np.zeros((4, 0)), np.zeros(4, dtype=np.int64)))
    assert np.array_equal(got, np.zeros(4))
    # with a varying rubric y=[1,1,0,nan]: mean 2/3, std sqrt((1/9+1/9+4/9)/2)=1/sqrt3
    #   A_rub = [(1/3)/(1/sqrt3+eps), same, -(2/3)/(1/sqrt3+eps)] = [0.5773503, 0.5773503, -1.1547005]
    #   A = 0.3 * A_rub, pos3 -> 0
    got = adv(np.full(4, 0.5), np.array([[1.0], [1.0], [0.0], [NAN]]), np.zeros(4, dtype=np.int64))
    lo, hi = (1 / 3) / (1 / S3 + EPS), -(2 / 3) / (1 / S3 + EPS)
    check(got, [0.3 * lo, 0.3 * lo, 0.3 * hi, 0.0])


def test_rubric_with_one_applicable_trajectory_is_ignored(adv):
    # group [0,1,2] (A_task -1,0,1); rubric r0 applies only to pos1 (y=1): not
    # in I, so A = A_task; rubric r1 y=[0,1,1] varies: mean 2/3, std 1/sqrt3,
    # A_rub = [-(2/3)/(1/sqrt3+eps), (1/3)/(...), (1/3)/(...)] = [-1.1547005, 0.5773503, 0.5773503]
    # |I| = 1 (r0 is not counted):
    #   pos0 = -0.7 - 0.3*1.1547005 = -1.0464102; pos1 = 0.1732051; pos2 = 0.7 + 0.1732051 = 0.8732051
    r = np.array([0.0, 1.0, 2.0])
    g = np.array([3, 3, 3])
    only_r0 = np.array([[NAN], [1.0], [NAN]])
    check(adv(r, only_r0, g), [-1 / (1 + EPS), 0.0, 1 / (1 + EPS)])
    v = np.array([[NAN, 0.0], [1.0, 1.0], [NAN, 1.0]])
    lo, hi = -(2 / 3) / (1 / S3 + EPS), (1 / 3) / (1 / S3 + EPS)
    got = adv(r, v, g)
    check(got, [-0.7 / (1 + EPS) + 0.3 * lo, 0.3 * hi, 0.7 / (1 + EPS) + 0.3 * hi])
    check(got, [-1.0464102, 0.1732051, 0.8732051], rtol=0, atol=1e-7)
    # a verdict of 0 from the single applicable trajectory is not variance either
    check(adv(r, np.array([[NAN], [0.0], [NAN]]), g), [-1 / (1 + EPS), 0.0, 1 / (1 + EPS)])


@pytest.mark.parametrize(
    "name,v",
    [
        ("no rubrics (R=0)", np.zeros((5, 0))),
        ("all inapplicable", np.full((5, 3), NAN)),
        ("constant verdicts", np.array([[1, 0, NAN]] * 5, dtype=np.float64)),
        ("constant within each group", np.array([[1, 0], [0, 1], [1, 0], [0, NAN], [NAN, 1]], dtype=np.float64)),
        (
            "single applicable per group",
            np.array([[1, NAN], [NAN, 0], [NAN, NAN], [0, NAN], [NAN, NAN]], dtype=np.float64),
        ),
    ],
)
def test_no_rubric_variance_gives_task_advantage_exactly(adv, name, v):
    # groups: id 1 -> pos 0, 2 (R 1, 3); id 0 -> pos 1, 3, 4 (R 0, 3, 6)
    # group 1: mean 2, std sqrt(2)   -> A_task = -+1/(sqrt2+eps)
    # group 0: mean 3, std 3         -> A_task = [-3/(3+eps), 0, 3/(3+eps)]
    r = np.array([1.0, 0.0, 3.0, 3.0, 6.0])
    g = np.array([1, 0, 1, 0, 0])
    got = as64(adv(r, v, g))
    check(got, [-1 / (S2 + EPS), -3 / (3 + EPS), 1 / (S2 + EPS), 0.0, 3 / (3 + EPS)])
    assert np.array_equal(got, as64(adv(r, np.zeros((5, 0)), g)))


def test_verdicts_with_float_zero_and_one_only():
    # verdicts given as float32 0/1 with float32 rewards: type preserved
    r, v, g = hand_inputs(np.float32)
    got = _impl()(r, v, g)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (8,)
    check(got, hand_expected(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------
# Types, dtypes, devices
# ----------------------------------------------------------------------------
def test_numpy_in_numpy_out_not_mutated():
    r, v, g = hand_inputs()
    r0, v0, g0 = r.copy(), v.copy(), g.copy()
    got = _impl()(r, v, g)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == (8,)
    assert np.array_equal(r, r0) and np.array_equal(v, v0, equal_nan=True) and np.array_equal(g, g0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_in_torch_out(dtype, device):
    r, v, g = hand_inputs()
    rt = torch.tensor(r, dtype=dtype, device=device)
    vt = torch.tensor(v, dtype=dtype, device=device)
    gt = torch.tensor(g, device=device)
    copies = [x.clone() for x in (rt, vt, gt)]
    got = _impl()(rt, vt, gt)
    assert isinstance(got, torch.Tensor)
    assert got.dtype == dtype and got.device == rt.device and tuple(got.shape) == (8,)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    check(got, hand_expected(), **tol)
    check(got, as64(_impl()(r, v, g)), **tol)  # same numbers as the NumPy path
    assert torch.equal(rt, copies[0]) and torch.equal(gt, copies[2])
    assert torch.equal(torch.isnan(vt), torch.isnan(copies[1]))
    assert torch.equal(torch.nan_to_num(vt), torch.nan_to_num(copies[1]))


# ----------------------------------------------------------------------------
# Random groups vs the reference
# ----------------------------------------------------------------------------
@st.composite
def adv_batches(draw, max_groups=5, max_size=8, max_rubrics=5):
    """Several groups of 1..8 trajectories, arbitrary distinct int ids, shuffled
    together; rewards on a dyadic grid (so all-equal groups have an exact mean);
    per (group, rubric) a verdict pattern: random with some NaN, constant, a
    single applicable trajectory, or all inapplicable."""
    n_groups = draw(st.integers(1, max_groups))
    sizes = [draw(st.integers(1, max_size)) for _ in range(n_groups)]
    ids = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n_groups, max_size=n_groups, unique=True))
    n_rub = draw(st.integers(0, max_rubrics))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rewards, verdicts, gids = [], [], []
    for gid, size in zip(ids, sizes):
        rmode = draw(st.sampled_from(["binary", "grid", "constant", "few"]))
        if rmode == "binary":
            r = rng.choice([0.0, 1.0], size=size)
        elif rmode == "grid":
            r = rng.integers(-128, 129, size=size) / 64.0
        elif rmode == "constant":
            r = np.full(size, rng.integers(-128, 129) / 64.0)
        else:
            r = rng.choice([-1.0, 0.0, 0.5, 1.5], size=size)
        v = np.empty((size, n_rub))
        for i in range(n_rub):
            vmode = draw(st.sampled_from(["random", "random_nan", "mostly_nan", "constant", "single", "all_nan"]))
            if vmode in ("random", "random_nan", "mostly_nan"):
                p_nan = {"random": 0.0, "random_nan": 0.3, "mostly_nan": 0.7}[vmode]
                col = rng.integers(0, 2, size=size).astype(np.float64)
                col[rng.random(size) < p_nan] = NAN
            elif vmode == "constant":
                col = np.full(size, float(rng.integers(0, 2)))
                col[rng.random(size) < 0.3] = NAN
            elif vmode == "single":
                col = np.full(size, NAN)
                col[rng.integers(0, size)] = float(rng.integers(0, 2))
            else:
                col = np.full(size, NAN)
            v[:, i] = col
        rewards.append(r)
        verdicts.append(v)
        gids.append(np.full(size, gid, dtype=np.int64))
    r, v, g = np.concatenate(rewards), np.concatenate(verdicts, axis=0), np.concatenate(gids)
    perm = rng.permutation(len(r))
    return r[perm], v[perm].reshape(len(r), n_rub), g[perm]


PARAMS = st.fixed_dictionaries(
    {},
    optional={
        "lam": st.sampled_from([0.0, 0.3, 1.0, 0.7, 0.125]),
        "eps": st.sampled_from([1e-9, 1e-6, 0.5]),
        "ddof": st.sampled_from([0, 1]),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=adv_batches(), kw=PARAMS)
def test_random_vs_reference_float64(batch, kw):
    r, v, g = batch
    got = _impl()(r, v, g, **kw)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == r.shape
    assert np.all(np.isfinite(got)), "NaN/inf in the output"
    np.testing.assert_allclose(got, ref_compute_advantages(r, v, g, **kw), rtol=RTOL64, atol=ATOL64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=adv_batches(), kw=PARAMS)
def test_random_float32(batch, kw):
    r, v, g = batch
    r32, v32 = r.astype(np.float32), v.astype(np.float32)
    exp = ref_compute_advantages(r32, v32, g, **kw)
    got = _impl()(r32, v32, g, **kw)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got.astype(np.float64), exp, rtol=RTOL32, atol=ATOL32)
    got_t = _impl()(torch.from_numpy(r32), torch.from_numpy(v32), torch.from_numpy(g), **kw)
    assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.float32
    np.testing.assert_allclose(got_t.double().numpy(), exp, rtol=RTOL32, atol=ATOL32)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=adv_batches(), kw=PARAMS)
def test_random_torch_matches_numpy(batch, kw):
    r, v, g = batch
    got_np = _impl()(r, v, g, **kw)
    got_t = _impl()(torch.from_numpy(r.copy()), torch.from_numpy(v.copy()), torch.from_numpy(g.copy()), **kw)
    assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.float64
    np.testing.assert_allclose(got_t.numpy(), got_np, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=adv_batches(), ddof=st.sampled_from([0, 1]))
def test_random_lam0_and_no_variance_equal_task_advantage_exactly(batch, ddof):
    r, v, g = batch
    no_rub = _impl()(r, np.zeros((len(r), 0)), g, ddof=ddof)
    np.testing.assert_allclose(no_rub, ref_task_advantage(r, g, ddof=ddof), rtol=RTOL64, atol=ATOL64)
    assert np.array_equal(_impl()(r, v, g, lam=0.0, ddof=ddof), no_rub)
    assert np.array_equal(_impl()(r, np.full_like(v, NAN), g, ddof=ddof), no_rub)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=adv_batches(), lens_seed=st.integers(0, 2**32 - 1))
def test_random_pipeline_length_then_advantages(batch, lens_seed):
    # length_regularize feeds compute_advantages (eq. 17 precedes eq. 15)
    import rwcore

    r, v, g = batch
    lengths = np.random.default_rng(lens_seed).integers(10000, 30000, size=len(r))
    reg = rwcore.length_regularize(r, lengths, g)
    np.testing.assert_allclose(reg, ref_length_regularize(r, lengths, g), rtol=RTOL64, atol=1e-12)
    got = rwcore.compute_advantages(reg, v, g)
    exp = ref_compute_advantages(ref_length_regularize(r, lengths, g), v, g)
    np.testing.assert_allclose(got, exp, rtol=1e-8, atol=1e-10)


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------
def _raises_naming(name, fn, *args, **kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), f"error message {str(info.value)!r} does not name {name!r}"


LIBS = ["numpy", "torch"]


def _conv(lib, x, dt=None):
    if lib == "numpy":
        return np.asarray(x, dtype={None: None, "f": np.float64, "i": np.int64}[dt])
    return torch.tensor(np.asarray(x), dtype={None: None, "f": torch.float64, "i": torch.int64}[dt])


@pytest.mark.parametrize("lib", LIBS)
def test_nan_reward_rejected(lib):
    v = _conv(lib, [[1.0], [0.0], [NAN]], "f")
    _raises_naming("task_rewards", _impl(), _conv(lib, [0.0, NAN, 1.0], "f"), v, _conv(lib, [0, 0, 0], "i"))


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0, float("inf"), -float("inf"), 1e-12])
def test_bad_verdict_value_rejected(lib, bad):
    v = _conv(lib, [[1.0, 0.0], [0.0, bad], [NAN, 1.0]], "f")
    _raises_naming("verdicts", _impl(), _conv(lib, [0.0, 1.0, 2.0], "f"), v, _conv(lib, [0, 0, 1], "i"))


@pytest.mark.parametrize("lib", LIBS)
def test_shape_errors_name_the_argument(lib):
    f = _impl()
    r = _conv(lib, [0.0, 1.0, 2.0], "f")
    v = _conv(lib, [[1.0], [0.0], [NAN]], "f")
    g = _conv(lib, [0, 0, 1], "i")
    _raises_naming("task_rewards", f, _conv(lib, [[0.0], [1.0], [2.0]], "f"), v, g)  # [N,1] rewards
    _raises_naming("verdicts", f, r, _conv(lib, [1.0, 0.0, 1.0], "f"), g)  # 1-D verdicts
    _raises_naming("verdicts", f, r, _conv(lib, [[1.0], [0.0]], "f"), g)  # N-1 rows
    _raises_naming("verdicts", f, r, _conv(lib, [[1.0], [0.0], [1.0], [1.0]], "f"), g)  # N+1 rows
    _raises_naming("verdicts", f, r, _conv(lib, np.zeros((3, 1, 1)), "f"), g)  # 3-D
    _raises_naming("group_ids", f, r, v, _conv(lib, [0, 0], "i"))
    _raises_naming("group_ids", f, r, v, _conv(lib, [0, 0, 1, 1], "i"))


def test_errors_do_not_mutate_inputs():
    r = np.array([0.0, 1.0, 2.0])
    v = np.array([[1.0], [0.5], [NAN]])
    g = np.array([0, 0, 0])
    with pytest.raises(ValueError):
        _impl()(r, v, g)
    assert np.array_equal(r, [0.0, 1.0, 2.0]) and np.array_equal(v, [[1.0], [0.5], [NAN]], equal_nan=True)
