"""The model side of a verifiers environment, played by rwcore.

verifiers runs an agent as a *harness program* (a chat loop, Codex, Claude Code...) in a runtime (a
subprocess or a container), whose model requests reach the model through an interception server. rwcore's
policy is a model in this process that `rw train`'s rollout engines step turn by turn, for every live episode
of a batch at once. So rwcore takes the place of the agent itself, at the seam verifiers' own environments
program against: the `Agents` an `Env.run(task, agents)` receives. Everything else is verifiers' own code:
`Env.run_episode` (setup, run, finalize, its episode deadline and error capture), the environment's `run()`
(its multi-turn protocol), the `Trace` (the message graph written with verifiers' `prepare_turn(...).commit`),
the task's `@stop` hooks and its scoring (`Task.score`: `@metric`s, `@reward`s with their weights, plugged
judges).

`Bridge` runs each rwcore episode as one `Env.run_episode` coroutine on an event loop in a background
thread. When the environment asks the trained seat for a turn (`interaction.turn(...)` or `agent.run(task)`),
the coroutine parks the request: the text the agent is shown becomes the rwcore episode's observation, and
the coroutine resumes when `rw train` hands in the policy's message. Seats other than the trained one (a
modeled user, an opponent) are served by an LLM partner over an OpenAI-compatible API
(rwcore.trainer.envs.llm_partner).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence

_TERMINATE = object()  # handed to a parked turn when rw train ends the episode (its turn limit)


class SetupError(ValueError):
    """The environment cannot be trained through rwcore as configured (raised to the caller, not a partner
    failure): e.g. it runs the trained seat twice in one episode."""


def message_text(messages) -> str:
    """The text of a verifiers prompt or turn (a string, or messages: their text parts, images dropped)."""
    from verifiers.v1.types import content_text

    if messages is None:
        return ""
    if isinstance(messages, str):
        return messages
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
        text = content_text(content) if not isinstance(content, str) else content
        if text:
            parts.append(text)
    return "\n\n".join(parts)


def _as_messages(message) -> list:
    from verifiers.v1.dialects.chat import parse_message
    from verifiers.v1.types import UserMessage

    if isinstance(message, str):
        return [UserMessage(content=message)]
    return [parse_message(m) if isinstance(m, dict) else m for m in message]


class EpisodeRun:
    """One rwcore episode: one `Env.run_episode` on the bridge's loop.

    `event` is set whenever the coroutine waits for the trained seat's message (`pending` holds the
    observation) or has ended (`future` done); the rwcore thread waits on it."""

    def __init__(self, task, seed: int, first_prefix: str) -> None:
        self.id = uuid.uuid4().hex
        self.task = task
        self.seed = seed
        self.first_prefix = first_prefix  # the task's own system prompt when it is not the environment's
        self.event = threading.Event()
        self.pending: tuple[str, asyncio.Future] | None = None
        self.future: concurrent.futures.Future | None = None
        self.terminating = False
        self.fatal = ""  # a SetupError message
        self.trained_traces = 0
        self.timed_out = False


class _RunContext:
    """What `Env.run_episode` hands to `_episode_agents`: the rwcore run (verifiers passes it through)."""

    def __init__(self, run: EpisodeRun) -> None:
        self.run = run


class Bridge:
    """Drives a verifiers `Env` with rwcore's policy as its trained seat (see the module docstring).

    env: the verifiers Env (built by verifiers' load_environment); seat: the trained seat's name;
    max_turns: the trained seat's turns per episode at most (a further turn comes back terminated, as
    verifiers' own `max_turns` limit does); partner: answers the other seats (`reply_many`), or None;
    wait_timeout: seconds the environment may take between two of the agent's turns."""

    def __init__(self, env, seat: str, max_turns: int, partner, wait_timeout: float) -> None:
        self.env = env
        self.seat = seat
        self.max_turns = max_turns
        self.partner = partner
        self.wait_timeout = wait_timeout
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rwcore-verifiers", daemon=True)
        self._thread.start()
        self._live: set[EpisodeRun] = set()
        # verifiers' Env builds each episode's agents here; rwcore's take their place (see the module docstring)
        env._episode_agents = self._episode_agents

    # -- the rwcore side (caller's thread) ------------------------------------------------

    def start(self, run: EpisodeRun) -> None:
        self._live.add(run)
        run.future = asyncio.run_coroutine_threadsafe(self._episode(run), self.loop)

        def ended(_) -> None:
            self._live.discard(run)
            run.event.set()

        run.future.add_done_callback(ended)

    def deliver(self, run: EpisodeRun, reply) -> None:
        """Hands the policy's message (or _TERMINATE) to the parked turn."""
        if run.pending is None:
            return
        _, future = run.pending
        run.pending = None
        run.event.clear()
        if reply is _TERMINATE:
            run.terminating = True

        def resolve() -> None:
            if not future.done():
                future.set_result(reply)

        self.loop.call_soon_threadsafe(resolve)

    def wait(self, runs: Sequence[EpisodeRun]) -> None:
        """Until every run waits for the agent or has ended; a run whose environment takes longer than
        wait_timeout is cancelled (its future then holds the cancellation)."""
        deadline = time.monotonic() + self.wait_timeout
        for run in runs:
            if not run.event.wait(max(0.0, deadline - time.monotonic())):
                run.future.cancel()
                self.loop.call_soon_threadsafe(lambda: None)  # wake the loop to run the cancellation
                run.event.wait(5.0)
                run.timed_out = True

    def close(self) -> None:
        """Cancels the episodes still running (reset but never finished: aborted, not scored) and stops the loop."""
        live = list(self._live)
        for run in live:
            run.future.cancel()
        for run in live:
            run.event.wait(5.0)
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

    # -- the verifiers side (the loop's thread) ----------------------------------------------

    async def _episode(self, run: EpisodeRun):
        random.seed(run.seed)  # the environment's own randomness (the caller's stream is restored around it)
        return await self.env.run_episode(run.task, _RunContext(run))

    async def ask(self, run: EpisodeRun, observation: str):
        """Parks the trained seat's turn until rw train hands in the policy's message."""
        if run.terminating:
            return _TERMINATE
        future = self.loop.create_future()
        run.pending = (observation, future)
        run.event.set()
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


class _Agent:
    """What an `Env.run` uses of a verifiers Agent: `run(task)`, `interaction(task)`, `trainable`, `name`."""

    def __init__(self, bridge: Bridge, run: EpisodeRun, name: str, config, completed: list, on_trace) -> None:
        self.bridge = bridge
        self.episode_run = run
        self.name = name
        self.config = config
        self.trainable = True
        self._completed = completed
        self._on_trace = on_trace

    async def run(self, task, *, runtime=None, tools=None, on_trace=None, collect_artifacts: bool = False):
        """One segment on the task's prompt (verifiers' single-agent run): the agent answers once."""
        self._refuse_resources(runtime, tools, collect_artifacts)
        if task.data.prompt is None:
            raise ValueError(f"agent {self.name!r}: run() needs a task with a prompt (TaskData.prompt is None)")
        async with self.interaction(task, on_trace=on_trace, _condition="agent_completed") as interaction:
            await interaction.turn()
        return interaction.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task, *, runtime=None, tools=None, on_trace=None, _condition: str = "user_closed"):
        self._refuse_resources(runtime, tools, False)
        interaction = self._open(task, _condition)
        trace = interaction.trace
        trace.agent.name = self.name
        trace.agent.trainable = self.trainable
        for watcher in (self._on_trace, on_trace):
            if watcher is not None:
                watcher(trace)
        aborted = False
        try:
            yield interaction
        except Exception as error:
            trace.record_error(error)
            raise
        except BaseException:  # cancelled (a timeout, the environment closing): ended, not scored
            aborted = True
            raise
        finally:
            if aborted:
                interaction.abort()
            else:
                await interaction.close()
            self._completed.append(trace)

    def _open(self, task, condition: str):
        return Interaction(self, task, condition)

    def _refuse_resources(self, runtime, tools, collect_artifacts) -> None:
        if runtime is not None or tools or collect_artifacts:
            self.refuse(
                f"agent {self.name!r}: the environment hands the agent a runtime, tools or artifacts; rwcore's "
                "policy writes text turns only (no sandbox, no tool calls)"
            )

    def refuse(self, message: str):
        """Stops the run: the environment asks for something rwcore cannot be (raised to rw train as a
        SetupError, not recorded as a partner failure)."""
        self.episode_run.fatal = message
        raise SetupError(message)

    async def respond(self, interaction: Interaction, observation: str):
        raise NotImplementedError


class TrainedAgent(_Agent):
    """The seat rwcore's policy plays: each turn parks until rw train hands in the policy's message."""

    def _open(self, task, condition: str):
        run = self.episode_run
        run.trained_traces += 1
        if run.trained_traces > 1:
            self.refuse(
                f"the verifiers environment runs its seat {self.name!r} more than once per episode (e.g. "
                "best-of-n); rwcore trains one conversation per episode"
            )
        return Interaction(self, task, condition, first_prefix=run.first_prefix)

    async def respond(self, interaction: Interaction, observation: str):
        return await self.bridge.ask(self.episode_run, observation)


class PartnerAgent(_Agent):
    """A seat other than the trained one (a modeled user, an opponent): the LLM partner answers it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trainable = False

    async def respond(self, interaction: Interaction, observation: str):
        from rwcore.trainer.envs.llm_partner import PartnerFailure, PartnerRequest

        partner = self.bridge.partner
        if partner is None:
            self.refuse(f"seat {self.name!r} needs a partner: set env.options.partner_model")
        system = interaction.system_text
        messages = tuple(
            {"role": "assistant" if m.role == "assistant" else "user", "content": message_text([m])}
            for m in interaction.conversation
            if m.role in ("user", "assistant")
        )
        (reply,) = await asyncio.to_thread(partner.reply_many, [PartnerRequest(system, messages)])
        if isinstance(reply, PartnerFailure):
            raise RuntimeError(f"partner for seat {self.name!r} failed: {reply.reason}")
        return reply.message


_ids = itertools.count()


class Interaction:
    """verifiers' `Interaction` surface for one seat's conversation: `turn(message)` -> Segment, `trace`,
    `close()`. The trace is written the way verifiers writes it (graph.prepare_turn(...).commit), limits and
    the task's trace-level `@stop` hooks are checked before each turn (verifiers' RolloutSession.refused),
    and closing scores it with the task's own `Task.score`."""

    def __init__(self, agent: _Agent, task, condition: str, first_prefix: str = "") -> None:
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import SystemMessage

        self.agent = agent
        self.task = task
        self._condition = condition
        self._first_prefix = first_prefix
        self.trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=AgentInfo(config=agent.config),
        )
        self.system_text = task.data.system_prompt or ""
        self.conversation: list = [SystemMessage(content=self.system_text)] if self.system_text else []
        self._started = False
        self._over = False
        self._closed = False
        self._lock = asyncio.Lock()

    async def send(self, *args, **kwargs):
        self.agent.refuse("Interaction.send / steer (messages mid-turn) have no counterpart in rwcore's turn loop")

    steer = send

    async def turn(self, message=None):
        from verifiers.v1.agent import Segment
        from verifiers.v1.graph import prepare_turn
        from verifiers.v1.types import AssistantMessage, Response

        async with self._lock:
            if self._closed:
                raise RuntimeError("this interaction is closed")
            if self._over:
                raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
            prompted = not self._started and self.task.data.prompt is not None
            if message is None and not prompted:
                raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
            if message is not None and prompted:
                raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
            if prompted:
                new = _as_messages(self.task.data.prompt)
                observation = message_text(new)
                if self._first_prefix:
                    observation = f"{self._first_prefix}\n\n{observation}"
            else:
                new = _as_messages(message)
                observation = message_text(new)
            self._started = True
            self.conversation.extend(new)
            stopped = await self._refused()
            reply = _TERMINATE if stopped else await self.agent.respond(self, observation)
            if reply is _TERMINATE:
                if not stopped:
                    self.trace.stop("max_turns")
                prepare_turn(self.trace, list(self.conversation)).commit_prompt()
                self._over = True
                return Segment(messages=[], terminated=True)
            answer = AssistantMessage(content=str(reply))
            prepare_turn(self.trace, list(self.conversation)).commit(
                Response(
                    id=f"rwcore-{next(_ids)}",
                    created=int(time.time()),
                    model="rwcore-policy",
                    message=answer,
                    finish_reason="stop",
                )
            )
            self.conversation.append(answer)
            return Segment(messages=[answer])

    async def _refused(self) -> bool:
        """verifiers' checks before a turn is served: the turn limit, then the task's trace-level @stop hooks."""
        from verifiers.v1.errors import TaskError
        from verifiers.v1.session import call_hook, hook_boundary
        from verifiers.v1.trace import Trace

        limit = self.agent.config.max_turns
        if isinstance(self.agent, TrainedAgent):
            limit = self.agent.bridge.max_turns if limit is None else min(limit, self.agent.bridge.max_turns)
        if limit is not None and self.trace.num_turns >= limit:
            self.trace.stop("max_turns")
            return True
        for stop in self.task.hooks("stop"):
            if hook_boundary(stop, allow_trace=True) is not Trace:
                continue  # request / response stops belong to a harness's model calls
            result = await call_hook(stop, {Trace: self.trace})
            if not isinstance(result, bool):
                raise TaskError(f"@stop must return bool, got {type(result).__name__}")
            if result:
                self.trace.stop(stop.__name__)
                return True
        return False

    def abort(self) -> None:
        """Ends the exchange without scoring it (the episode was cancelled)."""
        self._closed = True
        self.trace.stop("aborted")
        self.trace.ok = False

    async def close(self):
        """Ends the exchange and scores the trace with the task's own scoring (idempotent)."""
        if self._closed:
            return self.trace
        self._closed = True
        trace = self.trace
        if trace.stop_condition is None:
            trace.stop(self._condition)
        if not trace.errors:
            try:
                await self.task.score(trace, None)
            except Exception as error:  # a reward function that raised: recorded, the episode fails
                trace.record_error(error)
        trace.ok = not trace.errors
        trace.is_completed = True
        return trace


def run_all(bridge: Bridge, runs: Sequence[EpisodeRun], replies: Sequence | None, keep_random: Callable) -> None:
    """Delivers `replies` (None: none, the runs were just started) and waits until each run waits again or
    has ended, with the caller's global `random` state restored afterwards (verifiers environments such as
    TextArena seed Python's global stream)."""
    with keep_random():
        if replies is not None:
            for run, reply in zip(runs, replies):
                bridge.deliver(run, reply)
        bridge.wait(runs)
