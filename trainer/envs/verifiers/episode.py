"""One rwcore episode of a verifiers environment (`EpisodeRun`), and the ways it ends other than by its own
scoring: `_TERMINATE` (rw train's turn limit), `SetupError` (the environment cannot be trained as configured),
`EnvironmentFault` (it raised a BaseException or was abandoned).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import uuid

_TERMINATE = object()  # handed to a parked turn when rw train ends the episode (its turn limit)


class EnvironmentFault(Exception):
    """An episode's failure that is no ordinary exception of the environment: it raised a BaseException
    (SystemExit, KeyboardInterrupt, GeneratorExit, one of its own) or was abandoned (its message says which)."""


class SetupError(ValueError):
    """The environment cannot be trained through rwcore as configured (raised to the caller, not a partner
    failure): e.g. it runs the trained seat twice in one episode."""


class EpisodeRun:
    """One rwcore episode: one `Env.run_episode` on an event loop of its own, in a thread of its own.

    `event` is set whenever the coroutine waits for the trained seat's message (`pending` holds the
    observation) or has ended (`future` done: the verifiers Episode, or the exception that ended it); the
    rwcore thread waits on it. The environment's clock (`Bridge.spent`) runs from `turn_start` (its start,
    or the agent's message handed in; None while it waits for the agent) less the time it waited for its
    turn behind other episodes (`queued`, and the wait under way since `queued_since`)."""

    def __init__(self, task, seed: int, first_prefix: str) -> None:
        self.id = uuid.uuid4().hex
        self.task = task
        self.seed = seed
        self.first_prefix = first_prefix  # the task's own system prompt when it is not the environment's
        self.event = threading.Event()
        self.pending: tuple[str, asyncio.Future] | None = None
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.terminating = False
        self.fatal = ""  # a SetupError message
        self.trained_traces = 0
        self.timed_out = False
        self.abandoned = False  # its thread may still run, but nothing it does is read any more
        self.turn_start: float | None = None
        self.queued = 0.0
        self.queued_since: float | None = None
        self.random_state = random.Random(seed).getstate()  # the episode's own stream of the global `random`
        self.running = False  # its thread runs environment code (holds the turn, or lost it while running)
        self.section_start: float | None = None  # when it last took the turn (it runs since, not yielding)
        self.section_cpu: float | None = None  # its thread's CPU time then (read by the watchdog)
        self.section_seen: float | None = None  # the section_start that section_cpu belongs to
        self.probe: tuple[float, float, float] | None = None  # (section_start, time, CPU time) last read
        self.loop: asyncio.AbstractEventLoop | None = None
        self.main: asyncio.Task | None = None
        self.thread: threading.Thread | None = None


class _RunContext:
    """What `Env.run_episode` hands to `_episode_agents`: the rwcore run (verifiers passes it through)."""

    def __init__(self, run: EpisodeRun) -> None:
        self.run = run
