"""`rw ablate --executor ray` on a real local Ray cluster of two raylets (one CPU each, on loopback, started once
for the module): the table is the one `--jobs 2` writes from the same grid; `kill -9` of the driver mid-grid
leaves no `rw train` running, and the rerun finishes the grid with every run trained once, step by step, to its
end; bad input (an address where nothing listens, --address without Ray, Ray missing, a GPU the cluster lacks, a
node that cannot see --out) is one line before anything is written or started."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from _util import ABLATE_RUN, ablate_command, child_env, free_port, train_steps

from rwcore.trainer import ablate
from rwcore.trainer.ablate import ray_executor as ablate_ray
from rwcore.trainer.cli import main

# Ray resolves this machine's address to loopback (127.0.0.1) instead of the address it would use to reach other
# machines: the cluster, the driver and every connection between them stay on loopback.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
ENV = child_env(MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **LOOPBACK)
STEPS = 3
VARIANTS = ("rewardweaver", "rw_outcome_grpo")
SEEDS = (0, 1)

# Two raylets of one CPU each (ray.cluster_utils.Cluster: real raylet processes, the ports chosen so that two
# fit on one machine); prints the address, stops when its stdin closes. It neither writes nor removes
# /tmp/ray/ray_current_cluster, where a plain ray.init() on this machine would find it (or another cluster).
CLUSTER = """
import sys
import ray._common.utils, ray._private.utils
ray._private.utils.write_ray_address = lambda *args, **kwargs: None
ray._common.utils.reset_ray_address = lambda *args, **kwargs: None
from ray.cluster_utils import Cluster
head = {"num_cpus": 1, "include_dashboard": False, "temp_dir": sys.argv[1]}
cluster = Cluster(initialize_head=True, head_node_args=head)
cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@pytest.fixture(scope="module")
def cluster():
    """The address of a two-node Ray cluster on loopback, for the module."""
    # Ray's sessions (logs, sockets) in a folder of their own, short enough for a Unix socket path
    temp_dir = tempfile.mkdtemp(prefix="rwray")
    process = subprocess.Popen(
        [sys.executable, "-c", CLUSTER, temp_dir], env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    first = []
    reader = threading.Thread(target=lambda: first.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=120)
    try:
        address = (first[0] if first else "").strip()
        assert address.startswith("127.0.0.1:"), f"the cluster did not start on loopback: {address!r}"
        yield address
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ablate(out: Path, *options: str) -> list[str]:
    return ablate_command(
        out, *ABLATE_RUN, variants=",".join(VARIANTS), seeds=",".join(map(str, SEEDS)), steps=STEPS, options=options
    )


def _rows(out: Path) -> list[dict]:
    """The table's rows without the run folders' paths (the only thing two tables of one grid may differ in)."""
    rows = json.loads((out / "ablation.json").read_text())["rows"]
    for row in rows:
        for entry in row["seeds"].values():
            entry.pop("run_dir")
    return rows


def _rw_train_in(out: Path) -> list[int]:
    """Pids of the live `rw train` processes writing under `out`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in ("Z", "X") or b"rwcore.trainer" not in argv or b"train" not in argv:  # rw ablate is not one
            continue
        if any(str(out).encode() in a for a in argv):
            found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------- the table and a kill -9


def test_a_ray_grid_killed_and_rerun_runs_each_run_once_and_gives_the_local_table(cluster, tmp_path):
    """The same grid twice. `--jobs 2` here. `--executor ray` on the two-node cluster: stopped with SIGTERM once
    a run started (its tasks are cancelled and stop their runs), started again and killed with SIGKILL as soon
    as a run wrote its first checkpoint: no `rw train` is left running either time, and the same command again
    finishes the grid on both nodes with every training step 1..N of every run written once, and the table
    `--jobs 2` wrote (the killed runs continue exactly from their checkpoints, the others run whole as Ray
    tasks)."""
    jobs = str(max(2, os.cpu_count() or 1))  # one thread per run, as each Ray task here has one CPU
    local = subprocess.run(_ablate(tmp_path / "local", "--jobs", jobs), env=ENV, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    expected = _rows(tmp_path / "local")
    assert [row["variant"] for row in expected] == list(VARIANTS)
    assert all(entry["status"] == "finished" for row in expected for entry in row["seeds"].values())

    out = tmp_path / "ray"
    command = _ablate(out, "--executor", "ray", "--address", cluster)
    # SIGTERM (or Ctrl-C) cancels the Ray tasks, and each stops its rw train before the driver exits
    driver = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not _rw_train_in(out):
            assert driver.poll() is None and time.monotonic() < deadline, "no rw train started"
            time.sleep(0.05)
        driver.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = driver.communicate(timeout=ablate.local_executor.STOP_SECONDS + 30)
        print(f"rw ablate stopped {time.monotonic() - signalled:.2f} s after SIGTERM")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 130 and err.endswith("interrupted\n"), err
    assert _rw_train_in(out) == [] and not list((out / "runs").glob("*/ablation_status.json"))

    started = time.time()
    driver = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240

        def checkpointed_by_this_driver() -> bool:  # `latest` is rewritten once a checkpoint is complete; the
            # stopped driver's runs may have left one already, which says nothing about this driver's runs. Only
            # a checkpoint before the last step counts: after the last one a run has no steps left, and killing
            # it then (on a loaded machine) would leave no run stopped mid-way to resume
            return any(
                p.stat().st_mtime > started and p.read_text().strip() != f"step_{STEPS}"
                for p in (out / "runs").glob("*/checkpoints/latest")
            )

        while not (checkpointed_by_this_driver() and _rw_train_in(out)):
            assert driver.poll() is None and time.monotonic() < deadline, "no run reached a checkpoint"
            time.sleep(0.05)
        running = _rw_train_in(out)
        assert running, "no rw train was running when the driver was killed"
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        killed = time.monotonic()
        while _rw_train_in(out) and time.monotonic() - killed < 20:
            time.sleep(0.05)
        left = _rw_train_in(out)
        gone_after = time.monotonic() - killed
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert left == [], f"rw train {left} outlived the killed rw ablate"
    print(f"{len(running)} rw train process(es) gone {gone_after:.2f} s after the driver was killed")
    stopped = {run.name: train_steps(run) for run in (out / "runs").iterdir() if (run / "metrics.jsonl").exists()}
    # killed mid-grid (a run not counted finished: runs resumed from the stopped driver's checkpoints may have
    # finished first, and the rerun must skip those) and mid-run (a run with a checkpoint had steps left to train)
    finished_before = {path.parent.name for path in (out / "runs").glob("*/ablation_status.json")}
    assert len(finished_before) < len(VARIANTS) * len(SEEDS), finished_before
    mid = [name for name, steps in stopped.items() if steps and steps[-1] < STEPS]
    mid = [name for name in mid if (out / "runs" / name / "checkpoints" / "latest").exists()]
    assert mid, stopped

    again = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "each run a Ray task with 1 CPU(s)" in again.stderr and "(2 node(s), 2 CPUs, 0 GPUs)" in again.stderr
    for variant in VARIANTS:
        for seed in SEEDS:
            run = out / "runs" / f"{variant}-s{seed}"
            assert train_steps(run) == list(range(1, STEPS + 1)), run.name  # each step once, to the last
            assert json.loads((run / "ablation_status.json").read_text())["status"] == "finished"
    for name in mid:  # a run killed after a checkpoint continued from it
        assert f"--resume {out / 'runs' / name}" in (out / "runs" / name / "ablation.log").read_text()
    assert _rows(out) == expected
    stored = json.loads((out / "ablation.json").read_text())["machine"]
    assert stored["executor"] == "ray" and stored["ray_nodes"] == 2 and stored["threads_per_run"] == 1
    nodes = set()
    for run in (out / "runs").iterdir():
        for line in (run / "ablation.log").read_text().splitlines():
            if line.startswith("rw ablate: on Ray node "):
                nodes.add(line.split()[5])
    assert len(nodes) == 2  # both raylets ran runs


# ---------------------------------------------------------------------------- bad input


def test_an_address_where_no_ray_cluster_listens_is_one_line_and_nothing_is_written(tmp_path, capsys, monkeypatch):
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # 127.0.0.1 stays loopback
    monkeypatch.setattr(ablate, "run_ablation", lambda *a, **k: pytest.fail("nothing may start"))
    port = free_port()
    out = tmp_path / "out"
    started = time.monotonic()
    argv = ["ablate", "--paper", "rewardweaver", "--seeds", "0", "--executor", "ray", "--out", str(out), "--quiet"]
    assert main([*argv, "--address", f"127.0.0.1:{port}"]) == 2
    took = time.monotonic() - started
    err = capsys.readouterr().err
    where = f"127.0.0.1:{port}"
    assert err == f"rw: error: --address {where}: no Ray cluster there (connection refused at {where})\n"
    assert took < ablate_ray.CONNECT_SECONDS + 5 and not out.exists()
    # RAY_ADDRESS is read as Ray reads it, and named as where the address came from
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"rw: error: RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster there (")
    assert main([*argv, "--address", "ray://127.0.0.1:10001"]) == 2
    assert "Ray Client address" in capsys.readouterr().err and not out.exists()


def test_an_address_ray_rewrites_is_named_as_rewritten_and_a_malformed_one_is_one_line(tmp_path, capsys, monkeypatch):
    """Ray connects to this machine's own address where it is given 127.0.0.1 (ENABLE_RAY_CLUSTER): the refusal
    named only the rewritten address, as if the user had typed it. `--address ':'` printed Ray's traceback before
    rw's line. The rewrite is pinned to another loopback address, so the refusal is immediate on any machine."""
    from ray._private import ray_constants, services

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setattr(services, "resolve_ip_for_localhost", lambda host: "127.0.0.2" if host == "127.0.0.1" else host)
    monkeypatch.setattr(ablate, "run_ablation", lambda *a, **k: pytest.fail("nothing may start"))
    port = free_port()
    out = tmp_path / "out"
    argv = ["ablate", "--paper", "rewardweaver", "--seeds", "0", "--executor", "ray", "--out", str(out), "--quiet"]
    assert main([*argv, "--address", f"127.0.0.1:{port}"]) == 2
    assert capsys.readouterr().err == (
        f"rw: error: --address 127.0.0.1:{port}: no Ray cluster there (connection refused at 127.0.0.2:{port}, the "
        f"address Ray connects to for 127.0.0.1:{port})\n"
    )
    for malformed in (":", "host:", ":80", "h:99999"):
        assert main([*argv, "--address", malformed]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == f"rw: error: --address {malformed}: no Ray cluster there ({malformed!r} is not host:port (or auto))\n"
        )
    assert not out.exists()


def test_address_without_the_ray_executor_and_ray_missing_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ablate, "run_ablation", lambda *a, **k: pytest.fail("nothing may start"))
    out = tmp_path / "out"
    argv = ["ablate", "--paper", "rewardweaver", "--seeds", "0", "--out", str(out), "--quiet"]
    assert main([*argv, "--address", "127.0.0.1:6379"]) == 2
    assert capsys.readouterr().err == "rw: error: --address 127.0.0.1:6379: only with --executor ray\n"
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as it does where Ray is not installed
    assert main([*argv, "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rw: error: --executor ray needs Ray: pip install 'rwcore[ray]' (or pip install ray)")
    assert err.count("\n") == 1 and not out.exists()


def test_a_run_needing_a_gpu_on_a_cluster_without_one_is_refused(cluster, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [*_ablate(out, "--executor", "ray", "--address", cluster), "model.device=cuda"],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"rw: error: --executor ray: each run needs a GPU and a CPU on one node; no node of --address {cluster} "
        "has them"
    )
    assert not out.exists()


NODE_A, NODE_B = "a" * 56, "b" * 56  # Ray node ids are 28 bytes in hex


class _NodeWithoutTheFolder:
    """Stands in for `ray` where one of two nodes mounts another filesystem at --out: the probe task runs for
    real, on that node against an empty folder of the same name."""

    def __init__(self, elsewhere: Path):
        self.elsewhere = elsewhere

    def remote(self, function):
        class Task:
            def options(self, **kwargs):
                node = kwargs["scheduling_strategy"].node_id
                return type("Bound", (), {"remote": lambda _, *args: (node, function, args)})()

        return Task()

    def wait(self, refs, num_returns=1, timeout=None):
        return list(refs), []

    def get(self, ref):
        node, function, (folder, token, cwd) = ref
        return function(str(self.elsewhere) if node == NODE_B else folder, token, cwd)


def test_a_node_that_cannot_see_out_is_named_and_nothing_starts(tmp_path):
    plan = ablate.plan_ablation("rewardweaver", ["rewardweaver"], [0], 2, 1, tmp_path / "out")
    plan.out.mkdir()
    elsewhere = tmp_path / "other-machine"
    elsewhere.mkdir()
    nodes = [{"id": NODE_A, "address": "10.0.0.1", "cpus": 1.0, "gpus": 0.0}]
    nodes.append({"id": NODE_B, "address": "10.0.0.2", "cpus": 1.0, "gpus": 0.0})
    executor = ablate_ray.RayExecutor(_NodeWithoutTheFolder(elsewhere), "10.0.0.1:6379", nodes, 1, 0, 2)
    with pytest.raises(ValueError) as refused:
        executor.check_folder(plan)
    message = str(refused.value)
    assert message.startswith(f"--executor ray: 1 Ray node(s) cannot see --out {plan.out.resolve()} or the working")
    assert f"10.0.0.2 ({socket.gethostname()}: not --out)" in message and "10.0.0.1" not in message
    assert list(plan.out.iterdir()) == []  # the probe file is gone again
    # a task on such a node (one that joined later) starts no run: the run fails, saying why
    log = tmp_path / "cell.log"
    code, note = ablate_ray._run_cell(["python"], str(tmp_path), str(log), 1, str(elsewhere / "ablation_settings.json"))
    assert code == 2 and note == f"Ray node {socket.gethostname()} cannot see {elsewhere} (no shared filesystem there)"
    assert not log.exists()
