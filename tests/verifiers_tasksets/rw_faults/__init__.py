"""rw_faults: a single-turn verifiers taskset (in verifiers' own style) with two weighted rewards and
faults on demand, for the env.name=verifiers tests.

Each task asks for a word; `exact` (weight 0.75) pays 1.0 when the reply's first word is it, `short` (weight
0.25) pays 1.0 for a reply of at most two words. Config `fault` puts a fault into every task whose idx is a
multiple of `every`: "raise" (the `exact` reward raises), "nan" (it returns NaN), "hang" (the Env's run
never completes), "env_raise" (the Env's run raises), "twice" (the Env runs its agent twice), "steer" (the
Env sends a message mid-turn, Interaction.send).
"""

import asyncio
import math
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud"]


class FaultConfig(vf.TasksetConfig):
    fault: Literal["none", "raise", "nan", "hang", "env_raise", "twice", "steer"] = "none"
    every: int = 3
    tasks: int = 24


class FaultData(vf.TaskData):
    word: str
    faulty: bool = False
    fault: str = "none"


class FaultTask(vf.Task[FaultData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.75)
    async def exact(self, task: FaultData, trace: vf.Trace) -> float:
        if task.faulty and task.fault == "raise":
            raise RuntimeError("the exact reward broke")
        if task.faulty and task.fault == "nan":
            return math.nan
        words = trace.last_reply.lower().split()
        return 1.0 if words and words[0] == task.word else 0.0

    @vf.reward(weight=0.25)
    async def short(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply.split()) <= 2 else 0.0


class FaultEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class FaultEnv(vf.Env[FaultEnvConfig]):
    async def run(self, task, agents):
        if task.data.faulty and task.data.fault == "hang":
            await asyncio.sleep(3600)
        if task.data.faulty and task.data.fault == "env_raise":
            raise RuntimeError("the environment broke")
        if task.data.faulty and task.data.fault == "steer":
            async with agents.agent.interaction(task) as interaction:
                await interaction.turn()
                await interaction.send("hurry up")
            return
        await agents.agent.run(task)
        if task.data.faulty and task.data.fault == "twice":
            await agents.agent.run(task)


class FaultTaskset(vf.Taskset[FaultTask, FaultConfig]):
    def load(self) -> Iterator[FaultTask]:
        for i in range(self.config.tasks):
            word = WORDS[i % len(WORDS)]
            yield FaultTask(
                FaultData(
                    id=f"t{i}",
                    prompt=f"say {word}",
                    word=word,
                    faulty=i % self.config.every == 0,
                    fault=self.config.fault,
                ),
                self.config.task,
            )


__all__ = ["FaultConfig", "FaultData", "FaultEnv", "FaultEnvConfig", "FaultTask", "FaultTaskset"]
