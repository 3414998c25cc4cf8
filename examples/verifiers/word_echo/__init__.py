"""word_echo: a single-turn verifiers taskset, written the way verifiers' own tasksets are.

Each task asks the agent to say one word; the `@vf.reward` scores the reply's first word (1.0 when it is the
word asked for), a `@vf.metric` counts the reply's words. No Env is exported, so verifiers pairs it with its
SingleAgentEnv (one seat, one reply). `TasksetConfig` fields: `words` (the words to ask for) and `copies`
(tasks per word, each with its own id).

    PYTHONPATH=examples/verifiers .venv/bin/rw train env.name=verifiers env.options.taskset=word_echo
"""

from collections.abc import Iterator

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud", "green", "seven", "table", "light"]


class WordEchoConfig(vf.TasksetConfig):
    words: list[str] = WORDS
    copies: int = 4


class WordEchoData(vf.TaskData):
    word: str
    """The word the agent must say."""


class WordEchoTask(vf.Task[WordEchoData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def said_the_word(self, task: WordEchoData, trace: vf.Trace) -> float:
        words = trace.last_reply.lower().split()
        return 1.0 if words and words[0] == task.word else 0.0

    @vf.metric
    async def reply_words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class WordEchoTaskset(vf.Taskset[WordEchoTask, WordEchoConfig]):
    def load(self) -> Iterator[WordEchoTask]:
        for copy in range(self.config.copies):
            for word in self.config.words:
                yield WordEchoTask(
                    WordEchoData(
                        id=f"{word}-{copy}",
                        prompt=f"say the word {word}",
                        system_prompt="answer with one word",
                        word=word,
                    ),
                    self.config.task,
                )


__all__ = ["WordEchoConfig", "WordEchoData", "WordEchoTask", "WordEchoTaskset"]
