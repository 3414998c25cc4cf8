"""color_guess: a multi-turn verifiers environment, written the way verifiers' own are (compare
verifiers.v1.tasksets.textarena: a game engine playing the user in `Env.run`).

The agent must find a secret color among the ones the prompt lists. Each wrong guess gets the reply
"no, not <guess> ; guess again" and the exchange goes on; the right one ends it (a trace-level `@vf.stop`).
The `@vf.reward` pays 1.0 for finding it on the first guess, a quarter less for each further guess (never
below 0.25 once found; 0 when never found); `@vf.metric`s count the guesses and whether it was found.
`TasksetConfig` fields: `colors` (the palette) and `games` (tasks: each picks its secret with its own seed).

    PYTHONPATH=examples/verifiers .venv/bin/rw train env.name=verifiers env.options.taskset=color_guess
"""

import random
from collections.abc import Iterator

import verifiers.v1 as vf

COLORS = ["red", "green", "blue", "yellow"]


class ColorGuessConfig(vf.TasksetConfig):
    colors: list[str] = COLORS
    games: int = 48


class ColorGuessData(vf.TaskData):
    secret: str
    colors: list[str]


def _guesses(trace: vf.Trace) -> list[str]:
    return [(m.content or "").lower().split()[:1] for m in trace.assistant_messages]


class ColorGuessTask(vf.Task[ColorGuessData, vf.State, vf.TaskConfig]):
    @vf.stop
    async def found(self, trace: vf.Trace) -> bool:
        return [trace.task.data.secret] in _guesses(trace)

    @vf.reward(weight=1.0)
    async def found_quickly(self, task: ColorGuessData, trace: vf.Trace) -> float:
        guesses = _guesses(trace)
        if [task.secret] not in guesses:
            return 0.0
        return max(0.25, 1.0 - 0.25 * guesses.index([task.secret]))

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)

    @vf.metric
    async def solved(self, task: ColorGuessData, trace: vf.Trace) -> float:
        return float([task.secret] in _guesses(trace))


class ColorGuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=4)


class ColorGuessEnv(vf.Env[ColorGuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guess = (segment.last_reply.lower().split() or [""])[0]
                if guess == task.data.secret:
                    break  # found: the exchange ends here
                segment = await interaction.turn(f"no, not {guess or 'that'} ; guess again")


class ColorGuessTaskset(vf.Taskset[ColorGuessTask, ColorGuessConfig]):
    def load(self) -> Iterator[ColorGuessTask]:
        for game in range(self.config.games):
            secret = random.Random(f"color_guess:{game}").choice(self.config.colors)
            yield ColorGuessTask(
                ColorGuessData(
                    id=f"game-{game}",
                    prompt="guess the secret color : " + " ".join(self.config.colors),
                    system_prompt="answer with one color",
                    secret=secret,
                    colors=list(self.config.colors),
                ),
                self.config.task,
            )


__all__ = [
    "ColorGuessConfig",
    "ColorGuessData",
    "ColorGuessEnv",
    "ColorGuessEnvConfig",
    "ColorGuessTask",
    "ColorGuessTaskset",
]
