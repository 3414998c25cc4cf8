"""What a server's answer can do to the client: compressed bombs, oversized bodies, an echoed API key,
and a damaged judge cache. Every case runs against a real HTTP server on loopback (or real files)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import resource
import socket
import sqlite3
import threading
import time
import zlib

import pytest
from _util import SMALL_LOOP, chat_trajectory, child_env, overrides_with, rw_command
from judge_server import (
    ChatServer,
    Reply,
    all_pass,
    completion,
    loopback_without_proxy,  # noqa: F401 - autouse fixture
    verdict_line,
)

from rwcore.judges import OpenAIJudge
from rwcore.judges.cache import MAX_ENTRY_BYTES, JudgmentCache, cache_key
from rwcore.judges.client import ChatClient, ChatError, ClientOptions, run_sync
from rwcore.types import RubricJudgment, RubricSpec
from rwcore.verdict import Verdict

KEY_ENV = "RWCORE_TEST_CLIENT_KEY"
SECRET = "sk-hardening-7Qx2-never-in-a-file"
RUBRIC = RubricSpec("cites-order-id", "The agent cites the order id before issuing a refund.")


def _compressed(payload_head: bytes, padding: int, coding: str) -> bytes:
    """payload_head + `padding` spaces, compressed in `coding` without building the plain text."""
    wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[coding]
    encoder = zlib.compressobj(9, zlib.DEFLATED, wbits)
    parts = [encoder.compress(payload_head)]
    block = b" " * (1 << 20)
    for _ in range(padding >> 20):
        parts.append(encoder.compress(block))
    parts.append(encoder.flush())
    return b"".join(parts)


def _complete(server: ChatServer, **options) -> str:
    client = ChatClient(
        ClientOptions(
            model="m",
            base_url=server.base_url,
            api_key_env=KEY_ENV,
            timeout=20.0,
            max_retries=2,
            backoff=(0.01, 0.02),
            **options,
        )
    )

    async def go():
        async with client.session() as session:
            return (await session.complete([{"role": "user", "content": "hi"}])).text

    return run_sync(go())


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- compressed and oversized answers -----------------------------------------------------------


@pytest.mark.parametrize(
    "coding,header", [("gzip", "gzip"), ("gzip", "x-gzip"), ("deflate", "deflate"), ("raw-deflate", "deflate")]
)
def test_a_compressed_bomb_is_refused_without_expanding_it(serve, key, coding, header):
    # A valid completion followed by 384 MiB of JSON whitespace: about 380 KB compressed. Expanded
    # whole (as httpx does by default), this process would grow by the decoded size at least.
    head = json.dumps(completion("fine"))[:-1].encode()  # the object left open: whitespace is still JSON
    body = _compressed(head, 384 << 20, coding)
    server = serve(lambda request: Reply(body=body, headers={"content-encoding": header}))
    before = _max_rss_bytes()
    with pytest.raises(ChatError) as caught:
        _complete(server, max_response_bytes=1 << 20)
    grown = _max_rss_bytes() - before
    assert "max_response_bytes" in caught.value.message
    assert caught.value.attempts == 1 and server.count == 1  # the same server would send the same bomb
    assert grown < 128 << 20, f"peak RSS grew by {grown >> 20} MiB"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
def test_a_compressed_answer_within_the_bound_is_decoded(serve, key, coding):
    text = "verdict text " * 500
    plain = json.dumps(completion(text)).encode()
    wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[coding]
    encoder = zlib.compressobj(6, zlib.DEFLATED, wbits)
    body = encoder.compress(plain) + encoder.flush()
    server = serve(lambda request: Reply(body=body, headers={"content-encoding": coding.replace("raw-", "")}))
    assert _complete(server, max_response_bytes=len(plain) + 10) == text


def test_a_doubly_compressed_answer_is_decoded_within_the_bound(serve, key):
    plain = json.dumps(completion("twice")).encode()
    inner = zlib.compressobj(6, zlib.DEFLATED, 31)
    once = inner.compress(plain) + inner.flush()
    outer = zlib.compressobj(6, zlib.DEFLATED, 31)
    twice = outer.compress(once) + outer.flush()
    server = serve(lambda request: Reply(body=twice, headers={"content-encoding": "gzip, gzip"}))
    assert _complete(server) == "twice"


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br"])
def test_an_encoding_that_was_not_asked_for_is_refused(serve, key, encoding):
    server = serve(lambda request: Reply(body=b"\x00" * 64, headers={"content-encoding": encoding}))
    with pytest.raises(ChatError) as caught:
        _complete(server)
    assert "not asked for" in caught.value.message and caught.value.attempts == 1
    request = server.requests[0]
    assert request.headers["accept-encoding"] == "gzip, deflate"


@pytest.mark.parametrize("size", [(1 << 16) + 1, 3 << 20])
def test_an_answer_larger_than_the_bound_on_the_wire_is_refused(serve, key, size):
    head = json.dumps(completion("x"))[:-1]
    body = (head + " " * (size - len(head) - 1) + "}").encode()
    assert len(body) == size
    server = serve(lambda request: Reply(body=body))
    with pytest.raises(ChatError) as caught:
        _complete(server, max_response_bytes=1 << 16)
    assert "max_response_bytes" in caught.value.message and caught.value.attempts == 1


def test_an_answer_exactly_at_the_bound_is_read(serve, key):
    head = json.dumps(completion("edge"))[:-1]
    size = 1 << 16
    body = (head + " " * (size - len(head) - 1) + "}").encode()
    server = serve(lambda request: Reply(body=body))
    assert _complete(server, max_response_bytes=size) == "edge"


def test_max_response_bytes_is_checked():
    for bad in (0, -1, 1.5, True, None, math.inf):
        with pytest.raises(ValueError, match="max_response_bytes"):
            ClientOptions(model="m", max_response_bytes=bad)


# ---- chunked transfer, nested codings, many refusals in a row ------------------------------------


class ChunkedServer:
    """A loopback HTTP/1.1 server that answers every request with a chunked body: `chunks()` gives the
    chunks, each written and flushed on its own after `pause` seconds (judge_server speaks HTTP/1.0, which
    has no chunked transfer). Stops writing when the client hangs up; `sent` counts the body bytes."""

    def __init__(self, chunks, headers: dict | None = None, pause: float = 0.0) -> None:
        self.chunks, self.headers, self.pause, self.sent = chunks, headers or {}, pause, 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
            while len(body) < length:
                body += connection.recv(65536)
            extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
            try:
                connection.sendall(
                    (
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        f"transfer-encoding: chunked\r\nconnection: close\r\n{extra}\r\n"
                    ).encode()
                )
                for chunk in self.chunks():
                    if self._stop.is_set():
                        return
                    if self.pause:
                        time.sleep(self.pause)
                    connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.sent += len(chunk)
                connection.sendall(b"0\r\n\r\n")
            except OSError:  # the client hung up: what a bounded reader does
                pass

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()


@pytest.fixture
def chunked():
    servers: list[ChunkedServer] = []

    def start(chunks, **kwargs) -> ChunkedServer:
        servers.append(ChunkedServer(chunks, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_a_chunked_stream_longer_than_the_default_bound_is_cut_off(chunked, key):
    # A valid completion padded with 64 MiB of whitespace, chunked (no Content-Length to check up front):
    # read whole, it would parse; the default bound (8 MiB) stops reading early.
    head = json.dumps(completion("fine"))[:-1].encode()

    def chunks():
        yield head
        for _ in range(64 * 16):
            yield b" " * (64 << 10)
        yield b"}"

    server = chunked(chunks)
    with pytest.raises(ChatError) as caught:
        _complete(server)
    assert "max_response_bytes" in caught.value.message and "on the wire" in caught.value.message
    assert caught.value.attempts == 1
    # What the server got rid of includes what the kernel's socket buffers took (several MiB on loopback).
    assert server.sent < 32 << 20, f"the server wrote {server.sent >> 20} MiB of 64"


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_chunked_compressed_bomb_is_refused_under_the_default_bound(chunked, key, coding):
    # 96 MiB of JSON whitespace, compressed to about 100 KB and sent in 4 KiB chunks.
    body = _compressed(json.dumps(completion("fine"))[:-1].encode(), 96 << 20, coding)
    server = chunked(
        lambda: (body[i : i + 4096] for i in range(0, len(body), 4096)), headers={"content-encoding": coding}
    )
    with pytest.raises(ChatError) as caught:
        _complete(server)
    assert "decoded answer is larger than max_response_bytes=8388608" in caught.value.message


def test_a_nested_encoding_is_decoded_when_it_arrives_a_few_bytes_at_a_time(chunked, key):
    # "deflate, gzip": zlib-wrapped deflate inside gzip. The first few bytes of gzip decode to nothing, so
    # the inner stage must wait for its own first byte before telling zlib-wrapped from raw deflate.
    plain = json.dumps(completion("nested")).encode()
    inner = zlib.compressobj(6, zlib.DEFLATED, 15)
    once = inner.compress(plain) + inner.flush()
    outer = zlib.compressobj(6, zlib.DEFLATED, 31)
    twice = outer.compress(once) + outer.flush()
    server = chunked(
        lambda: (twice[i : i + 3] for i in range(0, len(twice), 3)),
        headers={"content-encoding": "deflate, gzip"},
        pause=0.002,
    )
    assert _complete(server) == "nested"


def test_a_nested_bomb_that_pads_after_the_inner_stream_is_refused(chunked, key):
    # The inner gzip member holds a whole valid completion; the outer stream goes on with 64 MiB of
    # zeros after it, about 1 MiB per 1 KiB chunk. Read past the inner end, that padding would be kept
    # (or decoded) without a bound; it counts against max_response_bytes like any other output.
    inner = zlib.compressobj(6, zlib.DEFLATED, 31)
    member = inner.compress(json.dumps(completion("fine")).encode()) + inner.flush()
    outer = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = outer.compress(member) + b"".join(outer.compress(b"\0" * (1 << 20)) for _ in range(64)) + outer.flush()
    server = chunked(
        lambda: (body[i : i + 1024] for i in range(0, len(body), 1024)),
        headers={"content-encoding": "gzip, gzip"},
        pause=0.001,
    )
    with pytest.raises(ChatError) as caught:
        _complete(server, max_response_bytes=4 << 20)
    assert "max_response_bytes" in caught.value.message


def test_refused_bombs_do_not_accumulate_in_memory(serve, key):
    # 24 bombs of 64 MiB, 8 at a time, under the default bound (8 MiB). Whatever a refused answer had
    # decoded must be freed with it: kept alive (e.g. by a traceback in a reference cycle), 24 of them
    # would hold ~190 MiB; decoded whole, one alone would take 64 MiB.
    import asyncio
    import gc
    import tracemalloc

    body = _compressed(json.dumps(completion("fine"))[:-1].encode(), 64 << 20, "gzip")
    server = serve(
        lambda request: (
            Reply("warm") if request.user == "warm up" else Reply(body=body, headers={"content-encoding": "gzip"})
        )
    )
    client = ChatClient(
        ClientOptions(
            model="m", base_url=server.base_url, api_key_env=KEY_ENV, timeout=20.0, max_retries=0, max_concurrency=8
        )
    )

    async def one(session):
        with pytest.raises(ChatError, match="max_response_bytes"):
            await session.complete([{"role": "user", "content": "hi"}])

    async def go():
        async with client.session() as session:
            # One good answer first, outside the measure: the first request imports and builds the
            # openai client's response types, which is not what this test is about.
            assert (await session.complete([{"role": "user", "content": "warm up"}])).text == "warm"
            gc.collect()
            gc.disable()  # the cyclic collector would hide what only it frees
            tracemalloc.start()
            await asyncio.gather(*(one(session) for _ in range(24)))
            return tracemalloc.get_traced_memory()

    try:
        held, peak = run_sync(go())
    finally:
        tracemalloc.stop()
        gc.enable()
    assert server.count == 25
    print(f"24 refused answers: {held / 2**20:.1f} MiB still held, peak {peak / 2**20:.1f} MiB")
    # Measured: 6 MiB held (tracebacks, kept while the collector is off), 15 MiB peak; one refused answer's
    # decoded part is 8 MiB, so holding 4 of the 24 fails, as does decoding one whole.
    assert held < 32 << 20, f"{held >> 20} MiB still held after 24 refused answers"
    assert peak < 32 << 20, f"peak traced memory {peak >> 20} MiB over 24 refused answers"


# ---- an API key echoed by the server ------------------------------------------------------------


def _escaped(text: str, every: int) -> str:
    """`text` with every `every`-th character written as a JSON \\u escape (still the same string)."""
    return "".join(f"\\u{ord(c):04x}" if i % every == 0 else c for i, c in enumerate(text))


@pytest.mark.parametrize("spelling", ["plain", "escaped-all", "escaped-some", "twice", "mixed"])
def test_an_echoed_key_never_reaches_the_judgment_or_the_cache(serve, key, tmp_path, spelling):
    spelled = {
        "plain": key,
        "escaped-all": _escaped(key, 1),
        "escaped-some": _escaped(key, 3),
        "twice": key + " and " + key,
        "mixed": key + " and " + _escaped(key, 2),
    }[spelling]

    def script(request):
        line = verdict_line(request, RUBRIC.rubric_id, "pass")
        # Written into the JSON text by hand so that the escapes reach the client as escapes.
        line = line.replace('"evidence": "', f'"evidence": "the header said {spelled}; ', 1)
        diag = json.dumps({"request_id": request.request_id, "uncovered": ["x"]}).replace(
            '["x"]', f'["seen {spelled} in turn 1"]'
        )
        return Reply(line + "\n" + diag)

    server = serve(script)
    judge = OpenAIJudge(
        "judge-test",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        timeout=5.0,
        max_retries=0,
        cache_dir=tmp_path / "cache",
    )
    [report] = judge.evaluate([chat_trajectory()], [RUBRIC])
    judgment = report.judgments[RUBRIC.rubric_id]
    assert judgment.verdict == Verdict.PASS
    assert "the header said ***" in judgment.evidence and key not in judgment.evidence
    assert report.uncovered and all(key not in note for note in report.uncovered)
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert files
    for path in files:  # the database, its write-ahead log (where new entries are first) and its index
        assert key.encode() not in path.read_bytes(), path
    assert b"***" in b"".join(path.read_bytes() for path in files)


def test_a_reply_without_the_key_is_passed_through_unchanged(serve, key):
    text = 'quote \\u0041 and "\\\\u0042" and \\u00e9 stay as they were'
    server = serve(lambda request: Reply(text))
    assert _complete(server) == text  # no key in it: nothing is rewritten


def test_a_key_with_slashes_echoed_as_json_escapes_is_redacted_from_the_reply_text(serve, monkeypatch):
    # A base64-like key echoed by an encoder that writes "/" as "\\/" (PHP's json_encode does): the reply
    # text does not contain the key, but whatever parses it as JSON (the reflector's proposals) would.
    slashed = "sk-b64/Qx7+tail/9z=="
    monkeypatch.setenv(KEY_ENV, slashed)
    spelled = slashed.replace("/", "\\/")
    server = serve(lambda request: Reply('{"definition": "the agent sends ' + spelled + '", "n": 1}'))
    text = _complete(server)
    assert slashed not in json.loads(text)["definition"] and "***" in text


def test_a_password_in_base_url_is_redacted_like_the_key(serve, key, tmp_path):
    password = "pw-Zq81-in-the-url"

    def script(request):
        line = verdict_line(request, RUBRIC.rubric_id, "pass")
        return Reply(line.replace('"evidence": "', f'"evidence": "auth was judge:{password}; ', 1))

    server = serve(script)
    url = server.base_url.replace("http://", f"http://judge:{password}@")
    judge = OpenAIJudge(
        "judge-test",
        base_url=url,
        api_key_env=KEY_ENV,
        timeout=5.0,
        max_retries=0,
        diagnostics=False,
        cache_dir=tmp_path / "cache",
    )
    [report] = judge.evaluate([chat_trajectory()], [RUBRIC])
    judgment = report.judgments[RUBRIC.rubric_id]
    assert judgment.verdict == Verdict.PASS and "auth was judge:***" in judgment.evidence
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert files and all(password.encode() not in p.read_bytes() for p in files)


# ---- a damaged cache ----------------------------------------------------------------------------


def _raw_values(cache) -> dict[bytes, object]:
    """Every row's stored value, by key, read from the database as another program would."""
    with contextlib.closing(sqlite3.connect(cache.path)) as raw:
        return dict(raw.execute("SELECT key, value FROM verdicts").fetchall())


def _rewrite(cache, key_: str, value) -> None:
    """Replaces the stored value of `key_` behind the cache's back (another version, a bad disk)."""
    with contextlib.closing(sqlite3.connect(cache.path)) as raw, raw:
        assert raw.execute("UPDATE verdicts SET value = ? WHERE key = ?", (value, bytes.fromhex(key_))).rowcount == 1


def _stored(tmp_path, **entry_fields):
    cache = JudgmentCache(tmp_path)
    key_ = cache_key("judgment", model="m", rubric="r", trajectory="t")
    good = RubricJudgment("r", Verdict.PASS, score=0.8, confidence=0.9, evidence="e")
    assert cache.put_judgment(key_, good, model="m")
    entry = json.loads(_raw_values(cache)[bytes.fromhex(key_)])
    entry.update(entry_fields)
    return cache, key_, entry


BAD_FIELDS = [
    {"score": 1.0001},
    {"score": -0.25},
    {"score": 7},
    {"score": "0.5"},
    {"score": True},
    {"confidence": 1.5},
    {"confidence": -1e-9},
    {"confidence": [0.5]},
    {"verdict": "MAYBE"},
    {"verdict": "INVALID"},
    {"verdict": None},
    {"verdict": "NA", "score": 0.5},
    {"evidence": ["quoted"]},
    {"evidence": 12},
    {"format": 0},
    {"format": 1},
    {"kind": "diagnostics"},
]


@pytest.mark.parametrize("fields", BAD_FIELDS, ids=[json.dumps(f) for f in BAD_FIELDS])
def test_an_out_of_range_cache_entry_is_a_logged_miss(tmp_path, caplog, fields):
    cache, key_, entry = _stored(tmp_path, **fields)
    _rewrite(cache, key_, json.dumps(entry).encode())
    with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
        assert cache.get_judgment(key_, "r") is None
    assert fields.get("verdict") == "INVALID" or any("a miss" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_score_in_the_cache_is_a_miss(tmp_path, number):
    cache, key_, entry = _stored(tmp_path)
    text = json.dumps(entry).replace('"score": 0.8', f'"score": {number}')
    assert number in text
    _rewrite(cache, key_, text.encode())
    assert cache.get_judgment(key_, "r") is None


@pytest.mark.parametrize("uncovered", [None, "one note", [1, 2], ["fine", None], {"a": "b"}])
def test_a_diagnostics_entry_of_the_wrong_shape_is_a_logged_miss(tmp_path, caplog, uncovered):
    cache = JudgmentCache(tmp_path)
    key_ = cache_key("diagnostics", model="m", pool="p", trajectory="t")
    cache.put_uncovered(key_, ("turn 0: a note",), model="m")
    assert cache.get_uncovered(key_) == ("turn 0: a note",)
    entry = json.loads(_raw_values(cache)[bytes.fromhex(key_)])
    _rewrite(cache, key_, json.dumps({**entry, "uncovered": uncovered}).encode())
    with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
        assert cache.get_uncovered(key_) is None
    assert any("a miss" in r.getMessage() for r in caplog.records)


def test_an_entry_written_with_the_key_in_it_is_judged_again_and_replaced(serve, key, tmp_path, caplog):
    # What a version that did not redact replies left on disk: the key in a cached judgment's evidence and
    # in cached diagnostics. Served as is, it would carry the key into the run folder.
    server = serve(all_pass)
    judge = OpenAIJudge(
        "judge-test",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        timeout=5.0,
        max_retries=0,
        cache_dir=tmp_path / "cache",
    )
    judge.evaluate([chat_trajectory()], [RUBRIC])
    assert server.count == 1
    values = _raw_values(judge.cache)
    assert len(values) == 2
    for blob, value in values.items():
        entry = json.loads(value)
        if entry["kind"] == "judgment":
            entry["evidence"] = f"the server said {key}"
        else:
            entry["uncovered"] = [f"turn 0: key {key} seen"]
        _rewrite(judge.cache, blob.hex(), json.dumps(entry).encode())
    with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
        [report] = judge.evaluate([chat_trajectory()], [RUBRIC])
    assert server.count == 2
    assert key not in report.judgments[RUBRIC.rubric_id].evidence and all(key not in u for u in report.uncovered)
    assert all(key not in r.getMessage() for r in caplog.records)
    assert sum("holds a secret" in r.getMessage() for r in caplog.records) == 2
    assert all(key.encode() not in value for value in _raw_values(judge.cache).values())
    judge.cache.close()  # the log is folded into the database: the overwritten bytes are in neither
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert files and all(key.encode() not in p.read_bytes() for p in files)


def test_a_good_entry_is_still_a_hit(tmp_path):
    cache, key_, entry = _stored(tmp_path)
    judgment = cache.get_judgment(key_, "relabelled")
    assert judgment == RubricJudgment("relabelled", Verdict.PASS, score=0.8, confidence=0.9, evidence="e")


ENTRY_KINDS = ["oversized", "truncated", "deep-json", "not-utf8", "a-number", "a-float", "a-list", "a-string"]


@pytest.mark.parametrize("kind", ENTRY_KINDS)
def test_a_cache_entry_that_is_not_a_small_json_object_is_a_miss_without_hanging(tmp_path, caplog, kind):
    # What is at the database's path itself (a FIFO, a symlink, a directory, /dev/zero, not a database):
    # tests/rwcore/judges/test_judge_cache_store.py.
    cache, key_, entry = _stored(tmp_path)
    good = json.dumps(entry).encode()
    value = {
        "oversized": good[:-1] + b" " * (MAX_ENTRY_BYTES + 1) + b"}",
        "truncated": good[: len(good) // 2],
        "deep-json": b"[" * 100_000 + b"]" * 100_000,
        "not-utf8": b"\xff\xfe" + good,
        "a-number": 42,
        "a-float": 0.5,
        "a-list": json.dumps([entry]).encode(),
        "a-string": json.dumps(json.dumps(entry)).encode(),
    }[kind]
    _rewrite(cache, key_, value)
    result: list = []
    with caplog.at_level(logging.WARNING, logger="rwcore.judges"):
        worker = threading.Thread(target=lambda: result.append(cache.get_judgment(key_, "r")), daemon=True)
        worker.start()
        worker.join(timeout=10)
    assert not worker.is_alive(), f"reading a {kind} entry hung"
    assert result == [None]
    assert any("a miss" in r.getMessage() and key_ in r.getMessage() for r in caplog.records)


def test_a_judge_with_damaged_entries_asks_the_server_again_and_the_run_goes_on(serve, key, tmp_path):
    server = serve(all_pass)
    judge = OpenAIJudge(
        "judge-test",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        timeout=5.0,
        max_retries=0,
        cache_dir=tmp_path / "cache",
    )
    judge.evaluate([chat_trajectory()], [RUBRIC])
    assert server.count == 1
    [(blob, value)] = [(b, v) for b, v in _raw_values(judge.cache).items() if b'"judgment"' in v]
    _rewrite(judge.cache, blob.hex(), json.dumps({**json.loads(value), "score": 3.5}).encode())
    [report] = judge.evaluate([chat_trajectory()], [RUBRIC])
    assert report.judgments[RUBRIC.rubric_id].verdict == Verdict.PASS and server.count == 2
    assert json.loads(_raw_values(judge.cache)[blob])["score"] is None  # overwritten by the new answer
    _rewrite(judge.cache, blob.hex(), b"{truncated")
    [report] = judge.evaluate([chat_trajectory()], [RUBRIC])
    assert report.judgments[RUBRIC.rubric_id].verdict == Verdict.PASS and server.count == 3
    # The database itself replaced by a FIFO (it hung the run when entries were files): a new judge over
    # the folder refuses it and asks the server.
    judge.cache.close()
    for path in (tmp_path / "cache").iterdir():
        path.unlink()
    os.mkfifo(judge.cache.path)
    again = OpenAIJudge(
        "judge-test",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        timeout=5.0,
        max_retries=0,
        cache_dir=tmp_path / "cache",
    )
    result: list = []
    worker = threading.Thread(target=lambda: result.append(again.evaluate([chat_trajectory()], [RUBRIC])), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "a FIFO at the cache's path hung the judge"
    [[report]] = result
    assert report.judgments[RUBRIC.rubric_id].verdict == Verdict.PASS and server.count == 4


# ---- a whole `rw train` against a server that answers every request with a bomb ------------------


def test_rw_train_against_a_server_of_compressed_bombs_stays_under_one_gib(serve, key, tmp_path):
    """Arise on the embedded environment with the judge and the reflection model on a server whose
    every answer is 512 KB of gzip that expands to 512 MiB: the run finishes (the verdicts INVALID, the
    reflections skipped), and the process's peak RSS stays under 1 GiB."""
    import subprocess
    import sys

    head = json.dumps(completion("fine"))[:-1].encode()
    bomb = _compressed(head, 512 << 20, "gzip")
    server = serve(lambda request: Reply(body=bomb, headers={"content-encoding": "gzip"}))
    run = tmp_path / "run"
    overrides = overrides_with(
        SMALL_LOOP,
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "pool.delta_pool=2",
        "train.steps=3",
        "train.method=arise",
        "judge.kind=openai",
        "judge.model=judge-test",
        f"judge.base_url={server.base_url}",
        f"judge.api_key_env={KEY_ENV}",
    )
    # The child's peak RSS, read by a parent that has no other children.
    measure = (
        "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
    )
    env = child_env(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    done = subprocess.run(
        [sys.executable, "-c", measure, *rw_command("train", "--quiet", "--out", str(run), *overrides)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peak = int(done.stdout.split("MAXRSS")[-1].split()[0]) * 1024
    print(f"rw train peak RSS against gzip bombs: {peak / 2**20:.0f} MiB; {server.count} requests")
    assert server.count >= 3
    assert peak < 1 << 30, f"peak RSS {peak / 2**20:.0f} MiB"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row.get("kind") == "train"]
    assert len(train) == 3 and all(row["invalid_rate"] == 1.0 for row in train if row["judgments"])
