"""`train.loggers`: the experiment trackers of `rw train` (rwcore/trainer/trackers.py, docs/trackers.md).

Every value a tracker stored is read back with that package's own reader and compared with metrics.jsonl:
TensorBoard's event accumulator, MLflow's client, the records of wandb's offline run file (decoded with wandb's
own protobuf messages) and trackio's SQLite storage. The name each tracker shows is the row's key, prefixed with
the row's kind unless it already starts with it (`train/loss`, `eval/success_rate`); MLflow, which refuses some
characters in names, gets `_` in their place. Only finite numbers reach a tracker.

Nothing here touches the network: the `rw train` run happens in a child process whose sockets refuse any address
but loopback, and which reports afterwards what tried (wandb's service is a separate Go process, outside that
guard: offline mode is what keeps it off the network). The child's environment has no PYTEST_CURRENT_TEST or CI,
which MLflow takes as a reason to skip its telemetry: the guard would catch a telemetry report if `rw` let one go.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml
from _util import ROOT, SMALL_RUN, metrics_rows, overrides_with

from rwcore.trainer import cli
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

SMALL = overrides_with(
    SMALL_RUN,
    "train.start_pass_k=2",  # an exploration row: its `pass@2` names hold a character MLflow refuses
)

# The child process that runs `rw train`: sockets reach loopback and Unix sockets only, and a name lookup of
# anything but the local host fails; what tried is printed at the end, with the child processes and the threads
# still alive once the command returned.
GUARDED_RW = r"""
import json, os, socket, sys, threading
attempts = []
LOCAL = {"127.0.0.1", "::1", "localhost", "0.0.0.0", ""}
def _refuse(what):
    attempts.append(what)
    raise OSError("the network is closed in this test")
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and str(address[0]) not in LOCAL:
        _refuse(f"connect {address!r}")
    return _connect(self, address)
def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and str(address[0]) not in LOCAL:
        _refuse(f"connect_ex {address!r}")
    return _connect_ex(self, address)
def getaddrinfo(host, *args, **kwargs):
    if host is not None and str(host) not in LOCAL:
        _refuse(f"getaddrinfo {host!r}")
    return _getaddrinfo(host, *args, **kwargs)
socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
import rwcore
from rwcore.trainer.cli import main
code = main(sys.argv[1:])
children = []
for task in os.listdir(f"/proc/{os.getpid()}/task"):
    with open(f"/proc/{os.getpid()}/task/{task}/children") as stream:
        children += stream.read().split()
threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
print("AFTER=" + json.dumps({"network": attempts, "children": children, "threads": threads}), flush=True)
sys.exit(code)
"""

TRACKER_ENV = re.compile(r"^(WANDB_|MLFLOW_|TRACKIO_|TENSORBOARD_)")
# a child `rw train` also loses what MLflow reads as "under test or CI: no telemetry", so that the guard sees one
CHILD_ENV_DROPPED = re.compile(r"^(WANDB_|MLFLOW_|TRACKIO_|TENSORBOARD_|PYTEST_CURRENT_TEST$|CI$|DO_NOT_TRACK$)")


# ------------------------------------------------------------------------------------------ expectations


def expected_values(rows: list[dict]) -> dict[tuple[str, int], float]:
    """(name, step) -> value for every finite number of the rows, named as docs/trackers.md says."""
    expected = {}
    for row in rows:
        kind = row["kind"]
        for key, value in row.items():
            if key in ("step", "kind") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            name = key if key.startswith(f"{kind}/") else f"{kind}/{key}"
            assert (name, row["step"]) not in expected, f"two rows give {name} at step {row['step']}"
            expected[(name, row["step"])] = float(value)
    return expected


def mlflow_named(values: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """MLflow's names: characters other than letters, digits, `_ - . /` and space become `_`."""
    return {(re.sub(r"[^\w\-./ ]", "_", name), step): value for (name, step), value in values.items()}


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    """`section.key` -> value, nested mappings flattened; lists, null and booleans as their JSON text."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{prefix}{key}."))
        elif isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            flat[f"{prefix}{key}"] = value
        else:
            flat[f"{prefix}{key}"] = json.dumps(value)
    return flat


# ------------------------------------------------------------------------------------------ readers


def tensorboard_values(logdir: Path) -> dict[tuple[str, int], float]:
    """What TensorBoard shows: its plugin event accumulator over every event file (restarts purged)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    accumulator = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    accumulator.Reload()
    values = {}
    for tag in accumulator.Tags()["tensors"]:
        if accumulator.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        for event in accumulator.Tensors(tag):
            assert (tag, event.step) not in values, f"TensorBoard holds {tag} twice at step {event.step}"
            values[(tag, event.step)] = float(tensor_util.make_ndarray(event.tensor_proto).item())
    return values


def tensorboard_hparams(logdir: Path) -> dict[str, object]:
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return {key: getattr(value, value.WhichOneof("kind")) for key, value in hparams.items()}


def wandb_records(run_file: Path) -> list:
    """The records of a wandb run file (`run-ID.wandb`): a 7-byte header (":W&B", magic 0xBEE1, version 0), then
    LevelDB log blocks of 32 KiB whose chunks (7-byte header: CRC-32 of type byte + data, length, type) carry
    wandb's protobuf `Record`s; every checksum is verified."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a wandb run file"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[position + 7 : position + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == checksum, f"bad checksum at byte {position}"
        position += 7 + length
        if kind == 1:  # FULL
            records.append(chunk)
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            records.append(pending + chunk)
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def wandb_run(folder: Path) -> tuple[dict[tuple[str, int], float], dict, object]:
    """(name, step) -> value of the offline run's history, its config and its run record."""
    (run_file,) = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
    values, config, run = {}, {}, None
    for record in wandb_records(Path(run_file)):
        which = record.WhichOneof("record_type")
        if which == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = items.pop("_step")
            for key, value in items.items():
                if not key.startswith("_"):
                    assert (key, step) not in values
                    values[(key, step)] = float(value)
        elif which == "run":
            run = record.run
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif which == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return values, {k: v for k, v in config.items() if k != "_wandb"}, run


def mlflow_runs(folder: Path, experiment: str = "rw") -> list:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when mlflow is imported: no usage reports
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"])
    return [(client, run) for run in runs]


def mlflow_values(client, run) -> dict[tuple[str, int], float]:
    values = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            assert (key, metric.step) not in values
            values[(key, metric.step)] = metric.value
    return values


def trackio_store(folder: Path, project: str, run: str) -> tuple[list[dict], dict]:
    """trackio's logs and config of a run, read by trackio's SQLiteStorage in a fresh interpreter (trackio fixes
    its store folder, TRACKIO_DIR, when it is first imported)."""
    code = (
        "import json, sys\n"
        "from trackio.sqlite_storage import SQLiteStorage\n"
        "print(json.dumps([SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), "
        "SQLiteStorage.get_run_config(sys.argv[1], sys.argv[2])]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not TRACKER_ENV.match(k)}
    env["TRACKIO_DIR"] = str(folder / "trackio")
    done = subprocess.run(
        [sys.executable, "-c", code, project, run], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def trackio_values(logs: list[dict]) -> dict[tuple[str, int], float]:
    values = {}
    for entry in logs:
        step = entry["step"]
        for key, value in entry.items():
            if key not in ("step", "timestamp"):
                assert (key, step) not in values
                values[(key, step)] = float(value)
    return values


# ------------------------------------------------------------------------------------------ the run


def test_a_run_with_all_four_trackers_stores_what_metrics_jsonl_holds(tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not CHILD_ENV_DROPPED.match(k)}
    env["WANDB_CACHE_DIR"] = str(tmp_path / "wandb-cache")  # wandb-core's own debug log, out of the home folder
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run(
        [sys.executable, "-c", GUARDED_RW, "train", "--out", str(run), "--quiet", *SMALL, "train.steps=2"]
        + ["train.loggers=[console,tensorboard,wandb,mlflow,trackio]"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "failed" not in done.stderr, done.stderr
    after = json.loads(done.stdout.split("AFTER=", 1)[1].splitlines()[0])
    assert after == {"network": [], "children": [], "threads": []}, after  # no service, thread or socket outlives

    rows = metrics_rows(run)
    assert {row["kind"] for row in rows} == {"eval", "exploration", "train"}
    expected = expected_values(rows)
    assert any("@" in name for name, _ in expected)  # MLflow's renaming is exercised
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["train"]["loggers"] == ["console", "tensorboard", "wandb", "mlflow", "trackio"]
    flat = flat_config(config)

    # TensorBoard: one scalar per (name, step), and the config as the session's hyperparameters
    assert tensorboard_values(run / "tensorboard") == expected
    numbers_as_floats = {k: float(v) if isinstance(v, int) else v for k, v in flat.items()}
    assert tensorboard_hparams(run / "tensorboard") == numbers_as_floats

    # wandb: one offline run under RUN/wandb, named after the run folder, with the whole config
    values, wandb_config, wandb_record = wandb_run(run)
    assert values == expected
    assert wandb_config == config
    assert (wandb_record.display_name, wandb_record.project, wandb_record.run_group) == ("run", "rw", "run")

    # MLflow: a local sqlite store under RUN/mlflow, experiment "rw", the config as (text) parameters
    ((client, mlflow_run),) = mlflow_runs(run)
    assert mlflow_values(client, mlflow_run) == mlflow_named(expected)
    assert mlflow_run.data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in flat.items()}
    assert (mlflow_run.info.run_name, mlflow_run.info.status) == ("run", "FINISHED")

    # trackio: a local store under RUN/trackio, project "rw"
    logs, trackio_config = trackio_store(run, "rw", "run")
    assert trackio_values(logs) == expected
    assert {k: v for k, v in trackio_config.items() if not k.startswith("_")} == config

    # the tracker folders sit beside what rw report reads: it draws the same plots
    assert cli.main(["report", str(run)]) == 0
    assert (run / "report" / "success_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------ resume, failure


def train_in_process(folder: Path, *overrides: str, steps: int) -> Trainer:
    trainer = Trainer(load_config(None, [*SMALL, f"train.steps={steps}", *overrides]), folder, quiet=True)
    trainer.setup()
    return trainer


@pytest.fixture
def no_tracker_env():
    """No tracker settings from the environment; the environment as it was afterwards (the trackers set a few
    defaults, MLFLOW_DISABLE_TELEMETRY and WANDB_ERROR_REPORTING, for the process)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if TRACKER_ENV.match(name):
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_a_resumed_run_continues_each_tracker_as_docs_say(tmp_path, no_tracker_env):
    run = tmp_path / "run"
    trainer = train_in_process(run, "train.loggers=[tensorboard,mlflow]", "train.start_pass_k=0", steps=3)
    trainer.config.train.steps = 2
    trainer.train()  # checkpoint at step 2
    trainer._log(trainer.train_step())  # step 3 reaches the trackers, then the run is killed before its checkpoint
    trainer.cleanup()
    before = metrics_rows(run)
    assert max(row["step"] for row in before) == 3

    resumed = Trainer.resume(run, quiet=True)
    resumed.setup()
    assert resumed.step == 2
    resumed.train()
    resumed.cleanup()
    after = metrics_rows(run)
    assert [row for row in after if row["step"] <= 2] == [row for row in before if row["step"] <= 2]

    # TensorBoard: a second event file; its reader drops what the killed run wrote after the checkpoint
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert tensorboard_values(run / "tensorboard") == expected_values(after)

    # MLflow: a second run in the experiment, holding the rows after the checkpoint; the first keeps its own
    (first_client, first), (second_client, second) = mlflow_runs(run)
    assert mlflow_values(first_client, first) == mlflow_named(expected_values(before))
    assert mlflow_values(second_client, second) == mlflow_named(expected_values([r for r in after if r["step"] > 2]))
    assert (first.info.run_name, second.info.run_name) == ("run", "run-resumed-at-step-2")
    assert second.data.tags["rw.resumed_at_step"] == "2"


def test_a_tracker_failing_mid_run_is_named_once_and_dropped_while_training_goes_on(
    tmp_path, no_tracker_env, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    calls = []
    log_batch = MlflowClient.log_batch

    def disk_full_on_the_third_row(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if metrics:
            calls.append(len(metrics))
            if len(calls) == 3:
                raise OSError(28, "No space left on device")
        return log_batch(self, run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", disk_full_on_the_third_row)
    run = tmp_path / "run"
    trainer = train_in_process(run, "train.loggers=[mlflow,tensorboard]", steps=2)
    trainer.train()
    trainer.cleanup()
    rows = metrics_rows(run)
    assert [row["kind"] for row in rows] == ["eval", "exploration", "train", "train", "eval"]
    assert len(calls) == 3  # dropped: never called again
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rw: tracker")]
    assert len(err) == 1 and "mlflow" in err[0] and "No space left on device" in err[0] and "dropped" in err[0], err
    assert tensorboard_values(run / "tensorboard") == expected_values(rows)
    ((client, mlflow_run),) = mlflow_runs(run)
    assert mlflow_values(client, mlflow_run) == mlflow_named(expected_values(rows[:2]))


def test_overwrite_replaces_a_run_with_tracker_folders_and_keeps_a_foreign_file_refused(tmp_path, no_tracker_env):
    """--overwrite removes what rw wrote, the trackers' folders included; a file rw did not write still stops it."""
    run = tmp_path / "run"
    first = train_in_process(run, "train.loggers=[tensorboard,mlflow]", "train.start_pass_k=0", steps=1)
    first.train()
    first.cleanup()
    assert (run / "tensorboard").is_dir() and (run / "mlflow").is_dir()
    for name in ("wandb", "trackio"):  # the other two trackers' folders, as they leave them
        (run / name / "inner").mkdir(parents=True)
        (run / name / "inner" / "data").write_bytes(b"x")
    (run / "notes.txt").write_text("mine")
    args = ["train", "--out", str(run), "--overwrite", "--quiet", *SMALL, "train.steps=1", "train.start_pass_k=0"]
    assert cli.main(args) == 2
    assert (run / "notes.txt").read_text() == "mine" and (run / "wandb" / "inner" / "data").exists()
    (run / "notes.txt").unlink()
    assert cli.main(args) == 0
    assert not any((run / name).exists() for name in ("tensorboard", "mlflow", "wandb", "trackio"))
    assert [row["step"] for row in metrics_rows(run) if row["kind"] == "train"] == [1]


# ------------------------------------------------------------------------------------------ refusals


def test_a_tracker_that_is_not_installed_is_one_line_before_the_run_folder_is_written(
    tmp_path, no_tracker_env, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what importlib finds when the package is absent
    run = tmp_path / "run"
    assert cli.main(["train", "--out", str(run), "--quiet", *SMALL, "train.loggers=[tensorboard,wandb]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "train.loggers" in err[0] and "wandb" in err[0] and "rwcore[trackers]" in err[0], err
    assert not (run / "config.yaml").exists() and not (run / "metrics.jsonl").exists()
    assert not (run / "tensorboard").exists()


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.loggers=[console,neptune]", ["train.loggers", "neptune", "tensorboard", "wandb", "mlflow", "trackio"]),
        ("train.loggers=wandb", ["train.loggers", "list"]),
        ("train.loggers=[wandb,wandb]", ["train.loggers", "wandb", "twice"]),
        ("train.tracker_project=a/b", ["train.tracker_project", "a/b"]),
        ("train.tracker_project=", ["train.tracker_project"]),
    ],
)
def test_bad_tracker_settings_are_refused_naming_the_key(override, words):
    with pytest.raises(ValueError) as caught:
        load_config(None, [override])
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_the_default_is_the_console_alone_and_imports_no_tracker(tmp_path):
    assert load_config(None, []).train.loggers == ["console"]
    code = (
        "import sys, rwcore\n"
        "from rwcore.trainer.config import load_config\n"
        "from rwcore.trainer.trainer import Trainer\n"
        "from rwcore.trainer import trackers\n"
        "trackers.Trackers(['console'], 'rw').start({}, sys.argv[1])\n"
        "print(sorted(m for m in ('wandb', 'mlflow', 'trackio', 'tensorboard') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert list(tmp_path.iterdir()) == []


def test_only_finite_numbers_reach_a_tracker_under_the_kind_prefixed_name():
    from rwcore.trainer.trackers import metric_values

    row = {
        "step": 7,
        "kind": "train",
        "loss": 0.5,
        "grad_norm": float("nan"),
        "lr": float("inf"),
        "active_rubrics": 3,
        "note": "text",
        "flag": True,
        "nested": {"a": 1.0},
        "judge/requests": 2,
    }
    assert metric_values(row) == (7, {"train/loss": 0.5, "train/active_rubrics": 3.0, "train/judge/requests": 2.0})
    assert metric_values({"step": 2, "kind": "eval", "eval/success_rate": 0.25, "time/probe": 1.5}) == (
        2,
        {"eval/success_rate": 0.25, "eval/time/probe": 1.5},
    )
