"""The tool sandbox under attack: every test tries to break out or to exhaust a resource, and checks that
the attempt failed and came back as a result (never an exception in the parent)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from rwcore.trainer.envs.tools.sandbox import Limits, Sandbox, SandboxUnavailable, ToolResult, detect_isolation

LIMITS = Limits(
    wall_seconds=10.0,
    cpu_seconds=2,
    memory_bytes=512 << 20,
    file_bytes=1 << 20,
    processes=32,
    output_bytes=2048,
    flood_bytes=256 << 10,
    workspace_bytes=8 << 20,
)


@pytest.fixture(scope="module")
def box():
    with Sandbox(LIMITS) as sandbox:
        yield sandbox


def test_namespace_isolation_is_what_auto_picks_here(box):
    # this machine can create network namespaces (root or user namespaces): "auto" must use them
    assert detect_isolation() == "namespace"
    assert box.isolation == "namespace"
    result = box.run_python("print(6 * 7)")
    assert result.ok and result.stdout == "42\n" and result.error is None


@pytest.fixture()
def loopback_server():
    """A TCP server on 127.0.0.1 that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    server.close()


def test_cannot_reach_a_loopback_server_from_python_or_shell(box, loopback_server):
    port, accepted = loopback_server
    # the server is reachable from here (so a refusal below is the sandbox's doing)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as probe:
        probe.sendall(b"parent")
    deadline = time.time() + 2
    while not accepted and time.time() < deadline:
        time.sleep(0.02)
    assert accepted == [b"parent"]
    code = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'escaped')\nprint('connected')"
    )
    result = box.run_python(code)
    assert not result.ok and "connected" not in result.stdout
    assert "Network is unreachable" in result.stderr or "Connection refused" in result.stderr
    shell = box.run_shell(
        f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
        f" || python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')\""
    )
    assert not shell.ok and "connected" not in shell.stdout
    time.sleep(0.3)
    assert accepted == [b"parent"]  # nothing from the sandbox arrived


def test_dns_and_http_fail(box):
    result = box.run_python(
        "import socket, urllib.request\n"
        "for call in (lambda: socket.getaddrinfo('example.com', 80), lambda: urllib.request.urlopen('http://1.1.1.1/', "
        "timeout=2)):\n"
        "    try:\n        call()\n        print('REACHED')\n    except OSError as exc:\n        print('failed', "
        "type(exc).__name__)\n"
    )
    assert result.ok, result.render()
    assert "REACHED" not in result.stdout and result.stdout.count("failed") == 2


def test_secrets_in_the_parent_environment_never_reach_the_tool(box, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123456")
    monkeypatch.setenv("RW_SECRET_TOKEN", "hunter2-secret")
    result = box.run_python(
        "import os, pathlib\nprint(sorted(os.environ))\n"
        "print(os.environ.get('OPENAI_API_KEY'), os.environ.get('RW_SECRET_TOKEN'))\n"
        f"try:\n    print(pathlib.Path('/proc/{os.getpid()}/environ').read_bytes()[:2000])\n"
        "except OSError as exc:\n    print('proc', type(exc).__name__)\n"
    )
    assert result.ok, result.render()
    assert "sk-test-secret" not in result.stdout and "hunter2" not in result.stdout
    assert result.stdout.splitlines()[0] == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"
    shell = box.run_shell("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert "sk-test-secret" not in shell.stdout and "hunter2" not in shell.stdout


def test_writes_outside_the_working_folder_fail(box, tmp_path):
    # The guarantee (module docstring, root mode): everything but the working folder is read-only for the
    # tool, world-writable places included, and it runs under its own unprivileged uid.
    assert os.geteuid() == 0 and box.own_uid  # this suite runs as root; the guarantee below is root mode's
    os.chmod(tmp_path, 0o777)  # even a folder anyone may write
    name = f"escaped-{os.path.basename(box.workdir)}.txt"
    attempts = {
        "python": box.run_python(f"open({str(tmp_path / 'py.txt')!r}, 'w').write('x')"),
        "relative": box.run_shell(f"echo x > ../{name}"),
        "tmp": box.run_shell(f"echo x > /tmp/{name}"),
        "shm": box.run_shell(f"echo x > /dev/shm/{name}"),
        "symlink": box.run_shell(f"ln -s {tmp_path} link; echo y > link/via-link.txt"),
        "chmod": box.run_shell(f"chmod 777 {os.path.dirname(box.workdir)}"),
    }
    for label, result in attempts.items():
        assert not result.ok, (label, result.render())
    assert "Read-only file system" in attempts["tmp"].stderr and "Read-only file system" in attempts["shm"].stderr
    assert sorted(os.listdir(tmp_path)) == []
    for folder in (os.path.dirname(box.workdir), "/tmp", "/dev/shm"):
        assert not os.path.exists(os.path.join(folder, name))
    # inside the folder it may write
    inside = box.run_shell("mkdir -p sub && echo ok > sub/f.txt && cat sub/f.txt")
    assert inside.ok and inside.stdout == "ok\n" and box.read_file("sub/f.txt") == "ok\n"
    # and the parent reading a file the tool planted as a symlink does not follow it out of the folder
    (tmp_path / "secret.txt").write_text("parent secret")
    box.run_shell(f"ln -sf {tmp_path / 'secret.txt'} planted.txt")
    assert box.read_file("planted.txt") is None
    with pytest.raises(ValueError, match="leaves the sandbox"):
        box.path("../x")


def test_infinite_loop_is_killed_at_the_time_limit():
    with Sandbox(Limits(wall_seconds=1.5, cpu_seconds=30)) as sandbox:
        start = time.monotonic()
        result = sandbox.run_python("while True:\n    pass")
        elapsed = time.monotonic() - start
    assert result.error == "timeout" and not result.ok and result.exit_code is None
    assert 1.4 <= elapsed < 8


def test_cpu_limit_kills_a_spinning_tool():
    with Sandbox(Limits(wall_seconds=30, cpu_seconds=1)) as sandbox:
        start = time.monotonic()
        result = sandbox.run_shell("while :; do :; done")
    assert result.error == "cpu_limit" and not result.ok
    assert time.monotonic() - start < 20


def test_sleeping_children_that_escape_the_process_group_die_with_the_call(box):
    # setsid puts the child in a new session; the PID namespace still takes it down with the call
    result = box.run_shell("setsid sh -c 'sleep 30' & echo started")
    assert result.ok and "started" in result.stdout
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == box.uid]
    assert leftovers == [] or not box.own_uid


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_fork_bomb_is_bounded(box):
    start = time.monotonic()
    result = box.run_python("import os\nn = 0\nwhile True:\n    os.fork()\n    n += 1\n")
    assert not result.ok
    assert time.monotonic() - start < LIMITS.wall_seconds + 6
    if box.own_uid:  # RLIMIT_NPROC on the tool's own uid
        assert "BlockingIOError" in result.stderr or "Resource temporarily unavailable" in result.stderr
    # nothing of it survives (the kernel reaps the killed processes asynchronously: give it a few seconds on a
    # loaded machine), and the sandbox still works
    deadline = time.monotonic() + 10
    while box.own_uid and time.monotonic() < deadline:
        if not [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == box.uid]:
            break
        time.sleep(0.1)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == box.uid] or not box.own_uid
    assert box.run_python("print('alive')").stdout == "alive\n"


def test_memory_hog_fails_inside_the_tool(box):
    result = box.run_python("x = bytearray(2 << 30)\nprint('allocated')")
    assert not result.ok and "allocated" not in result.stdout and "MemoryError" in result.stderr


def test_output_flood_is_cut_and_the_tool_killed(box):
    start = time.monotonic()
    result = box.run_python("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n")
    assert result.error == "output_limit" and not result.ok
    assert len(result.stdout) == LIMITS.output_bytes and result.truncated
    assert LIMITS.flood_bytes < result.output_bytes <= LIMITS.flood_bytes + 2 * 65536
    assert time.monotonic() - start < LIMITS.wall_seconds
    # a large but finite output is truncated, not killed
    big = box.run_shell("seq 1 20000")
    assert big.ok and big.truncated and big.stdout.startswith("1\n2\n3\n") and len(big.stdout) == LIMITS.output_bytes
    assert big.output_bytes == len("".join(f"{i}\n" for i in range(1, 20001)))


def test_huge_file_stops_at_the_file_size_limit(box):
    result = box.run_python(
        "f = open('huge.bin', 'wb')\nfor _ in range(64):\n    f.write(b'z' * (1 << 20))\nf.close()\nprint('wrote')"
    )
    assert not result.ok and "wrote" not in result.stdout
    assert "File too large" in result.stderr or result.error == "file_limit"
    assert os.path.getsize(os.path.join(box.workdir, "huge.bin")) <= LIMITS.file_bytes
    shell = box.run_shell("head -c 5000000 /dev/zero > big2.bin; echo status $?")
    assert os.path.getsize(os.path.join(box.workdir, "big2.bin")) <= LIMITS.file_bytes
    assert not shell.ok or "status 0" not in shell.stdout


def test_workspace_quota_is_reported_after_the_call():
    limits = Limits(wall_seconds=10, file_bytes=1 << 20, workspace_bytes=2 << 20)
    with Sandbox(limits) as sandbox:
        result = sandbox.run_shell("for i in 1 2 3 4; do head -c 900000 /dev/zero > f$i; done")
        assert result.error == "workspace_limit" and not result.ok
        assert result.changed == ("f1", "f2", "f3", "f4")


def test_files_written_by_the_parent_are_readable_and_changes_are_reported(box):
    box.write_file("data/in.csv", "a,b\n1,2\n")
    result = box.run_shell("cat data/in.csv && echo done > out.txt")
    assert result.ok and result.stdout == "a,b\n1,2\n"
    assert "out.txt" in result.changed and box.read_file("out.txt") == "done\n"


def test_bad_arguments_are_results_or_named_errors(box):
    assert box.run_python(None).error.startswith("bad_call")  # type: ignore[arg-type]
    assert box.run_shell(123).error.startswith("bad_call")  # type: ignore[arg-type]
    syntax = box.run_python("def (")
    assert not syntax.ok and "SyntaxError" in syntax.stderr
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="container")
    with pytest.raises(ValueError, match="limits.wall_seconds"):
        Limits(wall_seconds=0)
    with pytest.raises(ValueError, match="limits.flood_bytes"):
        Limits(output_bytes=100, flood_bytes=10)


def test_closed_sandbox_removes_its_folder_and_refuses_calls():
    sandbox = Sandbox(LIMITS)
    folder = sandbox.workdir
    sandbox.write_file("x.txt", "x")
    sandbox.close()
    assert not os.path.exists(folder)
    assert sandbox.run_python("print(1)").error.startswith("closed")


def test_unisolated_mode_is_opt_in_and_weaker_but_still_guards_python(monkeypatch):
    from rwcore.trainer.envs.tools import sandbox as module

    # on a machine without namespaces "auto" refuses, naming the option to opt in
    monkeypatch.setitem(module._PROBES, "namespace", None)
    with pytest.raises(SandboxUnavailable, match="isolation='none'"):
        Sandbox(LIMITS)
    with Sandbox(LIMITS, isolation="none") as weak:
        assert weak.run_shell("echo hi").error.startswith("unavailable")
        blocked = weak.run_python("import socket\nsocket.socket()")
        assert not blocked.ok and "socket.__new__ is not allowed" in blocked.stderr
        spawn = weak.run_python("import subprocess\nsubprocess.run(['true'])")
        assert not spawn.ok and "not allowed" in spawn.stderr
        assert weak.run_python("print(sum(range(10)))").stdout == "45\n"


def test_result_render_is_transcript_text():
    text = ToolResult(False, None, "out", "err", error="timeout", truncated=True, output_bytes=99).render()
    assert text.startswith("no exit code error timeout") and "stdout:\nout" in text and "99 bytes" in text


_NON_ROOT_SCRIPT = r"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("sandbox_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["sandbox_under_test"] = module
spec.loader.exec_module(module)
out = {"uid": os.geteuid()}
with module.Sandbox(module.Limits(wall_seconds=10, cpu_seconds=1)) as box:
    out["isolation"], out["own_uid"] = box.isolation, box.own_uid
    out["inside"] = box.run_shell("echo ok > f.txt && cat f.txt").stdout
    out["tmp"] = box.run_shell("echo x > /tmp/" + sys.argv[2]).stderr
    out["remount"] = box.run_shell("mount -o remount,rw / ; grep CapEff /proc/self/status").render()
    connect = "import socket\nsocket.create_connection(('127.0.0.1', int(%s)), 2)" % sys.argv[3]
    out["net"] = box.run_python(connect).stderr
    out["env"] = box.run_shell("env").stdout
    out["cpu"] = box.run_shell("while :; do :; done").error
print(json.dumps(out))
"""


def test_the_unprivileged_user_namespace_mode_keeps_the_same_file_and_network_guarantees(loopback_server, tmp_path):
    """Run as an ordinary user (uid 65534 via setpriv when this suite runs as root): the sandbox then uses an
    unprivileged user namespace, and must still cut the network, keep everything but its folder read-only
    and leave the tool without capabilities."""
    import json
    import subprocess
    import sys

    from rwcore.trainer.envs.tools import sandbox as module

    port, accepted = loopback_server
    name = f"rw-nonroot-escape-{os.getpid()}"
    python = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
    prefix = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"] if os.geteuid() == 0 else []
    done = subprocess.run(
        [*prefix, python, "-c", _NON_ROOT_SCRIPT, module.__file__, name, str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "SECRET_TOKEN": "s3cr3t-value"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["uid"] != 0 and out["isolation"] == "namespace" and out["own_uid"] is False
    assert out["inside"] == "ok\n"
    assert "Read-only file system" in out["tmp"] and not os.path.exists(f"/tmp/{name}")
    assert "CapEff:\t0000000000000000" in out["remount"]
    assert "Network is unreachable" in out["net"] and accepted == []
    assert "s3cr3t" not in out["env"]
    assert out["cpu"] == "cpu_limit"
