"""Arise's rubric-skill pool: evidence windows, the lifecycle of eq. 4-8, event history and resume.

Use (Algorithm 1; `step` is the 0-based training iteration k):

    pool = RubricSkillPool(reflector)                       # empty, as the paper starts
    for step in range(num_steps):
        prompt = pool.system_prompt(base_prompt)             # active skills injected (line 6)
        ...roll out, judge pool.active_rubrics() -> reports (line 11)...
        pool.record(reports, step)                           # window evidence (line 16)
        update = pool.maybe_update(step, recent_trajectories)   # lines 17-26, when (step+1) % delta_pool == 0
        if update is not None:
            sampler.set_rubrics(pool.rubric_capabilities())

An update at step k, in Algorithm 1's order:

1. pass rates p_i (eq. 2) over the window of steps k - delta_pool + 1 .. k, from
   applicable evaluations only (PASS / FAIL; NA and INVALID never count). A pair
   without an applicable evaluation in the window keeps its state ("retained",
   pass rate None) - no evidence is no reason to retire, hide, activate or refine;
2. p_i <= eta_low: a hidden skill is activated, an active one is refined by
   `reflector.refine_skill(rubric, skill, failures)` (the rubric is unchanged);
   `failures` are the given recent trajectories this rubric failed in the window
   (at most `max_failures`, the latest);
3. eta_low < p_i < eta_high: an active skill is hidden (the pair stays);
4. p_i >= eta_high: the pair is retired - by default (retire_while_shown=False) only when its skill is
   hidden: an active skill is hidden instead, and the pair retires on a later window measured with it hidden;
   with retire_while_shown=True (eq. 5 read alone) whatever its skill's status;
5. `reflector.propose_rubric_skills(trajectories, existing, room)` with `existing`
   = every rubric of P_k (the pool before this update, retiring ones included, so
   a just-mastered criterion is not proposed again; eq. 4) and
   room = min(max_new, max_pool - pairs left after step 4). It is not called when
   room is 0; proposals beyond `room` are dropped (counted in `PoolUpdate.dropped`).
   New skills start hidden.

Everything the reflector returns is validated and every call made before the
pool changes: if the reflector raises or returns something invalid, the update
raises and the pool is exactly as before (the same update can be retried).
Evidence up to step k is then discarded (windows do not overlap); evidence
recorded for later steps stays for the next window.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping, Sequence

from rwcore._io import atomic_write_bytes
from rwcore.arise.pool.lifecycle import apply_update, transition
from rwcore.arise.pool.prompt import render_system_prompt
from rwcore.arise.pool.records import (
    PoolEvent,
    PoolUpdate,
    RubricSkillPair,
    Skill,
    SkillStatus,
    pass_rate,
)
from rwcore.arise.pool.state import (
    STATE_KIND,
    Entry,
    PoolContents,
    Retired,
    check_proposals,
    created_event,
    read_state,
    retired_pair,
    rubric_snapshot,
    write_state,
)
from rwcore.arise.pool.window import WindowEvidence, parse_counts, parse_reports
from rwcore.judged import JudgedBatch
from rwcore.tasks import DEFAULT_CAPABILITIES, check_capabilities
from rwcore.types import RubricReflector, RubricSkillProposal, RubricSpec, Trajectory
from rwcore.validation import check_int, check_trajectories, check_unit
from rwcore.verdict import Verdict


class RubricSkillPool:
    """The evolving pool of (rubric, skill) pairs of Arise §3.2.1 (eq. 4-8); see the module docstring.

    reflector: a rwcore.types.RubricReflector (the reflection model G_ref); needed by an
        update that refines a skill or has room for new pairs. May also be given per update.
    max_pool: the most pairs the pool holds [64]. max_new: the most pairs one update adds [8].
    delta_pool: updates run at steps k with (k + 1) % delta_pool == 0 [10].
    eta_high: retirement threshold, in (0, 1] [0.9]; eta_low: activation / refinement
        threshold, in [0, eta_high) [0.3].
    capabilities: the categories a rubric may belong to (the sampler's; Arise table 3).
    base_prompt: the default base of `system_prompt()`; not part of the state.
    proposals: an initial pool (RubricSkillProposal list; skills hidden, created at step -1).
        The paper starts empty and lets the first update generate from initial rollouts.
    max_failures: failed trajectories kept per rubric and step and handed to refinement
        [256, the record limit of Arise B.3].
    frozen: a fixed rubric set (Arise's frozen-rubrics ablation): `proposals` are the pool for the
        whole run; updates never retire a pair nor ask for new ones, while skills still activate,
        hide and refine by the same thresholds.
    retire_while_shown: False (default): an active skill whose pass rate reaches eta_high is hidden instead,
        and the pair retires only on a window measured with the skill hidden (mastery without guidance: the
        paper's lifecycle tables 7-10 and appendix G). True: eq. 5 read alone, a pair whose pass rate reaches
        eta_high retires whether its skill is shown or hidden.

    Bad arguments raise ValueError naming them, and leave the pool unchanged.
    """

    def __init__(
        self,
        reflector: RubricReflector | None = None,
        *,
        max_pool: int = 64,
        max_new: int = 8,
        delta_pool: int = 10,
        eta_high: float = 0.9,
        eta_low: float = 0.3,
        capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
        base_prompt: str = "",
        proposals: Sequence[RubricSkillProposal] = (),
        max_failures: int = 256,
        frozen: bool = False,
        retire_while_shown: bool = False,
    ) -> None:
        self._max_pool = check_int(max_pool, "max_pool", low=1)
        self._max_new = check_int(max_new, "max_new", low=0)
        self._delta_pool = check_int(delta_pool, "delta_pool", low=1)
        self._eta_high = check_unit(eta_high, "eta_high")
        if self._eta_high <= 0.0:
            raise ValueError(f"eta_high must be in (0, 1], got {eta_high!r}")
        self._eta_low = check_unit(eta_low, "eta_low")
        if not self._eta_low < self._eta_high:
            raise ValueError(f"eta_low must be in [0, eta_high) = [0, {self._eta_high}), got {eta_low!r}")
        self._capabilities = check_capabilities(capabilities)
        for name in self._capabilities:
            if not isinstance(name, str) or not name:
                raise ValueError(f"capabilities must be non-empty strings, got {name!r}")
        self._max_failures = check_int(max_failures, "max_failures", low=0)
        if not isinstance(frozen, bool):
            raise ValueError(f"frozen must be True or False, got {frozen!r}")
        self._frozen = frozen
        if not isinstance(retire_while_shown, bool):
            raise ValueError(f"retire_while_shown must be True or False, got {retire_while_shown!r}")
        self._retire_while_shown = retire_while_shown
        if not isinstance(base_prompt, str):
            raise ValueError(f"base_prompt must be a string, got {type(base_prompt).__name__}")
        self.base_prompt = base_prompt
        self._reflector = None if reflector is None else _check_reflector(reflector, "reflector")
        self._config = {
            "max_pool": self._max_pool,
            "max_new": self._max_new,
            "delta_pool": self._delta_pool,
            "eta_high": self._eta_high,
            "eta_low": self._eta_low,
            "capabilities": list(self._capabilities),
            "max_failures": self._max_failures,
            "frozen": self._frozen,
            "retire_while_shown": self._retire_while_shown,
        }

        self._entries: dict[str, Entry] = {}
        self._retired: dict[str, Retired] = {}
        self._window = WindowEvidence(self._max_failures)
        self._events: list[PoolEvent] = []
        self._updates: list[PoolUpdate] = []
        self._last_update = -1
        self._next_id = 0

        if isinstance(proposals, (str, bytes)) or not isinstance(proposals, Sequence):
            raise ValueError(f"proposals must be a sequence of RubricSkillProposal, got {type(proposals).__name__}")
        if len(proposals) > self._max_pool:
            raise ValueError(f"proposals holds {len(proposals)} pairs, more than max_pool={self._max_pool}")
        checked, self._next_id = check_proposals(proposals, self._capabilities, "proposals", set(), 0)
        for spec, skill in checked:
            self._entries[spec.rubric_id] = Entry(spec, skill, SkillStatus.HIDDEN, 0, -1)
            self._events.append(created_event(spec, skill, -1))

    # -- configuration -------------------------------------------------------------------------
    @property
    def max_pool(self) -> int:
        return self._max_pool

    @property
    def max_new(self) -> int:
        return self._max_new

    @property
    def delta_pool(self) -> int:
        return self._delta_pool

    @property
    def eta_high(self) -> float:
        return self._eta_high

    @property
    def eta_low(self) -> float:
        return self._eta_low

    @property
    def capabilities(self) -> tuple[str, ...]:
        return self._capabilities

    @property
    def reflector(self) -> RubricReflector | None:
        return self._reflector

    @reflector.setter
    def reflector(self, reflector: RubricReflector | None) -> None:
        self._reflector = None if reflector is None else _check_reflector(reflector, "reflector")

    def __repr__(self) -> str:
        return (
            f"RubricSkillPool(pairs={len(self._entries)}, active_skills={len(self.active_skills())}, "
            f"retired={len(self._retired)}, last_update_step={self._last_update})"
        )

    # -- the pool as the rest of training sees it -------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rubric_id) -> bool:
        return rubric_id in self._entries

    def rubric_ids(self) -> list[str]:
        """Ids of the pairs in the pool, in pool (creation) order."""
        return list(self._entries)

    def active_rubrics(self) -> list[RubricSpec]:
        """R_k: every rubric in the pool (the judge evaluates them all, whether or not its skill is active)."""
        return [entry.spec for entry in self._entries.values()]

    def rubric_capabilities(self) -> dict[str, str]:
        """{rubric id: capability} of the pool: what `CapabilitySampler.set_rubrics` takes."""
        return {rubric_id: entry.spec.capability for rubric_id, entry in self._entries.items()}

    def active_skills(self) -> dict[str, str]:
        """{rubric id: skill text} of the active skills, in pool order (what the prompt injects)."""
        return {rid: e.skill for rid, e in self._entries.items() if e.status == SkillStatus.ACTIVE}

    def system_prompt(self, base_prompt: str | None = None) -> str:
        """`base_prompt` (default: the pool's) with the active skills appended; format in rwcore.arise.pool.prompt."""
        base = self.base_prompt if base_prompt is None else base_prompt
        return render_system_prompt(base, list(self.active_skills().values()))

    @staticmethod
    def system_prompt_from_state(state: Mapping, base_prompt: str) -> str:
        """`system_prompt(base_prompt)` of the pool whose `state_dict()` is `state`, without building it (what a
        checkpoint's training prompt was)."""
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND:
            raise ValueError(f"state must be a {STATE_KIND!r} state_dict")
        skills = [pair["skill"] for pair in state.get("pairs", []) if pair.get("status") == SkillStatus.ACTIVE.value]
        return render_system_prompt(base_prompt, skills)

    def pairs(self) -> list[RubricSkillPair]:
        """Snapshots of the pool's pairs in pool order, with the evidence recorded since the last update."""
        return [self._pair(rubric_id) for rubric_id in self._entries]

    def pair(self, rubric_id: str) -> RubricSkillPair:
        """One pair of the pool, or a retired one; ValueError naming rubric_id when it never was in the pool."""
        if rubric_id in self._entries:
            return self._pair(rubric_id)
        if isinstance(rubric_id, str) and rubric_id in self._retired:
            return retired_pair(self._retired[rubric_id])
        raise ValueError(f"rubric_id {rubric_id!r} is not in the pool")

    def retired_pairs(self) -> list[RubricSkillPair]:
        """Retired pairs in retirement order, with their skill as it was and the window they retired in."""
        return [retired_pair(record) for record in self._retired.values()]

    def pass_rates(self) -> dict[str, float | None]:
        """Eq. 2 per pair over the evidence recorded since the last update (None: no applicable evaluation)."""
        return {rid: pass_rate(*self._window.totals(rid)[:2]) for rid in self._entries}

    # -- history -------------------------------------------------------------------------------
    @property
    def last_update_step(self) -> int:
        """Step of the latest update (-1 before the first)."""
        return self._last_update

    @property
    def events(self) -> tuple[PoolEvent, ...]:
        return tuple(self._events)

    @property
    def updates(self) -> tuple[PoolUpdate, ...]:
        return tuple(self._updates)

    def history(self, rubric_id: str | None = None) -> list[dict]:
        """The event history as JSON-ready dicts (one rubric's when `rubric_id` is given)."""
        return [event.to_dict() for event in self._events if rubric_id is None or event.rubric_id == rubric_id]

    def counts(self) -> list[dict]:
        """Figure 4a: per update, active / added / retired counts (and running totals)."""
        return [update.counts() for update in self._updates]

    # -- evidence ------------------------------------------------------------------------------
    def record(self, reports: Sequence, step: int) -> None:
        """Adds judge reports (rwcore.types.JudgeReport) of training step `step` to the evidence window.

        Every judgment must name a rubric in the pool. PASS / FAIL count toward the
        pass rate, NA and INVALID are kept for diagnostics only. A FAIL's trajectory
        id is remembered for skill refinement. `step` must be after the last update:
        the windows of earlier updates are closed.
        """
        step = self._check_record_step(step)
        counts, failures = parse_reports(reports, self._entries, self._retired_steps())
        self._window.add(step, counts, failures)

    def record_judged(self, judged: JudgedBatch, step: int) -> None:
        """Adds the pool's columns of a `rwcore.JudgedBatch` of step `step` (what `record` does for
        reports, without rebuilding them): counts per rubric and the FAILed trajectory ids.
        Columns of rubrics outside the pool are ignored; a pool rubric the batch did not judge
        gets no evidence."""
        step = self._check_record_step(step)
        if not isinstance(judged, JudgedBatch):
            raise ValueError(f"judged must be a rwcore.JudgedBatch, got {type(judged).__name__}")
        counts: dict[str, list[int]] = {}
        failures: dict[str, list[str]] = {}
        for j, rubric_id in enumerate(judged.rubric_ids):
            if rubric_id not in self._entries:
                continue
            column = judged.codes[:, j]
            counts[rubric_id] = [
                int((column == code).sum()) for code in (Verdict.PASS, Verdict.FAIL, Verdict.NA, Verdict.INVALID)
            ]
            failures[rubric_id] = [
                tid for tid, code in zip(judged.trajectory_ids, column) if code == Verdict.FAIL and tid
            ]
        self._window.add(step, counts, failures)

    def record_counts(self, counts: Mapping[str, Sequence[int]], step: int) -> None:
        """Adds already-aggregated evidence {rubric id: (passes, fails)} of step `step` (no failure ids)."""
        step = self._check_record_step(step)
        rows = parse_counts(counts, self._entries, self._retired_steps())
        self._window.add(step, rows, {})

    # -- the lifecycle ---------------------------------------------------------------------------
    def is_update_step(self, step: int) -> bool:
        """Whether an update is scheduled at the end of step `step`: (step + 1) % delta_pool == 0."""
        step = check_int(step, "step", low=0)
        return (step + 1) % self._delta_pool == 0

    def maybe_update(
        self,
        step: int,
        trajectories: Sequence[Trajectory] = (),
        *,
        reflector: RubricReflector | None = None,
        evidence: Sequence[Trajectory] | None = None,
        diagnostics: str | None = None,
    ) -> PoolUpdate | None:
        """`update(step, ...)` when step is an update step not yet run, else None."""
        if self.is_update_step(step) and step > self._last_update:
            return self.update(step, trajectories, reflector=reflector, evidence=evidence, diagnostics=diagnostics)
        return None

    def update(
        self,
        step: int,
        trajectories: Sequence[Trajectory] = (),
        *,
        reflector: RubricReflector | None = None,
        evidence: Sequence[Trajectory] | None = None,
        diagnostics: str | None = None,
    ) -> PoolUpdate:
        """Runs the scheduled update at the end of step `step` (see the module docstring); all or nothing.

        trajectories: the window's rollouts, where each refined skill's failures are looked up
            (by the trajectory ids its FAIL verdicts were recorded with). An active skill due for
            refinement whose failures are not among them is kept as it is, without a reflector call
            (event "retained"): refinement needs failure evidence.
        evidence: the records the reflector generates new pairs from (B_k: up to 256 diagnostic
            records of the window, Arise B.3; `rwcore.AdaptiveMethod` selects them); default
            `trajectories`.
        diagnostics: compressed diagnostic text for the reflector (e.g. the judge's uncovered-
            behaviour notes); passed as `diagnostics=` to reflectors whose
            `propose_rubric_skills` takes that keyword.
        reflector: overrides the pool's reflector for this update.
        """
        step = check_int(step, "step", low=0)
        if (step + 1) % self._delta_pool:
            raise ValueError(
                f"step {step} is not an update step: updates run when (step + 1) % delta_pool == 0 "
                f"(delta_pool={self._delta_pool})"
            )
        if step <= self._last_update:
            raise ValueError(f"step {step} is not after the last update (step {self._last_update})")
        trajectories = check_trajectories(trajectories)
        evidence = trajectories if evidence is None else check_trajectories(evidence, "evidence")
        if diagnostics is not None and not isinstance(diagnostics, str):
            raise ValueError(f"diagnostics must be a str or None, got {type(diagnostics).__name__}")
        if reflector is not None:
            reflector = _check_reflector(reflector, "reflector")
        else:
            reflector = self._reflector
        low = step - self._delta_pool + 1

        # 1. pass rates over the window and the decision for each pair (nothing changes yet)
        window: dict[str, list[int]] = {}
        rates: dict[str, float | None] = {}
        plan: dict[str, str] = {}
        for rubric_id, entry in self._entries.items():
            window[rubric_id] = self._window.totals(rubric_id, low, step)
            rates[rubric_id] = pass_rate(*window[rubric_id][:2])
            plan[rubric_id] = transition(
                rates[rubric_id], entry.status, self._eta_low, self._eta_high, self._retire_while_shown
            )
            if self._frozen and plan[rubric_id] == "retired":
                plan[rubric_id] = "retained"  # a frozen pool keeps every rubric; only skills change

        # 2. refinement of active skills that still fail (eq. 8)
        refined: dict[str, str] = {}
        for rubric_id, kind in plan.items():
            if kind != "refined":
                continue
            failed_ids = set(self._window.failure_ids(rubric_id, low, step))
            failures = [t for t in trajectories if t.trajectory_id in failed_ids]
            failures = failures[-self._max_failures :] if self._max_failures else []
            if not failures:
                plan[rubric_id] = "retained"  # nothing to refine from: keep the skill, ask nobody
                continue
            if reflector is None:
                raise ValueError(f"reflector is needed: the active skill of {rubric_id!r} must be refined")
            entry = self._entries[rubric_id]
            text = reflector.refine_skill(entry.spec, entry.skill, failures)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(
                    f"reflector.refine_skill returned {text!r} for rubric {rubric_id!r}; a skill must be non-empty text"
                )
            refined[rubric_id] = text

        # 3. new pairs (eq. 4), within the pool limits
        retiring = [rid for rid, kind in plan.items() if kind == "retired"]
        room = 0 if self._frozen else min(self._max_new, self._max_pool - (len(self._entries) - len(retiring)))
        new_pairs: list[tuple[RubricSpec, str]] = []
        dropped = 0
        next_id = self._next_id
        if room > 0:
            if reflector is None:
                raise ValueError(
                    f"reflector is needed: the update has room for {room} new pairs (use max_new=0 for a fixed pool)"
                )
            existing = [entry.spec for entry in self._entries.values()]
            if diagnostics is not None and _takes_diagnostics(reflector):
                proposals = reflector.propose_rubric_skills(evidence, existing, room, diagnostics=diagnostics)
            else:
                proposals = reflector.propose_rubric_skills(evidence, existing, room)
            argument = "reflector.propose_rubric_skills(...)"
            if isinstance(proposals, (str, bytes)) or not isinstance(proposals, Sequence):
                raise ValueError(
                    f"{argument} must return a list of RubricSkillProposal, got {type(proposals).__name__}"
                )
            taken = set(self._entries) | set(self._retired)
            # A reflector (an LLM especially) may propose a rubric the pool holds or has
            # retired; ids are never reused, so such proposals are dropped, not fatal.
            fresh = [
                p
                for p in proposals
                if not (
                    isinstance(p, RubricSkillProposal)
                    and isinstance(p.rubric, RubricSpec)
                    and p.rubric.rubric_id in taken
                )
            ]
            dropped = len(proposals) - min(len(fresh), room)
            new_pairs, next_id = check_proposals(fresh[:room], self._capabilities, argument, taken, next_id)

        # 4. commit: nothing below can fail
        contents, summary = apply_update(
            self._contents(), step, plan, refined, rates, window, new_pairs, dropped, next_id
        )
        self._set_contents(contents)
        return summary

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed for an exact resume, JSON-serializable (the reflector and base_prompt excluded)."""
        return write_state(self._config, self._capabilities, self._contents())

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()` output of a pool with the same settings; all or nothing."""
        self._set_contents(read_state(state, self._config, self._capabilities, self._max_pool, self._max_failures))

    def save(self, path: str | os.PathLike) -> None:
        """Writes `state_dict()` as JSON to `path` atomically."""
        atomic_write_bytes(path, json.dumps(self.state_dict(), ensure_ascii=False, sort_keys=True).encode())

    def load(self, path: str | os.PathLike) -> None:
        """Restores a file written by `save`; all or nothing."""
        with open(path, "rb") as stream:
            try:
                state = json.loads(stream.read().decode())
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"path {str(path)!r} does not hold a saved pool: {error}") from None
        self.load_state_dict(state)

    # -- internals -----------------------------------------------------------------------------
    def _contents(self) -> PoolContents:
        return PoolContents(
            self._entries,
            self._retired,
            self._window,
            self._events,
            self._updates,
            self._last_update,
            self._next_id,
        )

    def _set_contents(self, contents: PoolContents) -> None:
        self._entries = contents.entries
        self._retired = contents.retired
        self._window = contents.window
        self._events = contents.events
        self._updates = contents.updates
        self._last_update = contents.last_update
        self._next_id = contents.next_id

    def _pair(self, rubric_id: str) -> RubricSkillPair:
        entry = self._entries[rubric_id]
        return RubricSkillPair(
            rubric=rubric_snapshot(entry.spec, self._window.totals(rubric_id)),
            skill=Skill(entry.skill, entry.status, entry.revisions),
            created_step=entry.created_step,
        )

    def _retired_steps(self) -> dict[str, int]:
        return {rubric_id: record.retired_step for rubric_id, record in self._retired.items()}

    def _check_record_step(self, step) -> int:
        step = check_int(step, "step", low=0)
        if step <= self._last_update:
            raise ValueError(
                f"step {step} lies in a window already closed by the update at step {self._last_update}; "
                "record late evidence under the current training step"
            )
        return step


def _takes_diagnostics(reflector) -> bool:
    """Whether `reflector.propose_rubric_skills` accepts a `diagnostics` keyword."""
    try:
        parameters = inspect.signature(reflector.propose_rubric_skills).parameters
    except (TypeError, ValueError):
        return False
    return "diagnostics" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _check_reflector(reflector, argument: str) -> RubricReflector:
    if not isinstance(reflector, RubricReflector):
        raise ValueError(
            f"{argument} must implement rwcore.types.RubricReflector (propose_rubric_skills and refine_skill), "
            f"got {type(reflector).__name__}"
        )
    return reflector
