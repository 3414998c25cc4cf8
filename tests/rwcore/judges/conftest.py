"""Fixtures of the judge tests: the API key a test module's judges read, and scripted chat servers on loopback."""

import pytest
from judge_server import ChatServer


@pytest.fixture
def key(monkeypatch, request):
    """Sets the test module's KEY_ENV to its SECRET for the test (the judges read the key from there); the SECRET."""
    monkeypatch.setenv(request.module.KEY_ENV, request.module.SECRET)
    return request.module.SECRET


@pytest.fixture
def serve():
    """`serve(script)` starts a ChatServer answering with `script` and returns it; every one is stopped after the
    test."""
    servers: list[ChatServer] = []

    def start(script) -> ChatServer:
        server = ChatServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
