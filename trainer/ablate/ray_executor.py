"""`rw ablate --executor ray`: each run of a table a Ray task, on the nodes of a Ray cluster.

Only where a run's `rw train` runs changes. This process (the driver) does what it does with the local executor
(runner.py): it holds OUT's lock, picks the runs to start (finished ones are skipped, killed ones resumed
from their checkpoint, failed ones run again), decides whether a run that ended is finished (`_unfinished`: each
step 1..N once, a held-out evaluation, the step-N checkpoint), writes the status files and the table. Each run
is a task `ray.remote(num_cpus=threads, num_gpus=gpus)` that starts the command the local executor starts (the
same `python -m rwcore.trainer train ...`, its OMP / MKL / OpenBLAS threads set to the task's CPUs, in the
driver's working folder so that relative paths mean the same) as a child of the Ray worker, in a session of its
own and with the same parent-death signal, and returns its exit code.

Every node that runs a task must see OUT (and the working folder) at the same path: a shared filesystem.
Checked before anything starts: a probe task on each node that could run one reads back a token the driver wrote
into OUT; a node that cannot is named and nothing runs. Each task checks again (a node that joins later).

No run outlives its driver: the tasks are not detached, so when the driver dies (`kill -9` included) Ray kills
the workers leased to it, and a worker's `rw train` gets SIGTERM from its parent-death signal. Ray does not
retry a task (max_retries=0): a run whose worker died is a failed run, which the next call runs again.
Ctrl-C or SIGTERM cancels the tasks; a cancelled task stops its run as the local executor does (SIGTERM, then
SIGKILL to its group after STOP_SECONDS).

The cluster: `--address` or else RAY_ADDRESS, as `ray.init` reads them (neither: `ray.init()` connects to the
cluster `ray start` last started on this machine, or starts a Ray instance for this call). An address where
nothing answers is refused within CONNECT_SECONDS (a TCP connection first: `ray.init`'s own retries take
minutes), naming it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rwcore._io import atomic_write_bytes

__all__ = ["RayExecutor", "connect", "CONNECT_SECONDS"]

CONNECT_SECONDS = 5.0
"""How long the TCP connection to the cluster's address may take before the address is refused."""
PROBE_SECONDS = 120.0
"""How long a node may take to answer the shared-folder probe (it starts a worker process first)."""
PROBE_FILE = ".ray_probe"
# ray.init's connection attempts to a GCS address (each 35-45 s as measured; 20 by default): one, so that an
# address that accepts TCP but is no Ray cluster fails in under a minute rather than in a quarter of an hour
_GCS_TRIES_ENV = "RAY_gcs_server_port_wait_time_s"


def _import_ray():
    try:
        import ray
    except ImportError as error:
        raise ValueError(
            f"--executor ray needs Ray: pip install 'rwcore[ray]' (or pip install ray) ({error})"
        ) from None
    return ray


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _named(address: str | None) -> tuple[str | None, str]:
    """(the address `ray.init` is given, how an error names it): the flag first, then RAY_ADDRESS, as Ray reads
    them (`ray.init(address="auto")` also reads RAY_ADDRESS)."""
    if address is not None:
        return address, f"--address {address}"
    env = os.environ.get("RAY_ADDRESS", "")
    if env:
        return None, f"RAY_ADDRESS={env}"
    return None, "the Ray cluster ray.init() finds (no --address, no RAY_ADDRESS)"


def _gcs_endpoint(address: str | None) -> tuple[str, int] | None:
    """host, port of the cluster `ray.init(address)` would connect to; None where it would start its own."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # another Ray layout: read host:port ourselves
        text = address or os.environ.get("RAY_ADDRESS") or ""
        host, sep, port = text.rpartition(":")
        return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None
    given = address if address not in (None, "auto") else os.environ.get("RAY_ADDRESS") or address
    if given not in (None, "auto", "local"):  # malformed: Ray would log a traceback before raising
        host, sep, port = given.rpartition(":")
        if not (sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{given!r} is not host:port (or auto)")
    with _quiet_logger("ray._private.services"):
        resolved = canonicalize_bootstrap_address(address)
    if resolved is None:
        return None
    host, _, port = resolved.rpartition(":")
    return host.strip("[]"), int(port)


@contextlib.contextmanager
def _quiet_logger(name: str):
    """Ray's logger for `name` silenced for the block (it logs a traceback for an address it cannot parse, which rw
    then names in one line)."""
    logger = logging.getLogger(name)
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


def _check_reachable(address: str | None, name: str) -> None:
    """A ValueError naming the address unless something accepts a TCP connection there within CONNECT_SECONDS."""
    target = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    if target and target.startswith("ray://"):
        raise ValueError(
            f"{name}: a Ray Client address; rw ablate must run on a node of the cluster (it reads and writes --out "
            "there): give the cluster's GCS address (host:port, or auto) or submit rw ablate with `ray job submit`"
        )
    try:
        endpoint = _gcs_endpoint(address)
    except (ConnectionError, ValueError) as error:  # auto without a cluster; a malformed address
        raise ValueError(f"{name}: no Ray cluster there ({_first_line(error)})") from None
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS):
            pass
    except OSError as error:
        why = "no answer" if isinstance(error, TimeoutError) else (error.strerror or str(error)).lower()
        given = target or ""
        # Ray connects to this machine's own address where it is given localhost / 127.0.0.1: say so, since a
        # listener on loopback alone is never tried
        if given and given not in ("auto", "local") and given.rpartition(":")[0].strip("[]") != host:
            where = f"{host}:{port}, the address Ray connects to for {given}"
        else:
            where = f"{host}:{port}"
        raise ValueError(f"{name}: no Ray cluster there ({why} at {where})") from None


class _Held:
    ok = False


@contextlib.contextmanager
def _stderr_held(hold: bool):
    """While connecting, file descriptor 2 goes to a temporary file: Ray's C++ client writes each failed attempt
    there, and a refused address is one line. Once connected, what it wrote is passed on to stderr."""
    held = _Held()
    if not hold:
        yield held
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield held
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if held.ok:
                capture.seek(0)
                sys.stderr.write(capture.read().decode(errors="replace"))
                sys.stderr.flush()


def _run_cell(command: list[str], cwd: str, log_path: str, threads: int, settings: str) -> tuple[int, str | None]:
    """The Ray task of one run (in a Ray worker): `command` (the driver's `python -m rwcore.trainer train ...`,
    run with this worker's Python) in `cwd`, output appended to `log_path`, through the local executor's
    parent-death launcher. Returns (exit code, a line for the run's log or None). A cancel (KeyboardInterrupt)
    stops the run as Ctrl-C stops a local one."""
    from rwcore.trainer.ablate.local_executor import _dying_with_us, _poll, _stop_runs, _thread_env

    if not Path(settings).is_file():  # the driver wrote it before starting any run
        return 2, f"Ray node {socket.gethostname()} cannot see {Path(settings).parent} (no shared filesystem there)"
    argv = [sys.executable, *command[1:]]
    with open(log_path, "ab") as log:
        log.write(f"rw ablate: on Ray node {_node_id()} ({socket.gethostname()})\n".encode())
        log.flush()
        process = subprocess.Popen(
            _dying_with_us(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_thread_env(threads),
            cwd=cwd,
            start_new_session=True,
        )
        try:
            while (code := _poll(process)) is None:  # kills what is left of its group once it ended
                time.sleep(0.2)
        except BaseException:  # ray.cancel: KeyboardInterrupt
            _stop_runs({"run": (None, process, 0.0, log)})
            raise
    return code, None


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _probe(folder: str, token: str, cwd: str) -> dict:
    """Run on each node: does it see the driver's OUT (the token it wrote there) and working folder?"""
    try:
        seen = (Path(folder) / PROBE_FILE).read_text()
    except OSError as error:
        seen = f"<{error.strerror or error}>"
    return {"host": socket.gethostname(), "sees_out": seen == token, "sees_cwd": os.path.isdir(cwd)}


def _needs_gpu(plan) -> tuple[str, bool | None]:
    """(model.device, whether each run needs a GPU; None for auto: one where the cluster has any)."""
    from rwcore.trainer.config import load_config

    device = load_config(plan.config, [*plan.overrides, *plan.row_overrides(plan.variants[0])]).model.device
    if device == "auto":
        return device, None
    if device.startswith("cuda"):
        if device not in ("cuda", "cuda:0"):
            raise ValueError(
                f"model.device={device}: under --executor ray a run sees only the GPU Ray gives it; "
                "use model.device=cuda"
            )
        return device, True
    return device, False


class RayExecutor:
    """Runs each run of a table as a Ray task (see the module docstring); `connect` makes one."""

    def __init__(self, ray, name: str, nodes: list[dict], threads: int, gpus: int, jobs: int):
        self._ray, self.name, self.nodes = ray, name, nodes
        self._threads, self.gpus, self.jobs = threads, gpus, jobs
        self._cell = ray.remote(_run_cell)

    def threads(self, plan) -> int:
        return self._threads

    def check_folder(self, plan) -> None:
        """Every node that could run a task sees plan.out and this working folder, or a ValueError naming the
        nodes that do not. plan.out exists (the caller holds its lock); the probe file is removed again."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        out = plan.out.resolve()
        token = secrets.token_hex(16)
        probe = out / PROBE_FILE
        atomic_write_bytes(probe, token.encode())
        try:
            task = self._ray.remote(_probe)
            refs = [
                task.options(
                    num_cpus=0,
                    max_retries=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["id"], soft=False),
                ).remote(str(out), token, os.getcwd())
                for node in self.nodes
            ]
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=PROBE_SECONDS)
            blind = []
            for node, ref in zip(self.nodes, refs):
                if ref not in ready:
                    blind.append(f"{node['address']} (no answer within {PROBE_SECONDS:g} s)")
                    continue
                try:
                    seen = self._ray.get(ref)
                except Exception as error:  # e.g. rwcore not importable there
                    blind.append(f"{node['address']} ({_first_line(error)})")
                    continue
                missing = [what for what, ok in (("--out", seen["sees_out"]), ("cwd", seen["sees_cwd"])) if not ok]
                if missing:
                    blind.append(f"{node['address']} ({seen['host']}: not {' or '.join(missing)})")
        finally:
            probe.unlink(missing_ok=True)
        if blind:
            raise ValueError(
                f"--executor ray: {len(blind)} Ray node(s) cannot see --out {out} or the working folder "
                f"{os.getcwd()} at the same path: {'; '.join(blind)}. Every node that runs a run must see them "
                "(a shared filesystem); nothing was started"
            )

    def start(self, command: list[str], log, threads: int):
        from rwcore.trainer.ablate.runner import SETTINGS_FILE

        log_path = Path(os.path.abspath(log.name))  # OUT/runs/<run>/ablation.log
        ref = self._cell.options(num_cpus=threads, num_gpus=self.gpus, max_retries=0).remote(
            list(command), os.getcwd(), str(log_path), threads, str(log_path.parents[2] / SETTINGS_FILE)
        )
        return _RayRun(self._ray, ref, log)

    def machine(self, threads: int) -> dict:
        return {
            "threads_per_run": threads,
            "executor": "ray",
            "ray_nodes": len(self.nodes),
            "ray_cpus": sum(node["cpus"] for node in self.nodes),
            "gpus_per_run": self.gpus,
        }

    def describe(self) -> str:
        cpus = sum(node["cpus"] for node in self.nodes)
        gpus = sum(node["gpus"] for node in self.nodes)
        each = f"{self._threads} CPU(s)" + (f" and {self.gpus} GPU" if self.gpus else "")
        return (
            f"on the Ray cluster {self.name} ({len(self.nodes)} node(s), {cpus:g} CPUs, {gpus:g} GPUs); "
            f"each run a Ray task with {each}"
        )

    def close(self) -> None:
        self._ray.shutdown()


class _RayRun:
    """What `RayExecutor.start` returns: a `subprocess.Popen` stand-in over one Ray task, for the scheduling loop
    of runner.py. No pid: there is no local process group to kill."""

    def __init__(self, ray, ref, log):
        self._ray, self._ref, self._log = ray, ref, log
        self.returncode: int | None = None
        self._stopping = False

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _ = self._ray.wait([self._ref], timeout=0)
            if ready:
                self.returncode = self._outcome()
        return self.returncode

    def _outcome(self) -> int:
        from ray.exceptions import RayError, TaskCancelledError

        try:
            code, note = self._ray.get(self._ref)
        except TaskCancelledError:
            code, note = -signal.SIGTERM, "its Ray task was cancelled"
        except RayError as error:  # its worker died (node lost, out of memory), or the task could not start
            code, note = 1, f"its Ray task failed: {_first_line(error)}"
        if note and not self._log.closed:  # the run's last log line: what its failure says
            self._log.write(f"rw ablate: {note}\n".encode())
            self._log.flush()
        return code

    def terminate(self) -> None:
        self._stopping = True
        self._ray.cancel(self._ref)  # KeyboardInterrupt in the task: it stops its run

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            ready, _ = self._ray.wait([self._ref], timeout=timeout)
            if not ready:
                raise subprocess.TimeoutExpired("ray task", timeout)
            return self.poll()
        if self.poll() is None and self._stopping:  # it did not stop in time: end its worker (and so its run)
            self._ray.cancel(self._ref, force=True)
        self._ray.wait([self._ref])
        return self.poll()


def connect(address: str | None, plan, jobs: int | None) -> RayExecutor:
    """Connects to the Ray cluster (`--address`, else RAY_ADDRESS, else what `ray.init()` finds or starts) and
    sizes the runs: each gets `threads` CPUs, the cluster's CPUs over `jobs` (default: one per CPU; capped at
    the largest node's), and a GPU where model.device is cuda (or auto on a cluster with GPUs). ValueError,
    naming the address or setting, when Ray is missing, nothing answers there, or no node fits a run; nothing
    is written."""
    ray = _import_ray()
    given, name = _named(address)
    _check_reachable(given, name)
    _, gpu = _needs_gpu(plan)
    existing = _gcs_endpoint(given) is not None
    previous = os.environ.get(_GCS_TRIES_ENV)
    if previous is None:
        os.environ[_GCS_TRIES_ENV] = "1"
    try:
        with _stderr_held(existing) as held:
            ray.init(
                address=given,
                logging_level=logging.WARNING,
                log_to_driver=False,
                **({} if existing else {"include_dashboard": False}),
            )
            held.ok = True
    except (ConnectionError, TimeoutError) as error:
        if existing and os.environ.get("RAY_AUTH_MODE") != "token":
            # something took the TCP connection: most often a cluster `ray start` made with token authentication
            # (its default since Ray 2.5x), which a client joins only with RAY_AUTH_MODE=token and the token
            raise ValueError(
                f"{name}: Ray did not accept the connection ({_first_line(error)}); if the cluster uses token "
                "authentication, set RAY_AUTH_MODE=token (the token in ~/.ray/auth_token or RAY_AUTH_TOKEN)"
            ) from None
        raise ValueError(f"{name}: no Ray cluster there ({_first_line(error)})") from None
    except (RuntimeError, ValueError) as error:  # e.g. another Ray or Python version than the cluster's
        raise ValueError(f"{name}: cannot join the Ray cluster there ({_first_line(error)})") from None
    finally:
        if previous is None:
            os.environ.pop(_GCS_TRIES_ENV, None)
    try:
        nodes = [
            {
                "id": node["NodeID"],
                "address": node.get("NodeManagerAddress", "?"),
                "cpus": float(node.get("Resources", {}).get("CPU", 0)),
                "gpus": float(node.get("Resources", {}).get("GPU", 0)),
            }
            for node in ray.nodes()
            if node.get("Alive")
        ]
        gpus = 1 if (gpu or (gpu is None and any(node["gpus"] >= 1 for node in nodes))) else 0
        fit = [node for node in nodes if node["gpus"] >= gpus and node["cpus"] >= 1]
        if not fit:
            need = "a GPU and a CPU" if gpus else "a CPU"
            raise ValueError(f"--executor ray: each run needs {need} on one node; no node of {name} has them")
        total_cpus = int(sum(node["cpus"] for node in fit))
        if jobs is None:
            jobs = int(sum(node["gpus"] for node in fit)) if gpus else total_cpus
        threads = max(1, min(total_cpus // jobs, int(max(node["cpus"] for node in fit))))
        fit = [node for node in fit if node["cpus"] >= threads]
        try:
            where = ray.get_runtime_context().gcs_address
        except Exception:  # an older Ray: name it as it was given
            where = given or os.environ.get("RAY_ADDRESS") or "ray.init()"
        return RayExecutor(ray, where, fit, threads, gpus, jobs)
    except BaseException:
        ray.shutdown()
        raise
