"""What a table is and which runs it makes: the tables (`PAPERS`, `BASELINES`), the seeds, and an `AblationPlan`
checked before anything starts (every variant's config is loaded, so a bad key or value fails first).

`arise_frozen_rubrics` freezes the pool of the same seed's `arise` run (pool.frozen_from): the
scheduler starts it only after that run finished, and the arise run is part of every Arise table.

An override a variant cannot apply (`rwcore.method.inapplicable_settings`, e.g. advantage.process_gate for
outcome_only, which has no process credit to gate) is dropped for that variant only: without it the run is
the same run. ablation.md says which.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rwcore.method import VARIANTS
from rwcore.trainer.ablate.statistics import BOOTSTRAP_REPS

__all__ = [
    "PAPERS",
    "BASELINES",
    "DEPENDS",
    "Job",
    "AblationPlan",
    "parse_seeds",
    "plan_ablation",
    "inapplicable_overrides",
]

PAPERS: dict[str, tuple[str, ...]] = {
    # Arise fig. 3(a): the full method, its ablations and outcome-only RL.
    "arise": (
        "arise",
        "arise_retire_while_shown",
        "arise_frozen_rubrics",
        "arise_no_skills",
        "arise_no_adaptive_sampling",
        "arise_vade_sampling",
        "outcome_only",
    ),
    # RewardWeaver table 2: the full method and every alternative process-reward construction.
    "rewardweaver": (
        "rewardweaver",
        "rw_outcome_grpo",
        "rw_static_topk",
        "rw_random_active_set",
        "rw_failure_frequency",
        "rw_random_trajectory",
        "rw_success_failure",
        "rw_open_vocabulary",
        "rw_instance_specific",
    ),
    # The rows the papers' main claim rests on: each paper's full method, its two strongest alternatives or
    # ablations, both composed, and outcome-only RL.
    "claim": (
        "rewardweaver",
        "rw_static_topk",
        "rw_random_active_set",
        "arise",
        "arise_no_skills",
        "combined",
        "outcome_only",
    ),
}
"""Each table, in its row order (every name is a `rwcore.method.VARIANTS` key): the two papers' and `claim`."""

BASELINES = {"arise": "outcome_only", "rewardweaver": "rw_outcome_grpo", "claim": "outcome_only"}
"""Each table's outcome-only row: what 'steps to baseline' / 'steps to reach' measure against (Arise fig. 3(b))
and what the probability of improvement and the IQM difference compare with."""

DEPENDS = {"arise_frozen_rubrics": "arise"}
"""variant -> the variant whose same-seed run it reads (pool.frozen_from)."""


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; a malformed, negative or repeated seed is a ValueError naming --seeds."""
    parts = [part.strip() for part in str(text).split(",")]
    if not parts or any(not part for part in parts):
        raise ValueError(f"--seeds must be comma-separated integers such as 0,1,2, got {text!r}")
    try:
        seeds = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers such as 0,1,2, got {text!r}") from None
    if any(seed < 0 for seed in seeds):
        raise ValueError(f"--seeds must be non-negative, got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds repeats a seed: {text!r}")
    return seeds


@dataclass(frozen=True)
class Job:
    """One run of the table."""

    variant: str
    seed: int
    overrides: tuple[str, ...]
    after: str | None = None  # name of the job that must finish first

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


@dataclass
class AblationPlan:
    paper: str
    variants: list[str]
    seeds: list[int]
    steps: int | None
    jobs: int
    out: Path
    overrides: list[str] = field(default_factory=list)
    config: str | None = None
    inapplicable: dict[str, list[dict]] = field(default_factory=dict)
    """variant -> the overrides it cannot apply: [{"key", "dropped": [override, ..], "replaced_with": str | None,
    "note": sentence}] (`inapplicable_overrides`)."""
    bootstrap_reps: int = BOOTSTRAP_REPS

    def variant_overrides(self, variant: str) -> list[str]:
        """The overrides `variant`'s runs get: every override, less those it cannot apply (plus a reset to the
        default of a setting it cannot apply that the --config file sets)."""
        dropped = {o for cell in self.inapplicable.get(variant, ()) for o in cell["dropped"]}
        added = [cell["replaced_with"] for cell in self.inapplicable.get(variant, ()) if cell["replaced_with"]]
        return [o for o in self.overrides if o not in dropped] + added

    @property
    def runs_dir(self) -> Path:
        return self.out / "runs"

    def run_jobs(self) -> list[Job]:
        """Every run, dependencies before the runs that read them."""
        listed = []
        for seed in self.seeds:
            for variant in self.variants:
                extra = [f"train.method={variant}", f"train.seed={seed}"]
                if self.steps is not None:
                    extra.append(f"train.steps={self.steps}")
                after = None
                if variant in DEPENDS:
                    after = f"{DEPENDS[variant]}-s{seed}"
                    extra.append(f"pool.frozen_from={self.runs_dir / after}")
                listed.append(Job(variant, seed, tuple(self.variant_overrides(variant)) + tuple(extra), after))
        order = {name: i for i, name in enumerate(PAPERS[self.paper])}
        return sorted(listed, key=lambda job: (job.after is not None, job.seed, order.get(job.variant, 99)))


def plan_ablation(
    paper: str,
    variants: Sequence[str] | None,
    seeds: Sequence[int],
    steps: int | None,
    jobs: int | None,
    out: str | os.PathLike,
    overrides: Sequence[str] = (),
    config: str | None = None,
    bootstrap_reps: int = BOOTSTRAP_REPS,
) -> AblationPlan:
    """Checks every argument before anything starts (the config of every variant included); ValueError names the
    bad one."""
    if paper not in PAPERS:
        raise ValueError(f"--paper must be one of {', '.join(PAPERS)}, got {paper!r}")
    table = PAPERS[paper]
    chosen = list(table) if not variants else list(variants)
    unknown = [v for v in chosen if v not in table]
    if unknown:
        hint = " (a variant of another table)" if all(v in VARIANTS for v in unknown) else ""
        raise ValueError(
            f"--variants: {', '.join(map(repr, unknown))} not in the {paper} table{hint}; "
            f"choose from {', '.join(table)}"
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--variants repeats a variant: {','.join(chosen)}")
    for variant, needed in DEPENDS.items():
        if variant in chosen and needed not in chosen:
            raise ValueError(
                f"--variants: {variant} freezes the pool of the same seed's {needed} run; add {needed} to --variants"
            )
    if not seeds:
        raise ValueError("--seeds is empty")
    if steps is not None and steps <= 0:
        raise ValueError(f"--steps must be a positive integer, got {steps}")
    jobs = jobs or os.cpu_count() or 1
    if jobs <= 0:
        raise ValueError(f"--jobs must be a positive integer, got {jobs}")
    for override in overrides:
        if "=" not in override or override.startswith("="):
            raise ValueError(f"override {override!r} is not section.key=value")
        if override.split("=", 1)[0] in ("train.method", "train.seed", "train.steps", "pool.frozen_from"):
            raise ValueError(f"override {override!r}: rw ablate sets {override.split('=', 1)[0]} itself")
    if isinstance(bootstrap_reps, bool) or not isinstance(bootstrap_reps, int) or bootstrap_reps < 1:
        raise ValueError(f"--bootstrap-reps must be a positive integer, got {bootstrap_reps!r}")
    ordered = [v for v in table if v in chosen]  # the paper's row order
    # the pool a frozen-rubrics run reads is named by rw ablate (`AblationPlan.run_jobs`); its config needs one
    frozen = {v: [f"pool.frozen_from={Path(out) / 'runs' / f'{DEPENDS[v]}-s{seeds[0]}'}"] for v in DEPENDS}
    inapplicable = inapplicable_overrides(config, list(overrides), ordered, frozen)
    return AblationPlan(
        paper, ordered, list(seeds), steps, jobs, Path(out), list(overrides), config, inapplicable, bootstrap_reps
    )


def _inapplicable_settings():
    """`rwcore.method.inapplicable_settings`, or None where this rwcore predates it (every override applies)."""
    try:
        from rwcore.method import inapplicable_settings
    except ImportError:
        return None
    return inapplicable_settings


def inapplicable_overrides(
    config: str | None,
    overrides: Sequence[str],
    variants: Sequence[str],
    extra: dict[str, Sequence[str]] | None = None,
) -> dict:
    """Loads every variant's config (a bad key or value is a ValueError naming it, before anything starts) and
    finds the settings a variant cannot apply (`rwcore.method.inapplicable_settings`).

    Such a setting changes nothing for that variant (outcome-only has no process credit for
    advantage.process_gate to gate), but building the variant refuses it: its overrides are dropped for that
    variant; set by the --config file instead, it is reset to its default for that variant.
    extra: variant -> overrides rw ablate adds to that variant's runs (pool.frozen_from).
    Returns variant -> [{"key", "dropped": [override, ..], "replaced_with": "key=default" | None, "note"}]."""
    import dataclasses

    from rwcore.method import MethodSettings
    from rwcore.trainer.config import load_config
    from rwcore.trainer.method_setup import method_settings

    check = _inapplicable_settings()
    defaults = {f.metadata.get("config"): f.default for f in dataclasses.fields(MethodSettings)}
    found: dict[str, list[dict]] = {}
    for variant in variants:
        own = [*(extra or {}).get(variant, ()), f"train.method={variant}"]
        cfg = load_config(config, [*overrides, *own])
        if check is None:
            continue
        cells = []
        for key in check(variant, method_settings(cfg)):
            dropped = [o for o in overrides if o.split("=", 1)[0].strip() == key]
            if dropped:
                note = f"{' and '.join(dropped)} does not apply to {variant}: run without it, which is the same run"
                cells.append({"key": key, "dropped": dropped, "replaced_with": None, "note": note})
        kept = [o for o in overrides if not any(o in cell["dropped"] for cell in cells)]
        cfg = load_config(config, [*kept, *own])
        for key in check(variant, method_settings(cfg)):  # what is left comes from the --config file
            section, _, name = key.partition(".")
            reset = f"{key}={defaults[key]}"
            note = (
                f"{key}={getattr(getattr(cfg, section), name)} (from --config) does not apply to {variant}: run "
                f"with {reset}, which is the same run"
            )
            cells.append({"key": key, "dropped": [], "replaced_with": reset, "note": note})
        if not cells:
            continue
        found[variant] = cells
        resets = [cell["replaced_with"] for cell in cells if cell["replaced_with"]]
        still = check(variant, method_settings(load_config(config, [*kept, *resets, *own])))
        if still:
            raise ValueError(
                f"{', '.join(still)}: {variant} cannot apply this setting even at its default; "
                f"leave {variant} out of --variants"
            )
    return found
