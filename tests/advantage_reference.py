"""Independent, deliberately plain reference for Arise eq. 15-17.

Written from the Arise paper (section 3.3 "Advantage Estimation", eq. 15-16,
and appendix B.4 "Length Regularization", eq. 17) and docs/math.md (its eq. 15-17
rows) -- not from rwcore/arise/advantages.py.

Everything is computed in float64 with Python loops, one group at a time, so
that it is easy to check by eye:

* ``ref_length_regularize`` (eq. 17): per group, active only when the group
  has both a positive and a non-positive raw reward, its maximum length is
  strictly greater than ``threshold`` and its lengths are not all equal; then
  every positive reward is multiplied by
  ``1 + alpha * (1 - 2 * (l - l_min) / (l_max - l_min + eps))`` with
  l_min / l_max over the whole group (failed trajectories included).
* ``ref_compute_advantages`` (eq. 15-16): group-normalized task reward, per
  rubric normalization over the applicable (non-NaN) verdicts only, ``I`` =
  rubrics whose applicable verdicts are not all equal (a rubric applicable to a
  single trajectory of the group never varies), and
  ``A = (1 - lam) * A_task + lam / |I| * sum_{i in I, i applies to j} A_rub``
  for trajectories with at least one applicable rubric in ``I``, ``A_task``
  otherwise.  ``|I|`` is the size of the group's varying set, not the number of
  rubrics that apply to the trajectory.

Standard deviation: ``sqrt(sum((x - mean)^2) / (n - ddof))``; when
``n - ddof <= 0`` (a lone trajectory with ddof=1) the spread is taken as 0,
which makes ``A_task = 0 / (0 + eps) = 0`` because the numerator is 0 too.
"""

import math

import numpy as np


def _as_f64_1d(x):
    try:
        import torch

        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().double().numpy()
    except ImportError:  # pragma: no cover
        pass
    return np.asarray(x, dtype=np.float64)


def _groups(group_ids):
    """{group id: [positions in first-appearance order]} (plain Python)."""
    try:
        import torch

        if isinstance(group_ids, torch.Tensor):
            group_ids = group_ids.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    out = {}
    for pos, g in enumerate(np.asarray(group_ids).tolist()):
        out.setdefault(int(g), []).append(pos)
    return out


def _mean(xs):
    return math.fsum(xs) / len(xs)


def _std(xs, ddof):
    n = len(xs)
    if n - ddof <= 0:
        return 0.0
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - ddof))


def ref_length_regularize(rewards, lengths, group_ids, alpha=0.5, threshold=16384, eps=1e-9):
    r = _as_f64_1d(rewards)
    l = _as_f64_1d(lengths)
    out = r.copy()
    for _, idx in _groups(group_ids).items():
        rs = [float(r[j]) for j in idx]
        ls = [float(l[j]) for j in idx]
        has_pos = any(x > 0 for x in rs)
        has_nonpos = any(x <= 0 for x in rs)
        l_min, l_max = min(ls), max(ls)
        active = has_pos and has_nonpos and l_max > threshold and l_min != l_max
        if not active:
            continue
        for j in idx:
            if r[j] > 0:
                t = (l[j] - l_min) / (l_max - l_min + eps)
                out[j] = r[j] * (1.0 + alpha * (1.0 - 2.0 * t))
    return out


def ref_task_advantage(rewards, group_ids, eps=1e-9, ddof=1):
    r = _as_f64_1d(rewards)
    a = np.zeros_like(r)
    for _, idx in _groups(group_ids).items():
        rs = [float(r[j]) for j in idx]
        m, s = _mean(rs), _std(rs, ddof)
        for j in idx:
            a[j] = (r[j] - m) / (s + eps)
    return a


def ref_compute_advantages(task_rewards, verdicts, group_ids, lam=0.3, eps=1e-9, ddof=1):
    r = _as_f64_1d(task_rewards)
    v = _as_f64_1d(verdicts)
    n = r.shape[0]
    assert v.ndim == 2 and v.shape[0] == n, "reference expects verdicts [N, R]"
    n_rub = v.shape[1]
    a_task = ref_task_advantage(r, group_ids, eps=eps, ddof=ddof)
    out = a_task.copy()
    for _, idx in _groups(group_ids).items():
        varying = []  # the group's set I
        a_rub = {}  # (i, j) -> A_rub[i, j] for i in I and i applicable to j
        for i in range(n_rub):
            app = [j for j in idx if not math.isnan(v[j, i])]
            ys = [float(v[j, i]) for j in app]
            if len(ys) < 2 or min(ys) == max(ys):
                continue  # does not vary within the group
            varying.append(i)
            m, s = _mean(ys), _std(ys, ddof)
            for j in app:
                a_rub[(i, j)] = (v[j, i] - m) / (s + eps)
        if not varying:
            continue
        size_i = len(varying)
        for j in idx:
            terms = [a_rub[(i, j)] for i in varying if (i, j) in a_rub]
            if not terms:
                continue  # no usable feedback from I: A = A_task
            out[j] = (1.0 - lam) * a_task[j] + lam / size_i * math.fsum(terms)
    return out


# ------------------------------------------------------------------------------------------------
# Credit settings (docs/method.md "Credit and exploration settings"), written from TRL 1.16's
# GRPOTrainer._generate_and_score_completions (scale_rewards, multi_objective_aggregation) and the
# definitions of the process gate -- not from rwcore/arise/advantages.py:
#
# * scale_rewards: advantages are R - mean_group(R) divided by std_group(R) + eps ("group"), by the std of
#   R over every trajectory of the batch + eps ("batch", TRL's nanstd(rewards)), or not divided ("none").
#   Arise's rubric advantages alike: y - mean_group_i divided by the group's std of rubric i ("group"),
#   by rubric i's std over the batch's applicable trajectories ("batch"), or nothing ("none").
# * aggregation "normalize_then_sum" (TRL): each reward (R_task, J) centred on its group mean and scaled
#   by the rule above, the two summed, and the sum centred on its batch mean and divided by its batch
#   std + eps. "sum_then_normalize": R = R_task + J, then as above.
# * process_gate: a trajectory gets process credit when the gate is "off", when its group holds a success
#   ("success_groups") or when it is a success itself ("success_only"). Without credit J counts 0 and no
#   rubric applies to it (so A = A_task there).
# ------------------------------------------------------------------------------------------------


def ref_credit_mask(successes, group_ids, process_gate="off"):
    ok = [bool(x) for x in np.asarray(successes).tolist()]
    out = [True] * len(ok)
    if process_gate == "off":
        return out
    for _, idx in _groups(group_ids).items():
        any_success = any(ok[j] for j in idx)
        for j in idx:
            out[j] = ok[j] if process_gate == "success_only" else any_success
    return out


def _scaled(values, group_ids, scale_rewards, eps, ddof):
    """values centred on their group mean, divided per scale_rewards (plain loops)."""
    out = [0.0] * len(values)
    batch_std = _std(list(values), ddof)
    for _, idx in _groups(group_ids).items():
        xs = [values[j] for j in idx]
        m = _mean(xs)
        scale = {"group": _std(xs, ddof) + eps, "batch": batch_std + eps, "none": 1.0}[scale_rewards]
        for j in idx:
            out[j] = (values[j] - m) / scale
    return out


def ref_credit_advantages(
    task_rewards,
    verdicts,
    group_ids,
    lam=0.3,
    eps=1e-9,
    ddof=1,
    process_rewards=None,
    scale_rewards="group",
    aggregation="sum_then_normalize",
    process_gate="off",
    successes=None,
):
    r = [float(x) for x in _as_f64_1d(task_rewards)]
    n = len(r)
    v = _as_f64_1d(verdicts).reshape(n, -1)
    credit = ref_credit_mask(successes if successes is not None else [True] * n, group_ids, process_gate)
    j_term = [0.0] * n if process_rewards is None else [float(x) for x in _as_f64_1d(process_rewards)]
    j_term = [j_term[k] if credit[k] else 0.0 for k in range(n)]
    if aggregation == "sum_then_normalize":
        a_task = _scaled([r[k] + j_term[k] for k in range(n)], group_ids, scale_rewards, eps, ddof)
    else:
        parts = [_scaled(x, group_ids, scale_rewards, eps, ddof) for x in (r, j_term)]
        total = [parts[0][k] + parts[1][k] for k in range(n)]
        m, s = _mean(total), _std(total, ddof)
        a_task = [(t - m) / (s + eps) for t in total]
    # rubric verdicts: NaN (not applicable) where the gate gives no process credit
    v = np.array([[v[k, i] if credit[k] else math.nan for i in range(v.shape[1])] for k in range(n)]).reshape(n, -1)
    batch_std = {}
    for i in range(v.shape[1]):
        ys = [float(v[k, i]) for k in range(n) if not math.isnan(v[k, i])]
        batch_std[i] = _std(ys, ddof) if ys else 0.0
    out = list(a_task)
    for _, idx in _groups(group_ids).items():
        varying, a_rub = [], {}
        for i in range(v.shape[1]):
            app = [k for k in idx if not math.isnan(v[k, i])]
            ys = [float(v[k, i]) for k in app]
            if len(ys) < 2 or min(ys) == max(ys):
                continue
            varying.append(i)
            m = _mean(ys)
            scale = {"group": _std(ys, ddof) + eps, "batch": batch_std[i] + eps, "none": 1.0}[scale_rewards]
            for k in app:
                a_rub[(i, k)] = (v[k, i] - m) / scale
        if not varying:
            continue
        for k in idx:
            terms = [a_rub[(i, k)] for i in varying if (i, k) in a_rub]
            if terms:
                out[k] = (1.0 - lam) * a_task[k] + lam / len(varying) * math.fsum(terms)
    return np.array(out)
