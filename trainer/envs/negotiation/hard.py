"""The hard tier of the embedded default (`env.options.difficulty=hard`): multi-item sales.

Why a second tier
-----------------
Both papers claim that adapting the reward to what the policy fails at trains a better agent than outcome-only
RL, and the literature places that gain where outcome-only barely learns: the starting policy's pass@k near 0 and
most outcome-only groups failing entirely (PRIME, PAV, MT-GRPO, GiGPO). On the learnable tier
(`difficulty=learnable`, `NegotiationEnv`) the reading prior explores well enough that outcome-only
finds sales by itself (a no-deal task is won by `ask, end`, 1 in 64 uniform episodes), so that tier tests the regime
where the papers predict no gain. The hard tier is the papers' regime.

What a task is
--------------
The seller sells `items` (default 2) items to one buyer, one after the other, in one episode. Each item is a
learnable-tier sale of its own kind (standard, bundle, haggler, quote, no_deal; hostile and sold_out make a task
unwinnable), with the same observations, the same eight move words, the same buyer and the same per-item turn limit
(`max_turns`, 6). When an item's sale ends as the learnable tier counts a success (a closed deal at exactly the
buyer's budget, or an informed `end` of a hopeless one), the next observation is the next item's brief, exactly as
a new episode would open; when it ends any other way, the episode is over. The task succeeds when every item does,
so a win is a chain of 4 to 10 distinct, situation-dependent moves, and nothing about the language, the buyer or a
single sale is harder than on the learnable tier: the reading prior reads the same guidance lines, and every skill
text and rubric means what it means there.

Every split holds `unwinnable_share` (default 0.15) of tasks whose last item is hostile or sold out (the
partner's or the scenario's failure, as on the learnable tier); the other items are drawn uniformly from the five
winnable kinds, with distinct item names within a task. The ceiling (`ceiling()`) is the share of winnable held-out
tasks; `scripted_policy` reaches it. Task tags are the kinds of the task's items (a task counts under each), so
Arise's sampler and the per-type figures see the same seven task types as on the learnable tier.

Rubrics
-------
The capability library is the learnable tier's (`rubrics`): each rule is checked on every item of the
sale and passes when it passes on every item it applies to (fails when it fails on one; does not apply when it
applies to none). The reference annotator reads each item's part of the transcript with that item's scenario sheet
(`annotate`). Nothing names a winning sequence: each rule is one step of a sale, judged on the situation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rwcore.trainer.envs.base import Episode, Outcome, Task
from rwcore.trainer.envs.negotiation.environment import NegotiationEnv
from rwcore.trainer.envs.negotiation.tasks import KINDS, _apportion, make_task_data

__all__ = ["DIFFICULTIES", "HARD_KINDS", "HardNegotiationEnv", "make_negotiation"]

DIFFICULTIES: tuple[str, ...] = ("learnable", "hard")
HARD_KINDS: tuple[str, ...] = ("standard", "bundle", "haggler", "quote", "no_deal")
"""The winnable kinds an item of a hard task is drawn from (uniformly)."""
UNWINNABLE_KINDS: tuple[str, ...] = ("hostile", "sold_out")


def make_negotiation(
    difficulty: str = "learnable",
    seed: int = 0,
    num_train: int = 400,
    num_eval: int = 300,
    max_turns: int = 6,
    kind_weights: dict | None = None,
    price_words: bool = False,
    items: int | None = None,
    unwinnable_share: float | None = None,
):
    """`env.name=negotiation`: the learnable tier (`NegotiationEnv`, the embedded default) or the hard tier
    (`HardNegotiationEnv`). `items` and `unwinnable_share` are the hard tier's; `kind_weights` the learnable's."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"env.options.difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    if difficulty == "learnable":
        for key, value in (("items", items), ("unwinnable_share", unwinnable_share)):
            if value is not None:
                raise ValueError(
                    f"env.options.{key} is an option of env.options.difficulty=hard (multi-item sales), not of the "
                    "learnable tier"
                )
        return NegotiationEnv(
            seed=seed,
            num_train=num_train,
            num_eval=num_eval,
            max_turns=max_turns,
            kind_weights=kind_weights,
            price_words=price_words,
        )
    if kind_weights is not None:
        raise ValueError(
            "env.options.kind_weights is an option of the learnable tier; the hard tier draws every item "
            f"uniformly from {', '.join(HARD_KINDS)} (env.options.unwinnable_share sets the unwinnable tasks)"
        )
    return HardNegotiationEnv(
        seed=seed,
        num_train=num_train,
        num_eval=num_eval,
        max_turns=max_turns,
        price_words=price_words,
        items=2 if items is None else items,
        unwinnable_share=0.15 if unwinnable_share is None else unwinnable_share,
    )


class HardNegotiationEnv:
    """Multi-item seller negotiations (see the module docstring): `items` learnable-tier sales in a row.

    seed: task generation seed; num_train / num_eval: split sizes (disjoint, same every call); max_turns: agent
    turns per item (the episode's limit is items x max_turns); items: sales per task (2 to 4);
    unwinnable_share: share of each split whose last item is hostile or sold out; price_words: as on the
    learnable tier (the ten price numbers as action words).
    """

    name = "negotiation"
    difficulty = "hard"

    def __init__(
        self,
        seed: int = 0,
        num_train: int = 400,
        num_eval: int = 300,
        max_turns: int = 6,
        price_words: bool = False,
        items: int = 2,
        unwinnable_share: float = 0.15,
    ) -> None:
        if isinstance(items, bool) or not isinstance(items, int) or not 2 <= items <= 4:
            raise ValueError(f"env.options.items must be an integer from 2 to 4, got {items!r}")
        if (
            isinstance(unwinnable_share, bool)
            or not isinstance(unwinnable_share, (int, float))
            or not 0.0 <= unwinnable_share < 1.0
        ):
            raise ValueError(f"env.options.unwinnable_share must be a number in [0, 1), got {unwinnable_share!r}")
        # one item's sale: the learnable tier's simulator (it validates seed, split sizes, max_turns, price_words)
        self.item_env = NegotiationEnv(seed=seed, num_train=1, num_eval=1, max_turns=max_turns, price_words=price_words)
        for key, value in (("num_train", num_train), ("num_eval", num_eval)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"env.options.{key} must be an integer >= 1, got {value!r}")
        self.seed = seed
        self.num_train = num_train
        self.num_eval = num_eval
        self.items = items
        self.unwinnable_share = float(unwinnable_share)
        self.price_words = price_words
        self.max_turns_per_item = max_turns
        self.max_turns = items * max_turns
        self.system_prompt = self.item_env.system_prompt
        self._splits = self._generate()

    def __repr__(self) -> str:
        return (
            f"HardNegotiationEnv(seed={self.seed}, num_train={self.num_train}, num_eval={self.num_eval}, "
            f"items={self.items}, max_turns={self.max_turns_per_item} per item)"
        )

    # -- tasks ----------------------------------------------------------------

    def _generate(self) -> dict[str, list[Task]]:
        """Each split: round(unwinnable_share x size) tasks end with a hostile or sold-out item (alternately), the
        rest are winnable; every item kind is drawn uniformly from HARD_KINDS, item names distinct within a task,
        tasks distinct across both splits."""
        rng = random.Random(f"negotiation-hard-tasks-v1-{self.seed}-{self.items}")
        seen: set[tuple] = set()
        splits: dict[str, list[Task]] = {}
        for split, size in (("train", self.num_train), ("eval", self.num_eval)):
            unwinnable = _apportion({"unwinnable": self.unwinnable_share, "winnable": 1 - self.unwinnable_share}, size)
            lasts = [UNWINNABLE_KINDS[i % len(UNWINNABLE_KINDS)] for i in range(unwinnable.get("unwinnable", 0))]
            lasts += [None] * (size - len(lasts))
            tasks: list[Task] = []
            for last in lasts:
                for _attempt in range(200 * size):
                    kinds = [rng.choice(HARD_KINDS) for _ in range(self.items - (last is not None))]
                    kinds += [last] if last is not None else []
                    data = _task_data(rng, kinds)
                    if data is None:
                        continue
                    key = tuple(tuple(sorted((k, str(v)) for k, v in item.items())) for item in data["items"])
                    if key in seen:
                        continue
                    seen.add(key)
                    tasks.append(Task("", _tags(kinds), data))
                    break
                else:
                    raise ValueError(f"cannot generate {size} distinct {split} tasks; ask for fewer")
            rng.shuffle(tasks)
            splits[split] = [Task(f"neghard-{split}-{i:04d}", t.tags, t.data) for i, t in enumerate(tasks)]
        return splits

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return list(self._splits[split])

    def ceiling(self) -> float:
        """The best held-out success any policy can reach: the share of winnable held-out tasks."""
        tasks = self.tasks("eval")
        return sum(bool(t.data["winnable"]) for t in tasks) / len(tasks)

    # -- episodes -----------------------------------------------------------------

    def _item_task(self, task: Task, index: int) -> Task:
        data = task.data["items"][index]
        return Task(f"{task.task_id}/item{index}", KINDS[data["kind"]], data)

    def reset(self, task: Task, seed: int) -> Episode:
        first = self.item_env.reset(self._item_task(task, 0), seed)
        state = {
            "seed": int(seed),
            "items": len(task.data["items"]),
            "winnable": bool(task.data["winnable"]),
            "phases": [first.state],  # one learnable-tier episode state per item reached; the last is running
            "ended_by": None,
        }
        return Episode(task=task, observation=first.observation, state=state)

    def step(self, episode: Episode, action: str) -> Episode:
        if episode.done:
            raise ValueError("step called on a finished episode")
        s = dict(episode.state)
        phases = list(s["phases"])  # the given episode is left as it was (the item env copies what it changes)
        index = len(phases) - 1
        item = Episode(self._item_task(episode.task, index), episode.observation, False, phases[-1])
        after = self.item_env.step(item, action)
        phases[-1] = after.state
        s["phases"] = phases
        if not after.done:
            return Episode(task=episode.task, observation=after.observation, done=False, state=s)
        if self.item_env.outcome(after).success and index + 1 < s["items"]:
            nxt = self.item_env.reset(self._item_task(episode.task, index + 1), s["seed"])
            phases.append(nxt.state)
            return Episode(task=episode.task, observation=nxt.observation, done=False, state=s)
        s["ended_by"] = "sold_all" if self.item_env.outcome(after).success else after.state["ended_by"]
        return Episode(task=episode.task, observation=after.observation, done=True, state=s)

    def outcome(self, episode: Episode) -> Outcome:
        s = episode.state
        results = [
            self.item_env.outcome(Episode(self._item_task(episode.task, i), "", True, phase))
            for i, phase in enumerate(s["phases"])
        ]
        if len(results) == s["items"] and all(r.success for r in results):
            return Outcome(1.0, True, f"all {s['items']} items: " + "; ".join(r.reason for r in results))
        last = len(results)
        return Outcome(0.0, False, f"item {last} of {s['items']}: {results[-1].reason}")

    # -- language (the learnable tier's: the reading prior reads the same lines) --------------

    def action_vocabulary(self) -> list[str]:
        return self.item_env.action_vocabulary()

    def vocabulary(self) -> list[str]:
        return self.item_env.vocabulary()

    def guidance_language(self):
        return self.item_env.guidance_language()

    # -- adaptive-method pieces: the learnable tier's library, checked item by item ------------------

    def rules(self):
        from rwcore.trainer.envs.negotiation.rubrics import make_rules

        return make_rules(self)

    def reflector(self):
        from rwcore.trainer.envs.negotiation.reflector import NegotiationReflector

        return NegotiationReflector(self)

    def initial_library(self) -> tuple[str, ...]:
        from rwcore.trainer.envs.negotiation.rubrics import INITIAL_LIBRARY

        return INITIAL_LIBRARY

    def attributor(self):
        from rwcore.trainer.envs.negotiation.attributor import NegotiationAttributor

        return NegotiationAttributor(self)

    def labelled_cases(self, rule_ids: Sequence[str]) -> list:
        from rwcore.trainer.envs.negotiation.cases import labelled_cases

        return labelled_cases(self, rule_ids)

    def labelled_cases_by_rule(self, rule_ids: Sequence[str]) -> dict:
        from rwcore.trainer.envs.negotiation.cases import labelled_cases_by_rule

        return labelled_cases_by_rule(self, rule_ids)

    def case_tasks(self, rng: random.Random, tasks_per_kind: int, source: int) -> list[Task]:
        """Tasks for the labelled cases of one source (not the train / eval tasks): for every kind, `tasks_per_kind`
        tasks whose first item is of that kind, the other items drawn as in the splits (the unwinnable kinds last)."""
        out = []
        for kind in sorted(KINDS):
            for j in range(tasks_per_kind):
                while True:
                    rest = [rng.choice(HARD_KINDS) for _ in range(self.items - 1)]
                    kinds = [kind, *rest] if kind not in UNWINNABLE_KINDS else [*rest, kind]
                    data = _task_data(rng, kinds)
                    if data is not None:
                        break
                out.append(Task(f"neghard-case-{source}-{kind}-{j}", _tags(kinds), data))
        return out


def _tags(kinds: Sequence[str]) -> tuple[str, ...]:
    """A task's tags: its items' kinds' tags, in item order, each once."""
    return tuple(dict.fromkeys(tag for kind in kinds for tag in KINDS[kind]))


def _task_data(rng: random.Random, kinds: Sequence[str]) -> dict | None:
    """A task of these item kinds (None when the draw repeats an item name: the caller draws again)."""
    items = [make_task_data(rng, kind) for kind in kinds]
    if len({item["item"] for item in items}) < len(items):
        return None
    return {
        "kinds": list(kinds),
        "items": items,
        "winnable": all(item["winnable"] for item in items),
        "feasible": all(item["feasible"] for item in items),
    }
