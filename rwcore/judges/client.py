"""The one chat-completions client behind `OpenAIJudge` and `OpenAIReflector`.

Talks to any OpenAI-compatible server (`vllm serve`, hosted APIs) through the `openai` package's
async client, and adds what judging at training scale needs: a concurrency limit, optional
requests- and tokens-per-minute limits, a hard per-attempt timeout, and retries with exponential
backoff and jitter on time-outs, connection errors, malformed response bodies, 429 (honouring
Retry-After) and 5xx — never on other 4xx, which a retry cannot fix. After the last attempt a
`ChatError` says what happened and how many attempts were made; callers turn it into INVALID
verdicts or a clear exception, never into a pass or a fail.

API keys: the key is read from the environment variable named by `api_key_env` each time a
session starts (once per `evaluate` call), lives only inside that session's `openai` client, and
is closed with it. No attribute of `ChatClient` (or of the judges holding one) contains it, so
repr, pickling, logs and caches cannot show it. In case a server echoes it back, error messages and
the reply text (also where JSON escapes spell it) are redacted of it, and of a password written into
`base_url`, before a caller sees them. When the variable is unset or empty:
- with `base_url` given (a self-hosted server such as vLLM, which accepts any key unless started
  with `--api-key`), the placeholder key "EMPTY" is sent; a server that does need a key answers
  401, which is not retried and becomes INVALID with the server's message;
- without `base_url` (and without the `openai` package's OPENAI_BASE_URL variable): the default
  OpenAI endpoint, which always needs a key, so the session refuses to start with
  `MissingAPIKeyError` naming the variable — before any request is made.
`api_key_env=None` always sends the placeholder (explicitly key-less servers).

Response size: every answer is read through a transport that stops once the body, on the wire or decoded,
passes `max_response_bytes` (rwcore.judges.transport); the call then fails with a `ChatError` saying so - not
retried, since the same server would send the same answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import logging
import math
import os
import random
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rwcore.judges.ratelimit import SlidingWindowLimiter
from rwcore.judges.transport import ResponseTooLarge, _bounded_transport

logger = logging.getLogger("rwcore.judges")

PLACEHOLDER_API_KEY = "EMPTY"
"""Sent when no key is configured for a `base_url` server (vLLM's documented convention)."""

_T = TypeVar("_T")


class MissingAPIKeyError(RuntimeError):
    """The default OpenAI endpoint was chosen but the API-key environment variable is unset."""


class ChatError(RuntimeError):
    """A chat request that failed for good: after `attempts` tries, or at once when not retryable.

    status: the HTTP status of the last answer, when there was one.
    """

    def __init__(self, message: str, *, attempts: int, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts
        self.status = status
        self.retryable = retryable


@dataclass(frozen=True)
class ChatReply:
    """A successful completion: the assistant's text (may be empty) and bookkeeping."""

    text: str
    attempts: int
    finish_reason: str | None = None
    total_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


USAGE_FIELDS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cache_hits",
    "retries",
    "rate_limited",
    "failed",
    "seconds",
)
"""What `Usage` counts (see there)."""


class Usage:
    """What one client's requests cost, counted as they happen (thread-safe; `snapshot()`).

    requests: HTTP requests sent (every attempt, retries included: what the server receives).
    prompt_tokens / completion_tokens: the server-reported `usage` of the successful answers.
    cache_hits: judgments (or diagnostics) served from the cache instead of a request.
    retries: attempts after a failed one. rate_limited: attempts the server answered 429.
    failed: requests that failed for good (after their retries). seconds: summed wall time of the attempts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(USAGE_FIELDS, 0)
        self._counts["seconds"] = 0.0

    def add(self, **amounts: float) -> None:
        unknown = set(amounts) - set(USAGE_FIELDS)
        if unknown:
            raise ValueError(f"unknown usage fields {sorted(unknown)}")
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._counts)


def usage_cost(usage: Mapping[str, float], price_in: float, price_out: float) -> float:
    """Money for `usage`: prompt tokens at `price_in` and completion tokens at `price_out` per million."""
    return (usage.get("prompt_tokens", 0) * price_in + usage.get("completion_tokens", 0) * price_out) / 1e6


def _positive(value, argument: str, *, allow_none: bool = False, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if integer:
        ok = ok and isinstance(value, int)
    if not ok:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{argument} must be {kind}{' or None' if allow_none else ''}, got {value!r}")


@dataclass(frozen=True)
class ClientOptions:
    """How to reach the server and how hard to try.

    model: the model name the server serves (for vLLM, the `--served-model-name`).
    base_url: e.g. "http://127.0.0.1:8000/v1"; None for the default OpenAI endpoint.
    api_key_env: name of the environment variable holding the key (see the module docstring).
    max_concurrency: requests in flight at once, per event loop.
    requests_per_minute / tokens_per_minute: optional sliding-window limits; a request's tokens
        are estimated as (prompt characters / 4) + max_tokens (1024 when None) and corrected to the
        server-reported usage afterwards.
    timeout: seconds one attempt may take, end to end. max_retries: retries after the first try.
    max_response_bytes: the most bytes one answer may have, on the wire and decoded (8 MiB; a chat
        completion is a few KiB), see the module docstring.
    backoff: (base, cap) seconds; retry k waits min(cap, base * 2**(k-1)) scaled by a random
        factor in [0.5, 1], or the server's Retry-After when longer (at most retry_after_cap).
    temperature: sampling temperature (None leaves it to the server). max_tokens: completion cap.
    seed: passed through when set. extra_body: extra JSON fields for the request body (e.g.
        vLLM's `chat_template_kwargs`); it must not hold secrets — it is shown by repr.
    """

    model: str
    base_url: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    max_concurrency: int = 8
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout: float = 60.0
    max_retries: int = 3
    backoff: tuple[float, float] = (0.5, 8.0)
    temperature: float | None = 0.0
    max_tokens: int | None = 2048
    seed: int | None = None
    extra_body: Mapping[str, Any] | None = field(default=None, hash=False)
    retry_after_cap: float = 60.0
    max_response_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be a non-empty string, got {self.model!r}")
        if self.base_url is not None and (not isinstance(self.base_url, str) or not self.base_url.strip()):
            raise ValueError(f"base_url must be a non-empty string or None, got {self.base_url!r}")
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str) or not self.api_key_env.strip()):
            raise ValueError(f"api_key_env must be an environment variable name or None, got {self.api_key_env!r}")
        _positive(self.max_concurrency, "max_concurrency", integer=True)
        _positive(self.requests_per_minute, "requests_per_minute", allow_none=True)
        _positive(self.tokens_per_minute, "tokens_per_minute", allow_none=True)
        _positive(self.timeout, "timeout")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        backoff = self.backoff
        if (
            not isinstance(backoff, (tuple, list))
            or len(backoff) != 2
            or any(
                isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 0 for b in backoff
            )
            or backoff[0] > backoff[1]
        ):
            raise ValueError(f"backoff must be (base, cap) seconds with 0 <= base <= cap, got {backoff!r}")
        object.__setattr__(self, "backoff", (float(backoff[0]), float(backoff[1])))
        if self.temperature is not None and (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not 0.0 <= self.temperature <= 2.0
        ):
            raise ValueError(f"temperature must be in [0, 2] or None, got {self.temperature!r}")
        _positive(self.max_tokens, "max_tokens", allow_none=True, integer=True)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.extra_body is not None and not isinstance(self.extra_body, Mapping):
            raise ValueError(f"extra_body must be a mapping or None, got {type(self.extra_body).__name__}")
        if (
            isinstance(self.retry_after_cap, bool)
            or not isinstance(self.retry_after_cap, (int, float))
            or not self.retry_after_cap >= 0
        ):
            raise ValueError(f"retry_after_cap must be a number >= 0, got {self.retry_after_cap!r}")
        _positive(self.max_response_bytes, "max_response_bytes", integer=True)


def resolve_api_key(options: ClientOptions) -> str:
    """The key to send now (see the module docstring); MissingAPIKeyError for the default endpoint."""
    if options.api_key_env is None:
        return PLACEHOLDER_API_KEY
    key = os.environ.get(options.api_key_env, "").strip()
    if key:
        return key
    # The openai client falls back to OPENAI_BASE_URL when base_url is None: that is a chosen server too.
    if options.base_url is None and not os.environ.get("OPENAI_BASE_URL", "").strip():
        raise MissingAPIKeyError(
            f"api_key_env: environment variable {options.api_key_env!r} is not set, and the default OpenAI "
            "endpoint needs a key; set it, or pass base_url= for a server that needs none"
        )
    return PLACEHOLDER_API_KEY


def estimate_tokens(messages: Sequence[Mapping[str, str]], max_tokens: int | None) -> int:
    """A rough request size for the tokens-per-minute limit: prompt characters / 4 plus the completion cap."""
    characters = sum(len(message.get("content") or "") for message in messages)
    return characters // 4 + 8 * len(messages) + (max_tokens if max_tokens is not None else 1024)


def _retry_after_seconds(headers) -> float | None:
    """Retry-After (seconds or an HTTP date) or retry-after-ms, when the server sent one."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(float(value) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


class _Malformed(Exception):
    """A 200 answer that is not a usable chat completion."""


def _usage_tokens(response) -> tuple[int | None, int | None, int | None]:
    """(total, prompt, completion) tokens of the server's `usage`, each None when absent or not an int."""
    usage = getattr(response, "usage", None)
    values = [
        getattr(usage, name, None) if usage is not None else None
        for name in ("total_tokens", "prompt_tokens", "completion_tokens")
    ]
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None for v in values)


def _reply_parts(response) -> tuple[str, str | None, int | None]:
    choices = getattr(response, "choices", None)
    if not choices:
        raise _Malformed("the response has no choices")
    first = choices[0]
    message = getattr(first, "message", None)
    content = getattr(message, "content", None) if message is not None else None
    if content is None:
        content = ""  # e.g. a refusal or a tool call: an answer with no verdicts in it
    if not isinstance(content, str):
        raise _Malformed(f"message content is {type(content).__name__}, not text")
    usage = getattr(response, "usage", None)
    total = getattr(usage, "total_tokens", None) if usage is not None else None
    return content, getattr(first, "finish_reason", None), total if isinstance(total, int) else None


class ChatClient:
    """Shared state of one judge or reflector: options, rate limiters, per-loop concurrency limits.

    Use `async with client.session() as session: await session.complete(messages)`.
    Safe to use from several event loops and threads; the limits are shared by all of them
    (the concurrency limit is per event loop).
    """

    def __init__(self, options: ClientOptions) -> None:
        if not isinstance(options, ClientOptions):
            raise ValueError(f"options must be a ClientOptions, got {type(options).__name__}")
        self.options = options
        self._setup()

    def _setup(self) -> None:
        options = self.options
        self._rpm = (
            SlidingWindowLimiter(options.requests_per_minute, argument="requests_per_minute")
            if options.requests_per_minute is not None
            else None
        )
        self._tpm = (
            SlidingWindowLimiter(options.tokens_per_minute, argument="tokens_per_minute")
            if options.tokens_per_minute is not None
            else None
        )
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._random = random.Random()
        self.usage = Usage()  # what this client's requests cost (metrics rows: judge/*, reflector/*)

    # Pickling keeps only the options (locks and loop-bound objects are rebuilt), so a judge can
    # be sent to worker processes; there is no key to leak in either direction.
    def __getstate__(self) -> dict:
        return {"options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.options = state["options"]
        self._setup()

    def __repr__(self) -> str:
        o = self.options
        return f"ChatClient(model={o.model!r}, base_url={o.base_url!r}, api_key_env={o.api_key_env!r})"

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._lock:
            semaphore = self._semaphores.get(loop)
            if semaphore is None:
                semaphore = asyncio.Semaphore(self.options.max_concurrency)
                self._semaphores[loop] = semaphore
            return semaphore

    def backoff_delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        base, cap = self.options.backoff
        delay = min(cap, base * (2.0 ** (retry - 1))) * self._random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.options.retry_after_cap))
        return delay

    def redactor(self) -> Callable[[str], str]:
        """A function that replaces the secrets a session started now would know (see `ChatSession.redact`)
        by "***": for text that did not come through a session, such as a cache entry written by a
        version that did not redact replies. The key lives only in the returned function."""
        try:
            key = resolve_api_key(self.options)
        except MissingAPIKeyError:
            key = PLACEHOLDER_API_KEY
        secrets = _secrets(key, self.options.base_url)
        return lambda text: _redact(text, secrets)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[ChatSession]:
        """An open connection pool with the key read from the environment now; closed on exit."""
        import openai  # imported here so `import rwcore.judges` works without the package

        key = resolve_api_key(self.options)
        transport = _bounded_transport(self.options.max_response_bytes)
        client = openai.AsyncOpenAI(
            api_key=key,
            base_url=self.options.base_url,
            max_retries=0,
            timeout=self.options.timeout + 5.0,
            http_client=openai.DefaultAsyncHttpxClient(transport=transport),
        )
        try:
            yield ChatSession(self, client, key)
        finally:
            await client.close()


# \uXXXX or \/ preceded by an even number of backslashes (so the backslash is an escape, not escaped).
_ASCII_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\(?:u00([2-7][0-9a-fA-F])|/)")


def _url_passwords(base_url: str | None) -> tuple[str, ...]:
    """The password in base_url's user information, as written and percent-decoded; () when none."""
    if not base_url:
        return ()
    import urllib.parse

    try:
        password = urllib.parse.urlsplit(base_url).password
    except ValueError:
        return ()
    return (password, urllib.parse.unquote(password)) if password else ()


def _secrets(key: str, base_url: str | None) -> tuple[str, ...]:
    """What a session knows to be secret: the API key, and a password written into base_url (httpx sends
    it as Basic auth). One shorter than 4 characters is left alone: redacting it would rewrite ordinary
    words. Longest first, so that a secret containing another is redacted whole."""
    found = {key, *_url_passwords(base_url)}
    return tuple(sorted((s for s in found if s != PLACEHOLDER_API_KEY and len(s) >= 4), key=len, reverse=True))


def _redact(text, secrets: Sequence[str]):
    if not isinstance(text, str):
        return text
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _unescape_ascii(match: re.Match) -> str:
    char = chr(int(match.group(2), 16)) if match.group(2) is not None else "/"
    if char in '"\\' or char == "\x7f":
        return match.group(0)
    return match.group(1) + char


class ChatSession:
    """One open client; `complete` sends a chat request with the limits, time-out and retries."""

    def __init__(self, owner: ChatClient, client, key: str) -> None:
        self._owner = owner
        self._client = client
        self._secrets = _secrets(key, owner.options.base_url)

    def __repr__(self) -> str:
        return f"ChatSession({self._owner!r})"

    def _scrub(self, text: str) -> str:
        # Redacted before cutting, so that a secret across the cut is not left half-shown.
        return self.redact(text)[:1000]

    def scrub(self, text: str) -> str:
        """`text` without this session's secrets (and cut to 1000 characters): for error messages."""
        return self._scrub(str(text))

    def redact(self, text: str) -> str:
        """`text` with this session's secrets (API key, base_url password) replaced by "***", whole (for
        what a reply carries)."""
        return _redact(text, self._secrets)

    def _redact_reply(self, text: str) -> str:
        # A key echoed inside a JSON string may be spelled with \u or \/ escapes that the parsers later decode;
        # escapes of printable ASCII other than '"' and '\' mean the same character there, so when a secret
        # shows up only with them written out, the text is used in that spelling (and the secret redacted).
        if self._secrets and ("\\u" in text or "\\/" in text):
            plain = _ASCII_ESCAPE.sub(_unescape_ascii, text)
            if any(secret in plain for secret in self._secrets):
                text = plain
        return self.redact(text)

    def _classify(self, error: Exception) -> tuple[str, bool, int | None, float | None]:
        """(message, retryable, status, retry_after) for a failed attempt; re-raises unknown errors."""
        import openai

        timeout = self._owner.options.timeout
        # Not retried: the same server would send the same oversized answer again. Depending on the openai
        # release it arrives as is or as the cause of an APIConnectionError.
        for cause in (error, error.__cause__):
            if isinstance(cause, ResponseTooLarge):
                return str(cause), False, None, None
        if isinstance(error, (asyncio.TimeoutError, TimeoutError, openai.APITimeoutError)):
            return f"timed out after {timeout:g} s", True, None, None
        if isinstance(error, openai.APIStatusError):
            status = error.status_code
            message = f"HTTP {status}: {error.message}"
            if status == 429:
                return message, True, status, _retry_after_seconds(error.response.headers)
            return message, status >= 500, status, None
        if isinstance(error, openai.APIConnectionError):
            return f"connection error: {error.message}", True, None, None
        if isinstance(error, (openai.APIResponseValidationError, _Malformed, ValueError)):
            # A body that is not JSON or not a chat completion: a glitch a retry may fix.
            return f"malformed response: {error}", True, None, None
        raise error

    async def complete(
        self, messages: Sequence[Mapping[str, str]], response_format: Mapping[str, Any] | None = None
    ) -> ChatReply:
        """The assistant's reply to `messages`; ChatError after the last failed attempt.

        response_format: sent as the request's `response_format` when given (structured outputs,
        e.g. {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}); a server that
        does not support it answers 400 / 422, which is not retried (the caller decides).
        """
        options = self._owner.options
        request: dict[str, Any] = {"model": options.model, "messages": [dict(m) for m in messages]}
        if response_format is not None:
            request["response_format"] = dict(response_format)
        if options.temperature is not None:
            request["temperature"] = options.temperature
        if options.max_tokens is not None:
            request["max_tokens"] = options.max_tokens
        if options.seed is not None:
            request["seed"] = options.seed
        if options.extra_body:
            request["extra_body"] = dict(options.extra_body)
        estimate = estimate_tokens(messages, options.max_tokens)
        attempt = 0
        while True:
            attempt += 1
            usage = self._owner.usage
            async with self._owner._semaphore():
                # Limits are taken inside the concurrency slot so that a grant's time is the send time.
                if self._owner._rpm is not None:
                    await self._owner._rpm.acquire(1)
                tokens = await self._owner._tpm.acquire(estimate) if self._owner._tpm is not None else None
                usage.add(requests=1, retries=1 if attempt > 1 else 0)
                sent = time.monotonic()
                try:
                    try:
                        response = await asyncio.wait_for(
                            self._client.chat.completions.create(**request), timeout=options.timeout
                        )
                    finally:
                        usage.add(seconds=time.monotonic() - sent)
                    text, finish_reason, total = _reply_parts(response)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # classified, unknown ones re-raised
                    message, retryable, status, retry_after = self._classify(error)
                    if status == 429:
                        usage.add(rate_limited=1)
                else:
                    if tokens is not None and total is not None:
                        tokens.settle(total)
                    _, prompt, completion = _usage_tokens(response)
                    usage.add(prompt_tokens=prompt or 0, completion_tokens=completion or 0)
                    return ChatReply(self._redact_reply(text), attempt, finish_reason, total, prompt, completion)
            message = self._scrub(message)
            if not retryable or attempt > options.max_retries:
                usage.add(failed=1)
                suffix = f" (after {attempt} attempts)" if attempt > 1 else ""
                raise ChatError(message + suffix, attempts=attempt, status=status, retryable=retryable)
            delay = self._owner.backoff_delay(attempt, retry_after)
            logger.warning(
                "chat request to %s failed (%s); retry %d/%d in %.2f s",
                options.model,
                message,
                attempt,
                options.max_retries,
                delay,
            )
            await asyncio.sleep(delay)


def run_sync(awaitable: Awaitable[_T]) -> _T:
    """Runs a coroutine to completion from synchronous code.

    Uses `asyncio.run` when no event loop runs in this thread; inside a running loop (a notebook,
    an async trainer calling the sync API) it runs the coroutine on a fresh loop in a worker
    thread instead of failing.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awaitable)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rwcore-judge") as pool:
        return pool.submit(asyncio.run, awaitable).result()
