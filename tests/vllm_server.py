"""ONE real vLLM OpenAI-compatible server per pytest session, shared by every test that needs one.

Usage (the fixture is registered in tests/conftest.py, nothing to import):

    def test_something(vllm_server):
        vllm_server.base_url     # "http://127.0.0.1:<port>/v1" (loopback only)
        vllm_server.model        # the served model name, "judge-tiny"
        vllm_server.log          # the server's log file (Path)

`vllm_server` is also a `str` equal to base_url, so `OpenAIJudge("judge-tiny", base_url=vllm_server, ...)`
works as before. The server runs a tiny random model (tests/scripts/vllm_judge_model.py: one layer, head_dim 64,
a byte-level tokenizer built locally; nothing is downloaded) on the CPU with vLLM's OpenAI API server
entry point (--max-model-len 8192, float32, --enforce-eager, --seed 0); it starts on first use (about 45 s
on an idle 2-core machine) and is killed at the end of the session. Its free text is random bytes: use
structured outputs (the judge's default) for parsable answers, and small max_tokens for free text.
No API key is needed (api_key_env=None).

vLLM comes from the test set-up (RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh): this Python when it
has vllm, else RWCORE_VLLM_PYTHON, else the shared environment ~/.cache/rwcore/venv*-vllm. Its absence is
a set-up failure, not a skip.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _util import free_port

HERE = Path(__file__).parent
START_TIMEOUT = 420  # seconds; about a minute on an idle 2-core machine
MODEL = "judge-tiny"


def vllm_python() -> str:
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    candidates = [os.environ.get("RWCORE_VLLM_PYTHON", "")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.cache/rwcore/venv*-vllm/bin/python")))
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    raise AssertionError(
        "vLLM is missing: run the tests after RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh "
        "(or point RWCORE_VLLM_PYTHON at a Python that has vllm)"
    )


class VLLMServer(str):
    """The running server: a str (its base_url) with .base_url, .model and .log."""

    base_url: str
    model: str
    log: Path

    def __new__(cls, base_url: str, model: str, log: Path) -> VLLMServer:
        self = super().__new__(cls, base_url)
        self.base_url, self.model, self.log = base_url, model, log
        return self


def start_server(folder: Path):
    """Builds the tiny model in `folder` and starts the server; returns (process, VLLMServer, log handle)."""
    model = folder / "model"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, str(HERE / "scripts" / "vllm_judge_model.py"), str(model)],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    log_path = folder / "server.log"
    log = open(log_path, "w")
    started = time.monotonic()
    # cwd outside the repository: its kernels/ folder would shadow the `kernels` package transformers probes
    process = subprocess.Popen(
        [
            vllm_python(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "8192",
            "--enforce-eager",
            "--seed",
            "0",
        ],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the vLLM server exited ({process.returncode}):\n" + log_path.read_text()[-4000:])
            try:
                with opener.open(base_url + "/models", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - started > START_TIMEOUT:
                raise AssertionError(
                    f"the vLLM server did not start within {START_TIMEOUT} s:\n" + log_path.read_text()[-4000:]
                )
            time.sleep(1.0)
    except BaseException:
        stop_server(process, log)
        raise
    print(f"vLLM server up after {time.monotonic() - started:.0f} s")
    return process, VLLMServer(base_url, MODEL, log_path), log


def stop_server(process, log) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    log.close()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The session's real vLLM server (see the module docstring)."""
    process, server, log = start_server(tmp_path_factory.mktemp("vllm-server"))
    try:
        yield server
    finally:
        stop_server(process, log)
