"""Experiment trackers for `rw train` (`train.loggers`): TensorBoard, Weights & Biases, MLflow and trackio.

Each tracker is one adapter over the rows the trainer appends to metrics.jsonl, behind one small interface
(`Tracker`: `start(config, run_folder)`, `log(metrics, step)`, `log_transcripts(name, transcripts, step)`,
`close()`); `TRACKERS` maps the names `train.loggers` accepts to them. `Trackers` is what the trainer holds: it
checks the packages before anything is written (`check_installed`), starts the trackers once the run folder and its
config.yaml exist, hands each row to every tracker, and drops a tracker that raises, naming it once on stderr, while
training and metrics.jsonl go on. The packages are imported only when a tracker starts (the `trackers` extra
installs them).

What a tracker receives from a row (`metric_values`): the row's `step` as the step, and every other value that is
a finite number (bool, text, NaN and infinities are left out) under the row's key prefixed with its kind
(`train/loss`; `eval/success_rate` keeps its name, it already starts with `eval/`), less the keys that do not apply
to the run's settings (`omit`: rwcore.trainer.tracker_rows). The resolved config (the same as config.yaml) goes
with each run: nested for wandb and trackio, flattened to `section.key` parameters for MLflow and TensorBoard
(`config_params`), and as the file config.yaml for MLflow. Each held-out evaluation sends a few transcripts
(rwcore.trainer.transcripts) in each tracker's own form.

Defaults keep everything inside the run folder RUN and off the network: RUN/tensorboard, RUN/wandb (offline unless
WANDB_MODE is set), RUN/mlflow/mlflow.db (unless MLFLOW_TRACKING_URI is set), RUN/trackio (unless TRACKIO_DIR is
set). docs/trackers.md has the details, the resume behaviour and the peers' equivalent keys.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rwcore.trainer.run_paths import run_path
from rwcore.trainer.tracker_guard import (
    BOUNDS,
    ThreadFaults,
    TrackerTimeout,
    Worker,
    check_reachable,
    check_writable,
    one_line,
)
from rwcore.trainer.transcripts import TABLE_COLUMNS, transcripts_document, transcripts_markdown

__all__ = [
    "EXTRA",
    "LOGGERS",
    "TRACKERS",
    "MlflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "Trackers",
    "TrackioTracker",
    "WandbTracker",
    "check_installed",
    "config_params",
    "metric_values",
    "mlflow_name",
]

EXTRA = "trackers"
"""The pip extra that installs every tracker's package: pip install 'rwcore[trackers]'."""

_INSTALL = f"pip install 'rwcore[{EXTRA}]'"

Omit = Callable[[str, str], bool]
"""(row kind, key) -> whether the trackers leave the key out (rwcore.trainer.tracker_rows.not_applicable)."""


# --------------------------------------------------------------------------------------------- rows and config


def metric_values(row: Mapping[str, Any], omit: Omit | None = None) -> tuple[int, dict[str, float]]:
    """(step, {name: value}) of one metrics row: the finite numbers of the row (not bool) as floats, each named
    `<kind>/<key>` unless the key already starts with `<kind>/` (a row without a kind keeps its keys); a key
    for which `omit(kind, key)` is true is left out."""
    kind = row.get("kind")
    prefix = f"{kind}/" if isinstance(kind, str) and kind else ""
    values = {}
    for key, value in row.items():
        if key in ("step", "kind") or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        if omit is not None and omit(str(kind), str(key)):
            continue
        value = float(value)
        if math.isfinite(value):
            name = str(key)
            values[name if name.startswith(prefix) else prefix + name] = value
    return int(row.get("step", 0)), values


def config_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str | int | float]:
    """The config flattened to `section.key` (deeper mappings `section.key.inner`): text and numbers as they are,
    anything else (booleans, null, lists, an empty mapping) as its JSON text."""
    params: dict[str, str | int | float] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            params.update(config_params(value, name + "."))
        elif isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            params[name] = value
        else:
            params[name] = json.dumps(value)
    return params


def _run_name(run_folder: Path, resume_step: int | None) -> str:
    """The tracker run's name: the run folder's, and for a resumed segment the step it continues from."""
    name = run_folder.resolve().name or "run"
    return name if resume_step is None else f"{name}-resumed-at-step-{resume_step}"


@contextlib.contextmanager
def _environment(**values: str | None):
    """Sets (a str) or leaves alone (None) environment variables for the block, then restores them."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is not None:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _quiet_loggers(*names: str):
    """Python loggers (MLflow's, Alembic's) at WARNING for the block: their INFO lines are set-up chatter."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# --------------------------------------------------------------------------------------------- the adapters


class Tracker:
    """One experiment tracker. `start` opens its run (with the resolved config as the run's parameters), `log`
    records one metrics row (`metric_values`), `log_transcripts` one evaluation's sampled transcripts
    (rwcore.trainer.transcripts.Transcript, `name`: the row kind, `eval`), `close` finishes the run and stops what
    the package started (threads, service processes). Any of them may raise: `Trackers` then drops the tracker."""

    name = ""
    modules: tuple[str, ...] = ()
    """The import names `check_installed` looks for."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.location = ""  # where the data go, for the one line the run prints

    @classmethod
    def required_modules(cls) -> tuple[str, ...]:
        return cls.modules

    def start(self, config: Mapping[str, Any], run_folder: Path, resume_step: int | None = None) -> None:
        raise NotImplementedError

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def log_transcripts(self, name: str, transcripts: Sequence, step: int) -> None:
        raise NotImplementedError

    def close(self, complete: bool = True) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    """Scalars in RUN/tensorboard as classic float32 `simple_value` summaries, what PyTorch's SummaryWriter writes
    by default: with float32 tensors, the one form TensorBoard's default (fast, Rust) loader shows; it drops
    float64 tensor summaries unseen. So TensorBoard shows the values rounded to float32 (about 7 significant
    digits) and metrics.jsonl keeps them exact. The config goes as the session's hyperparameters, each
    evaluation's transcripts as text (markdown, one code block each: `transcripts_markdown`) under
    `<name>/transcripts`. Every start writes a new event file beginning with a session start at its first step
    (`purge_step`): TensorBoard's reader drops what an earlier file holds from that step on, so a resumed run
    replaces the rows the killed one wrote after its checkpoint."""

    name = "tensorboard"
    modules = ("tensorboard",)

    def start(self, config, run_folder, resume_step=None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        folder = run_path(Path(run_folder) / "tensorboard", "folder")
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=0 if resume_step is None else resume_step + 1)
        if resume_step is None:  # a resumed run has the same config, already recorded at step 0
            for summary in hparams(config_params(config), {}):
                self.writer.file_writer.add_summary(summary)
        self.writer.flush()
        self.location = f"{folder} (view: tensorboard --logdir {folder})"

    def log(self, metrics, step):
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)  # float32 simple_value: see the class docstring
        self.writer.flush()

    def log_transcripts(self, name, transcripts, step):
        # TensorBoard's own text summary: PyTorch's add_text would name the tag `<tag>/text_summary`
        from tensorboard.plugins.text.summary_v2 import text_pb

        self.writer.file_writer.add_summary(text_pb(f"{name}/transcripts", transcripts_markdown(transcripts)), step)
        self.writer.flush()

    def close(self, complete=True):
        writer, self.writer = getattr(self, "writer", None), None
        if writer is not None:
            writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run under RUN/wandb, offline unless WANDB_MODE is set in the environment (then wandb
    does what it says). Offline, nothing is sent and no key is needed or written; wandb-core's error reports are
    off too (WANDB_ERROR_REPORTING=false unless set). The run is named after the run folder and grouped by it;
    its history steps are the rows' steps. A resumed `rw train` opens a new offline run in the same group (an
    offline run cannot be resumed). `close` finishes the run and stops wandb's service process."""

    name = "wandb"
    modules = ("wandb",)

    def start(self, config, run_folder, resume_step=None):
        mode = None if os.environ.get("WANDB_MODE") else "offline"
        if mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # read when wandb starts its service
        import wandb

        folder = Path(run_folder)
        run_path(folder / "wandb", "folder")  # wandb.init(dir=RUN) writes into RUN/wandb
        name = _run_name(folder, resume_step)
        self.run = wandb.init(
            project=self.project,
            name=name,
            group=_run_name(folder, None),
            dir=str(folder),
            mode=mode,
            config=dict(config),
            settings=wandb.Settings(console="off", silent=True),
        )
        files = Path(self.run.dir).parent
        hint = f" (upload: wandb sync {files})" if self.run.offline else ""
        self.location = f"{files}{hint}"

    def log(self, metrics, step):
        self.run.log(dict(metrics), step=step)

    def log_transcripts(self, name, transcripts, step):
        import wandb

        table = wandb.Table(columns=list(TABLE_COLUMNS), data=[t.table_row() for t in transcripts])
        self.run.log({f"{name}/transcripts": table}, step=step)

    def close(self, complete=True):
        run, self.run = getattr(self, "run", None), None
        if run is None:
            return
        import wandb

        try:
            run.finish(exit_code=0 if complete else 1)
        finally:
            if wandb.run is None:  # no other run of this process needs wandb's service process
                wandb.teardown()


_MLFLOW_BAD = re.compile(r"[^\w\-./ ]")


def mlflow_name(name: str) -> str:
    """A metric or parameter name MLflow accepts: characters other than letters, digits and `_ - . /` or space
    become `_` (`exploration/pass@8` -> `exploration/pass_8`)."""
    return _MLFLOW_BAD.sub("_", name)


class MlflowTracker(Tracker):
    """An MLflow run (experiment `train.tracker_project`, run named after the run folder) through MLflow's client
    (no global state, no background thread): by default in a sqlite store at RUN/mlflow/mlflow.db with artifacts
    under RUN/mlflow/artifacts; MLFLOW_TRACKING_URI, when set, names the store instead. The config is logged as
    text parameters (`config_params`, cut at MLflow's length limit) and as the artifact config.yaml (the run folder's
    file); each evaluation's transcripts as the JSON artifact `transcripts/<name>-step-<step>.json`
    (`transcripts_document`). MLflow's usage telemetry is off unless MLFLOW_DISABLE_TELEMETRY is set. A resumed
    `rw train` opens a new run, tagged `rw.resumed_at_step`."""

    name = "mlflow"
    modules = ("mlflow",)
    _PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
    _METRICS_PER_BATCH = 1000
    _PARAM_LENGTH = 6000

    @classmethod
    def required_modules(cls):
        # the default store is sqlite, which mlflow-skinny's client reads and writes through SQLAlchemy and Alembic
        return cls.modules if os.environ.get("MLFLOW_TRACKING_URI") else (*cls.modules, "sqlalchemy", "alembic")

    def start(self, config, run_folder, resume_step=None):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read at import and at every client call
        folder = Path(run_folder).resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        # MLflow's client retries a silent server for minutes by default (7 retries, 120 s each): fewer, shorter
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        if uri:
            check_reachable(uri, "the MLflow server (MLFLOW_TRACKING_URI)")
            if uri.startswith("sqlite:///"):
                check_writable(Path(uri[len("sqlite:///") :]).parent, "the folder of MLFLOW_TRACKING_URI's database")
        else:
            store = run_path(folder / "mlflow", "folder", create=True)
            run_path(store / "mlflow.db", "file")
            run_path(store / "artifacts", "folder")
            check_writable(store, "MLflow's store")
            uri = f"sqlite:///{store / 'mlflow.db'}"
            artifacts = (store / "artifacts").as_uri()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        with _quiet_loggers("mlflow", "alembic"):  # after the import, which sets MLflow's logger to INFO
            self.client = MlflowClient(tracking_uri=uri)
            experiment = self.client.get_experiment_by_name(self.project)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(self.project, artifact_location=artifacts)
            )
        tags = {"rw.run_folder": str(folder)}
        if resume_step is not None:
            tags["rw.resumed_at_step"] = str(resume_step)
        self.run_id = self.client.create_run(
            experiment_id, run_name=_run_name(folder, resume_step), tags=tags
        ).info.run_id
        params = [
            Param(mlflow_name(key), (value if isinstance(value, str) else json.dumps(value))[: self._PARAM_LENGTH])
            for key, value in config_params(config).items()
        ]
        for first in range(0, len(params), self._PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[first : first + self._PARAMS_PER_BATCH])
        self.client.log_artifact(self.run_id, str(run_path(folder / "config.yaml", "file")))
        self.location = f"{uri}, experiment {self.project!r}"
        if artifacts is not None:
            self.location += f" (view: mlflow ui --backend-store-uri {uri})"

    def log(self, metrics, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_name(name), value, now, step) for name, value in metrics.items()]
        for first in range(0, len(batch), self._METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[first : first + self._METRICS_PER_BATCH])

    def log_transcripts(self, name, transcripts, step):
        document = transcripts_document(name, step, transcripts)
        self.client.log_dict(self.run_id, document, f"transcripts/{name}-step-{step:06d}.json")

    def close(self, complete=True):
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            client.set_terminated(self.run_id, "FINISHED" if complete else "KILLED")


class TrackioTracker(Tracker):
    """A trackio run in a local store at RUN/trackio (trackio's TRACKIO_DIR, unless set in the environment;
    TRACKIO_SPACE_ID or TRACKIO_SERVER_URL, when set, send it where they say), project `train.tracker_project`,
    named after the run folder and grouped by it. trackio reads TRACKIO_DIR once, when it is first imported: a
    second run folder in the same process cannot get its own store, and the tracker says so and is dropped.
    trackio's CPU/GPU sampling threads stay off; `close` finishes the run, which ends trackio's writer thread.
    Each evaluation's transcripts go as a trackio Table (its viewer shows the cells as text). A resumed
    `rw train` opens a new run in the same group."""

    name = "trackio"
    modules = ("trackio",)

    def start(self, config, run_folder, resume_step=None):
        folder = Path(run_folder).resolve()
        wanted = None if os.environ.get("TRACKIO_DIR") else run_path(folder / "trackio", "folder")
        with _environment(TRACKIO_DIR=None if wanted is None else str(wanted)):
            import trackio
            import trackio.utils
        store = Path(trackio.utils.TRACKIO_DIR)
        if wanted is not None and store.resolve() != wanted:
            raise RuntimeError(
                f"trackio's store was fixed at {store} when trackio was first imported in this process; set "
                "TRACKIO_DIR before that, or train each run folder in its own process"
            )
        if os.environ.get("TRACKIO_SERVER_URL"):
            check_reachable(os.environ["TRACKIO_SERVER_URL"], "the trackio server (TRACKIO_SERVER_URL)")
        elif not os.environ.get("TRACKIO_SPACE_ID"):  # trackio's writer thread would drop every row unseen
            check_writable(store, "trackio's store (TRACKIO_DIR)")
        with contextlib.redirect_stdout(io.StringIO()):  # trackio prints its dashboard instructions
            self.run = trackio.init(
                project=self.project,
                name=_run_name(folder, resume_step),
                group=_run_name(folder, None),
                config=dict(config),
                resume="never",
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )
        self.location = f"{store} (view: TRACKIO_DIR={store} trackio show --project {self.project})"

    def log(self, metrics, step):
        self.run.log(dict(metrics), step=step)

    def log_transcripts(self, name, transcripts, step):
        import trackio

        table = trackio.Table(columns=list(TABLE_COLUMNS), data=[t.table_row() for t in transcripts])
        self.run.log({f"{name}/transcripts": table}, step=step)

    def close(self, complete=True):
        run, self.run = getattr(self, "run", None), None
        if run is None:
            return
        import trackio

        with contextlib.redirect_stdout(io.StringIO()):
            if trackio.context_vars.current_run.get() is run:
                trackio.finish()  # also forgets the run, which trackio's exit handler would finish again
            else:
                run.finish()


TRACKERS: dict[str, type[Tracker]] = {
    tracker.name: tracker for tracker in (TensorBoardTracker, WandbTracker, MlflowTracker, TrackioTracker)
}
"""`train.loggers` name -> adapter class."""

LOGGERS = ("console", *TRACKERS)
"""What `train.loggers` accepts: `console` (the progress `rw train` prints in any case) and the trackers."""


def check_installed(names: Sequence[str]) -> None:
    """Raises ValueError naming `train.loggers`, the trackers whose packages are missing and the extra that installs
    them; an unknown name is refused with the choices. Nothing is imported."""
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        raise ValueError(
            f"config key 'train.loggers': {', '.join(map(repr, unknown))} is not a logger; "
            f"choices: {', '.join(LOGGERS)}"
        )
    missing: dict[str, list[str]] = {}
    for name in names:
        if name in TRACKERS:
            for module in TRACKERS[name].required_modules():
                if not _importable(module):
                    missing.setdefault(name, []).append(module)
    if missing:
        trackers = ", ".join(missing)
        modules = ", ".join(module for found in missing.values() for module in found)
        raise ValueError(
            f"config key 'train.loggers': {trackers} needs Python packages that are not installed ({modules}); "
            f"install the {EXTRA} extra: {_INSTALL}"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec, i.e. imported somehow
        return module in sys.modules and sys.modules[module] is not None


# --------------------------------------------------------------------------------------------- the group


class Trackers:
    """The trackers of a run. Built before anything is written (`check_installed` refuses a missing package);
    `start` once RUN and config.yaml exist (main process only); `log(row)` with every metrics row (less the keys
    `omit` names); `log_transcripts` with every evaluation's transcripts; `close` at the end. Each tracker's calls
    run on a thread of its own and are bounded (`BOUNDS`): a tracker that raises or does not answer in time is named
    once on stderr and dropped; the others, training and metrics.jsonl go on."""

    def __init__(self, names: Sequence[str], project: str, omit: Omit | None = None) -> None:
        check_installed(names)
        self.omit = omit  # (kind, key) -> leave the key out (rwcore.trainer.tracker_rows.not_applicable)
        self.active: list[Tracker] = [TRACKERS[name](project) for name in dict.fromkeys(names) if name in TRACKERS]
        self._workers: dict[str, Worker] = {}
        # what the trackers' own threads raise (one line, the tracker dropped) or warn (one line, the tracker kept)
        self._faults = ThreadFaults({tracker.name: tracker.modules[0] for tracker in self.active})

    def start(self, config: Mapping[str, Any], run_folder: str | os.PathLike, resume_step: int | None = None) -> None:
        if self.active:
            self._faults.install()
        for tracker in list(self.active):
            if self._call(tracker, "start", tracker.start, config, Path(run_folder), resume_step):
                print(f"rw: tracker {tracker.name}: {tracker.location}", flush=True)

    def log(self, row: Mapping[str, Any]) -> None:
        if not self.active:
            return
        step, metrics = metric_values(row, self.omit)
        if metrics:
            self._each(lambda tracker: (tracker.log, metrics, step))

    def log_transcripts(self, name: str, transcripts: Sequence, step: int) -> None:
        """One evaluation's sampled transcripts (rwcore.trainer.transcripts.Transcript) to every tracker, each
        bounded as a row is; `name`: the evaluation's row kind (`eval`)."""
        if self.active and transcripts:
            self._each(lambda tracker: (tracker.log_transcripts, name, list(transcripts), step))

    def _each(self, call) -> None:
        """`call(tracker)` -> (method, *args), run for every active tracker as a bounded `log` call."""
        for tracker in list(self.active):
            if tracker.name in self._faults.failed:  # its thread failed (already said): closed, not fed
                self._drop(tracker, hung=False)
            else:
                method, *args = call(tracker)
                self._call(tracker, "log", method, *args)

    def close(self, complete: bool = True) -> None:
        """Finishes every tracker (`complete`: the run reached train.steps; MLflow and wandb record it)."""
        trackers, self.active = self.active, []
        for tracker in trackers:
            try:
                self._run(tracker, "close", tracker.close, complete)
            except Exception as error:  # the run is over: name it, close the others
                print(f"rw: tracker {tracker.name} did not close cleanly ({one_line(error)})", file=sys.stderr)
            finally:
                self._stop(tracker)
        self._faults.remove()

    def _run(self, tracker: Tracker, what: str, method, *args) -> Any:
        worker = self._workers.get(tracker.name)
        if worker is None:
            worker = self._workers[tracker.name] = Worker(tracker.name)
        bound = BOUNDS[what]

        def waiting() -> None:
            print(
                f"rw: waiting for tracker {tracker.name} ({what}); it is dropped if it does not answer within "
                f"{bound:.0f} s",
                file=sys.stderr,
                flush=True,
            )

        return worker.call(method, args, bound, waiting)

    def _stop(self, tracker: Tracker, wait: float = 5.0) -> None:
        worker = self._workers.pop(tracker.name, None)
        if worker is not None:
            worker.stop(wait)

    def _call(self, tracker: Tracker, what: str, method, *args) -> bool:
        try:
            self._run(tracker, what, method, *args)
            return True
        except Exception as error:
            if tracker.name not in self._faults.failed:  # one line per tracker, whichever thread saw it first
                self._faults.failed[tracker.name] = what
                print(
                    f"rw: tracker {tracker.name} failed at {what} ({one_line(error)}); dropped it: training and "
                    "metrics.jsonl go on",
                    file=sys.stderr,
                    flush=True,
                )
            self._drop(tracker, hung=isinstance(error, TrackerTimeout))
            return False

    def _drop(self, tracker: Tracker, hung: bool) -> None:
        """Takes a failed tracker out: closed as failed, unless its call hangs (then left to its daemon thread)."""
        if tracker in self.active:
            self.active.remove(tracker)
        if not hung:
            with contextlib.suppress(Exception):
                self._run(tracker, "close", tracker.close, False)
        self._stop(tracker, wait=0.0 if hung else 5.0)
