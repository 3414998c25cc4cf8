"""Bad input: a clear error naming the argument, and nothing half-applied
(docs/design.md "Bad input is an error that names the argument")."""

import os

import numpy as np
import pytest
from _util import normalize

from rwcore import CapabilitySampler, EvidenceStore, OutcomeSampler, UniformSampler, Verdict

NAN, INF = float("nan"), float("inf")
PASS, FAIL, NA, INVALID = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID


def filled_store():
    s = EvidenceStore(gamma_obs=0.3, gamma_unobs=0.9)
    for k in range(12):
        s.observe(k % 3, k % 4, 0.5 * k, 1.0, k)
    return s


def assert_raises_naming(exc, names, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    names = (names,) if isinstance(names, str) else names
    assert any(n in msg for n in names), f"error message {msg!r} does not name any of {names}"
    return info.value


# ----------------------------------------------------------------------------
# EvidenceStore
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(gamma_obs=0.0), "gamma_obs"),
        (dict(gamma_obs=-0.2), "gamma_obs"),
        (dict(gamma_obs=1.0001), "gamma_obs"),
        (dict(gamma_obs=NAN), "gamma_obs"),
        (dict(gamma_unobs=0.0), "gamma_unobs"),
        (dict(gamma_unobs=2.0), "gamma_unobs"),
        (dict(gamma_unobs=NAN), "gamma_unobs"),
        (dict(gamma_unobs=-INF), "gamma_unobs"),
    ],
)
def test_store_bad_gamma(kw, name):
    assert_raises_naming(ValueError, name, EvidenceStore, **kw)


OBSERVE_OK = dict(tag=1, rubric=2, success=1.0, failure=0.5, version=3)
ORDER = ["tag", "rubric", "success", "failure", "version"]


@pytest.mark.parametrize(
    "name,value",
    [
        ("tag", -1),
        ("tag", 2**32),
        ("tag", 2**40),
        ("rubric", -1),
        ("rubric", 2**32),
        ("success", NAN),
        ("success", INF),
        ("success", -INF),
        ("success", -1.0),
        ("success", -1e-300),
        ("failure", NAN),
        ("failure", INF),
        ("failure", -0.5),
        ("version", -1),
    ],
)
def test_observe_rejects(name, value):
    s = filled_store()
    before = s.to_bytes()
    args = [value if k == name else OBSERVE_OK[k] for k in ORDER]
    assert_raises_naming(ValueError, name, s.observe, *args)
    assert s.to_bytes() == before
    assert len(s) == 12


@pytest.mark.parametrize("name,value", [("version", 2**63), ("version", 2**64), ("tag", 2**64), ("rubric", 2**70)])
def test_observe_rejects_huge_integers_naming_the_argument(name, value):
    """Out-of-range integers are bad values, not bad types: a clear error
    naming the argument (an OverflowError is a ValueError-like choice too)."""
    s = filled_store()
    before = s.to_bytes()
    args = [value if k == name else OBSERVE_OK[k] for k in ORDER]
    e = assert_raises_naming((ValueError, OverflowError), name, s.observe, *args)
    others = [k for k in ORDER if k != name and k not in name]
    assert not all(k in str(e) for k in others), f"message lists every argument: {e}"
    assert s.to_bytes() == before


@pytest.mark.parametrize("name,value", [("tag", "a"), ("rubric", None), ("success", "x"), ("version", 1.5)])
def test_observe_wrong_types(name, value):
    s = filled_store()
    before = s.to_bytes()
    args = [value if k == name else OBSERVE_OK[k] for k in ORDER]
    with pytest.raises((TypeError, ValueError)):
        s.observe(*args)
    assert s.to_bytes() == before


def _many(n=5):
    return dict(
        tags=np.arange(n, dtype=np.int64),
        rubrics=np.full(n, 7, dtype=np.int64),
        successes=np.linspace(0, 2, n),
        failures=np.ones(n),
        versions=np.arange(n, dtype=np.int64) + 20,
    )


MANY_ORDER = ["tags", "rubrics", "successes", "failures", "versions"]


@pytest.mark.parametrize(
    "name,index,value",
    [
        ("tags", 4, -1),
        ("tags", 4, 2**32),
        ("rubrics", 4, -1),
        ("rubrics", 3, 2**33),
        ("successes", 4, NAN),
        ("successes", 4, INF),
        ("successes", 4, -1.0),
        ("failures", 4, NAN),
        ("failures", 2, -INF),
        ("failures", 4, -0.1),
        ("versions", 4, -1),
    ],
)
def test_observe_many_rejects_bad_element_without_applying_any(name, index, value):
    s = filled_store()
    before = s.to_bytes()
    cols = _many()
    col = cols[name].copy()
    col[index] = value
    cols[name] = col
    assert_raises_naming(ValueError, name, s.observe_many, *[cols[k] for k in MANY_ORDER])
    assert s.to_bytes() == before  # the valid elements before the bad one were not applied either


@pytest.mark.parametrize(
    "name,value", [("tags", 2**64 - 1), ("rubrics", 2**32), ("versions", 2**63), ("versions", 2**64 - 1)]
)
def test_observe_many_rejects_huge_unsigned(name, value):
    s = filled_store()
    before = s.to_bytes()
    cols = _many()
    col = cols[name].astype(np.uint64)
    col[4] = value
    cols[name] = col
    assert_raises_naming((ValueError, OverflowError), name, s.observe_many, *[cols[k] for k in MANY_ORDER])
    assert s.to_bytes() == before


@pytest.mark.parametrize("name", MANY_ORDER)
def test_observe_many_length_mismatch(name):
    s = filled_store()
    before = s.to_bytes()
    cols = _many()
    cols[name] = cols[name][:3]
    assert_raises_naming(ValueError, ("length", "5", "3"), s.observe_many, *[cols[k] for k in MANY_ORDER])
    assert s.to_bytes() == before


@pytest.mark.parametrize("name", MANY_ORDER)
def test_observe_many_rejects_2d(name):
    s = filled_store()
    before = s.to_bytes()
    cols = _many(4)
    cols[name] = cols[name].reshape(2, 2)
    with pytest.raises((ValueError, TypeError)) as info:
        s.observe_many(*[cols[k] for k in MANY_ORDER])
    assert name in str(info.value) or "dim" in str(info.value).lower(), str(info.value)
    assert s.to_bytes() == before


def test_query_rejects():
    s = filled_store()
    before = s.to_bytes()
    assert_raises_naming(ValueError, "version", s.query, 0, 0, -1)
    assert_raises_naming(ValueError, "tag", s.query, -1, 0, 0)
    assert_raises_naming(ValueError, "tag", s.query, 2**32, 0, 0)
    assert_raises_naming(ValueError, "rubric", s.query, 0, 2**32, 0)
    assert_raises_naming(ValueError, "version", s.query_sum, 0, [0, 1], -1)
    assert_raises_naming(ValueError, "rubric", s.query_sum, 0, [0, -1], 0)
    assert_raises_naming(ValueError, ("length", "3", "2"), s.query_many, np.arange(3), np.arange(2), 0)
    assert_raises_naming(ValueError, "version", s.query_many, np.arange(3), np.arange(3), -1)
    assert_raises_naming(ValueError, "tags", s.query_many, np.array([0, -1]), np.array([0, 0]), 0)
    assert_raises_naming(ValueError, "rubric", s.remove_rubric, -1)
    assert s.to_bytes() == before


# ----------------------------------------------------------------------------
# Persistence errors
# ----------------------------------------------------------------------------
def _mentions_corruption(msg, path=None):
    low = msg.lower()
    return any(w in low for w in ("corrupt", "truncat", "checksum", "magic", "invalid")) or (
        path is not None and str(path) in msg
    )


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        EvidenceStore.load(str(tmp_path / "nope.bin"))


def test_load_truncated(tmp_path):
    s = filled_store()
    good = tmp_path / "good.bin"
    s.save(str(good))
    data = good.read_bytes()
    for cut in sorted({0, 1, 3, 4, 7, 8, 12, 16, len(data) // 2, len(data) - 8, len(data) - 4, len(data) - 1}):
        p = tmp_path / f"cut{cut}.bin"
        p.write_bytes(data[:cut])
        with pytest.raises(ValueError) as info:
            EvidenceStore.load(str(p))
        assert _mentions_corruption(str(info.value), p), str(info.value)
        with pytest.raises(ValueError):
            EvidenceStore.from_bytes(data[:cut])


def test_load_every_single_bit_flip_is_detected(tmp_path):
    s = EvidenceStore(gamma_obs=0.3, gamma_unobs=0.9)
    s.observe(1, 2, 1.0, 0.5, 3)
    s.observe(4, 2, 0.25, 2.0, 5)
    data = s.to_bytes()
    p = tmp_path / "flip.bin"
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            bad = bytes(bad)
            with pytest.raises(ValueError):
                EvidenceStore.from_bytes(bad)
            if bit == i % 8:  # the file path for a subset (file I/O is slower)
                p.write_bytes(bad)
                with pytest.raises(ValueError) as info:
                    EvidenceStore.load(str(p))
                assert _mentions_corruption(str(info.value), p), str(info.value)


def test_load_wrong_magic_and_garbage(tmp_path):
    s = filled_store()
    data = s.to_bytes()
    for bad in (b"XXXX" + data[4:], b"\x00" * len(data), os.urandom(len(data)), b"not an evidence store at all"):
        p = tmp_path / "bad.bin"
        p.write_bytes(bad)
        with pytest.raises(ValueError) as info:
            EvidenceStore.load(str(p))
        assert _mentions_corruption(str(info.value), p), str(info.value)
        with pytest.raises(ValueError):
            EvidenceStore.from_bytes(bad)


def test_failed_load_does_not_touch_file(tmp_path):
    p = tmp_path / "bad.bin"
    p.write_bytes(b"garbage")
    with pytest.raises(ValueError):
        EvidenceStore.load(str(p))
    assert p.read_bytes() == b"garbage"
    assert os.listdir(tmp_path) == ["bad.bin"]


# ----------------------------------------------------------------------------
# CapabilitySampler
# ----------------------------------------------------------------------------
TASKS = {"t0": ["A"], "t1": ["A", "B"], "t2": ["B"], "t3": ["C"]}


def sampler(**kw):
    args = dict(batch_size=2, group_size=3, seed=1)
    args.update(kw)
    cs = CapabilitySampler(TASKS, **args)
    cs.set_rubrics({"e": "Execution", "v": "Verification", "u": "Understanding"})
    cs.record_group("t0", {"e": [True, False, NA], "v": [FAIL, FAIL, PASS]}, 0)
    cs.record_group("t1", {"u": [INVALID, True, True]}, 1)
    return cs


def full_snapshot(cs):
    tags = ["A", "B", "C"]
    caps = ["Understanding", "Execution", "Verification", "Debugging", "Efficiency"]
    return (
        normalize(cs.state_dict()),
        {t: {k: (set(v) if not isinstance(v, int) else v) for k, v in cs.task_state(t).items()} for t in TASKS},
        cs.coverage(),
        dict(cs.rubrics),
        {(d, c): tuple(cs.evidence(d, c, 2)) for d in tags for c in caps},
        {(d, r): tuple(cs.rubric_evidence(d, r, 2)) for d in tags for r in cs.rubrics},
    )


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(batch_size=5), "batch_size"),
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=-1), "batch_size"),
        (dict(group_size=0), "group_size"),
        (dict(rho_min=-0.01), "rho_min"),
        (dict(rho_min=1.01), "rho_min"),
        (dict(rho_min=NAN), "rho_min"),
        (dict(quota_fraction=-0.5), "quota_fraction"),
        (dict(quota_fraction=1.5), "quota_fraction"),
        (dict(quota_fraction=NAN), "quota_fraction"),
        (dict(gamma_obs=0.0), "gamma_obs"),
        (dict(gamma_unobs=1.5), "gamma_unobs"),
    ],
)
def test_sampler_bad_constructor_args(kw, name):
    args = dict(batch_size=2, group_size=3)
    args.update(kw)
    assert_raises_naming(ValueError, name, CapabilitySampler, TASKS, **args)


def test_sampler_boundary_constructor_args_are_fine():
    CapabilitySampler(TASKS, batch_size=4, group_size=1, rho_min=0.0, quota_fraction=0.0)
    CapabilitySampler(
        TASKS, batch_size=1, group_size=1, rho_min=1.0, quota_fraction=1.0, gamma_obs=1.0, gamma_unobs=1.0
    )


def test_sampler_no_tasks():
    with pytest.raises(ValueError) as info:
        CapabilitySampler({}, batch_size=1, group_size=2)
    assert "batch_size" in str(info.value) or "task" in str(info.value)


def test_sampler_unknown_capability_in_constructor_pool():
    cs = CapabilitySampler(TASKS, batch_size=1, group_size=2, capabilities=("X", "Y"))
    assert_raises_naming(ValueError, "capability", cs.set_rubrics, {"a": "X", "b": "Execution"})
    assert cs.rubrics == {}


BAD_RECORDS = [
    (("nope", {"e": [True] * 3}, 2), "task_id"),
    (("t0", {"e": [True] * 3, "zzz": [True] * 3}, 2), "verdicts"),
    (("t0", {"e": [True] * 3, "v": [True] * 2}, 2), "group_size"),
    (("t0", {"e": [True] * 3, "v": [True] * 4}, 2), "group_size"),
    (("t0", {"e": [True] * 3, "v": []}, 2), "group_size"),
    (("t0", {"e": [True] * 3}, -1), "policy_version"),
]


@pytest.mark.parametrize("args,name", BAD_RECORDS)
def test_record_group_rejects_without_half_applying(args, name):
    cs = sampler()
    before = full_snapshot(cs)
    assert_raises_naming(ValueError, name, cs.record_group, *args)
    assert full_snapshot(cs) == before


@pytest.mark.parametrize("value", ["pass", None, 0.5, 2, 1, object(), "PASS"])
def test_record_group_rejects_non_verdict_values(value):
    cs = sampler()
    before = full_snapshot(cs)
    with pytest.raises((ValueError, TypeError)) as info:
        cs.record_group("t1", {"e": [True, FAIL, NA], "v": [True, True, value]}, 2)
    assert "verdict" in str(info.value).lower(), str(info.value)
    assert full_snapshot(cs) == before


def test_set_rubrics_rejects_unknown_capability_without_change():
    cs = sampler()
    before = full_snapshot(cs)
    assert_raises_naming(ValueError, "capability", cs.set_rubrics, {"e": "Execution", "x": "Cooking"})
    # a change that would drop rubrics must not have happened either
    assert_raises_naming(ValueError, "capability", cs.set_rubrics, {"e": "Verification", "x": "Cooking"})
    assert full_snapshot(cs) == before


@pytest.mark.parametrize("what", ["record_group", "sample"])
def test_sampler_rejects_huge_policy_version(what):
    cs = sampler()
    before = full_snapshot(cs)
    if what == "record_group":
        assert_raises_naming(
            (ValueError, OverflowError), "policy_version", cs.record_group, "t0", {"e": [True] * 3}, 2**63
        )
    else:
        assert_raises_naming((ValueError, OverflowError), "policy_version", cs.sample, 2**63)
    assert full_snapshot(cs) == before


def test_sample_rejects_negative_version():
    cs = sampler()
    before = full_snapshot(cs)
    assert_raises_naming(ValueError, "policy_version", cs.sample, -1)
    assert full_snapshot(cs) == before


def test_load_state_dict_from_other_task_set():
    cs = sampler()
    before = full_snapshot(cs)
    for tasks in (
        {"t0": ["A"], "t1": ["A", "B"], "t2": ["B"], "t9": ["C"]},
        {"t0": ["A"], "t1": ["A", "B"], "t2": ["B"], "t3": ["C"], "t4": ["C"]},
        {"t0": ["A"], "t1": ["A"], "t2": ["B"], "t3": ["C"]},
    ):
        other = CapabilitySampler(tasks, batch_size=2, group_size=3, seed=1)
        with pytest.raises(ValueError):
            cs.load_state_dict(other.state_dict())
        assert full_snapshot(cs) == before


def test_load_state_dict_garbage():
    cs = sampler()
    before = full_snapshot(cs)
    with pytest.raises((ValueError, TypeError, KeyError)):
        cs.load_state_dict({"nonsense": 1})
    assert full_snapshot(cs) == before


# ----------------------------------------------------------------------------
# Baseline samplers
# ----------------------------------------------------------------------------
def test_outcome_sampler_requires_valid_outcomes():
    os_ = OutcomeSampler(TASKS, batch_size=2, group_size=3, seed=0)
    os_.record_group("t0", {}, 0, outcomes=[1.0, 0.0, 0.5])
    before = {t: tuple(os_.task_evidence(t, 3)) for t in TASKS}
    before_sd = normalize(os_.state_dict())
    assert_raises_naming(ValueError, "outcomes", os_.record_group, "t1", {}, 1)
    assert_raises_naming(ValueError, "outcomes", os_.record_group, "t1", {}, 1, outcomes=None)
    for bad in ([1.0, 0.0], [1.0, 0.0, 0.5, 0.5], [1.0, 0.0, NAN], [1.0, 0.0, 1.5], [-0.1, 0.0, 1.0], [INF, 0, 0]):
        with pytest.raises(ValueError) as info:
            os_.record_group("t1", {}, 1, outcomes=bad)
        assert "outcomes" in str(info.value) or "group_size" in str(info.value), str(info.value)
    assert_raises_naming(ValueError, "task_id", os_.record_group, "zz", {}, 1, outcomes=[1.0, 1.0, 1.0])
    assert_raises_naming(ValueError, "policy_version", os_.record_group, "t1", {}, -2, outcomes=[1.0, 1.0, 1.0])
    assert {t: tuple(os_.task_evidence(t, 3)) for t in TASKS} == before
    assert normalize(os_.state_dict()) == before_sd


def test_baseline_samplers_bad_constructor_args():
    assert_raises_naming(ValueError, "batch_size", UniformSampler, TASKS, batch_size=5, group_size=2)
    assert_raises_naming(ValueError, "batch_size", OutcomeSampler, TASKS, batch_size=5, group_size=2)
    assert_raises_naming(ValueError, "gamma_obs", OutcomeSampler, TASKS, batch_size=1, group_size=2, gamma_obs=0.0)


def test_uniform_sampler_rejects_unknown_task():
    us = UniformSampler(TASKS, batch_size=2, group_size=3, seed=0)
    before = normalize(us.state_dict())
    assert_raises_naming(ValueError, "task_id", us.record_group, "zz", {}, 0)
    assert normalize(us.state_dict()) == before
