"""Running a table: every unfinished run, at most `plan.jobs` at a time, through an executor (`LocalExecutor` by
default; ray_executor.py runs each as a Ray task); everything but where a run runs is the same for both.

One writer per folder: `rw ablate` holds OUT's lock (trainer/run_lock.py) while it runs, and each `rw train`
holds its run's. `rw ablate` again with the same OUT skips finished runs, resumes killed ones from their latest
checkpoint and re-runs failed ones; it must use the same steps, overrides and config (ablation_settings.json).
A rerun waits a little (`CELL_WAIT_SECONDS`) for a run whose folder another process still writes, then refuses,
naming it and that process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rwcore._io import atomic_write_bytes
from rwcore.trainer.ablate.local_executor import LocalExecutor, _poll, _stop_runs
from rwcore.trainer.ablate.plan import DEPENDS, AblationPlan, Job
from rwcore.trainer.ablate.status import (
    STATUS_FILE,
    _failure,
    _read_status,
    _steps_done,
    _unfinished,
    _write_status,
)
from rwcore.trainer.ablate.summary import summarize
from rwcore.trainer.ablate.table import write_table

__all__ = ["SETTINGS_FILE", "CELL_WAIT_SECONDS", "check_resume", "run_ablation", "prepare_prior"]

CELL_WAIT_SECONDS = 30.0
"""How long a rerun waits for a run whose folder another process still writes before refusing (the `rw train`
of a killed `rw ablate` gets SIGTERM as it dies and is gone within seconds)."""
SETTINGS_FILE = "ablation_settings.json"


def _resolved(plan: AblationPlan) -> dict[str, dict[str, Any]]:
    """variant -> every config key its runs get ("section.key" -> value), resolved from the --config file's
    content, the overrides and the code's defaults; the seed (and pool.frozen_from, a path inside OUT) left out.
    This, not a file's path, is what makes two calls' runs one table."""
    from rwcore.trainer.config import config_to_dict, load_config

    resolved = {}
    for variant in plan.variants:
        own = list(plan.row_overrides(variant))
        if plan.steps is not None:
            own.append(f"train.steps={plan.steps}")
        if variant in DEPENDS and not plan.points:  # each seed's own run folder; left out of the comparison below
            own.append(f"pool.frozen_from={plan.runs_dir / DEPENDS[variant]}")
        cfg = load_config(plan.config, [*plan.variant_overrides(variant), *own])
        flat = {
            f"{section}.{key}": value
            for section, values in config_to_dict(cfg).items()
            for key, value in values.items()
        }
        for per_run in ("train.seed", "pool.frozen_from"):
            flat.pop(per_run, None)
        resolved[variant] = json.loads(json.dumps(flat))  # as the file holds it (tuples as lists)
    return resolved


def _settings(plan: AblationPlan) -> dict:
    """What every run of a table shares; variants and seeds may grow between calls, these may not. `config`
    (the file's path) and `overrides` are for the reader; `resolved` is what a resume is checked against."""
    return {
        "steps": plan.steps,
        "overrides": list(plan.overrides),
        "config": str(Path(plan.config).resolve()) if plan.config else None,
        "resolved": _resolved(plan),
    }


def check_resume(plan: AblationPlan) -> None:
    """A second call into the same OUT must resolve every run's config to the same values (its finished runs
    would otherwise be mixed into a table they do not belong to): an edited --config file, another override
    or other code defaults are refused, naming the keys. ValueError says what differs."""
    path = plan.out / SETTINGS_FILE
    if not path.exists():
        return
    try:
        before = json.loads(path.read_text())
        if not isinstance(before, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--out {str(plan.out)!r}: {SETTINGS_FILE} is unreadable ({error}); use another --out"
        ) from None
    now = _settings(plan)
    if not isinstance(before.get("resolved"), dict):  # written before the resolved values were kept
        changed = [key for key in ("steps", "overrides", "config") if before.get(key) != now[key]]
        if changed:
            raise ValueError(
                f"--out {str(plan.out)!r} holds a table run with other settings "
                f"({', '.join(f'{k}: {before.get(k)!r} then, {now[k]!r} now' for k in changed)}); "
                "resume with the same ones or use another --out"
            )
        return
    differ: dict[str, tuple[Any, Any]] = {}
    for variant, values in now["resolved"].items():
        then = before["resolved"].get(variant)
        if not isinstance(then, dict):
            continue  # a variant this table did not run yet
        for key in sorted(set(values) | set(then)):
            if then.get(key, "(not a key then)") != values.get(key, "(not a key now)") and key not in differ:
                differ[key] = (then.get(key, "(not a key then)"), values.get(key, "(not a key now)"))
    if differ:
        shown = "; ".join(f"{key}: {old!r} then, {new!r} now" for key, (old, new) in list(differ.items())[:8])
        more = f"; and {len(differ) - 8} more" if len(differ) > 8 else ""
        raise ValueError(
            f"--out {str(plan.out)!r} holds runs resolved from other settings ({shown}{more}): the --config "
            "file, an override or a default changed since; resume with the same ones or use another --out"
        )


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
            for name, (_job, process, started, log) in list(running.items()):
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
    None when the runs start from random weights or a named model. A grid whose points change the prior's key
    (model.*, prior.*, env.*) gets each point's prior built here too; the first point's folder is returned."""
    from rwcore.trainer import envs
    from rwcore.trainer.config import load_config
    from rwcore.trainer.prior import ensure_prior, resolve_init

    folders: list[Path] = []
    for row in plan.variants if plan.points else plan.variants[:1]:
        config = load_config(plan.config, [*plan.overrides, *plan.row_overrides(row)])
        env = envs.make(config.env.name, **dict(config.env.options))
        if resolve_init(config, env) != "pretrained":
            continue
        folders.append(ensure_prior(config, env, progress=progress).folder)
    return folders[0] if folders else None


def _stop_on_sigterm():
    """SIGTERM (a scheduler, `kill`) stops the runs like Ctrl-C does, so none is left running unattended
    (a later resume would start it twice). Returns the previous handler (None off the main thread)."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        return None


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
