"""Pure-Python reference model of rwcore's evidence store and capability sampler.

Written independently from the paper (Arise §3.2.2, eq. 9-14; appendix B.5,
eq. 20) and from ``docs/math.md`` (its eq. 9-14, eq. 20 and appendix B.5 rows).
It is used

* by the test-suite as the oracle for the compiled ``rwcore`` classes
  (exact accounting: evidence, coverage, task state), and
* by the benchmark suite as "the pure-Python implementation of the same
  semantics".

It uses only the standard library (dicts, sets, ``random.Random``), favouring
clarity, while keeping the hot paths reasonably cheap.

Semantics in one place
----------------------
Evidence store: accumulators ``(S, F)`` per (tag ``d``, rubric ``i``) plus the
policy version ``v_last`` of the last update.  ``observe(d, i, dS, dF, v)``:

* no cell yet:    ``(S, F) = (dS, dF)``, ``v_last = v``
* ``dv = v - v_last > 0``: ``(S, F) <- g_obs * g_unobs**(dv-1) * (S, F) + (dS, dF)``, ``v_last = v``
* ``dv == 0``:    ``(S, F) += (dS, dF)``
* ``dv < 0`` (late group of an older policy):
  ``(S, F) += g_obs * g_unobs**(|dv|-1) * (dS, dF)``, ``v_last`` unchanged.

``query(d, i, v) = (S, F) * g_unobs**(v - v_last)``; a query at ``v < v_last``
applies no decay; a missing cell is ``(0.0, 0.0)``.

Capability sampler: see :class:`RefCapabilitySampler`.
"""

from __future__ import annotations

import bisect
import copy
import math
import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from enum import Enum

__all__ = [
    "DEFAULT_CAPABILITIES",
    "Verdict",
    "normalize_verdict",
    "RefEvidenceStore",
    "RefCapabilitySampler",
    "RefOutcomeSampler",
]

DEFAULT_CAPABILITIES = ("Understanding", "Execution", "Verification", "Debugging", "Efficiency")


class Verdict(Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    NA = "NA"  # explicit not-applicable: valid for coverage, no evidence
    INVALID = "INVALID"  # judge failure: not valid, no evidence


_VERDICT_NAMES = frozenset(Verdict.__members__)
_APPLICABLE = (Verdict.PASS, Verdict.FAIL)


def normalize_verdict(value) -> Verdict:
    """Map ``True``/``False`` or any enum-like object whose ``.name`` is one of
    PASS/FAIL/NA/INVALID (e.g. ``rwcore.Verdict.NA``) onto :class:`Verdict`."""
    if isinstance(value, Verdict):
        return value
    if isinstance(value, bool):
        return Verdict.PASS if value else Verdict.FAIL
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in _VERDICT_NAMES:
        return Verdict[name]
    raise ValueError(f"verdicts: a verdict must be a bool or a Verdict, got {value!r}")


def _check_version(version, name="version") -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"{name} must be an int, got {version!r}")
    if version < 0:
        raise ValueError(f"{name} must be >= 0, got {version}")
    return version


def _check_evidence(x, name) -> float:
    x = float(x)
    if not math.isfinite(x) or x < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {x!r}")
    return x


def _check_gamma(g, name) -> float:
    g = float(g)
    if not (0.0 < g <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must lie in (0, 1], got {g!r}")
    return g


# --------------------------------------------------------------------------
# Evidence store
# --------------------------------------------------------------------------
class RefEvidenceStore:
    """Decayed (S, F) accumulators per (tag, rubric).  Ids may be any hashable."""

    def __init__(self, gamma_obs: float = 0.2, gamma_unobs: float = 0.999):
        self.gamma_obs = _check_gamma(gamma_obs, "gamma_obs")
        self.gamma_unobs = _check_gamma(gamma_unobs, "gamma_unobs")
        # (tag, rubric) -> [S, F, v_last]
        self._cells: dict[tuple[Hashable, Hashable], list] = {}
        # rubric -> set of tags that have a cell for it (makes remove_rubric cheap)
        self._tags_of_rubric: dict[Hashable, set[Hashable]] = {}

    def __len__(self) -> int:
        return len(self._cells)

    def observe(self, tag, rubric, success: float, failure: float, version: int) -> None:
        success = _check_evidence(success, "success")
        failure = _check_evidence(failure, "failure")
        version = _check_version(version)
        key = (tag, rubric)
        cell = self._cells.get(key)
        if cell is None:
            self._cells[key] = [success, failure, version]
            self._tags_of_rubric.setdefault(rubric, set()).add(tag)
            return
        dv = version - cell[2]
        if dv > 0:
            f = self.gamma_obs * self.gamma_unobs ** (dv - 1)
            cell[0] = f * cell[0] + success
            cell[1] = f * cell[1] + failure
            cell[2] = version
        elif dv == 0:
            cell[0] += success
            cell[1] += failure
        else:  # late observation: discount the contribution, keep v_last
            f = self.gamma_obs * self.gamma_unobs ** (-dv - 1)
            cell[0] += f * success
            cell[1] += f * failure

    def query(self, tag, rubric, version: int) -> tuple[float, float]:
        cell = self._cells.get((tag, rubric))
        if cell is None:
            return (0.0, 0.0)
        dv = version - cell[2]
        if dv <= 0:  # documented choice: no decay for a query older than v_last
            return (cell[0], cell[1])
        f = self.gamma_unobs**dv
        return (f * cell[0], f * cell[1])

    def query_sum(self, tag, rubrics: Iterable, version: int) -> tuple[float, float]:
        s = f = 0.0
        for r in rubrics:
            a, b = self.query(tag, r, version)
            s += a
            f += b
        return (s, f)

    def observe_many(self, tags, rubrics, successes, failures, versions) -> None:
        """Element-wise ``observe`` in order (validated first: all or nothing)."""
        cols = [list(tags), list(rubrics), list(successes), list(failures), list(versions)]
        if len({len(c) for c in cols}) != 1:
            raise ValueError(f"length mismatch: {[len(c) for c in cols]}")
        for x in cols[2]:
            _check_evidence(x, "successes")
        for x in cols[3]:
            _check_evidence(x, "failures")
        for x in cols[4]:
            if int(x) < 0:
                raise ValueError(f"versions must be >= 0, got {x}")
        for t, r, a, b, v in zip(*cols):
            self.observe(t, r, a, b, int(v))

    def query_many(self, tags, rubrics, version: int) -> tuple[list[float], list[float]]:
        tags, rubrics = list(tags), list(rubrics)
        if len(tags) != len(rubrics):
            raise ValueError(f"length mismatch: tags {len(tags)} vs rubrics {len(rubrics)}")
        S, F = [], []
        for t, r in zip(tags, rubrics):
            a, b = self.query(t, r, version)
            S.append(a)
            F.append(b)
        return S, F

    def remove_rubric(self, rubric) -> int:
        tags = self._tags_of_rubric.pop(rubric, ())
        for t in tags:
            del self._cells[(t, rubric)]
        return len(tags)

    def cells(self) -> dict[tuple[Hashable, Hashable], tuple[float, float, int]]:
        """Raw cells (tag, rubric) -> (S, F, v_last), for tests."""
        return {k: tuple(v) for k, v in self._cells.items()}


# --------------------------------------------------------------------------
# Weighted choice helper
# --------------------------------------------------------------------------
def _weighted_index(rng: random.Random, weights: Sequence[float]) -> int:
    total = 0.0
    cum = []
    for w in weights:
        total += w
        cum.append(total)
    if not total > 0.0:  # all weights zero (numerical corner): uniform
        return rng.randrange(len(weights))
    i = bisect.bisect_right(cum, rng.random() * total)
    return min(i, len(weights) - 1)


# --------------------------------------------------------------------------
# Capability sampler
# --------------------------------------------------------------------------
class RefCapabilitySampler:
    """Reference model of ``rwcore.CapabilitySampler``.

    State per task x: attempts ``a_x``, evaluated set ``E(x)`` (active rubrics
    for which some complete group gave G valid verdicts) and the set of active
    rubrics that ever received a PASS/FAIL verdict on x ("applicable").
    Evidence lives in a :class:`RefEvidenceStore` keyed by (tag, rubric_id).
    """

    def __init__(
        self,
        tasks: Mapping[Hashable, Sequence[Hashable]],
        batch_size: int = 32,
        group_size: int = 8,
        rho_min: float = 0.1,
        quota_fraction: float = 0.25,
        gamma_obs: float = 0.2,
        gamma_unobs: float = 0.999,
        seed: int = 0,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    ):
        self.tasks: dict[Hashable, tuple[Hashable, ...]] = {t: tuple(tags) for t, tags in tasks.items()}
        if batch_size < 1 or batch_size > len(self.tasks):
            raise ValueError(f"batch_size must be in [1, number of tasks={len(self.tasks)}], got {batch_size}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if not (0.0 <= rho_min <= 1.0):
            raise ValueError(f"rho_min must lie in [0, 1], got {rho_min}")
        if not (0.0 <= quota_fraction <= 1.0):
            raise ValueError(f"quota_fraction must lie in [0, 1], got {quota_fraction}")
        self.batch_size = int(batch_size)
        self.group_size = int(group_size)
        self.rho_min = float(rho_min)
        self.quota_fraction = float(quota_fraction)
        self.capabilities = tuple(capabilities)
        self.store = RefEvidenceStore(gamma_obs, gamma_unobs)
        self._rubrics: dict[Hashable, str] = {}
        self._attempts: dict[Hashable, int] = {t: 0 for t in self.tasks}
        self._evaluated: dict[Hashable, set[Hashable]] = {t: set() for t in self.tasks}
        self._applicable: dict[Hashable, set[Hashable]] = {t: set() for t in self.tasks}
        self.rng = random.Random(seed)

    # ------------------------------------------------------------------ pool
    @property
    def rubrics(self) -> dict[Hashable, str]:
        return dict(self._rubrics)

    @property
    def quota(self) -> int:
        return max(1, math.ceil(self.quota_fraction * self.batch_size))

    def set_rubrics(self, rubrics: Mapping[Hashable, str]) -> None:
        new = dict(rubrics)
        for rid, cap in new.items():
            if cap not in self.capabilities:
                raise ValueError(f"capability {cap!r} of rubric {rid!r} is not one of {self.capabilities}")
        stale = [rid for rid, cap in self._rubrics.items() if new.get(rid) != cap]
        for rid in stale:
            self.store.remove_rubric(rid)
        if stale:
            stale_set = set(stale)
            for t in self.tasks:
                self._evaluated[t] -= stale_set
                self._applicable[t] -= stale_set
        self._rubrics = new

    # --------------------------------------------------------------- record
    def record_group(self, task_id, verdicts: Mapping[Hashable, Sequence], policy_version: int, outcomes=None) -> None:
        if task_id not in self.tasks:
            raise ValueError(f"task_id {task_id!r} is not a known task")
        _check_version(policy_version, "policy_version")
        G = self.group_size
        norm: dict[Hashable, list[Verdict]] = {}
        for rid, seq in verdicts.items():
            if rid not in self._rubrics:
                raise ValueError(f"verdicts: rubric {rid!r} is not an active rubric")
            seq = list(seq)
            if len(seq) != G:
                raise ValueError(f"verdicts[{rid!r}] has {len(seq)} verdicts, expected group_size={G}")
            norm[rid] = [normalize_verdict(v) for v in seq]

        # ---- everything validated: apply
        self._attempts[task_id] += 1
        by_cap: dict[str, list[Hashable]] = {}
        for rid in norm:
            by_cap.setdefault(self._rubrics[rid], []).append(rid)
        dS: dict[Hashable, float] = {}
        dF: dict[Hashable, float] = {}
        for j in range(G):
            for rids in by_cap.values():
                applicable = [r for r in rids if norm[r][j] in _APPLICABLE]
                if not applicable:
                    continue
                n = len(applicable)
                for r in applicable:
                    if norm[r][j] is Verdict.PASS:
                        dS[r] = dS.get(r, 0.0) + 1.0 / n
                        dF.setdefault(r, 0.0)
                    else:
                        dF[r] = dF.get(r, 0.0) + 1.0 / n
                        dS.setdefault(r, 0.0)
        tags = self.tasks[task_id]
        for r in dS:
            for d in tags:
                self.store.observe(d, r, dS[r], dF[r], policy_version)
        self._applicable[task_id].update(dS)
        for r, seq in norm.items():
            if all(v is not Verdict.INVALID for v in seq):
                self._evaluated[task_id].add(r)

    # -------------------------------------------------------------- queries
    def task_state(self, task_id) -> dict:
        if task_id not in self.tasks:
            raise ValueError(f"task_id {task_id!r} is not a known task")
        return {
            "attempts": self._attempts[task_id],
            "evaluated": set(self._evaluated[task_id]),
            "applicable": set(self._applicable[task_id]),
        }

    def _rubrics_by_capability(self) -> dict[str, list[Hashable]]:
        by_cap: dict[str, list[Hashable]] = {}
        for rid, cap in self._rubrics.items():
            by_cap.setdefault(cap, []).append(rid)
        return by_cap

    def coverage(self) -> float:
        by_cap = self._rubrics_by_capability()
        if not by_cap or not self.tasks:
            return 0.0
        size = {c: len(rs) for c, rs in by_cap.items()}
        total = 0.0
        for t in self.tasks:
            counts: dict[str, int] = {}
            for r in self._evaluated[t]:
                c = self._rubrics[r]
                counts[c] = counts.get(c, 0) + 1
            for c, k in counts.items():
                total += k / size[c]
        return total / (len(self.tasks) * len(by_cap))

    def evidence(self, tag, capability: str, policy_version: int) -> tuple[float, float]:
        rids = [r for r, c in self._rubrics.items() if c == capability]
        return self.store.query_sum(tag, rids, policy_version)

    def rubric_evidence(self, tag, rubric_id, policy_version: int) -> tuple[float, float]:
        return self.store.query(tag, rubric_id, policy_version)

    # ---------------------------------------------------------- batch parts
    def rho(self) -> float:
        return max(self.rho_min, 1.0 - self.coverage())

    def discovery_candidates(self) -> list[Hashable]:
        """Tasks whose E(x) misses at least one active rubric (task order)."""
        n = len(self._rubrics)
        return [t for t in self.tasks if len(self._evaluated[t]) < n]

    def pair_members(self) -> dict[tuple[Hashable, str], list[Hashable]]:
        """(tag, capability) -> tasks tagged d with prior applicable evidence for c."""
        members: dict[tuple[Hashable, str], list[Hashable]] = {}
        for t, tags in self.tasks.items():
            app = self._applicable[t]
            if not app:
                continue
            caps = sorted({self._rubrics[r] for r in app})
            for d in tags:
                for c in caps:
                    members.setdefault((d, c), []).append(t)
        return members

    def pair_evidence(self, policy_version: int) -> dict[tuple[Hashable, str], tuple[float, float]]:
        """(S_dc, F_dc) for every pair that has members."""
        by_cap = self._rubrics_by_capability()
        return {(d, c): self.store.query_sum(d, by_cap.get(c, ()), policy_version) for (d, c) in self.pair_members()}

    # --------------------------------------------------------------- sample
    def sample(self, policy_version: int) -> list[Hashable]:
        _check_version(policy_version, "policy_version")
        rng = self.rng
        rho = self.rho()
        quota = self.quota
        weight = {t: 1.0 / (1.0 + a) for t, a in self._attempts.items()}
        discovery = self.discovery_candidates()
        members = self.pair_members()
        pair_keys = sorted(members, key=repr)
        evid = self.pair_evidence(policy_version)
        free_count = {p: len(members[p]) for p in pair_keys}
        pairs_of_task: dict[Hashable, list[tuple[Hashable, str]]] = {}
        for p in pair_keys:
            for t in members[p]:
                pairs_of_task.setdefault(t, []).append(p)
        targeted = {p: 0 for p in pair_keys}
        in_batch: set[Hashable] = set()
        batch: list[Hashable] = []

        def take(t):
            in_batch.add(t)
            batch.append(t)
            for p in pairs_of_task.get(t, ()):
                free_count[p] -= 1

        for _ in range(self.batch_size):
            disc_free = [t for t in discovery if t not in in_batch]
            eligible = [p for p in pair_keys if free_count[p] > 0 and targeted[p] < quota]
            if disc_free and rng.random() < rho:
                take(disc_free[_weighted_index(rng, [weight[t] for t in disc_free])])
            elif eligible:
                ws = []
                for p in eligible:
                    s, f = evid[p]
                    x = rng.betavariate(1.0 + s, 1.0 + f)
                    ws.append(x * (1.0 - x) ** 2)
                p = eligible[_weighted_index(rng, ws)]
                free = [t for t in members[p] if t not in in_batch]
                take(free[rng.randrange(len(free))])
                targeted[p] += 1
            else:
                pool = disc_free if disc_free else [t for t in self.tasks if t not in in_batch]
                take(pool[_weighted_index(rng, [weight[t] for t in pool])])
        return batch

    def pair_probabilities(
        self, policy_version: int, num_draws: int = 2000, seed: int = 0
    ) -> dict[tuple[Hashable, str], float]:
        """Monte-Carlo E[w_dc / sum w] over the pairs eligible at batch start."""
        evid = self.pair_evidence(policy_version)
        keys = sorted(evid, key=repr)
        if not keys:
            return {}
        rng = random.Random(seed)
        acc = [0.0] * len(keys)
        for _ in range(num_draws):
            ws = []
            for p in keys:
                s, f = evid[p]
                x = rng.betavariate(1.0 + s, 1.0 + f)
                ws.append(x * (1.0 - x) ** 2)
            tot = sum(ws)
            if tot > 0.0:
                for k, w in enumerate(ws):
                    acc[k] += w / tot
            else:
                for k in range(len(keys)):
                    acc[k] += 1.0 / len(keys)
        return {p: a / num_draws for p, a in zip(keys, acc)}

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "tasks": copy.deepcopy(self.tasks),
            "rubrics": dict(self._rubrics),
            "attempts": dict(self._attempts),
            "evaluated": copy.deepcopy(self._evaluated),
            "applicable": copy.deepcopy(self._applicable),
            "store": copy.deepcopy((self.store._cells, self.store._tags_of_rubric)),
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, sd: dict) -> None:
        if sd["tasks"] != self.tasks:
            raise ValueError("state_dict: task set differs from this sampler's tasks")
        self._rubrics = dict(sd["rubrics"])
        self._attempts = dict(sd["attempts"])
        self._evaluated = copy.deepcopy(sd["evaluated"])
        self._applicable = copy.deepcopy(sd["applicable"])
        self.store._cells, self.store._tags_of_rubric = copy.deepcopy(sd["store"])
        self.rng.setstate(sd["rng"])


# --------------------------------------------------------------------------
# Outcome (VADE-style) sampler
# --------------------------------------------------------------------------
class RefOutcomeSampler:
    """Per-task Beta evidence from task outcomes (VADE); weights p(1-p)^2."""

    def __init__(self, tasks, batch_size=32, group_size=8, gamma_obs=0.2, gamma_unobs=0.999, seed=0):
        self.tasks = {t: tuple(tags) for t, tags in tasks.items()}
        if batch_size < 1 or batch_size > len(self.tasks):
            raise ValueError("batch_size out of range")
        self.batch_size = batch_size
        self.group_size = group_size
        self.store = RefEvidenceStore(gamma_obs, gamma_unobs)
        self.rng = random.Random(seed)

    def record_group(self, task_id, verdicts, policy_version, outcomes=None):
        if task_id not in self.tasks:
            raise ValueError(f"task_id {task_id!r} is not a known task")
        if outcomes is None:
            raise ValueError("outcomes are required")
        outcomes = [float(o) for o in outcomes]
        if len(outcomes) != self.group_size or not all(0.0 <= o <= 1.0 for o in outcomes):
            raise ValueError("outcomes must be group_size floats in [0, 1]")
        s = f = 0.0
        for o in outcomes:
            s += o
            f += 1.0 - o
        self.store.observe(task_id, 0, s, f, policy_version)

    def task_evidence(self, task_id, policy_version):
        return self.store.query(task_id, 0, policy_version)

    def sample(self, policy_version):
        ids = list(self.tasks)
        ws = []
        for t in ids:
            s, f = self.task_evidence(t, policy_version)
            x = self.rng.betavariate(1.0 + s, 1.0 + f)
            ws.append(x * (1.0 - x) ** 2)
        batch = []
        for _ in range(self.batch_size):
            k = _weighted_index(self.rng, ws)
            batch.append(ids.pop(k))
            ws.pop(k)
        return batch
