"""Exact resume: state_dict -> pickle -> load into a fresh object continues
with identical batches and identical accounting (docs/design.md "Every run is
reproducible from its seed": checkpoints hold every RNG state ... so a resumed
run continues exactly)."""

import math
import pickle

import numpy as np
import pytest
from _util import normalize

from rwcore import AdaptiveBatchSampler, CapabilitySampler, OutcomeSampler, UniformSampler, Verdict

PASS, FAIL, NA, INVALID = Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID
TASKS = {f"task{i}": [f"tag{i % 4}"] + ([f"tag{(i + 1) % 4}"] if i % 3 == 0 else []) for i in range(12)}
RUBRICS = {"e1": "Execution", "e2": "Execution", "v": "Verification", "u": "Understanding", "d": "Debugging"}
G = 4


POOL2 = {**{k: c for k, c in RUBRICS.items() if k != "u"}, "x": "Efficiency"}


def pool_at(step):
    """Rubric pool active during a step of ``drive`` (switches after step 1)."""
    return RUBRICS if step < 2 else POOL2


def verdicts_for(task, step, pool=RUBRICS):
    """Deterministic pseudo-random verdicts (the same for both runs)."""
    rng = np.random.default_rng(int(task[4:]) * 1000 + step)
    choices = [True, False, PASS, FAIL, NA, INVALID]
    out = {}
    for r in sorted(pool):
        if rng.random() < 0.6:
            out[r] = [choices[k] for k in rng.choice(6, size=G, p=[0.3, 0.3, 0.1, 0.1, 0.15, 0.05])]
    return out


def outcomes_for(task, step):
    rng = np.random.default_rng(int(task[4:]) * 7919 + step)
    return [float(x) for x in rng.choice([0.0, 0.5, 1.0], size=G)]


def drive(sampler, steps, start=0, with_outcomes=False):
    """A small training loop: sample, feed back every task of the batch;
    the rubric pool changes after step 1."""
    has_pool = hasattr(sampler, "set_rubrics")
    batches = []
    for step in range(start, start + steps):
        v = step // 2
        b = sampler.sample(v)
        batches.append(list(b))
        for t in b:
            kw = {"outcomes": outcomes_for(t, step)} if with_outcomes else {}
            sampler.record_group(t, verdicts_for(t, step, pool_at(step)) if has_pool else {}, v, **kw)
        if step == 1 and has_pool:
            sampler.set_rubrics(POOL2)
    return batches


FACTORIES = {
    "capability": lambda seed: CapabilitySampler(TASKS, batch_size=5, group_size=G, seed=seed),
    "uniform": lambda seed: UniformSampler(TASKS, batch_size=5, group_size=G, seed=seed),
    "outcome": lambda seed: OutcomeSampler(TASKS, batch_size=5, group_size=G, seed=seed),
}


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_resume_gives_identical_batches(kind):
    make = FACTORIES[kind]
    outcomes = kind == "outcome"
    a = make(123)
    if hasattr(a, "set_rubrics"):
        a.set_rubrics(RUBRICS)
    drive(a, 6, with_outcomes=outcomes)
    sd = pickle.loads(pickle.dumps(a.state_dict()))
    b = make(123)
    b.sample(0)  # advance the fresh RNG: the RNG state must come from the state dict
    if hasattr(b, "set_rubrics"):
        b.set_rubrics({"zz": "Efficiency"})  # and so must the rubric pool
    b.load_state_dict(sd)
    assert normalize(b.state_dict()) == normalize(a.state_dict())
    cont_a = drive(a, 8, start=6, with_outcomes=outcomes)
    cont_b = drive(b, 8, start=6, with_outcomes=outcomes)
    assert cont_a == cont_b
    assert normalize(b.state_dict()) == normalize(a.state_dict())
    if kind == "capability":
        assert a.rubrics == b.rubrics
        assert a.coverage() == b.coverage()
        for t in TASKS:
            assert a.task_state(t) == b.task_state(t)
        for d in {d for tags in TASKS.values() for d in tags}:
            for c in ("Execution", "Verification", "Understanding", "Debugging", "Efficiency"):
                assert tuple(a.evidence(d, c, 9)) == tuple(b.evidence(d, c, 9))
    if kind == "outcome":
        for t in TASKS:
            assert tuple(a.task_evidence(t, 9)) == tuple(b.task_evidence(t, 9))


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_state_dict_is_a_snapshot(kind):
    """Mutating the sampler after state_dict() must not alter the snapshot."""
    a = FACTORIES[kind](5)
    if hasattr(a, "set_rubrics"):
        a.set_rubrics(RUBRICS)
    outcomes = kind == "outcome"
    drive(a, 2, with_outcomes=outcomes)
    sd = a.state_dict()
    frozen = normalize(pickle.loads(pickle.dumps(sd)))
    nxt = drive(a, 3, start=2, with_outcomes=outcomes)
    assert normalize(sd) == frozen
    b = FACTORIES[kind](5)
    b.load_state_dict(sd)
    assert drive(b, 3, start=2, with_outcomes=outcomes) == nxt


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_resume_into_sampler_built_with_another_seed(kind):
    """Brief: "after load into a fresh sampler built with the same tasks, the
    next sample() calls return the identical batches" -- the seed only sets
    the initial RNG state, which the state dict replaces."""
    a = FACTORIES[kind](123)
    if hasattr(a, "set_rubrics"):
        a.set_rubrics(RUBRICS)
    drive(a, 3, with_outcomes=kind == "outcome")
    sd = pickle.loads(pickle.dumps(a.state_dict()))
    b = FACTORIES[kind](999)
    b.load_state_dict(sd)
    assert [b.sample(2) for _ in range(10)] == [a.sample(2) for _ in range(10)]


def test_capability_resume_mid_stream_without_feedback():
    a = FACTORIES["capability"](1)
    a.set_rubrics(RUBRICS)
    drive(a, 4)
    sd = pickle.loads(pickle.dumps(a.state_dict()))
    want = [a.sample(3) for _ in range(25)]
    b = FACTORIES["capability"](1)
    b.load_state_dict(sd)
    assert [b.sample(3) for _ in range(25)] == want


# ----------------------------------------------------------------------------
# AdaptiveBatchSampler
# ----------------------------------------------------------------------------
DATASET_IDS = [t for t in sorted(TASKS, reverse=True)]  # index i -> task DATASET_IDS[i]


def epoch(adapter, start=0, stop=None):
    """Iterate the adapter, giving feedback for every index; returns batches."""
    out = []
    for k, batch in enumerate(adapter, start=start):
        out.append(list(batch))
        for i in batch:
            t = DATASET_IDS[i]
            adapter.feedback(t, verdicts_for(t, k))
        if k % 2 == 1:
            adapter.advance_policy()
        if stop is not None and k + 1 == stop:
            break
    return out


def make_adapter(seed=7, num_batches=7):
    s = CapabilitySampler(TASKS, batch_size=4, group_size=G, seed=seed)
    s.set_rubrics(RUBRICS)
    return s, AdaptiveBatchSampler(s, DATASET_IDS, num_batches=num_batches)


def test_adapter_basics():
    import torch.utils.data

    s, ad = make_adapter()
    assert isinstance(ad, torch.utils.data.Sampler)
    assert len(ad) == 7
    assert ad.policy_version == 0
    batches = epoch(ad)
    assert len(batches) == 7
    for b in batches:
        assert len(b) == 4 and len(set(b)) == 4
        assert all(isinstance(i, int) and 0 <= i < len(DATASET_IDS) for i in b)
    assert ad.policy_version == 3  # advanced after batches k = 1, 3, 5
    # a second epoch yields num_batches again
    assert len(epoch(ad)) == 7


def test_adapter_matches_manual_loop():
    """The adapter is sampler.sample(policy_version) mapped to dataset indices."""
    s, ad = make_adapter(seed=21)
    via_adapter = epoch(ad)
    m = CapabilitySampler(TASKS, batch_size=4, group_size=G, seed=21)
    m.set_rubrics(RUBRICS)
    manual, v = [], 0
    for k in range(7):
        b = m.sample(v)
        manual.append([DATASET_IDS.index(t) for t in b])
        for t in b:
            m.record_group(t, verdicts_for(t, k), v)
        if k % 2 == 1:
            v += 1
    assert via_adapter == manual
    assert normalize(s.state_dict()) == normalize(m.state_dict())


def test_adapter_feedback_and_policy_version():
    s, ad = make_adapter()
    ad.advance_policy()
    ad.advance_policy()
    assert ad.policy_version == 2
    ad.feedback("task1", {"e1": [True, True, False, NA]})  # at the adapter's version 2
    ts = s.task_state("task1")
    assert ts["attempts"] == 1 and set(ts["evaluated"]) == {"e1"}
    assert tuple(s.rubric_evidence("tag1", "e1", 2)) == (2.0, 1.0)
    ad.feedback("task1", {"e1": [True, True, True, True]}, policy_version=0)  # explicit, late by 2
    S, F = s.rubric_evidence("tag1", "e1", 2)
    assert math.isclose(S, 2.0 + 4 * 0.2 * 0.999, rel_tol=1e-12) and F == 1.0
    ad.advance_policy(10)
    assert ad.policy_version == 10
    ad.advance_policy()
    assert ad.policy_version == 11


def test_adapter_feedback_passes_outcomes():
    s = OutcomeSampler(TASKS, batch_size=3, group_size=G, seed=0)
    ad = AdaptiveBatchSampler(s, DATASET_IDS, num_batches=2, policy_version=4)
    assert ad.policy_version == 4
    ad.feedback("task2", {}, outcomes=[1.0, 0.0, 0.5, 1.0])
    assert tuple(s.task_evidence("task2", 4)) == (2.5, 1.5)
    batches = list(ad)
    assert len(batches) == 2 and all(len(set(b)) == 3 for b in batches)


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_adapter_wraps_every_sampler(kind):
    s = FACTORIES[kind](3)
    if hasattr(s, "set_rubrics"):
        s.set_rubrics(RUBRICS)
    ad = AdaptiveBatchSampler(s, DATASET_IDS, num_batches=4)
    assert len(ad) == 4
    batches = []
    for k, batch in enumerate(ad):
        batches.append(list(batch))
        assert len(batch) == 5 and len(set(batch)) == 5
        for i in batch:
            t = DATASET_IDS[i]
            kw = {"outcomes": outcomes_for(t, k)} if kind == "outcome" else {}
            ad.feedback(t, verdicts_for(t, k) if kind != "outcome" else {}, **kw)
        ad.advance_policy()
    assert len(batches) == 4 and ad.policy_version == 4


def test_adapter_with_dataloader():
    import torch.utils.data

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(DATASET_IDS)

        def __getitem__(self, i):
            return DATASET_IDS[i]

    s, ad = make_adapter(num_batches=5)
    loader = torch.utils.data.DataLoader(DS(), batch_sampler=ad, collate_fn=list)
    seen = list(loader)
    assert len(seen) == 5
    for b in seen:
        assert len(b) == 4 and len(set(b)) == 4 and set(b) <= set(TASKS)


@pytest.mark.parametrize("stop", [1, 3, 6])
def test_adapter_resume_mid_epoch(stop):
    s, ad = make_adapter()
    full = epoch(ad)
    s1, ad1 = make_adapter()
    first = epoch(ad1, stop=stop)
    assert len(first) == stop
    sd_s = pickle.loads(pickle.dumps(s1.state_dict()))
    sd_a = pickle.loads(pickle.dumps(ad1.state_dict()))
    s2, ad2 = make_adapter()
    s2.sample(0)  # the RNG state must come from the state dict
    s2.load_state_dict(sd_s)
    ad2.load_state_dict(sd_a)
    assert ad2.policy_version == ad1.policy_version
    assert len(ad2) == 7
    rest = epoch(ad2, start=stop)
    assert first + rest == full
    # the resumed adapter then runs full epochs again
    assert len(epoch(ad2)) == 7
