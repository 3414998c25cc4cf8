"""`CoffeeEnv`: the simulator (tasks, episodes, outcome) and the providers the methods ask for.

Everything `rw train` calls is here; rwcore.trainer.envs.base documents the protocol. Tasks are drawn from a
seeded generator, so every call of `tasks(split)` gives the same list, and "train" and "eval" are disjoint.
`step` never changes the Episode it is given: it returns a new one.
"""

from __future__ import annotations

import random

from rwcore.trainer.envs.base import Episode, Outcome, Task

SIZES = ("small", "large")
ACTIONS = ("ask", "small", "large", "end")  # the words the built-in model may say (action_vocabulary)


class CoffeeEnv:
    name = "coffee"
    system_prompt = "you serve coffee . serve the size the customer wants"
    max_turns = 3  # agent turns per episode at most

    def __init__(self, num_train: int = 64, num_eval: int = 16, seed: int = 0, told_share: float = 0.5) -> None:
        if num_train < 1 or num_eval < 1 or not 0.0 <= told_share <= 1.0:
            raise ValueError("env.options: num_train and num_eval must be >= 1 and told_share in [0, 1]")
        self.num_train, self.num_eval, self.seed, self.told_share = num_train, num_eval, seed, told_share

    # ---- the simulator: what every environment has

    def tasks(self, split: str) -> list[Task]:
        """The split's tasks: tagged "told" (the customer says the size) or "untold" (it must be asked)."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        rng = random.Random(f"{self.seed}/{split}")  # a string seed: the same tasks in every process
        out = []
        for i in range(self.num_train if split == "train" else self.num_eval):
            told = rng.random() < self.told_share
            out.append(Task(f"{split}-{i}", ("told" if told else "untold",), {"size": rng.choice(SIZES), "told": told}))
        return out

    def reset(self, task: Task, seed: int) -> Episode:
        size, told = task.data["size"], task.data["told"]
        brief = f"customer wants {size} coffee" if told else "customer wants coffee"
        state = {"size": size, "told": told, "known": told, "asked": 0, "served": None, "known_when_served": None}
        return Episode(task, brief, state=state)

    def step(self, episode: Episode, action: str) -> Episode:
        words = action.strip().lower().split()
        word = words[0] if words else ""
        state = {**episode.state, "moves": [*episode.state.get("moves", []), word]}
        done = False
        if word == "ask":
            state["asked"] += 1
            state["known"] = True
            reply = f"customer says {state['size']}"
        elif word in SIZES:
            state["served"], state["known_when_served"] = word, state["known"]
            reply, done = f"customer gets {word} coffee", True
        elif word == "end":
            reply, done = "customer leaves", True
        else:
            reply = "customer does not understand"
        if len(state["moves"]) >= self.max_turns and not done:
            reply, done = f"{reply} time up", True
        return Episode(episode.task, reply, done, state)

    def outcome(self, episode: Episode) -> Outcome:
        served, size = episode.state["served"], episode.state["size"]
        success = served == size
        return Outcome(1.0 if success else 0.0, success, f"served {served}, wanted {size}")

    def vocabulary(self) -> list[str]:
        """Every word of prompts, observations, moves and skill texts (the built-in model's tokenizer)."""
        from my_env_package.rules import SKILLS

        texts = [
            self.system_prompt,
            "customer wants coffee says gets does not understand leaves time up",
            *SKILLS.values(),
        ]
        return sorted({w for text in texts for w in text.split()} | set(SIZES) | set(ACTIONS))

    # ---- optional providers (absent ones are simply not provided)

    def action_vocabulary(self) -> list[str]:
        return list(ACTIONS)

    def rules(self):
        """The rubric library as programmatic checks (judge.kind=rule judges with them)."""
        from my_env_package.rules import rules

        return rules()

    def reflector(self):
        """Arise's reflection without an LLM: proposes each rule with its skill text."""
        from my_env_package.rules import SKILLS
        from rwcore.trainer.envs.rule_providers import RuleReflector

        return RuleReflector(self.rules(), SKILLS)

    def attributor(self):
        """RewardWeaver's failure attribution without an LLM: a failing rule is the deficit."""
        from rwcore.trainer.envs.rule_providers import RuleAttributor

        return RuleAttributor(self.rules())


def make_env(num_train: int = 64, num_eval: int = 16, seed: int = 0, told_share: float = 0.5) -> CoffeeEnv:
    """The factory `env.name=coffee` (or `my_env_package:make_env`) calls with `env.options` as keywords."""
    return CoffeeEnv(num_train=num_train, num_eval=num_eval, seed=seed, told_share=told_share)
