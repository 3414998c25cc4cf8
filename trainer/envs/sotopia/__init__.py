"""`env.name=sotopia`: SOTOPIA's scenarios and agent profiles (https://github.com/sotopia-lab/sotopia) as an
`rw train` environment, read from PROFILE FILES in sotopia's own export format - no Redis server and no
import of the sotopia package.

Why no sotopia import
---------------------
The sotopia package (0.1.5) pins openai<2 (and redis-om, litellm, pettingzoo==1.25, rich<15...), while this
project's vLLM set-up needs openai>=2.25 (vllm); it cannot live in the same environment as `rw train` with
vLLM. Its data, however, is plain JSON: this adapter reads the files sotopia writes with
`sotopia.database.environmentprofiles_to_jsonl`, `agentprofiles_to_jsonl` and `envagnetcombostorage_to_jsonl`.
To use sotopia's own scenarios, export them in a SEPARATE virtual environment (`python -m venv sotopia-venv &&
sotopia-venv/bin/pip install 'rwcore[sotopia]'` or just `pip install sotopia`, with its Redis server or
SOTOPIA_STORAGE_BACKEND=local as sotopia documents), write the three JSONL files into one folder and point
env.options.profiles at it. The project ships six environment profiles, six agent profiles and twelve
pairings written for it in that format (trainer/envs/sotopia/profiles/), not sotopia's dataset.

Profile folder (env.options.profiles; default: the shipped examples)
--------------------------------------------------------------------
environment_profiles.jsonl   one EnvironmentProfile per line. Required: env_id (or pk), codename, scenario,
                             agent_goals (two non-empty strings: agent 1's and agent 2's goal, sotopia's
                             <extra_info>/<strategy_hint> tags allowed), relationship (0-5 or its name:
                             stranger, know_by_name, acquaintance, friend, romantic_relationship,
                             family_member). Optional: source, tag, *_constraint (ignored).
agent_profiles.jsonl         one AgentProfile per line. Required: agent_id (or pk), first_name, last_name, age,
                             occupation, personality_and_values, secret. Optional: public_info, gender,
                             gender_pronoun, big_five, mbti, decision_making_style, ... (public_info joins the
                             background).
env_agent_combo_storages.jsonl  (optional) one pairing per line: env_id, agent_ids (two agent ids). Without it,
                             every environment is paired with `pairs_per_env` (2) distinct seeded pairs of agents.
A file or line that is not JSON, or that lacks a required field, is refused at start with an error naming the
file, the line and the field; an unknown id in a pairing likewise.

Tasks, tags and splits
----------------------
A task is (environment, pairing, the agent's side): the agent plays agent 1 or agent 2 (env.options.roles:
"both" (default), "agent1", "agent2"), the partner the other side. Tags: `relationship/<name>` (the
sampler's task types: the relationship changes what is appropriate), `sotopia/<agent1|agent2>` and
`codename/<codename>`. Splits are by ENVIRONMENT (no scenario appears in both): a seeded
`eval_fraction` (0.34) of the environments, at least one, is held out (env.options.seed).

Partner, evaluator, rubric families, success
--------------------------------------------
Exactly those of env.name=social (rwcore.trainer.envs.social), which this environment extends: partner
"scripted" (fallback; agrees once the agent used `difficulty` (2) distinct words of its goal), "llm" (an
OpenAI-compatible model role-playing the other profile: name, age, occupation, personality, its private
goal and secret) or "self" (self-play); the outcome from the SOTOPIA-EVAL seven-dimension rubric (an LLM
evaluator distinct from the process judge, or the keyword heuristic fallback); reward = goal / 10, success =
goal >= 7. Rubric families: pursues_goal, asks_partner, proposes_terms, stays_polite, keeps_secret,
no_repetition (keyword rules for judge.kind=rule; with judge.kind=openai the LLM judge scores them). The
goal keywords the scripted fallbacks read are the goal's content words (sotopia's hint tags removed); the
secret keywords the secret's content words.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from rwcore.trainer.envs.base import Task, register
from rwcore.trainer.envs.social import SocialEnv

DEFAULT_PROFILES = Path(__file__).parent / "profiles"
RELATIONSHIPS = ("stranger", "know_by_name", "acquaintance", "friend", "romantic_relationship", "family_member")
ENV_FILE, AGENT_FILE, COMBO_FILE = (
    "environment_profiles.jsonl",
    "agent_profiles.jsonl",
    "env_agent_combo_storages.jsonl",
)
ENV_REQUIRED = ("codename", "scenario", "agent_goals", "relationship")
AGENT_REQUIRED = ("first_name", "last_name", "age", "occupation", "personality_and_values", "secret")
_STOP = set(
    """a an the and or but if of to in on at for with from by as is are was were be been being it its this that
these those you your yours he she they them his her their we our i me my not no do does did have has had will would
can could should may might must so than then there here what which who whom when where why how all any some more
most other into over under about after before again also just only very too out up down off own same such both each
few while until because unless without within between through during per get got make made keep want need without
one two three four five tomorrow today extra info strategy hint clarification could""".split()
)
PARTNER_LINES = (
    "I see what you mean, but I am not sure yet.",
    "Hmm. Tell me more about why this matters to you.",
    "That is a lot to ask. What would that mean for me?",
)
PARTNER_AGREES = "Alright, you have convinced me. Let us do it your way."


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _plain(goal: str) -> str:
    """A sotopia goal without its <extra_info>/<strategy_hint>/<clarification_hint> tags (their text kept)."""
    return " ".join(re.sub(r"</?[a-z_]+>", " ", goal).split())


def _keywords(text: str, limit: int, min_len: int = 4) -> list[str]:
    out: list[str] = []
    for word in _words(_plain(text)):
        if len(word) >= min_len and word not in _STOP and not word.isdigit() and word not in out:
            out.append(word)
    return out[:limit]


def _read_jsonl(path: Path, kind: str, required: tuple[str, ...], id_key: str) -> dict[str, dict]:
    """id -> record of one sotopia export file; ValueError naming the file, the line and the field."""
    if not path.is_file():
        raise ValueError(
            f"env.options.profiles: {str(path.parent)!r} has no {path.name} ({kind} profiles in "
            "sotopia's JSONL export format)"
        )
    out: dict[str, dict] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"profile file {str(path)!r}: not readable ({error})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"profile file {str(path)!r}, line {number}"
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{where}: not JSON ({error})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: must be a JSON object")
        rid = record.get(id_key, record.get("pk"))
        if not isinstance(rid, str) or not rid.strip():
            raise ValueError(f"{where}: missing field {id_key!r} (or 'pk')")
        for key in required:
            if key not in record or record[key] is None:
                raise ValueError(f"{where} ({rid!r}): missing field {key!r}")
        if rid in out:
            raise ValueError(f"{where}: {id_key} {rid!r} appears twice")
        out[rid] = record
    if not out:
        raise ValueError(f"profile file {str(path)!r}: no {kind} profile in it")
    return out


def _check_environment(path: Path, rid: str, e: dict) -> None:
    where = f"profile file {str(path)!r} ({rid!r})"
    goals = e["agent_goals"]
    if not isinstance(goals, list) or len(goals) != 2 or not all(isinstance(g, str) and _plain(g) for g in goals):
        raise ValueError(f"{where}: field 'agent_goals' must be a list of two non-empty strings")
    for key in ("codename", "scenario"):
        if not isinstance(e[key], str) or not e[key].strip():
            raise ValueError(f"{where}: field {key!r} must be a non-empty string")
    rel = e["relationship"]
    if not (rel in RELATIONSHIPS or (isinstance(rel, int) and not isinstance(rel, bool) and 0 <= rel < 6)):
        raise ValueError(f"{where}: field 'relationship' must be 0-5 or one of {list(RELATIONSHIPS)}, got {rel!r}")


def _check_agent(path: Path, rid: str, a: dict) -> None:
    where = f"profile file {str(path)!r} ({rid!r})"
    for key in ("first_name", "last_name", "occupation", "personality_and_values"):
        if not isinstance(a[key], str) or not a[key].strip():
            raise ValueError(f"{where}: field {key!r} must be a non-empty string")
    if not isinstance(a["secret"], str):
        raise ValueError(f"{where}: field 'secret' must be a string")
    if isinstance(a["age"], bool) or not isinstance(a["age"], int) or a["age"] < 0:
        raise ValueError(f"{where}: field 'age' must be a non-negative integer, got {a['age']!r}")


def load_profiles(folder: str | Path, pairs_per_env: int = 2, seed: int = 0):
    """(environments, agents, pairings) from a sotopia export folder (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"env.options.profiles: {str(folder)!r} is not a folder holding {ENV_FILE} and {AGENT_FILE}")
    envs = _read_jsonl(folder / ENV_FILE, "environment", ENV_REQUIRED, "env_id")
    for rid, e in envs.items():
        _check_environment(folder / ENV_FILE, rid, e)
    agents = _read_jsonl(folder / AGENT_FILE, "agent", AGENT_REQUIRED, "agent_id")
    for rid, a in agents.items():
        _check_agent(folder / AGENT_FILE, rid, a)
    pairings: list[tuple[str, str, str]] = []
    combo_path = folder / COMBO_FILE
    if combo_path.is_file():
        combos = _read_jsonl(combo_path, "pairing", ("env_id", "agent_ids"), "combo_id")
        for rid, c in combos.items():
            where = f"profile file {str(combo_path)!r} ({rid!r})"
            ids = c["agent_ids"]
            if c["env_id"] not in envs:
                raise ValueError(f"{where}: field 'env_id' names unknown environment {c['env_id']!r}")
            if not isinstance(ids, list) or len(ids) != 2 or ids[0] == ids[1]:
                raise ValueError(f"{where}: field 'agent_ids' must list two different agent ids")
            for aid in ids:
                if aid not in agents:
                    raise ValueError(f"{where}: field 'agent_ids' names unknown agent {aid!r}")
            pairings.append((c["env_id"], ids[0], ids[1]))
    else:
        if len(agents) < 2:
            raise ValueError(f"profile file {str(folder / AGENT_FILE)!r}: at least two agent profiles are needed")
        rng = random.Random(f"sotopia-pairs:{seed}")
        ordered = [(a, b) for a in sorted(agents) for b in sorted(agents) if a != b]
        for eid in sorted(envs):  # distinct pairs per environment
            for a, b in rng.sample(ordered, min(pairs_per_env, len(ordered))):
                pairings.append((eid, a, b))
    return envs, agents, pairings


def _person(a: dict) -> tuple[str, str]:
    name = f"{a['first_name']} {a['last_name']}"
    pronoun = f" ({a['gender_pronoun']})" if a.get("gender_pronoun") else ""
    public = f" {a['public_info']}" if a.get("public_info") else ""
    background = f"a {a['age']} year old {a['occupation'].lower()}{pronoun}.{public} {a['personality_and_values']}"
    return name, " ".join(background.split())


def _lenient_json(parse):
    """`parse` that also takes a JSON reply with raw control characters inside its strings (guided decoding
    lets them through; a strict json.loads refuses them): such a reply is re-encoded first. Everything the
    wrapped parser checks (schema fields, garbage messages) still applies."""

    def wrapped(text, *args):
        if isinstance(text, str):
            try:
                text = json.dumps(json.loads(text, strict=False))
            except ValueError:
                pass  # the wrapped parser reports it
        return parse(text, *args)

    wrapped.lenient = True
    return wrapped


class SotopiaEnv(SocialEnv):
    """SOTOPIA profiles (files in sotopia's export format) on the social environment's machinery."""

    name = "sotopia"

    def __init__(
        self,
        profiles: str | None = None,
        roles: str = "both",
        eval_fraction: float = 0.34,
        pairs_per_env: int = 2,
        seed: int = 0,
        difficulty: int = 2,
        **social_options,
    ) -> None:
        if "scenarios" in social_options:
            raise ValueError(
                "env.options.scenarios is env.name=social's option; env.name=sotopia reads "
                "env.options.profiles (a folder of sotopia JSONL exports)"
            )
        if roles not in ("both", "agent1", "agent2"):
            raise ValueError(f"env.options.roles must be 'both', 'agent1' or 'agent2', got {roles!r}")
        if (
            isinstance(eval_fraction, bool)
            or not isinstance(eval_fraction, (int, float))
            or not 0.0 < float(eval_fraction) < 1.0
        ):
            raise ValueError(f"env.options.eval_fraction must be in (0, 1), got {eval_fraction!r}")
        for key, value in (("pairs_per_env", pairs_per_env), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int) or (key == "pairs_per_env" and value < 1):
                raise ValueError(
                    f"env.options.{key} must be {'a positive ' if key == 'pairs_per_env' else 'an '}"
                    f"integer, got {value!r}"
                )
        if isinstance(difficulty, bool) or difficulty not in (1, 2, 3):
            raise ValueError(f"env.options.difficulty must be 1, 2 or 3, got {difficulty!r}")
        folder = Path(profiles).expanduser() if profiles else DEFAULT_PROFILES
        envs, agents, pairings = load_profiles(folder, pairs_per_env, seed)
        env_ids = sorted(envs)
        random.Random(f"sotopia-split:{seed}").shuffle(env_ids)
        held_out = set(env_ids[: max(1, round(eval_fraction * len(env_ids)))])
        if len(held_out) == len(env_ids):
            raise ValueError(
                f"env.options.profiles {str(folder)!r}: {len(env_ids)} environment profile(s) cannot "
                "make disjoint train and eval splits (at least two are needed)"
            )
        super().__init__(**social_options)  # the partner, evaluator and turn settings (validated there)
        sides = {"both": (0, 1), "agent1": (0,), "agent2": (1,)}[roles]
        scenarios = []
        for eid, a1, a2 in pairings:
            e = envs[eid]
            rel = e["relationship"] if isinstance(e["relationship"], str) else RELATIONSHIPS[e["relationship"]]
            people = (agents[a1], agents[a2])
            for side in sides:
                me, other = people[side], people[1 - side]
                my_name, my_background = _person(me)
                other_name, other_background = _person(other)
                scenarios.append(
                    {
                        "id": f"{eid}/{a1}+{a2}/agent{side + 1}",
                        "task_type": rel,
                        "difficulty": difficulty,
                        "split": "eval" if eid in held_out else "train",
                        "setting": " ".join(e["scenario"].split()),
                        "agent": {
                            "name": my_name,
                            "background": my_background,
                            "goal": _plain(e["agent_goals"][side]),
                            "secret": me["secret"],
                        },
                        "partner": {
                            "name": other_name,
                            "background": other_background,
                            "goal": _plain(e["agent_goals"][1 - side]),
                            "secret": other["secret"],
                        },
                        "goal_keywords": _keywords(e["agent_goals"][side], 8)
                        or _keywords(e["agent_goals"][side], 8, 2),
                        "secret_keywords": _keywords(me["secret"], 6, 5),
                        "partner_lines": list(PARTNER_LINES),
                        "partner_agrees": PARTNER_AGREES,
                        "tags": (f"relationship/{rel}", f"sotopia/agent{side + 1}", f"codename/{e['codename']}"),
                        "sotopia": {"env_id": eid, "codename": e["codename"], "agent_ids": [a1, a2], "side": side + 1},
                    }
                )
        seen: set[str] = set()
        for s in scenarios:
            if s["id"] in seen:
                raise ValueError(f"profile file {str(folder / COMBO_FILE)!r}: the pairing {s['id']!r} appears twice")
            seen.add(s["id"])
        self.scenarios = scenarios
        self.by_id = {s["id"]: s for s in scenarios}
        self.profiles = str(folder)
        if callable(getattr(self.partner, "parse", None)):  # the LLM partner
            self.partner.parse = _lenient_json(self.partner.parse)

    def _resolve_evaluator(self) -> None:
        super()._resolve_evaluator()
        evaluator = getattr(self, "evaluator", None)
        if evaluator is not None and not getattr(evaluator.parse, "lenient", False):
            evaluator.parse = _lenient_json(evaluator.parse)

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return [Task(s["id"], tuple(s["tags"]), dict(s)) for s in self.scenarios if s["split"] == split]


register("sotopia", SotopiaEnv)

__all__ = ["DEFAULT_PROFILES", "SotopiaEnv", "load_profiles"]
