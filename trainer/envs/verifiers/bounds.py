"""What rwcore keeps of the texts and scores a verifiers environment hands over: every text is cut (`cut`:
`MAX_TEXT` characters, names `MAX_NAME`), and a reward or metric that returns a long string is refused where it
returns, without copying it (verifiers' float() would copy it into its error message).
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Mapping

MAX_TEXT = 65536  # characters kept of any one text the environment hands over (an observation, an error)
MAX_NAME = 200  # characters kept of a reward, metric or stop-condition name
_SHORT = 64  # a reward or metric value given as a longer string is refused unread (verifiers would copy it)


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """`text` with at most `limit` characters kept, the rest replaced by "... [N characters cut]"."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} characters cut]"


def _let_go(error: BaseException) -> None:
    """Clears the finished frames of `error`'s tracebacks (its causes' too), so that what they held - a huge
    value a reward returned - is freed now rather than when the garbage collector finds the cycles an
    exception's traceback makes."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def message_text(messages, limit: int = MAX_TEXT) -> str:
    """The text of a verifiers prompt or turn (a string, or messages: their text parts, images dropped), cut
    to `limit` characters (`cut`) without joining what is cut."""
    from verifiers.v1.types import content_text

    if messages is None:
        return ""
    if isinstance(messages, str):
        return cut(messages, limit)
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
        text = content_text(content) if not isinstance(content, str) else content
        if text:
            parts.append(text)
    total = sum(len(p) for p in parts) + 2 * max(0, len(parts) - 1)
    if total <= limit:
        return "\n\n".join(parts)
    head, size = [], 0
    for part in parts:
        if size + len(part) >= limit:
            head.append(part[: max(0, limit - size)])
            break
        head.append(part)
        size += len(part) + 2
    kept = "\n\n".join(head)[:limit]
    return f"{kept}... [{total - len(kept)} characters cut]"


def _too_long(kind: str, name, value) -> str:
    """Why a reward or metric value is refused unread ("" when it is not): a long string (or bytes), which
    verifiers' float() would copy into its error message."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > _SHORT:
        unit = "characters" if isinstance(value, str) else "bytes"
        return (
            f"{kind} {cut(str(name), MAX_NAME)!r} returned a {type(value).__name__} of {len(value)} {unit}, "
            "not a number"
        )
    return ""


def _refuse_long(kind: str, name, value) -> None:
    why = _too_long(kind, name, value)
    if why:
        raise TypeError(why)


def _guarded(fn, kind: str):
    """`fn` (a task's reward or metric) whose long-string result is refused where it is returned, so that it
    is freed before the episode's thread lets another episode run (verifiers gathers the results first)."""

    @functools.wraps(fn)
    async def guarded(*args, **kwargs):
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        items = value.items() if isinstance(value, Mapping) else [(fn.__name__, value)]
        why = next((w for w in (_too_long(kind, k, v) for k, v in items) if w), "")
        if why:
            del value, items  # nothing this frame keeps (its traceback outlives the raise) holds the string
            raise TypeError(why)
        return value

    return guarded


def _guard_hooks(task) -> None:
    """Makes `task.hooks("reward" / "metric")` give the functions guarded (`_guarded`); once per task."""
    if getattr(task, "_rwcore_guarded", False):
        return
    hooks = task.hooks

    def guarded_hooks(attr: str):
        fns = hooks(attr)
        return [_guarded(fn, attr) for fn in fns] if attr in ("reward", "metric") else fns

    try:
        task.hooks = guarded_hooks
        task._rwcore_guarded = True
    except (AttributeError, TypeError):  # a task that takes no attributes: the trace's own guard remains
        pass


@functools.cache
def _trace_class():
    """verifiers' `Trace` with what it records from the environment bounded: reward and metric values given
    as long strings are refused unread, and a recorded error keeps its message cut and its frames only."""
    from verifiers.v1.errors import stop_condition
    from verifiers.v1.trace import Error, Trace

    class BoundedTrace(Trace):
        def record_reward(self, name, value, weight=1.0):
            _refuse_long("reward", name, value)
            super().record_reward(name, value, weight)

        def record_metric(self, name, value):
            _refuse_long("metric", name, value)
            super().record_metric(name, value)

        def record_error(self, error):
            self.errors.append(
                Error(
                    type=type(error).__name__,
                    message=cut(str(error)),
                    status_code=getattr(error, "status_code", None),
                    traceback=cut("".join(traceback.format_tb(error.__traceback__))),
                )
            )
            self.ok = False
            self.stop(stop_condition(error))

    return BoundedTrace
