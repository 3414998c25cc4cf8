"""The HTTP transport every chat session reads its answers through, bounded in size.

Every answer is read through `_BoundedTransport`, which stops reading once the body on the wire (after
chunked transfer decoding) passes `max_response_bytes` or its decoded form (gzip / deflate, nested or not,
decompressed incrementally in 64 KiB steps) passes it, and refuses content encodings it did not ask for (br,
zstd, ...). A compressed bomb therefore costs at most about `max_response_bytes` of memory, and the call
fails with a `ChatError` saying so (rwcore.judges.client) - not retried, since the same server would send
the same answer.
"""

from __future__ import annotations

import zlib


class ResponseTooLarge(Exception):
    """An answer whose body, on the wire or decoded, passed `max_response_bytes`, or came in an encoding
    that was not asked for."""


_ACCEPTED_ENCODINGS = "gzip, deflate"


_DECODE_STEP = 64 << 10
"""Bytes one decompression call may produce: the bound is checked every 64 KiB of output, and decoding
never allocates one buffer of max_response_bytes at once."""


def _decoder(encoding: str, limit: int):
    """A function bytes -> list of bytes that decodes one `Content-Encoding` chain incrementally, never
    producing more than `limit` bytes in all, at any stage (ResponseTooLarge beyond)."""
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip() and c.strip().lower() != "identity"]
    for coding in codings:
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise ResponseTooLarge(
                f"the server answered in content encoding {coding!r}, which was not asked for "
                f"(Accept-Encoding: {_ACCEPTED_ENCODINGS})"
            )
    # Applied in reverse order of the header (the last coding was applied last). wbits=47 reads gzip or
    # zlib; raw deflate is what some servers send for "deflate", tried when the zlib header is absent.
    stages: list = [zlib.decompressobj(47) if c != "deflate" else None for c in reversed(codings)]
    # What each stage has produced: the decoded answer at the last, an inner compressed stream before it.
    # Each is bounded, so that a nested bomb cannot pile up an inner stream, not even past the inner end.
    produced = [0] * len(stages)

    def push(index: int, data: bytes, out: list[bytes]) -> None:
        if index == len(stages):
            out.append(data)
            return
        stage = stages[index]
        if stage is None:  # "deflate": zlib-wrapped or raw, decided on its first byte
            if not data:
                return
            stage = stages[index] = zlib.decompressobj(47 if data[:1] == b"\x78" else -15)
        while not stage.eof:
            piece = stage.decompress(data, _DECODE_STEP)
            data = stage.unconsumed_tail
            produced[index] += len(piece)
            if produced[index] > limit:
                raise ResponseTooLarge(f"the decoded answer is larger than max_response_bytes={limit}")
            if piece:
                push(index + 1, piece, out)
            # A full step may leave output pending inside zlib even with no input left: ask again.
            if not data and len(piece) < _DECODE_STEP:
                break
        # Bytes after the end of a stream (trailing data, a second gzip member) are not decoded, as in httpx;
        # they are not kept either.

    def feed(chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        try:
            push(0, chunk, out)
        except BaseException:
            out.clear()  # not kept alive by the traceback (see _read_bounded)
            raise
        return out

    return feed


def _bounded_transport(limit: int):
    """An httpx async transport that reads each answer itself, bounded on the wire and decoded.

    Wraps the default transport; returns a response whose body is already decoded (no
    Content-Encoding left for httpx to expand without a bound).
    """
    httpx = _openai_httpx()

    class _BoundedTransport(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            return await _read_bounded(self._inner, request, limit)

        async def aclose(self) -> None:
            await self._inner.aclose()

    return _BoundedTransport()


def _openai_httpx():
    """The HTTP package the installed `openai` is built on (`httpx`, or `httpx2` in newer releases): the
    transport must use its classes, since the client asserts on them."""
    import importlib

    import openai

    base = next(c for c in type.mro(openai.DefaultAsyncHttpxClient)[1:] if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.split(".")[0])


async def _read_bounded(inner, request, limit: int):
    httpx = _openai_httpx()
    request.headers["Accept-Encoding"] = _ACCEPTED_ENCODINGS
    response = await inner.handle_async_request(request)
    parts: list[bytes] = []
    try:
        feed = _decoder(response.headers.get("content-encoding", ""), limit)
        raw = 0
        async for chunk in response.aiter_raw():
            raw += len(chunk)
            if raw > limit:
                raise ResponseTooLarge(f"the answer is larger than max_response_bytes={limit} on the wire")
            parts.extend(feed(chunk))
    except BaseException:
        # The exception's traceback keeps this frame, and the openai client's handling puts it in a reference
        # cycle that only the cyclic collector frees - which large byte strings do not prompt: without this,
        # each refused answer held up to max_response_bytes (32 bombs: +270 MiB peak RSS).
        parts.clear()
        raise
    finally:
        await response.aclose()
    headers = [
        (k, v)
        for k, v in response.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(
        response.status_code, headers=headers, content=b"".join(parts), request=request, extensions=response.extensions
    )
