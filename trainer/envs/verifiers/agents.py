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

Each seat of an episode is an agent of this module: `TrainedAgent` (rwcore's policy, whose turns the `Bridge`
of rwcore.trainer.envs.verifiers.bridge parks until rw train hands in the policy's message) or `PartnerAgent`
(the LLM partner), each seat's conversation an `Interaction` that writes verifiers' `Trace` and scores it with
the task's own `Task.score`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from rwcore.trainer.envs.verifiers.bounds import _guard_hooks, _let_go, _trace_class, cut, message_text
from rwcore.trainer.envs.verifiers.episode import _TERMINATE, EpisodeRun, SetupError


def _as_messages(message) -> list:
    from verifiers.v1.dialects.chat import parse_message
    from verifiers.v1.types import UserMessage

    if isinstance(message, str):
        return [UserMessage(content=message)]
    return [parse_message(m) if isinstance(m, dict) else m for m in message]


class _Agent:
    """What an `Env.run` uses of a verifiers Agent: `run(task)`, `interaction(task)`, `trainable`, `name`.

    bridge: the `Bridge` that runs the episode (rwcore.trainer.envs.verifiers.bridge, which imports this
    module: the annotation would make an import cycle); run: the episode."""

    def __init__(self, bridge, run: EpisodeRun, name: str, config, completed: list, on_trace) -> None:
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
        if not self.episode_run.abandoned:
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
        system = cut(interaction.system_text)
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
        from verifiers.v1.trace import AgentInfo, TraceTask
        from verifiers.v1.types import SystemMessage

        self.agent = agent
        self.task = task
        self._condition = condition
        self._first_prefix = first_prefix
        self.trace = _trace_class()(
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
                head = [{"content": self._first_prefix}] if self._first_prefix else []
                observation = message_text([*head, *new])  # cut once, the prefix counted in
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
            _guard_hooks(self.task)
            try:
                await self.task.score(trace, None)
            except Exception as error:  # a reward function that raised: recorded, the episode fails
                trace.record_error(error)
                _let_go(error)
        trace.ok = not trace.errors
        trace.is_completed = True
        return trace
