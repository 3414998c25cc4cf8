"""The threads that run a verifiers environment's episodes for rw train, each isolated from the others.

`Bridge` runs each rwcore episode as one `Env.run_episode` coroutine on an event loop of its own, in a
daemon thread of its own. When the environment asks the trained seat for a turn (`interaction.turn(...)` or
`agent.run(task)`), the coroutine parks the request: the text the agent is shown becomes the rwcore
episode's observation, and the coroutine resumes when `rw train` hands in the policy's message. Seats other
than the trained one (a modeled user, an opponent) are served by an LLM partner over an OpenAI-compatible
API (rwcore.trainer.envs.llm_partner).

Isolation - nothing one episode's environment does stops the others or the run:
- Turns: the episode threads take turns running environment code (`_Baton`, first come first served), so
  episodes interleave as coroutines of one loop would and environments that rely on asyncio's single
  thread behave as in verifiers (TextArena seeds the global `random` and draws from it between two
  awaits); each episode keeps its own stream of the global `random`, the trainer's is left as it was.
- Time: each episode's environment has `wait_timeout` seconds of wall clock from the moment it gets the
  turn (its start, or the agent's message handed in) until it asks for the agent's next message or ends,
  not counting the time it waited for its turn behind other episodes. The watchdog thread abandons an
  episode past it: its future holds the timeout, its thread can never write a result back, the episodes
  behind it go on. A holder that runs longer than `_SLICE` seconds while others wait, or is blocked in a
  call, loses the turn; one that goes on computing without yielding for a quarter of its timeout (0.5 s at
  least) while others wait is abandoned. A blocked thread cannot be killed in Python: an abandoned thread
  is left as a daemon (an exception raised into it stops a Python-level loop; a blocking C call returns
  when it returns).
- Exceptions: a BaseException the environment's code raises (SystemExit, KeyboardInterrupt, GeneratorExit,
  one of its own) ends its episode only, as a failure naming it; a real Ctrl-C reaches the trainer's main
  thread, which never runs environment code, and stops the run.
- Size: every text kept from the environment is cut (`cut`: `MAX_TEXT` characters, names `MAX_NAME`); a
  reward or metric that returns a long string is refused where it returns, without copying it
  (rwcore.trainer.envs.verifiers.bounds).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import random
import selectors
import threading
import time
from collections.abc import Callable, Sequence

from rwcore.trainer.envs.verifiers.agents import PartnerAgent, TrainedAgent
from rwcore.trainer.envs.verifiers.bounds import cut
from rwcore.trainer.envs.verifiers.episode import _TERMINATE, EnvironmentFault, EpisodeRun, SetupError, _RunContext

_SLICE = 0.1  # seconds an episode may run environment code while others wait for their turn
_BUSY = 0.25  # of wait_timeout (0.5 s at least): computing that long without yielding, while others wait,
# abandons an episode - a busy loop would otherwise slow every other episode (they share the GIL) until
# its timeout
_TICK = 0.02  # seconds between two looks of the watchdog
_KICKS = 20  # exceptions raised into an abandoned thread that keeps running, 0.5 s apart, before it is left alone

logger = logging.getLogger(__name__)


class _Abandoned(BaseException):
    """Raised into the thread of an abandoned episode that keeps running environment code (a busy loop)."""


class _Baton:
    """The turn to run environment code: one episode thread at a time, first come first served, so the
    episodes interleave as coroutines of one loop would. Whoever holds it runs with the global `random` set
    to its episode's own stream (the state outside is put back when it lets go). The watchdog can take it
    from a holder that keeps it too long (`revoke`): that thread runs on without it until it next waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[EpisodeRun, threading.Event]] = collections.deque()
        self.holder: EpisodeRun | None = None
        self.since: float | None = None  # when the holder started running (None: handed over, not yet awake)
        self._outside = None  # the global random state outside environment code

    def acquire(self, run: EpisodeRun, swap: bool = True) -> None:
        """Waits for the turn (the wait is `run.queued`, off its clock). swap=False: the caller's thread
        is rwcore's own (its random stream stays)."""
        while True:
            with self._lock:
                if self.holder is run or (self.holder is None and not self._queue):
                    self._take(run, swap)
                    return
                ready = threading.Event()
                self._queue.append((run, ready))
                if run.queued_since is None:
                    run.queued_since = time.monotonic()
            ready.wait()  # set when the turn is handed to it; taken from it before it woke, it queues again

    def _take(self, run: EpisodeRun, swap: bool) -> None:
        now = time.monotonic()
        if run.queued_since is not None:
            run.queued += now - run.queued_since
            run.queued_since = None
        self.holder, self.since = run, now
        run.running = swap
        run.section_start = now if swap else None
        self._outside = None
        if swap:
            self._outside = random.getstate()
            random.setstate(run.random_state)

    def release(self, run: EpisodeRun) -> None:
        with self._lock:
            run.running = False
            if self.holder is run:
                if self._outside is not None:
                    run.random_state = random.getstate()
                self._hand_over()

    def revoke(self, run: EpisodeRun) -> None:
        """Takes the turn from `run` (a holder that keeps it too long, or an abandoned one)."""
        with self._lock:
            if self.holder is run:
                if self.since is not None and self._outside is not None:  # it was running with its stream set
                    run.random_state = random.getstate()
                self._hand_over()

    def _hand_over(self) -> None:
        if self.since is not None and self._outside is not None:
            random.setstate(self._outside)
        self.holder, self.since, self._outside = None, None, None
        if self._queue:
            self.holder, ready = self._queue.popleft()
            ready.set()

    def waited_for(self) -> bool:
        with self._lock:
            return bool(self._queue)

    def should_yield(self, run: EpisodeRun) -> bool:
        """Whether `run`, holding the turn with callbacks ready, has run its slice while others wait."""
        with self._lock:
            return (
                self.holder is not run
                or bool(self._queue)
                and self.since is not None
                and time.monotonic() - self.since > _SLICE
            )

    def stale(self, slice_s: float) -> EpisodeRun | None:
        """The holder when it has run longer than `slice_s` while others wait."""
        with self._lock:
            holder = self.holder
            if holder is not None and self._queue and self.since is not None:
                if time.monotonic() - self.since > slice_s:
                    return holder
            return None


class _BatonSelector(selectors.DefaultSelector):
    """An episode loop's selector: the loop lets go of the turn while it waits for I/O or timers (and, with
    callbacks ready, once it has run its slice while others wait), and takes it back before it runs
    callbacks. Running its ready callbacks in one go keeps an episode's step together (a value it made
    and drops is gone before the next episode runs)."""

    def __init__(self, baton: _Baton, run: EpisodeRun) -> None:
        super().__init__()
        self._baton = baton
        self._run = run

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0 and not self._baton.should_yield(self._run):
            return super().select(timeout)
        self._baton.release(self._run)
        if self._run.pending is not None:
            # parked: the rwcore thread learns it only now, once the turn and the global random are let go
            self._run.event.set()
        try:
            return super().select(timeout)
        finally:
            self._baton.acquire(self._run)


def _thread_cpu(thread: threading.Thread | None) -> float | None:
    """CPU seconds `thread` has used (None where the platform cannot tell, or it has ended)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, TypeError, OverflowError):
        return None


def _raise_into(thread: threading.Thread) -> None:
    """Raises `_Abandoned` in `thread` at its next Python instruction (a C call that blocks is not
    interrupted; the exception waits until it returns)."""
    import ctypes

    ident = thread.ident
    if ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Abandoned))


class Bridge:
    """Drives a verifiers `Env` with rwcore's policy as its trained seat (see the module docstring).

    env: the verifiers Env (built by verifiers' load_environment); seat: the trained seat's name;
    max_turns: the trained seat's turns per episode at most (a further turn comes back terminated, as
    verifiers' own `max_turns` limit does); partner: answers the other seats (`reply_many`), or None;
    wait_timeout: seconds (wall clock) an episode's environment may take from the moment it gets the turn
    (its start, or the agent's message) until it asks for the agent's next message or ends."""

    def __init__(self, env, seat: str, max_turns: int, partner, wait_timeout: float) -> None:
        self.env = env
        self.seat = seat
        self.max_turns = max_turns
        self.partner = partner
        self.wait_timeout = wait_timeout
        self.busy_limit = max(0.5, _BUSY * wait_timeout)
        self._baton = _Baton()
        self._lock = threading.Lock()
        self._live: set[EpisodeRun] = set()
        self._stuck: list[list] = []  # [run, abandoned at, kicks, last kick] of abandoned threads still alive
        self._watching = False  # a watchdog thread runs (it ends when nothing is left to watch)
        # verifiers' Env builds each episode's agents here; rwcore's take their place (see the module docstring)
        env._episode_agents = self._episode_agents

    # -- the rwcore side (caller's thread) ------------------------------------------------

    def start(self, run: EpisodeRun) -> None:
        self.start_many([run])

    def start_many(self, runs: Sequence[EpisodeRun]) -> None:
        """Starts the runs' threads while this thread holds the turn: none runs environment code before
        all are started (a busy-looping one would slow the starting of the others)."""
        self._ensure_watchdog()  # before waiting for the turn: the watchdog frees it from a stuck holder
        starter = EpisodeRun(None, 0, "")
        self._baton.acquire(starter, swap=False)
        try:
            for run in runs:
                self._launch(run)
        finally:
            self._baton.release(starter)

    def _launch(self, run: EpisodeRun) -> None:
        if run.thread is not None:  # started already
            return
        run.turn_start, run.queued = time.monotonic(), 0.0
        with self._lock:
            self._live.add(run)

        def ended(_) -> None:
            with self._lock:
                self._live.discard(run)
            run.event.set()

        run.future.add_done_callback(ended)
        run.thread = threading.Thread(target=self._serve, args=(run,), name=f"rwcore-verifiers-{run.id[:8]}")
        run.thread.daemon = True  # an abandoned thread never keeps the process alive
        run.thread.start()

    def deliver(self, run: EpisodeRun, reply) -> None:
        """Hands the policy's message (or _TERMINATE) to the parked turn."""
        if run.pending is None or run.future.done():
            return
        _, future = run.pending
        run.pending = None
        run.queued, run.turn_start = 0.0, time.monotonic()
        run.event.clear()
        if reply is _TERMINATE:
            run.terminating = True

        def resolve() -> None:
            if not future.done():
                future.set_result(reply)

        try:
            run.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # its loop is closed: the episode has ended
            pass

    def spent(self, run: EpisodeRun, now: float) -> float:
        """Seconds the run's environment has had the turn it is on (0 while it waits for the agent)."""
        start = run.turn_start
        if start is None:
            return 0.0
        queued_since = run.queued_since
        waiting = now - queued_since if queued_since is not None else 0.0
        return now - start - run.queued - waiting

    def wait(self, runs: Sequence[EpisodeRun]) -> None:
        """Until every run waits for the agent or has ended; a run whose environment has had wait_timeout
        seconds is abandoned (its future then holds the timeout)."""
        unstarted = [run for run in runs if run.thread is None]
        if unstarted:
            self.start_many(unstarted)
        for run in runs:
            while not (run.event.is_set() or run.future.done()):
                remaining = self.wait_timeout - self.spent(run, time.monotonic())
                if remaining <= 0:
                    self._abandon(run, f"did not answer within env.options.timeout ({self.wait_timeout:g} s)")
                    break
                run.event.wait(min(remaining, 0.5))

    def close(self) -> None:
        """Abandons the episodes still running (reset but never finished: not scored); their threads are
        given 2 s to end (an abandoned thread that does not is left to the watchdog, then to itself)."""
        with self._lock:
            live = list(self._live)
        for run in live:
            self._abandon(run, "was closed before the episode ended")
        deadline = time.monotonic() + 2.0
        for run in live:
            if run.thread is not None:
                run.thread.join(max(0.0, deadline - time.monotonic()))

    # -- the watchdog ------------------------------------------------------------------------

    def _ensure_watchdog(self) -> None:
        with self._lock:
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._watch, name="rwcore-verifiers-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(_TICK)
            try:
                if self._look():
                    return
            except Exception:  # the watchdog must outlive anything it looks at
                logger.exception("rwcore verifiers watchdog")

    def _look(self) -> bool:
        """One look: abandons runs past their deadline, takes the turn from a holder that keeps it, raises
        into abandoned threads that keep running. True when the watchdog has nothing left to do."""
        now = time.monotonic()
        with self._lock:
            live = list(self._live)
        waited_for, holder = self._baton.waited_for(), self._baton.holder
        for run in live:
            if run.event.is_set() or run.future.done():
                continue
            if self.spent(run, now) > self.wait_timeout:
                self._abandon(run, f"did not answer within env.options.timeout ({self.wait_timeout:g} s)")
                continue
            busy = self._busy(run, now, waited_for or run is not holder)
            if busy:
                self._abandon(
                    run,
                    f"ran environment code for {busy:.1f} s without yielding to its event loop while other "
                    "episodes waited",
                )
        stale = self._baton.stale(_SLICE)
        if stale is None and holder is not None and waited_for and self._blocked(holder, now):
            stale = holder
        if stale is not None:
            self._baton.revoke(stale)
        with self._lock:
            self._stuck = [entry for entry in self._stuck if entry[0].thread.is_alive() and entry[2] < _KICKS]
            stuck = list(self._stuck)
            idle = not self._live and not self._stuck and holder is None and not waited_for
            if idle:  # checked and cleared under the lock start() takes: a new run starts a new watchdog
                self._watching = False
        for entry in stuck:
            run, _, kicks, last = entry
            if run.running and now - last >= 0.5:
                entry[2], entry[3] = kicks + 1, now
                _raise_into(run.thread)
        return idle

    @staticmethod
    def _blocked(run: EpisodeRun, now: float) -> bool:
        """Whether the holder `run` is blocked in a call (its thread used no CPU for 40 ms of its section):
        it gives up the turn at once, not after its slice."""
        start = run.section_start
        if not run.running or start is None:
            return False
        probe = run.probe
        if probe is not None and probe[0] == start and now - probe[1] < 0.04:
            return False
        cpu = _thread_cpu(run.thread)
        if cpu is None:
            return False
        run.probe = (start, now, cpu)
        return probe is not None and probe[0] == start and cpu - probe[2] < 0.001

    def _busy(self, run: EpisodeRun, now: float, others_wait: bool) -> float:
        """The seconds `run` has computed without yielding (more than busy_limit, while others waited, its
        thread's CPU time growing: it is not merely blocked in a call that leaves the others free), else 0."""
        start = run.section_start
        if not run.running or start is None:
            return 0.0
        if run.section_seen != start:  # a section not looked at yet: its CPU time to compare with later
            run.section_seen, run.section_cpu = start, _thread_cpu(run.thread)
            return 0.0
        if not others_wait or now - start <= self.busy_limit or run.section_cpu is None:
            return 0.0
        cpu = _thread_cpu(run.thread)
        return now - start if cpu is not None and cpu - run.section_cpu > 0.05 else 0.0

    def _abandon(self, run: EpisodeRun, reason: str) -> None:
        """Ends `run` as a failure now, whatever its thread does from here on (it can no longer write a
        result), and frees the turn and the episodes behind it."""
        try:
            run.future.set_exception(EnvironmentFault(reason))
        except concurrent.futures.InvalidStateError:
            return  # it ended first
        run.abandoned = True
        run.timed_out = reason.startswith("did not answer")
        self._baton.revoke(run)
        loop, main = run.loop, run.main
        if loop is not None and main is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing left to cancel
                loop.call_soon_threadsafe(main.cancel)
        if run.thread is not None and run.thread.is_alive():
            with self._lock:
                self._stuck.append([run, time.monotonic(), 0, 0.0])

    # -- the verifiers side (the episode's own thread) ------------------------------------------

    def _serve(self, run: EpisodeRun) -> None:
        """The episode's thread: its loop runs `Env.run_episode` with the turn held; whatever it raises,
        BaseException included, ends this episode only."""
        try:
            loop = asyncio.SelectorEventLoop(_BatonSelector(self._baton, run))
            run.loop = loop
            asyncio.set_event_loop(loop)
            self._baton.acquire(run)
            value, error, ended = None, None, False
            try:
                if run.abandoned:  # its time ran out before its first turn
                    return
                run.main = loop.create_task(self._episode(run))
                try:
                    value = loop.run_until_complete(run.main)
                except BaseException as caught:  # anything the environment raises, SystemExit too
                    error = caught
                ended = True
                self._unwind(loop, run.main)
            finally:
                self._baton.release(run)
                asyncio.set_event_loop(None)
                loop.close()
            if ended:  # written once the turn and the global random are let go: the caller may go on at once
                self._settle(run, value=value, error=error)
        except BaseException as caught:  # e.g. _Abandoned, or the environment raising again
            self._settle(run, error=caught)

    def _settle(self, run: EpisodeRun, value=None, error: BaseException | None = None) -> None:
        """Writes the episode's end into its future, unless it was abandoned or has ended already."""
        if run.abandoned or run.future.done():
            return
        if error is not None and not isinstance(error, Exception):
            try:
                text = cut(str(error), 300)
            except Exception:  # an exception whose str() raises is named by its type alone
                text = ""
            error = EnvironmentFault(f"raised {type(error).__name__}{': ' + text if text else ''}")
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if error is None:
                run.future.set_result(value)
            else:
                run.future.set_exception(error)

    @staticmethod
    def _unwind(loop, main: asyncio.Task) -> None:
        """Cancels what the episode left running on its loop and lets it end (a few rounds at most: a
        hostile environment may raise again while it unwinds); the exceptions they ended with are read, so
        that asyncio does not log them again."""
        seen = {main}
        for _ in range(3):
            tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
            if not tasks:
                break
            seen.update(tasks)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        for task in seen:
            if task.done() and not task.cancelled():
                task.exception()

    async def _episode(self, run: EpisodeRun):
        return await self.env.run_episode(run.task, _RunContext(run))

    async def ask(self, run: EpisodeRun, observation: str):
        """Parks the trained seat's turn until rw train hands in the policy's message."""
        if run.terminating:
            return _TERMINATE
        future = asyncio.get_running_loop().create_future()
        run.turn_start = None  # the agent's time, not the environment's
        run.pending = (observation, future)  # cut already (message_text); `event` is set when the loop waits
        return await future

    def _episode_agents(self, ctx, completed, on_trace, on_discard):
        from verifiers.v1.agent import Agents

        run = ctx.run if isinstance(ctx, _RunContext) else None
        if run is None:
            raise SetupError("this verifiers Env is driven by rwcore: run its episodes through the rw train adapter")

        def make(name: str, spec):
            cls = TrainedAgent if name == self.seat else PartnerAgent
            return cls(self, run, name, spec, completed, on_trace)

        return Agents(self.env.config, make)


def run_all(bridge: Bridge, runs: Sequence[EpisodeRun], replies: Sequence | None, keep_random: Callable) -> None:
    """Delivers `replies` (None: none, the runs were just started) and waits until each run waits again or
    has ended, with the caller's global `random` state restored afterwards (verifiers environments such as
    TextArena seed Python's global stream)."""
    with keep_random():
        if replies is not None:
            for run, reply in zip(runs, replies):
                bridge.deliver(run, reply)
        bridge.wait(runs)
