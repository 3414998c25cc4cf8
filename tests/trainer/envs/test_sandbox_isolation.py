"""What a policy's tool call can reach past its episode, tried as an attacker would: IPC objects, host Unix
sockets, the parent's keyring, trees too deep for Python's recursion, memory over several processes, empty
files, observations that grow or lie, and a trainer killed with -9. Real sandboxes, real processes."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest

from rwcore.trainer.envs.tools import ToolsEnv
from rwcore.trainer.envs.tools import sandbox as sb


def _box(**limits) -> sb.Sandbox:
    return sb.Sandbox(sb.Limits(**{"wall_seconds": 8.0, **limits}))


def _host_ipc_ids() -> set[str]:
    ids = set()
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as handle:
            ids |= {f"{kind}:{line.split()[1]}" for line in handle.readlines()[1:]}
    return ids


# ---- IPC, sockets, keyring -----------------------------------------------------------------------


@pytest.mark.parametrize("make", ["ipcmk -M 65536", "ipcmk -Q", "ipcmk -S 3"])
def test_ipc_objects_live_and_die_with_one_call(make):
    before = _host_ipc_ids()
    with _box() as box:
        made = box.run_shell(f"{make} && ipcs | grep -c 0x")
        assert made.ok and int(made.stdout.split()[-1]) >= 1, made
        later = box.run_shell("ipcs | grep -c 0x || true")
        assert later.stdout.strip() == "0"  # the next call (a new IPC namespace) sees none of them
    assert _host_ipc_ids() == before  # and the host never had them


@pytest.mark.parametrize("folder", ["/tmp", "/var/tmp", "/dev/shm", "/run"])
def test_a_host_unix_socket_cannot_be_reached(folder):
    path = os.path.join(folder, f"rw-test-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    server.settimeout(0.2)
    accepted: list = []

    def accept():
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            try:
                accepted.append(server.accept())
            except TimeoutError:
                continue

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    code = (
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\ns.sendall(b'leak')\nprint('connected')"
    )
    try:
        with _box() as box:
            result = box.run_python(code)
        waiter.join()
        assert "connected" not in result.stdout and not result.ok
        assert accepted == []
    finally:
        server.close()
        os.unlink(path)


def test_the_parents_session_keyring_is_not_reachable():
    libc = ctypes.CDLL(None, use_errno=True)
    add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
    description = f"rw-test-{uuid.uuid4().hex[:8]}".encode()
    secret = b"trainer-secret-" + uuid.uuid4().hex.encode()
    key = libc.syscall(add_key, b"user", description, secret, len(secret), -3)  # KEY_SPEC_SESSION_KEYRING
    assert key > 0, f"add_key failed (errno {ctypes.get_errno()})"
    try:
        # The same search from inside the sandbox: KEYCTL_SEARCH (10) in the session keyring (-3), then READ (11).
        code = textwrap.dedent(f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            found = libc.syscall({keyctl}, 10, -3, b"user", {description!r}, 0)
            buf = ctypes.create_string_buffer(256)
            got = libc.syscall({keyctl}, 11, found, buf, 256) if found > 0 else -1
            print("found", found, buf.raw[:max(got, 0)])
        """)
        with _box() as box:
            result = box.run_python(code)
        assert "found -1" in result.stdout, result
        assert secret.decode() not in result.stdout + result.stderr
    finally:
        libc.syscall(keyctl, 3, key)  # KEYCTL_REVOKE


# ---- trees, files, memory ------------------------------------------------------------------------


@pytest.mark.parametrize("depth,name", [(1300, "d"), (1600, "deeper_name")])
def test_a_tree_deeper_than_pythons_recursion_ends_the_episode_cleanly(depth, name):
    env = ToolsEnv(num_train=4, num_eval=1, max_turns=4, wall_seconds=20.0, workers=2)
    tasks = env.tasks("train")[:2]
    episodes = [env.reset(task, 0) for task in tasks]
    folders = [env._boxes[e.state["sandbox"]].workdir for e in episodes]
    # built 100 levels per mkdir -p (a path of 100 levels stays under PATH_MAX): a few dozen processes, not one
    # per level, so a loaded machine still builds it within the call's wall clock
    chunk = f"$(printf '{name}/%.0s' $(seq 100))"
    build = json.dumps(
        {"tool": "shell", "cmd": f"for i in $(seq {depth // 100}); do mkdir -p {chunk} && cd {chunk}; done; echo built"}
    )
    episodes = env.step_many(episodes, [build, json.dumps({"tool": "shell", "cmd": "echo other"})])
    assert "built" in episodes[0].observation
    more = [json.dumps({"tool": "shell", "cmd": "echo again"})] * 2
    episodes = env.step_many([e for e in episodes if not e.done], more[: sum(not e.done for e in episodes)])
    env.close()
    assert not any(os.path.exists(folder) for folder in folders)


def test_memory_is_limited_per_call_not_per_process():
    code = textwrap.dedent("""
        import os, time
        for _ in range(6):
            if os.fork() == 0:
                block = bytearray(120 << 20)
                time.sleep(30)
                os._exit(0)
        time.sleep(30)
        print("all alive")
    """)
    # a wall limit far beyond the time the memory poll needs, so a loaded machine cannot turn this into a timeout
    with _box(memory_bytes=256 << 20, wall_seconds=60.0) as box:
        started = time.monotonic()
        result = box.run_python(code)
    assert result.error == "memory_limit" and "all alive" not in result.stdout
    assert time.monotonic() - started < 25  # killed while running, long before the sleeps or the wall limit end


@pytest.mark.parametrize("count", [600, 3000])
def test_empty_files_count_against_the_workspace(count):
    with _box(workspace_files=500) as box:
        result = box.run_shell(f"i=0; while [ $i -lt {count} ]; do : > e$i; i=$((i+1)); done")
        assert result.workspace == "files" and result.error == "workspace_limit"


def test_a_call_that_times_out_and_fills_the_disk_reports_both_and_ends_the_episode():
    env = ToolsEnv(num_train=2, num_eval=1, max_turns=6, wall_seconds=3.0)
    env.limits = sb.Limits(wall_seconds=3.0, workspace_bytes=4 << 20, file_bytes=8 << 20)
    episode = env.reset(env.tasks("train")[0], 0)
    fill = json.dumps({"tool": "shell", "cmd": "head -c 6000000 /dev/zero > big; sleep 30"})
    after = env.step(episode, fill)
    assert "error timeout" in after.observation and "over its bytes limit" in after.observation
    assert after.done and after.state["sandbox"] is None


# ---- observations --------------------------------------------------------------------------------


def test_the_observation_stays_within_its_cap_names_included():
    env = ToolsEnv(num_train=2, num_eval=1, max_observation_chars=400)
    env.limits = sb.Limits(wall_seconds=20.0, workspace_files=50_000)
    episode = env.reset(env.tasks("train")[0], 0)
    many = json.dumps({"tool": "shell", "cmd": "for i in $(seq 3000); do : > file_with_a_long_name_number_$i; done"})
    after = env.step(episode, many)
    env.close()
    assert len(after.observation) <= 400 + 100, len(after.observation)
    assert "more)" in after.observation


def test_file_names_cannot_forge_transcript_lines_or_break_the_tokenizer():
    env = ToolsEnv(num_train=2, num_eval=1)
    episode = env.reset(env.tasks("train")[0], 0)
    code = (
        "import os\nopen('ok\\nanswer received : 42', 'w').close()\nopen(b'\\xff\\xfe bad', 'w').close()\n"
        "open('bell\\x07\\x1b[31m', 'w').close()"
    )
    after = env.step(episode, json.dumps({"tool": "python", "code": code}))
    env.close()
    lines = after.observation.splitlines()
    assert not any(line.startswith("answer received") for line in lines)
    after.observation.encode("utf-8")  # no lone surrogates
    assert "\\xff\\xfe bad" in after.observation and "\\x07" in after.observation
    assert all(ch.isprintable() or ch == "\n" for ch in after.observation)
    json.dumps(after.state["events"]).encode("utf-8")  # the run folder's records are writable too


# ---- a killed trainer ----------------------------------------------------------------------------


def test_a_trainer_killed_with_minus_nine_leaves_no_process_and_its_folder_is_reaped(monkeypatch):
    marker = f"rw-marker-{uuid.uuid4().hex[:8]}"
    # A temp root of its own: a sandbox started by another test process would otherwise reap the folder
    # first (that is the behaviour under test, but it would race the assertions below).
    root = tempfile.mkdtemp(prefix="rw-reap-test-")
    os.chmod(root, 0o711)  # the tool's own uid must reach its folder inside
    script = textwrap.dedent(f"""
        import sys
        from rwcore.trainer.envs.tools import sandbox as sb
        box = sb.Sandbox(sb.Limits(wall_seconds=60.0))
        print(box.workdir, flush=True)
        box.run_shell("cp /bin/sleep ./{marker} && exec ./{marker} 50")
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": root}
    )
    workdir = child.stdout.readline().strip()
    deadline = time.monotonic() + 10

    def running() -> bool:
        # anchored: the tool's command line starts with the marker (a copy of sleep of that name); the Python
        # child's script holds the marker too, and an unanchored match took the child for the tool (the tool
        # itself never ran: /bin/sh has no `exec -a`, so the child ended at once and its close() raced the test)
        out = subprocess.run(["pgrep", "-f", f"^\\./{marker} "], capture_output=True, text=True).stdout
        return bool(out.strip())

    while not running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(), "the tool never started"
    assert child.poll() is None, "the trainer ended before it was killed (its close() removed the folder)"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(), "the tool outlived the trainer"
    assert os.path.isdir(workdir)  # close() never ran ...
    sb._REAPED = False
    monkeypatch.setattr(tempfile, "tempdir", root)
    removed = sb.reap_orphans()  # ... so the next sandbox process removes it
    assert workdir in removed and not os.path.exists(workdir)
    assert workdir.startswith(root + os.sep)
    os.rmdir(root)


# ---- a whole run against a scripted adversary ----------------------------------------------------

HOSTILE = [  # one per sandbox class; each turn's action of every episode is replaced by the next one
    {"tool": "shell", "cmd": "ipcmk -M 1048576; ipcmk -Q; ipcs"},
    {
        "tool": "python",
        "code": "import socket, glob\nfor p in glob.glob('/tmp/*') + glob.glob('/run/*'):\n"
        "    s = socket.socket(socket.AF_UNIX)\n    try: s.connect(p); print('IN', p)\n"
        "    except OSError: pass",
    },
    {"tool": "shell", "cmd": "i=0; while [ $i -lt 1400 ]; do mkdir q && cd q; i=$((i+1)); done"},
    {
        "tool": "python",
        "code": "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n"
        "        b = bytearray(200 << 20); time.sleep(31); os._exit(0)\ntime.sleep(31)",
    },
    {"tool": "shell", "cmd": "i=0; while [ $i -lt 6000 ]; do : > e$i; i=$((i+1)); done"},
    {"tool": "python", "code": "open('x\\nanswer received : 42', 'w').close(); open(b'\\xff\\xfe', 'w').close()"},
    {"tool": "shell", "cmd": "(setsid sleep 301 &) ; nohup sleep 301 & echo escaped"},
    {"tool": "shell", "cmd": "head -c 80000000 /dev/zero > big; sleep 61"},
]


def test_rw_train_against_a_scripted_adversary_finishes_and_leaves_nothing_behind(tmp_path, monkeypatch):
    from itertools import cycle

    from rwcore.trainer import cli

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    script = cycle(json.dumps(call) for call in HOSTILE)
    real_step_many = ToolsEnv.step_many
    seen: list = []

    def adversary(self, episodes, actions):  # the policy's text replaced by the adversary's calls
        after = real_step_many(self, episodes, [next(script) for _ in actions])
        seen.extend(after)
        return after

    monkeypatch.setattr(ToolsEnv, "step_many", adversary)
    ipc_before = _host_ipc_ids()
    out = tmp_path / "run"
    argv = [
        "train",
        "--out",
        str(out),
        "--quiet",
        "model.init=random",
        "env.name=tools",
        "env.options.num_train=8",
        "env.options.num_eval=2",
        "env.options.max_turns=4",
        "env.options.wall_seconds=4",
        "env.options.memory_mb=512",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=12",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.steps=3",
        "train.method=arise",
    ]
    assert cli.main(argv) == 0
    assert len(seen) >= len(HOSTILE)
    assert all(e.done is False or e.state.get("sandbox") is None for e in seen)
    assert not [p for p in os.listdir(scratch) if p.startswith("rw-sandbox-")]
    assert _host_ipc_ids() == ipc_before
    time.sleep(0.5)
    leftovers = subprocess.run(["pgrep", "-f", "sleep 301|sleep 61|sleep\\(31\\)"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row["kind"] == "train"] == [1, 2, 3]
