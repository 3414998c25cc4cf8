"""`rw ablate`: a paper's ablation table (its variants x seeds) as parallel `rw train` runs.

Layout of the output folder OUT:
  OUT/ablation.md, OUT/ablation.json, OUT/ablation.png   the table, its data and one point per seed
  OUT/runs/<variant>-s<seed>/                            each run's folder (rw train --out)
  OUT/runs/<variant>-s<seed>/ablation_status.json        {"status": "finished"|"failed", ...}

Runs are separate processes so a crash stays in its run; each gets `OMP_NUM_THREADS` (and the MKL /
OpenBLAS equivalents) set to its share of the cores, because two unpinned torch processes on a
2-core machine slow each other by an order of magnitude. A run is finished when its status file says
so, which `rw ablate` writes only when the run exited 0 having written each training step 1..N once,
a held-out evaluation and the step-N checkpoint; `rw ablate` again with the same OUT skips finished runs,
resumes killed ones from their latest checkpoint and re-runs failed ones. A failed run is a row marked
failed with its error, never averaged in. Where runs run is an executor's business (`LocalExecutor` here;
trainer/ablate_ray.py runs each as a Ray task); everything else is the same for both.

One writer per folder: `rw ablate` holds OUT's lock (trainer/run_lock.py) while it runs, and each `rw train`
holds its run's. Each run is started in a process group of its own with a parent-death signal (SIGTERM), so no
run outlives `rw ablate`, however it ends (`kill -9` included); when it stops, it stops its runs and kills
what is left of their groups. A rerun waits a little (`CELL_WAIT_SECONDS`) for a run whose folder another
process still writes, then refuses, naming it and that process.

`arise_frozen_rubrics` freezes the pool of the same seed's `arise` run (pool.frozen_from): the
scheduler starts it only after that run finished, and the arise run is part of every Arise table.

An override a variant cannot apply (`rwcore.method.inapplicable_settings`, e.g. advantage.process_gate for
outcome_only, which has no process credit to gate) is dropped for that variant only: without it the run is
the same run. ablation.md says which.

The statistics (normalized AUC, steps to reach, IQM, probability of improvement, bootstrap intervals) are in
trainer/ablate_stats.py; `rw compare` (trainer/compare.py) groups any runs by config and reports the same ones.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rwcore._io import atomic_write_bytes
from rwcore.method import VARIANTS
from rwcore.trainer.ablate_stats import (
    BOOTSTRAP_REPS,
    MIN_SEEDS,
    NEEDS_SEEDS,
    REACH_STEP,
    bootstrap_note,
    ceilings_used,
    eval_ceiling,
    eval_curve,
    format_estimate,
    mean_sd,
    metric_notes,
    normalized_auc,
    reach_target,
    seed_statistics,
    steps_to_reach,
)
from rwcore.trainer.compare import plot_compare
from rwcore.trainer.machine import cpu_model

__all__ = [
    "PAPERS",
    "BASELINES",
    "AblationPlan",
    "LocalExecutor",
    "plan_ablation",
    "run_ablation",
    "summarize",
    "parse_seeds",
    "write_table",
    "plot_runs",
    "plot_compare",
    "check_resume",
    "eval_curve",
    "eval_ceiling",
    "steps_to_reach",
    "inapplicable_overrides",
]

PAPERS: dict[str, tuple[str, ...]] = {
    # Arise fig. 3(a): the full method, its ablations and outcome-only RL.
    "arise": (
        "arise",
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

STATUS_FILE = "ablation_status.json"
CELL_WAIT_SECONDS = 30.0
"""How long a rerun waits for a run whose folder another process still writes before refusing (the `rw train`
of a killed `rw ablate` gets SIGTERM as it dies and is gone within seconds)."""
STOP_SECONDS = 30.0
"""How long a stopped run may take to end after SIGTERM before its process group is killed."""
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


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

SETTINGS_FILE = "ablation_settings.json"


def _settings(plan: AblationPlan) -> dict:
    """What every run of a table shares; variants and seeds may grow between calls, these may not."""
    return {
        "steps": plan.steps,
        "overrides": list(plan.overrides),
        "config": str(Path(plan.config).resolve()) if plan.config else None,
    }


def check_resume(plan: AblationPlan) -> None:
    """A second call into the same OUT must use the same steps, overrides and config (its finished runs
    would otherwise be mixed into a table they do not belong to); ValueError says what differs."""
    path = plan.out / SETTINGS_FILE
    if not path.exists():
        return
    try:
        before = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(
            f"--out {str(plan.out)!r}: {SETTINGS_FILE} is unreadable ({error}); use another --out"
        ) from None
    now = _settings(plan)
    changed = [key for key in now if before.get(key) != now[key]]
    if changed:
        raise ValueError(
            f"--out {str(plan.out)!r} holds a table run with other settings "
            f"({', '.join(f'{k}: {before.get(k)!r} then, {now[k]!r} now' for k in changed)}); "
            "resume with the same ones or use another --out"
        )


def _read_status(run_dir: Path) -> dict | None:
    try:
        status = json.loads((run_dir / STATUS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return status if isinstance(status, dict) and status.get("status") in ("finished", "failed") else None


def _write_status(run_dir: Path, status: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)  # a run that never started (its input failed) has no folder yet
    atomic_write_bytes(run_dir / STATUS_FILE, json.dumps(status, indent=1).encode())


def _steps_done(run_dir: Path) -> int:
    """The last training step in a run's metrics (0 when none yet)."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, path.stat().st_size - 4096))
            tail = stream.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    for line in reversed(tail):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            return row["step"]
    return 0


def _thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    return env


# Started before each `rw train` (exec'd in its place, same pid): PR_SET_PDEATHSIG(SIGTERM), so the kernel signals
# the run when rw ablate dies, however it dies; execve keeps the setting. Not a preexec_fn, which is unsafe
# with threads (tqdm's monitor). If rw ablate died before the call, getppid() no longer names it: stop at once.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:\n"
    "    sys.exit('rw ablate: prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('rw ablate: rw ablate ended before this run started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dying_with_us(command: list[str]) -> list[str]:
    """`command` run through `_DIE_WITH_PARENT` (Linux; elsewhere as it is). -I: the trampoline imports
    nothing from the current folder or PYTHONPATH."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


def _kill_group(process, sig: int) -> None:
    """Signals the process group a run was started in (its `rw train` is the leader; its own children are in
    it). A stand-in without a pid is left alone."""
    pid = getattr(process, "pid", None)
    if isinstance(pid, int) and pid > 0:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _poll(process):
    """`process.poll()`; a run that has ended has what is left of its group killed first, while its pid is
    still unreaped (so it cannot have been reused by another process's group)."""
    pid = getattr(process, "pid", None)
    if isinstance(pid, int) and pid > 0 and getattr(process, "returncode", 0) is None:
        try:
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            ended = None
        if ended is not None:
            _kill_group(process, signal.SIGKILL)
    return process.poll()


def _stop_runs(running: dict) -> None:
    """SIGTERM to each running `rw train`, SIGKILL to its group if it has not ended after STOP_SECONDS, and to
    whatever is left of the group (its own processes: the rollout process of rollout.max_lag) once it ended."""
    for _, process, _, _ in running.values():
        process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for _, process, _, log in running.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(process, signal.SIGKILL)
            process.wait()
        _kill_group(process, signal.SIGKILL)
        log.close()


def _wait_until_free(run_dir: Path) -> None:
    """Returns once no other process holds `run_dir`'s lock, waiting up to CELL_WAIT_SECONDS (with a line on
    stderr); RunFolderBusy naming it and the holder after that."""
    from rwcore.trainer.run_lock import RunFolderBusy, holder

    pid = holder(run_dir)
    if pid is None:
        return
    shown = pid if pid > 0 else "unknown"
    print(
        f"rw ablate: {run_dir} is being written by another process (pid {shown}); waiting up to "
        f"{CELL_WAIT_SECONDS:g} s for it to stop",
        file=sys.stderr,
        flush=True,
    )
    deadline = time.monotonic() + CELL_WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.2)
        pid = holder(run_dir)
        if pid is None:
            return
    raise RunFolderBusy(run_dir, pid if pid > 0 else None)


def _unfinished(run_dir: Path, total: int) -> str | None:
    """Why a run that exited 0 does not count as finished, or None when it does: metrics.jsonl must hold each
    training step 1..total exactly once (a step twice means two writers) and a held-out evaluation, and
    checkpoints/latest must name the checkpoint of step `total`."""
    from collections import Counter

    from rwcore.trainer.checkpoint import MANIFEST, CheckpointError, latest_checkpoint

    if _final_eval(run_dir) is None:
        return "no final held-out evaluation in metrics.jsonl"
    steps = []
    try:
        lines = (run_dir / "metrics.jsonl").read_bytes().splitlines()
    except OSError as error:
        return f"metrics.jsonl cannot be read ({error.strerror or error})"
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return "metrics.jsonl holds a line that is not JSON"
        if isinstance(row, dict) and row.get("kind") == "train" and isinstance(row.get("step"), int):
            steps.append(row["step"])
    counts = Counter(steps)
    repeated = sorted(step for step, n in counts.items() if n > 1)
    if repeated:
        return f"metrics.jsonl holds step {repeated[0]} {counts[repeated[0]]} times (two writers)"
    if sorted(steps) != list(range(1, total + 1)):
        last = max(steps, default=0)
        if last < total:
            return f"metrics.jsonl ends at step {last} of {total}"
        return f"metrics.jsonl holds steps {min(steps)}..{last}, not each of 1..{total} once"
    try:
        latest = latest_checkpoint(run_dir)
    except CheckpointError as error:
        return str(error)
    if latest is None or latest.name != f"step_{total:06d}" or not (latest / MANIFEST).is_file():
        return f"no checkpoint of step {total}, the last"
    return None


def _command(plan: AblationPlan, job: Job, run_dir: Path) -> list[str]:
    base = [sys.executable, "-m", "rwcore.trainer", "train", "--quiet"]
    if (run_dir / "checkpoints" / "latest").exists() and (run_dir / "config.yaml").exists():
        return base + ["--resume", str(run_dir)]  # a killed run continues from its latest checkpoint
    command = base + ["--out", str(run_dir)]
    from rwcore.trainer.checkpoint import is_run_folder

    if is_run_folder(run_dir):
        command.append("--overwrite")  # a run that failed before its first checkpoint starts over
    if plan.config:
        command += ["--config", plan.config]
    return command + list(job.overrides)


class LocalExecutor:
    """Where runs run by default: each a child process of this one (`plan.jobs` at a time, cores/jobs threads
    each), in a session of its own, getting SIGTERM if this process dies. `launch` is `subprocess.Popen` (tests
    may pass a stand-in). Another executor (trainer/ablate_ray.py) has the same three methods; what `start`
    returns needs `poll()`, `terminate()` and `wait(timeout)` as a Popen has, and a `pid` only if it is a local
    process group to kill."""

    def __init__(self, launch: Callable[..., subprocess.Popen] = subprocess.Popen):
        self.launch = launch

    def threads(self, plan: AblationPlan) -> int:
        return max(1, (os.cpu_count() or 1) // plan.jobs)

    def start(self, command: list[str], log, threads: int):
        return self.launch(
            _dying_with_us(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_thread_env(threads),
            start_new_session=True,  # its own group: stopping it stops its children too; no terminal ^C
        )

    def machine(self, threads: int) -> dict:
        """What ablation.json's `machine` says of where the runs ran."""
        return {"threads_per_run": threads}


def run_ablation(
    plan: AblationPlan,
    progress: bool = True,
    launch: Callable[..., subprocess.Popen] = subprocess.Popen,
    executor: LocalExecutor | None = None,
) -> dict:
    """Runs every unfinished job, at most `plan.jobs` at a time; returns `summarize(plan)`.

    One progress bar counts training steps over all runs. `executor` starts each run (default
    `LocalExecutor(launch)`); whichever starts them, finished, failed and killed runs are told apart here, the
    same way. Ctrl-C stops the running processes; finished runs stay finished. Holds plan.out's lock
    throughout: another process writing plan.out is a RunFolderBusy (a ValueError), and so is a run folder
    another process still writes after CELL_WAIT_SECONDS, before anything starts.
    """
    from rwcore.trainer.run_lock import acquire

    check_resume(plan)
    with acquire(plan.out):
        return _run_locked(plan, progress, executor or LocalExecutor(launch))


def _run_locked(plan: AblationPlan, progress: bool, executor: LocalExecutor) -> dict:
    from tqdm.auto import tqdm

    call_started = time.time()
    jobs = plan.run_jobs()
    total_steps = _total_steps(plan)
    pending = [
        job
        for job in jobs
        if (_read_status(plan.runs_dir / job.name) or {}).get("status") != "finished"
        or _unfinished(plan.runs_dir / job.name, total_steps) is not None  # a status written by an older rw
    ]
    for job in pending:  # a run another process still writes (a killed rw ablate's, dying) is never started twice
        _wait_until_free(plan.runs_dir / job.name)
    plan.runs_dir.mkdir(parents=True, exist_ok=True)
    earlier = 0.0
    if (plan.out / SETTINGS_FILE).exists():
        earlier = float(json.loads((plan.out / SETTINGS_FILE).read_text()).get("wall_seconds") or 0.0)
    atomic_write_bytes(
        plan.out / SETTINGS_FILE, json.dumps({**_settings(plan), "wall_seconds": earlier}, indent=1).encode()
    )
    threads = executor.threads(plan)
    finished = {job.name for job in jobs} - {job.name for job in pending}
    failed: set[str] = set()
    running: dict[str, tuple[Job, subprocess.Popen, float, object]] = {}
    bar = tqdm(
        total=total_steps * len(jobs),
        desc=f"rw ablate {plan.paper}",
        unit="step",
        disable=not progress,
        dynamic_ncols=True,
    )
    bar.update(total_steps * len(finished))
    shown = {job.name: (total_steps if job.name in finished else 0) for job in jobs}
    previous = _stop_on_sigterm()
    try:
        while pending or running:
            for job in list(pending):
                if len(running) >= plan.jobs:
                    break
                if job.after and job.after not in finished:
                    if job.after in failed:  # its input run failed: this one cannot start
                        pending.remove(job)
                        _write_status(plan.runs_dir / job.name, _failure(f"needs {job.after}, which failed"))
                        failed.add(job.name)
                    continue
                pending.remove(job)
                run_dir = plan.runs_dir / job.name
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / STATUS_FILE).unlink(missing_ok=True)
                log = open(run_dir / "ablation.log", "ab")
                command = _command(plan, job, run_dir)
                log.write(f"$ {' '.join(command)}\n".encode())  # which run this was: fresh or --resume
                log.flush()
                process = executor.start(command, log, threads)
                running[job.name] = (job, process, time.time(), log)
                bar.set_postfix_str(f"{len(finished)} done, {len(failed)} failed, {len(running)} running")
            time.sleep(0.5 if running else 0)
            for name, (job, process, started, log) in list(running.items()):
                done = _steps_done(plan.runs_dir / name)
                if done > shown[name]:
                    bar.update(min(done, total_steps) - shown[name])
                    shown[name] = min(done, total_steps)
                code = _poll(process)
                if code is None:
                    continue
                log.close()
                del running[name]
                run_dir = plan.runs_dir / name
                why = _unfinished(run_dir, total_steps) if code == 0 else None
                if code == 0 and why is None:
                    _write_status(run_dir, {"status": "finished", "seconds": round(time.time() - started, 1)})
                    finished.add(name)
                    bar.update(total_steps - shown[name])
                    shown[name] = total_steps
                else:
                    tail = _log_tail(run_dir / "ablation.log")
                    last = tail.splitlines()[-1].strip() if tail.strip() else ""
                    error = (f"exit code {code}: {last}" if last else f"exit code {code}") if code else why
                    _write_status(run_dir, _failure(error, tail))
                    failed.add(name)
                    bar.write(f"run {name} failed ({error}); see {run_dir / 'ablation.log'}")
                bar.set_postfix_str(f"{len(finished)} done, {len(failed)} failed, {len(running)} running")
    except BaseException:  # Ctrl-C, SIGTERM, or an error here: no run is left running unattended
        _stop_runs(running)
        raise
    finally:
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    summary = summarize(plan)
    summary["machine"].update(executor.machine(threads))
    # wall time over every call into this OUT (a resumed table counts each part once)
    summary["wall_seconds"] = round(earlier + time.time() - call_started, 1)
    atomic_write_bytes(
        plan.out / SETTINGS_FILE,
        json.dumps({**_settings(plan), "wall_seconds": summary["wall_seconds"]}, indent=1).encode(),
    )
    write_table(plan, summary)
    return summary


def prepare_prior(plan: AblationPlan, progress: bool = True) -> Path | None:
    """Builds (or finds) the reading prior every run of the table starts from (model.init=pretrained), once,
    before any run starts, so that they do not queue behind one another's build. Returns its cache folder, or
    None when the runs start from random weights or a named model."""
    from rwcore.trainer import envs
    from rwcore.trainer.config import load_config
    from rwcore.trainer.prior import ensure_prior, resolve_init

    config = load_config(plan.config, [*plan.overrides, f"train.method={plan.variants[0]}"])
    env = envs.make(config.env.name, **dict(config.env.options))
    if resolve_init(config, env) != "pretrained":
        return None
    return ensure_prior(config, env, progress=progress).folder


def _stop_on_sigterm():
    """SIGTERM (a scheduler, `kill`) stops the runs like Ctrl-C does, so none is left running unattended
    (a later resume would start it twice). Returns the previous handler (None off the main thread)."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        return None


def _failure(error: str, tail: str = "") -> dict:
    return {"status": "failed", "error": error, "log_tail": tail}


def _log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _total_steps(plan: AblationPlan) -> int:
    if plan.steps is not None:
        return plan.steps
    from rwcore.trainer.config import load_config

    return load_config(plan.config, list(plan.overrides)).train.steps


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


def _final_eval(run_dir: Path) -> tuple[int, float] | None:
    curve = eval_curve(run_dir)
    return (curve[-1][0], curve[-1][1]) if curve else None


def _run_entry(run_dir: Path) -> dict:
    """A run's status and, when finished with held-out evaluations, its per-run metrics (final, best, normalized
    AUC with the ceiling used, the curve)."""
    status = _read_status(run_dir) or {"status": "not run"}
    entry = {"status": status["status"], "run_dir": str(run_dir)}
    if status["status"] == "failed":
        entry["error"] = status.get("error", "")
    curve = eval_curve(run_dir)
    if status["status"] == "finished" and curve:
        ceiling, source = eval_ceiling(run_dir)
        entry.update(
            final=curve[-1][1],
            final_se=curve[-1][2],
            final_step=curve[-1][0],
            best=max(v for _, v, _ in curve),
            start=curve[0][1],
            curve=[list(c) for c in curve],
            auc=normalized_auc(curve, ceiling),
            ceiling=ceiling,
            ceiling_source=source,
        )
    return entry


def _reached(entries: Sequence[dict], key: str) -> dict:
    reached = [e[key] for e in entries if e.get(key) is not None]
    return {"mean": float(np.mean(reached)) if reached else None, "reached": len(reached), "of": len(entries)}


def summarize(plan: AblationPlan) -> dict:
    """Per variant and seed: status, final / best held-out success, normalized AUC, steps to reach the baseline's
    mean final success and its mean success at step REACH_STEP; per variant: mean and sd over finished seeds, and
    with MIN_SEEDS finished seeds the IQM and the comparison with the baseline with bootstrap intervals."""
    runs = {
        variant: {seed: _run_entry(plan.runs_dir / f"{variant}-s{seed}") for seed in plan.seeds}
        for variant in plan.variants
    }
    baseline = BASELINES[plan.paper]
    base_runs = [e for e in runs.get(baseline, {}).values() if "final" in e]
    base_finals = [e["final"] for e in base_runs]
    target = float(np.mean(base_finals)) if base_finals else None
    reach = reach_target([e["curve"] for e in base_runs], REACH_STEP)
    rows = []
    for variant in plan.variants:
        finished = [e for e in runs[variant].values() if "final" in e]
        for entry in finished:
            entry["steps_to_baseline"] = steps_to_reach(entry["curve"], target) if target is not None else None
            entry["steps_to_reach"] = steps_to_reach(entry["curve"], reach["value"]) if reach else None
        compared = base_runs if variant != baseline and baseline in runs else None
        rows.append(
            {
                "variant": variant,
                "paper_row": VARIANTS[variant].paper_row,
                "final": mean_sd([e["final"] for e in finished]),
                "best": mean_sd([e["best"] for e in finished]),
                "steps_to_baseline": _reached(finished, "steps_to_baseline"),
                "failed": sum(e["status"] == "failed" for e in runs[variant].values()),
                "seeds": {str(seed): entry for seed, entry in runs[variant].items()},
                "auc": mean_sd([e["auc"] for e in finished if e.get("auc") is not None]),
                "steps_to_reach": _reached(finished, "steps_to_reach"),
                "ceilings": ceilings_used(finished),
                **seed_statistics(finished, compared, plan.bootstrap_reps),
            }
        )
    return {
        "paper": plan.paper,
        "baseline": baseline,
        "baseline_final_mean": target,
        "seeds": plan.seeds,
        "steps": plan.steps,
        "rows": rows,
        "machine": machine_note(plan.jobs),
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "reach_target": reach,
        "ceilings": ceilings_used([e for variant in runs.values() for e in variant.values()]),
        "bootstrap": bootstrap_note(plan.bootstrap_reps),
        "inapplicable": [
            {"variant": variant, **cell} for variant in plan.variants for cell in plan.inapplicable.get(variant, ())
        ],
        "notes": metric_notes(baseline, REACH_STEP, plan.bootstrap_reps),
    }


def machine_note(jobs: int) -> dict:
    """The machine a table ran on. `cpu_capability` is the vector ISA torch's CPU kernels dispatch to
    (DEFAULT / AVX2 / AVX512): it changes float rounding, and these runs are chaotic in the last bit of a
    float, so two machines differing there give different curves from the same seed."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jobs": jobs,
        "threads_per_run": max(1, (os.cpu_count() or 1) // jobs),
    }


def _cpu_text(machine: dict) -> str:
    """' (AMD EPYC, torch kernels AVX512)'; empty for tables written before these were recorded."""
    parts = [
        part
        for part in (machine.get("cpu"), machine.get("cpu_capability") and f"torch kernels {machine['cpu_capability']}")
        if part
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _reach_text(reach: dict | None, baseline: str) -> str:
    """Which of the baseline's evaluations 'steps to reach' measures against, in words."""
    if not reach:
        return f"{baseline} has no finished seed evaluated at or before step {REACH_STEP}: no target"
    if reach["exact"]:
        read = f"at step {reach['at_step']}"
    else:
        steps = sorted(set(reach["steps"]))
        why = "was not evaluated" if reach["at_step"] not in steps else "not every seed evaluated"
        read = (
            f"at step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))} (the last evaluation at or "
            f"before step {reach['at_step']}, which {why})"
        )
    return f"{baseline}'s mean held-out success {read}, {_fmt(reach['value'])} over {reach['seeds']} seed(s)"


def _ceiling_text(ceilings: Sequence[dict]) -> str:
    if not ceilings:
        return "no finished run"
    return "; ".join(
        f"{c['value']:g} for {c['runs']} run(s) ("
        + ("logged as eval/ceiling" if c["source"] == "eval/ceiling" else f"not logged: the {c['source']}")
        + ")"
        for c in ceilings
    )


def _reach_cell(reach: dict) -> str:
    return (
        f"{reach['mean']:.0f} ({reach['reached']}/{reach['of']})"
        if reach["mean"] is not None
        else f"never (0/{reach['of']})"
    )


def render_markdown(summary: dict) -> str:
    """ablation.md: the table (today's columns plus normalized AUC and steps to reach), the statistics over seeds,
    a sentence per metric, the overrides a variant could not apply and the failed runs. A summary written before
    the statistics existed renders its own columns only."""
    m = summary["machine"]
    baseline = summary["baseline"]
    has_stats = "notes" in summary
    lines = [
        f"# Ablation: {summary['paper']}",
        "",
        f"Held-out success (one sampled episode per held-out task, no skills) at the final step and the best "
        f"evaluated step, mean ± sd over seeds {', '.join(map(str, summary['seeds']))}; each seed's final "
        f"value in the last column. 'Steps to baseline' is the first evaluated step at which a seed reaches "
        f"{baseline}'s mean final success ({_fmt(summary['baseline_final_mean'])}), averaged over "
        f"the seeds that reach it, with how many do (Arise fig. 3(b)). Wall time: "
        f"{_fmt(summary.get('wall_seconds'), 0)} s (every call into this folder together).",
        "",
        f"Machine: {m['processor']}{_cpu_text(m)}, {m['cpu_count']} cores, {m['platform']}, Python "
        f"{m['python']}, torch {m['torch']}; {m['jobs']} runs at a time, {m['threads_per_run']} thread(s) each.",
        "",
    ]
    if has_stats:
        lines += [
            f"'Steps to reach' measures against {_reach_text(summary.get('reach_target'), baseline)}. "
            f"Ceiling of the normalized AUC: {_ceiling_text(summary.get('ceilings', []))}.",
            "",
            "| variant | paper row | final | best | normalized AUC | steps to baseline | steps to reach "
            "| per-seed final |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            "| variant | paper row | final | best | steps to baseline | per-seed final |",
            "|---|---|---|---|---|---|",
        ]
    failures = []

    def stat(s):
        return f"{_fmt(s['mean'])} ± {_fmt(s['sd'])}" if s["n"] else "—"

    for row in summary["rows"]:
        per_seed = []
        for seed, entry in row["seeds"].items():
            if "final" in entry:
                per_seed.append(f"s{seed}: {entry['final']:.3f}")
            else:
                per_seed.append(f"s{seed}: {entry['status'].upper()}")
                if entry["status"] == "failed":
                    failures.append(f"- {row['variant']} seed {seed}: {entry.get('error', '')}")
        cells = [row["variant"], row["paper_row"], stat(row["final"]), stat(row["best"])]
        if has_stats:
            cells += [stat(row["auc"]), _reach_cell(row["steps_to_baseline"]), _reach_cell(row["steps_to_reach"])]
        else:
            cells.append(_reach_cell(row["steps_to_baseline"]))
        lines.append(f"| {' | '.join(cells)} | {', '.join(per_seed)} |")
    if has_stats:
        boot = summary["bootstrap"]
        lines += [
            "",
            f"## Over seeds: interquartile mean and comparison with {baseline}",
            "",
            f"Point estimate [{boot['confidence']:.0%} interval] over finished seeds; '{NEEDS_SEEDS}' where a variant "
            f"(or, for the comparison, {baseline}) has fewer than {boot['min_seeds']} finished seeds: the point "
            f"estimate alone. Intervals: {boot['method']}; {boot['reps']} resamples, seed {boot['seed']}.",
            "",
            "| variant | seeds | IQM final | IQM normalized AUC | P(improvement) final | IQM difference final | "
            "P(improvement) AUC | IQM difference AUC |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in summary["rows"]:
            versus = row.get("vs_baseline")
            if versus:
                compare = [
                    format_estimate(versus["final"]["probability_of_improvement"]),
                    format_estimate(versus["final"]["iqm_difference"], signed=True),
                    format_estimate(versus["auc"]["probability_of_improvement"]),
                    format_estimate(versus["auc"]["iqm_difference"], signed=True),
                ]
            else:
                compare = ["(baseline)" if row["variant"] == baseline else "—"] * 4
            cells = [
                row["variant"],
                str(row["final"]["n"]),
                format_estimate(row["iqm"]["final"]),
                format_estimate(row["iqm"]["auc"]),
                *compare,
            ]
            lines.append(f"| {' | '.join(cells)} |")
        lines += ["", "## What each number is", ""]
        lines += [f"- {sentence}" for sentence in summary["notes"].values()]
        if summary.get("inapplicable"):
            lines += ["", "## Overrides a variant cannot apply", ""]
            lines += [f"- {cell['note']}." for cell in summary["inapplicable"]]
    if failures:
        lines += ["", "Failed runs (not averaged in):", *failures]
    return "\n".join(lines) + "\n"


def plot_runs(summary: dict, path: Path) -> Path:
    """One point per seed (final held-out success), the mean per variant, and the IQM with its interval where a
    variant has enough seeds for one."""
    from rwcore.trainer.report import _figure, _save

    rows = summary["rows"]
    fig = _figure(max(6.0, 1.0 * len(rows) + 2), 4.2)
    ax = fig.add_subplot()
    for x, row in enumerate(rows):
        finals = [e["final"] for e in row["seeds"].values() if "final" in e]
        if finals:
            offsets = np.linspace(-0.15, 0.15, len(finals)) if len(finals) > 1 else [0.0]
            ax.scatter([x + o for o in offsets], finals, color="#1f5f8b", s=22, zorder=3)
            ax.hlines(np.mean(finals), x - 0.3, x + 0.3, color="#d1495b", linewidth=2)
        estimate = (row.get("iqm") or {}).get("final") or {}
        if estimate.get("low") is not None:
            point = estimate["point"]
            ax.errorbar(
                x + 0.3,
                point,
                yerr=[[point - estimate["low"]], [estimate["high"] - point]],
                fmt="D",
                markersize=4,
                color="black",
                capsize=3,
                zorder=4,
            )
        failed = sum(e["status"] == "failed" for e in row["seeds"].values())
        if failed:
            ax.annotate(f"{failed} failed", (x, 0.02), ha="center", fontsize=8, color="#d1495b")
    ax.set_xticks(range(len(rows)), [row["variant"] for row in rows], rotation=30, ha="right")
    ax.set_ylabel("Final held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(
        f"{summary['paper']} ablation: one point per seed, bar = mean, "
        f"diamond = IQM with 95% interval (>= {MIN_SEEDS} seeds)",
        fontsize=9,
    )
    return _save(fig, path)


def write_table(plan: AblationPlan, summary: dict) -> list[Path]:
    plan.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(plan.out / "ablation.json", json.dumps(summary, indent=1).encode())
    atomic_write_bytes(plan.out / "ablation.md", render_markdown(summary).encode())
    return [plan.out / "ablation.md", plan.out / "ablation.json", plot_runs(summary, plan.out / "ablation.png")]
