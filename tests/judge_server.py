"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 for the judge tests.

`ChatServer(script)` listens on an ephemeral loopback port in a background thread and answers
every POST .../chat/completions with `script(request)`, a `Reply`: a status, a body (by default
a chat completion whose assistant message is `content`), headers and an optional delay. It
records every request and the highest number of requests it was serving at once.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

_BEGIN = re.compile(r"<<<BEGIN_UNTRUSTED_DATA ([0-9a-f]+)>>>")


@dataclass
class Reply:
    """What the server answers. `body` (bytes, str or a JSON-able object) overrides `content`."""

    content: str | None = None
    status: int = 200
    body: object = None
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    finish_reason: str = "stop"


@dataclass
class Request:
    """One request as the server saw it."""

    path: str
    headers: dict
    body: dict

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", [])

    @property
    def system(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "system"), "")

    @property
    def user(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "user"), "")

    @property
    def request_id(self) -> str:
        match = _BEGIN.search(self.user)
        assert match, "no data block in the user message"
        return match.group(1)

    @property
    def data(self):
        """The JSON payload between the data markers of the user message."""
        lines = self.user.split("\n")
        assert len(lines) == 3, "the data block must be exactly three lines"
        return json.loads(lines[1])

    def _operator_list(self, heading: str) -> list[dict]:
        start = self.system.index(heading)
        start = self.system.index("[", start)
        value, _ = json.JSONDecoder().raw_decode(self.system, start)
        return value

    @property
    def rubric_ids(self) -> list[str]:
        """The rubric ids a judge request asks for, in order."""
        return [r["rubric_id"] for r in self._operator_list("## Rubrics to evaluate")]

    @property
    def wants_diagnostics(self) -> bool:
        return "## Uncovered behaviours" in self.system

    @property
    def pool_ids(self) -> list[str]:
        return [r["rubric_id"] for r in self._operator_list("## Uncovered behaviours")]

    @property
    def candidate_ids(self) -> list[str]:
        """The capability ids a failure-attribution request asks for."""
        return [c["capability_id"] for c in self._operator_list("## Candidate capabilities")]


@pytest.fixture(autouse=True)
def loopback_without_proxy(monkeypatch):
    """Keeps an HTTP(S)_PROXY of the machine running the tests away from loopback requests.

    Test modules import this fixture, which makes it autouse there.
    """
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")


def completion(content: str | None, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "judge-test",
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address) -> None:
        # A client that gave up (time-out test) leaves a broken pipe behind: expected, not noise.
        pass


class ChatServer:
    """See the module docstring. Use as a context manager or call start() / stop()."""

    def __init__(self, script: Callable[[Request], Reply]) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> ChatServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # http.server naming
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"{}"))
                with owner._lock:
                    owner.requests.append(request)
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    if not self.path.endswith("/chat/completions"):
                        reply = Reply(status=404, body={"error": {"message": "not found"}})
                    else:
                        reply = owner.script(request)
                    if reply.delay:
                        owner._stopping.wait(reply.delay)
                    if reply.body is None:
                        body = json.dumps(completion(reply.content, reply.finish_reason)).encode()
                    elif isinstance(reply.body, bytes):
                        body = reply.body
                    elif isinstance(reply.body, str):
                        body = reply.body.encode()
                    else:
                        body = json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    headers = {"content-type": "application/json", **reply.headers}
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (TimeoutError, BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with owner._lock:
                        owner.in_flight -= 1

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def verdict_line(request: Request, rubric_id: str, verdict: str = "pass", **fields) -> str:
    """One verdict object as a judge would write it for `request`."""
    obj = {
        "request_id": request.request_id,
        "rubric_id": rubric_id,
        "verdict": verdict,
        "confidence": 0.9,
        "evidence": f"turn 1: evidence for {rubric_id}",
        **fields,
    }
    return json.dumps(obj)


def diagnostics_line(request: Request, uncovered: list[str]) -> str:
    return json.dumps({"request_id": request.request_id, "diagnostics": {"uncovered": uncovered}})


def all_pass(request: Request) -> Reply:
    """A well-behaved judge: pass for every requested rubric, plus diagnostics when asked."""
    lines = [verdict_line(request, rubric_id) for rubric_id in request.rubric_ids]
    if request.wants_diagnostics:
        lines.append(diagnostics_line(request, ["turn 0: the agent never restates the goal"]))
    return Reply("\n".join(lines))
