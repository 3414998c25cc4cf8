"""The tools environment's task types and their seeded generator (see the package docstring, "Task types")."""

from __future__ import annotations

import random
import statistics

KINDS: tuple[str, ...] = ("compute", "transform", "write_file", "fix_bug", "search")
INPUT_FILES = {
    "compute": ("data.csv",),
    "transform": ("people.csv",),
    "write_file": (),
    "fix_bug": ("stats.py", "numbers.txt"),
    "search": ("docs",),
}
CALL_BUDGET = {"compute": 3, "transform": 4, "write_file": 3, "fix_bug": 4, "search": 4}
"""Tool calls a careful agent needs at most (efficient_calls)."""

_GROUPS = ("red", "blue", "green", "gold")
_ITEMS = ("bolt", "nut", "gear", "pipe", "valve", "wire", "cog", "pin", "rod", "belt", "cap", "disk")
_NAMES = (
    "ada",
    "ben",
    "cleo",
    "dan",
    "eve",
    "finn",
    "gus",
    "hana",
    "ivan",
    "june",
    "kai",
    "lena",
    "milo",
    "nora",
    "omar",
    "pia",
    "quin",
    "rosa",
    "sam",
    "tara",
)
_CITIES = ("oslo", "lima", "rome", "kyiv", "baku")
_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "lamp", "river", "stone", "cloud", "maple", "north", "amber")
_ENTITIES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
_KEYS = ("port", "owner", "region", "version", "color")
_VALUES = {
    "port": lambda r: str(r.randrange(1024, 9999)),
    "owner": lambda r: r.choice(_NAMES),
    "region": lambda r: r.choice(("north", "south", "east", "west")) + str(r.randrange(1, 9)),
    "version": lambda r: f"{r.randrange(1, 9)}.{r.randrange(0, 20)}",
    "color": lambda r: r.choice(("teal", "ochre", "navy", "plum", "jade")),
}
STATS = ("sum", "mean", "max", "count")

_GOOD_STATS = (
    "import sys\n\n\ndef total(values):\n    s = 0\n    for i in range(0, len(values)):\n"
    "        s += values[i]\n    return s\n\n\nvalues = [int(line) for line in open('numbers.txt') if "
    "line.strip()]\nprint(total(values))\n"
)
BUGS: dict[str, tuple[str, str]] = {  # bug name -> (buggy text, correct text) in stats.py
    "skips_first": ("range(1, len(values))", "range(0, len(values))"),
    "subtracts": ("s -= values[i]", "s += values[i]"),
    "starts_at_one": ("s = 1", "s = 0"),
}


def make_task_data(rng: random.Random, kind: str) -> dict:
    """One task instance of `kind` (files to put in the sandbox, the question, what the verifier expects)."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; known: {list(KINDS)}")
    hard = rng.random() < 0.5
    data: dict = {"kind": kind, "difficulty": "hard" if hard else "easy", "files": {}}
    if kind == "compute":
        rows = [(rng.choice(_ITEMS), rng.choice(_GROUPS), rng.randrange(1, 100)) for _ in range(30 if hard else 8)]
        group = rows[0][1]
        stat = rng.choice(STATS)
        values = [v for _, g, v in rows if g == group]
        expected = {
            "sum": sum(values),
            "mean": round(statistics.mean(values), 2),
            "max": max(values),
            "count": len(values),
        }[stat]
        data["files"]["data.csv"] = "item,group,value\n" + "".join(f"{i},{g},{v}\n" for i, g, v in rows)
        data.update(stat=stat, group=group, expected=expected)
        data["brief"] = (
            f"data.csv has columns item , group , value . answer the {stat} of value over the rows "
            f"whose group is {group}" + (" , rounded to 2 decimals" if stat == "mean" else "")
        )
    elif kind == "transform":
        people = [(name, rng.randrange(18, 70), rng.choice(_CITIES)) for name in rng.sample(_NAMES, 16 if hard else 6)]
        city, age = people[0][2], rng.choice((25, 30, 40))
        expected = sorted(n for n, a, c in people if c == city and a >= age)
        data["files"]["people.csv"] = "name,age,city\n" + "".join(f"{n},{a},{c}\n" for n, a, c in people)
        data.update(city=city, min_age=age, expected=expected, output="out.json")
        data["brief"] = (
            f"people.csv has columns name , age , city . write out.json : a json list of the names of "
            f"the people in {city} aged at least {age} , sorted . then answer done"
        )
    elif kind == "write_file":
        lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(2, 5))) for _ in range(5 if hard else 2)]
        data.update(lines=lines, output="notes/summary.txt")
        data["brief"] = (
            "create notes/summary.txt whose content is exactly these lines : "
            + " | ".join(lines)
            + " . then answer done"
        )
    elif kind == "fix_bug":
        numbers = [rng.randrange(1, 50) for _ in range(12 if hard else 4)]
        bug = rng.choice(sorted(BUGS))
        buggy, correct = BUGS[bug]
        data["files"]["numbers.txt"] = "".join(f"{n}\n" for n in numbers)
        data["files"]["stats.py"] = _GOOD_STATS.replace(correct, buggy)
        data.update(bug=bug, patch=[buggy, correct], expected=sum(numbers), output="stats.py")
        data["brief"] = (
            "stats.py should print the sum of the numbers in numbers.txt but it has a bug . fix it , "
            "run it and answer what it prints"
        )
    else:  # search
        entity, key = rng.choice(_ENTITIES), rng.choice(_KEYS)
        facts = {}
        for e in _ENTITIES:
            for k in _KEYS:
                facts[(e, k)] = _VALUES[k](rng)
        count = 8 if hard else 3
        pairs = sorted(facts)
        rng.shuffle(pairs)
        chunks = [pairs[i::count] for i in range(count)]
        for i, chunk in enumerate(chunks):
            data["files"][f"docs/file{i}.txt"] = "".join(f"the {k} of {e} is {facts[(e, k)]}.\n" for e, k in chunk)
        data.update(entity=entity, key=key, expected=facts[(entity, key)])
        data["brief"] = f"the files in docs say facts about services . what is the {key} of {entity} ?"
    return data


def task_words() -> set[str]:
    """Every word a task brief draws from the generator's lists (groups, cities, words, entities, keys, stats)."""
    return set(_GROUPS) | set(_CITIES) | set(_WORDS) | set(_ENTITIES) | set(_KEYS) | set(STATS)
