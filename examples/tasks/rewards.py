"""The example's outcome function and rubric checks for `env.name=tasks` (see docs/environments.md, section
tasks). rwcore imports this module by name, so its folder goes on PYTHONPATH:

    PYTHONPATH=examples/tasks rw train env.name=tasks env.options.reward=rewards:score ...

Each function takes, by name, any of: completion, messages, metadata, task_id, tags.
"""

ITEMS = {"lamp", "sofa", "desk", "chair", "phone", "radio", "laptop", "camera", "printer", "speaker"}
ITEMS |= {"tent", "bike", "scooter", "stove", "kettle"}


def score(completion: str, metadata: dict) -> float:
    """1.0 when the reply names the task's item (metadata["answer"]) and no other, 0.5 when it names it among
    others, else 0.0. Success (what success rates count) is a reward of 1.0 (env.options.success_threshold)."""
    named = ITEMS & set(completion.lower().split())
    if metadata["answer"] not in named:
        return 0.0
    return 1.0 if named == {metadata["answer"]} else 0.5


def names_one_item(completion: str) -> bool:
    """Rubric check: the reply names exactly one item (right or wrong)."""
    return len(ITEMS & set(completion.lower().split())) == 1


def no_repeats(completion: str) -> bool:
    """Rubric check: no word of the reply is said twice."""
    words = completion.lower().split()
    return len(words) == len(set(words))
