"""rw_hostile: a single-turn verifiers taskset (in verifiers' own style, as rw_faults) whose faulty tasks try
to hang, kill or flood the run, for the env.name=verifiers isolation tests.

Each task asks for a word; `exact` (weight 0.75) pays 1.0 when the reply's first word is it, `short` (weight
0.25) pays 1.0 for a reply of at most two words, the metric `reply_words` counts the reply's words. Config
`fault` puts a fault into every task whose idx is a multiple of `every` ("mixed": those tasks take the kinds
of `MIXED` in turn); `size` is the length of the huge strings.

Faults in a reward or metric: "reward_sleep" (`exact` blocks its thread: time.sleep), "reward_spin" (`exact`
busy-loops), "reward_exit" (sys.exit), "reward_interrupt" (KeyboardInterrupt), "reward_custom" (a
BaseException subclass of the taskset's own), "reward_huge" (`exact` returns a huge string), "metric_huge"
(`reply_words` returns one). Faults in the Env's run: "run_sleep" (blocks before the agent's turn),
"run_spin" (busy-loops before it), "run_generator_exit" (raises GeneratorExit), "message_huge" (sends the
agent a huge second message after its first reply), "error_huge" (raises RuntimeError with a huge message).
"""

import sys
import time
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud"]
MIXED = ["reward_sleep", "reward_spin", "reward_exit", "reward_interrupt", "reward_huge"]  # all when scoring
Fault = Literal[
    "none",
    "mixed",
    "reward_sleep",
    "reward_spin",
    "reward_exit",
    "reward_interrupt",
    "reward_custom",
    "reward_huge",
    "metric_huge",
    "run_sleep",
    "run_spin",
    "run_generator_exit",
    "message_huge",
    "error_huge",
]


class Hostile(BaseException):  # named as an environment would name its own
    """A BaseException subclass that is neither SystemExit nor KeyboardInterrupt."""


class HostileConfig(vf.TasksetConfig):
    fault: Fault = "none"
    every: int = 3
    tasks: int = 24
    size: int = 1_000_000


class HostileData(vf.TaskData):
    word: str
    fault: str = "none"  # this task's fault ("none": a healthy task)
    size: int = 0


def _spin() -> None:
    n = 0
    while True:  # never yields to the event loop
        n += 1


class HostileTask(vf.Task[HostileData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.75)
    async def exact(self, task: HostileData, trace: vf.Trace) -> float:
        fault = task.fault
        if fault == "reward_sleep":
            time.sleep(3600)  # a synchronous call inside an async reward: blocks the thread it runs on
        elif fault == "reward_spin":
            _spin()
        elif fault == "reward_exit":
            sys.exit(3)
        elif fault == "reward_interrupt":
            raise KeyboardInterrupt("from the reward")
        elif fault == "reward_custom":
            raise Hostile("the taskset's own BaseException")
        elif fault == "reward_huge":
            return "x" * task.size
        words = trace.last_reply.lower().split()
        return 1.0 if words and words[0] == task.word else 0.0

    @vf.reward(weight=0.25)
    async def short(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply.split()) <= 2 else 0.0

    @vf.metric
    async def reply_words(self, task: HostileData, trace: vf.Trace) -> float:
        if task.fault == "metric_huge":
            return "y" * task.size
        return float(len(trace.last_reply.split()))


class HostileEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class HostileEnv(vf.Env[HostileEnvConfig]):
    async def run(self, task, agents):
        fault = task.data.fault
        if fault == "run_sleep":
            time.sleep(3600)
        elif fault == "run_spin":
            _spin()
        elif fault == "run_generator_exit":
            raise GeneratorExit
        elif fault == "error_huge":
            raise RuntimeError("z" * task.data.size)
        elif fault == "message_huge":
            async with agents.agent.interaction(task) as interaction:
                await interaction.turn()
                await interaction.turn("m" * task.data.size)
            return
        await agents.agent.run(task)


class HostileTaskset(vf.Taskset[HostileTask, HostileConfig]):
    def load(self) -> Iterator[HostileTask]:
        for i in range(self.config.tasks):
            word = WORDS[i % len(WORDS)]
            fault = "none"
            if self.config.fault != "none" and i % self.config.every == 0:
                fault = self.config.fault
                if fault == "mixed":
                    fault = MIXED[(i // self.config.every) % len(MIXED)]
            yield HostileTask(
                HostileData(id=f"h{i}", prompt=f"say {word}", word=word, fault=fault, size=self.config.size),
                self.config.task,
            )


__all__ = [
    "Hostile",
    "HostileConfig",
    "HostileData",
    "HostileEnv",
    "HostileEnvConfig",
    "HostileTask",
    "HostileTaskset",
]
