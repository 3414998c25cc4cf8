"""Readers of what the experiment trackers of `rw train` stored (tests/trainer/test_trackers.py): each with that
package's own reader or format - TensorBoard's event accumulator and a real `tensorboard` server on loopback,
MLflow's client, the records of wandb's offline run file (decoded with wandb's own protobuf messages) and its media
files, trackio's SQLite storage - and the child process that runs `rw train` with its sockets closed to anything but
loopback."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import numpy as np
from _util import ROOT

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


def float32(values: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """The values as TensorBoard keeps them: rounded to float32 (classic `simple_value` scalars)."""
    return {key: float(np.float32(value)) for key, value in values.items()}


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


def _history_items(record) -> dict:
    """A history record's items, key -> value; a media entry (a table) is stored as items with a nested key
    [key, field] and comes back as one dict."""
    items: dict = {}
    for item in record.history.item:
        value = json.loads(item.value_json)
        if item.key:
            items[item.key] = value
        elif len(item.nested_key) == 1:
            items[item.nested_key[0]] = value
        else:
            items.setdefault(item.nested_key[0], {})["/".join(item.nested_key[1:])] = value
    return items


def wandb_run(folder: Path) -> tuple[dict[tuple[str, int], float], dict, object]:
    """(name, step) -> value of the offline run's history, its config and its run record."""
    (run_file,) = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
    values, config, run = {}, {}, None
    for record in wandb_records(Path(run_file)):
        which = record.WhichOneof("record_type")
        if which == "history":
            items = _history_items(record)
            step = items.pop("_step")
            for key, value in items.items():
                if not key.startswith("_") and not isinstance(value, dict):  # a table's entry is a dict
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
    """(name, step) -> value of the numbers trackio logged (its tables aside: `trackio_tables`)."""
    values = {}
    for entry in logs:
        step = entry["step"]
        for key, value in entry.items():
            if key not in ("step", "timestamp") and not isinstance(value, dict):
                assert (key, step) not in values
                values[(key, step)] = float(value)
    return values


def trackio_tables(logs: list[dict], key: str) -> dict[int, list[dict]]:
    """step -> the rows (column -> value) of the trackio Table logged under `key` at that step."""
    tables = {}
    for entry in logs:
        if key in entry:
            assert entry[key]["_type"] == "trackio.table", entry[key]
            tables[entry["step"]] = entry[key]["_value"]
    return tables


def wandb_tables(folder: Path, key: str) -> dict[int, dict]:
    """step -> the wandb Table (its JSON: columns, data) that the offline run logged under `key` at that step,
    from the table's entry in the run's history records and the media file that entry names."""
    (run_file,) = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
    files = Path(run_file).parent / "files"
    tables = {}
    for record in wandb_records(Path(run_file)):
        if record.WhichOneof("record_type") != "history":
            continue
        items = _history_items(record)
        if key in items:
            entry = items[key]
            assert entry["_type"] == "table-file", entry
            tables[items["_step"]] = json.loads((files / entry["path"]).read_text())
    return tables


def mlflow_artifact(client, run, path: str) -> bytes:
    """The bytes of the run's artifact at `path`, downloaded with MLflow's client."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return Path(client.download_artifacts(run.info.run_id, path, folder)).read_bytes()


class TensorBoardServer:
    """A real `tensorboard --logdir LOGDIR --host 127.0.0.1 --port 0` (the command docs/trackers.md gives, with
    TensorBoard's default loader: its Rust data server where it is installed), queried over HTTP on loopback.
    `started` is the monotonic time the process was started; `stderr` what it printed. The process and its data
    server (one process group) are ended on exit, whatever happened."""

    URL = re.compile(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)/")

    def __init__(self, logdir: Path, timeout: float = 180.0) -> None:
        self.logdir, self.timeout = logdir, timeout
        self.stderr: list[str] = []

    def __enter__(self) -> TensorBoardServer:
        script = Path(sys.executable).with_name("tensorboard")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "tensorboard.main"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORBOARD")}
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [*command, "--logdir", str(self.logdir), "--host", "127.0.0.1", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # its data server in the same group: both ended on exit
        )
        found = threading.Event()
        self.base = ""

        def read() -> None:
            for line in self.process.stderr:
                self.stderr.append(line)
                match = self.URL.search(line)
                if match and not found.is_set():
                    self.base = match.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        try:
            if not found.wait(self.timeout):
                raise AssertionError(f"tensorboard printed no address within {self.timeout:.0f} s: {self.stderr}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def get(self, path: str, **query: str):
        """The JSON answer of GET `path` with `query`."""
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=30) as answer:
            return json.loads(answer.read())

    def poll(self, path: str, ready, **query: str):
        """GET `path` until `ready(answer)` holds (the data server loads the event files after it starts)."""
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self.get(path, **query)
            if ready(answer):
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} still answers {answer!r} after {self.timeout:.0f} s")
            time.sleep(0.25)

    def __exit__(self, *exc) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(15)
        except ProcessLookupError:
            self.process.wait(15)
