"""The skill-reading probe: does the policy follow guidance in its prompt, and only guidance?

Two measurements, both the probability of the hinted move under the policy's action space (the move words
and `<end>`, as rollouts sample), with the guidance in the system prompt and without it:

- held-out pairings (`corpus.heldout_pairs`, which no corpus line makes): for each, contexts of 0 to 2
  earlier turns and then an observation of its situation, with its line among 0 to 5 distractor lines (other
  situations, random moves) in the skills section; "without" is the same conversation under the bare system
  prompt. Chance is 1 / the number of moves.
- the environment's own skill texts (`GuidanceLanguage.skill_texts`), each at the situation it names, in
  real episodes of held-out tasks (every move sequence of up to `depth` moves from the first `tasks` held-out
  tasks, the contexts where the episode shows that situation): the text alone in the skills section vs the
  bare prompt, and among every skill's first text at once. A text that names no single situation and move
  (e.g. "use one clear move each turn") is listed as not probed.

The light mode (`probe(..., light=True)`, what `rw train` takes at every held-out evaluation:
`EvaluationProbe`) is the full probe restricted to a subset of its contexts, with the same definitions: the
first `LIGHT_CONTEXTS` contexts of each held-out pairing and of each situation's episodes, only the first
text of each situation -> move pairing the skill texts name (in the negotiation environment 11 of its 30
texts: each rule's first, and one second text that names another pairing), and only the prompts with and
without the guidance (no distractors-only or all-skills prompt).

`rw probe` prints it for the cached prior or any checkpoint; `rw pretrain` runs it on the prior it builds
and keeps it in prior.json. The probe draws its contexts from its own seeded generators and runs under
`torch.random.fork_rng`: it leaves every global random state, and the model's train / eval mode, as it found
them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rwcore.arise.pool.prompt import render_system_prompt
from rwcore.trainer.prior.corpus import (
    CorpusSpec,
    encode_conversation,
    fillers_for,
    heldout_pairs,
    parse_guidance,
    render_line,
)

__all__ = [
    "CONTEXTS_PER_PAIR",
    "CONTEXTS_PER_SKILL",
    "LIGHT_CONTEXTS",
    "EvaluationProbe",
    "HeldoutContext",
    "episode_contexts",
    "format_probe",
    "heldout_contexts",
    "probe",
    "probe_metrics",
]

CONTEXTS_PER_PAIR = 24
CONTEXTS_PER_SKILL = 24
LIGHT_CONTEXTS = 6  # the light mode's contexts per held-out pairing and per skill text

Prompt = tuple[str, list[str], list[str]]  # (system prompt, observations, moves): the last cue is asked


@dataclass(frozen=True)
class HeldoutContext:
    """One context of a held-out pairing: the conversation under three system prompts - `guided` (the
    pairing's line among the distractor lines), `bare` (the base prompt) and `distractors` (the other lines
    alone)."""

    situation: str
    move: str
    guided: Prompt
    bare: Prompt
    distractors: Prompt


def heldout_contexts(
    env, language, spec: CorpusSpec, *, seed: int = 12345, per_pair: int = CONTEXTS_PER_PAIR
) -> list[HeldoutContext]:
    """The first `per_pair` (at most CONTEXTS_PER_PAIR) contexts of each held-out pairing, pairing by pairing,
    from one generator seeded by `seed`: every pairing's CONTEXTS_PER_PAIR contexts are drawn whatever
    `per_pair`, so a smaller `per_pair` keeps a prefix of the full probe's contexts."""
    if not 0 < per_pair <= CONTEXTS_PER_PAIR:
        raise ValueError(f"per_pair must be in 1..{CONTEXTS_PER_PAIR}, got {per_pair}")
    actions = list(language.actions)
    base = env.system_prompt
    names = [s.name for s in language.situations]
    fillers = fillers_for(language, env.vocabulary())
    rng = random.Random(f"rwcore-probe-{seed}")
    found = []
    for situation, move in heldout_pairs(language, spec):
        for k in range(CONTEXTS_PER_PAIR):
            others = rng.sample([n for n in names if n != situation], rng.randint(0, 5))
            lines = [(situation, move)] + [(o, rng.choice(actions)) for o in others]
            rng.shuffle(lines)
            texts = [render_line(rng, s, a, language, fillers, set(language.skill_texts)) for s, a in lines]
            earlier = [rng.choice(names) for _ in range(rng.randint(0, 2))]
            observations = [language.observe(s, rng) for s in earlier] + [language.observe(situation, rng)]
            moves = [rng.choice(actions) for _ in earlier]
            distractors = [t for (s, _), t in zip(lines, texts) if s != situation]
            if k < per_pair:
                found.append(
                    HeldoutContext(
                        situation,
                        move,
                        (render_system_prompt(base, texts), observations, moves),
                        (base, observations, moves),
                        (render_system_prompt(base, distractors), observations, moves),
                    )
                )
    return found


def episode_contexts(
    env, language, tasks: int = 300, depth: int = 4, per_situation: int = CONTEXTS_PER_SKILL
) -> dict[str, list[tuple[list[str], list[str]]]]:
    """situation -> up to `per_situation` (observations, moves) of real held-out episodes whose last
    observation shows it (every move sequence of up to `depth` moves from the first `tasks` held-out tasks,
    at most 2 contexts per task and situation, so that many tasks are represented)."""
    found: dict[str, list] = {s.name: [] for s in language.situations}
    for task in env.tasks("eval")[:tasks]:
        taken: dict[str, int] = {}
        frontier = [(env.reset(task, 0), [], [])]
        while frontier:
            episode, observations, moves = frontier.pop(0)
            observations = observations + [episode.observation]
            situation = language.situation_of(episode.observation)
            if situation in found and len(found[situation]) < per_situation and taken.get(situation, 0) < 2:
                found[situation].append((observations, moves))
                taken[situation] = taken.get(situation, 0) + 1
            if len(moves) < depth:
                for move in language.actions:
                    child = env.step(episode, move)
                    if not child.done:
                        frontier.append((child, observations, moves + [move]))
    return found


def _probabilities(
    model,
    codec,
    prompts: Sequence[Prompt],
    actions: Sequence[str],
    max_length: int,
    batch: int = 64,
) -> torch.Tensor:
    """[N, len(actions)] float probabilities of each move at the last cue of each (system, observations,
    moves), in batches of `batch` prompts, with the model in eval mode (restored afterwards) and no gradient."""
    from rwcore.trainer.policy import Policy
    from rwcore.trainer.prior.scoring import move_logprobs

    allowed = torch.tensor([codec.vocab[a] for a in actions] + [codec.end_id], dtype=torch.long)
    device = next(model.parameters()).device
    policy = Policy(model, codec, device)
    out = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(prompts), batch):
                encoded = []
                for system, observations, moves in prompts[start : start + batch]:
                    ids, positions = encode_conversation(codec, system, observations, moves)
                    encoded.append((ids[-max_length:], len(ids[-max_length:]) - 1))
                width = max(len(ids) for ids, _ in encoded)
                tensor = torch.tensor([ids + [codec.pad_id] * (width - len(ids)) for ids, _ in encoded], device=device)
                mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in encoded], device=device)
                rows = torch.arange(len(encoded), device=device)
                positions = torch.tensor([p for _, p in encoded], device=device)
                out.append(
                    move_logprobs(policy, tensor, mask, rows, positions, allowed.to(device)).exp()[:, : len(actions)]
                )
    finally:
        model.train(was_training)
    return torch.cat(out).cpu() if out else torch.zeros(0, len(actions))


def probe(
    model,
    codec,
    env,
    language,
    spec: CorpusSpec,
    *,
    seed: int = 12345,
    light: bool = False,
    contexts: dict[str, list[tuple[list[str], list[str]]]] | None = None,
) -> dict:
    """The probe's figures as plain data (see the module docstring). `light`: the light mode; `contexts`:
    `episode_contexts(env, language)` when the caller keeps them (they depend on the environment only)."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return _probe(model, codec, env, language, spec, seed, light, contexts)


def _probe(model, codec, env, language, spec: CorpusSpec, seed: int, light: bool, contexts) -> dict:
    actions = list(language.actions)
    base = env.system_prompt
    per_context = LIGHT_CONTEXTS if light else None
    # held-out pairings, synthetic contexts
    held = heldout_contexts(env, language, spec, seed=seed, per_pair=per_context or CONTEXTS_PER_PAIR)
    variants = ("with", "without") if light else ("with", "without", "distractors_only")
    prompts = [
        prompt for context in held for prompt in (context.guided, context.bare, context.distractors)[: len(variants)]
    ]
    probs = _probabilities(model, codec, prompts, actions, spec.max_length)
    pairs: dict[str, dict] = {}
    for k, context in enumerate(held):
        column = actions.index(context.move)
        entry = pairs.setdefault(f"{context.situation} -> {context.move}", {key: [] for key in variants})
        for j, key in enumerate(variants):
            entry[key].append(float(probs[len(variants) * k + j, column]))
    pairs = {name: {key: _mean(values) for key, values in entry.items()} for name, entry in pairs.items()}
    heldout = {key: _mean([entry[key] for entry in pairs.values()]) for key in variants}
    # the environment's own skill texts, in real episodes
    contexts = contexts if contexts is not None else episode_contexts(env, language)
    parsed = [(text, parse_guidance(text, language)) for text in language.skill_texts]
    firsts = _first_texts(parsed)
    probed_texts = set(firsts) if light else {text for text, pair in parsed if pair is not None}
    variants = ("with", "without") if light else ("with", "without", "among_all_skills")
    prompts, index, skills = [], [], []
    for text, pair in parsed:
        if pair is None:
            skills.append({"text": text, "probed": False})
            continue
        if text not in probed_texts:
            continue
        situation, move = pair
        shown = contexts[situation][:per_context] if per_context else contexts[situation]
        for observations, moves in shown:
            prompts += [
                (render_system_prompt(base, [text]), observations, moves),
                (base, observations, moves),
                (render_system_prompt(base, firsts), observations, moves),
            ][: len(variants)]
            index.append(len(skills))
        skills.append({"text": text, "probed": True, "situation": situation, "move": move, "contexts": len(shown)})
    probs = _probabilities(model, codec, prompts, actions, spec.max_length) if prompts else torch.zeros(0, 1)
    gathered: dict[int, list] = {}
    for k, position in enumerate(index):
        column = actions.index(skills[position]["move"])
        gathered.setdefault(position, []).append(
            [float(probs[len(variants) * k + j, column]) for j in range(len(variants))]
        )
    for position, rows in gathered.items():
        skills[position].update({key: _mean([r[j] for r in rows]) for j, key in enumerate(variants)})
        skills[position]["lift"] = skills[position]["with"] - skills[position]["without"]
    probed = [s for s in skills if s.get("probed") and "lift" in s]
    return {
        "chance": 1.0 / len(actions),
        "mode": "light" if light else "full",
        "heldout": {**heldout, "pairs": pairs, "contexts_per_pair": per_context or CONTEXTS_PER_PAIR},
        "skills": skills,
        "skills_summary": {
            "probed": len(probed),
            "not_probed": sum(not s["probed"] for s in skills),
            "min_lift": min((s["lift"] for s in probed), default=None),
            "mean_lift": _mean([s["lift"] for s in probed]) if probed else None,
            "mean_with": _mean([s["with"] for s in probed]) if probed else None,
            "mean_without": _mean([s["without"] for s in probed]) if probed else None,
        },
    }


def probe_metrics(report: dict, prefix: str = "eval/probe/") -> dict[str, float]:
    """The probe's summary as metric columns: `<prefix>heldout_with`, `heldout_without` (P(hinted move) on the
    held-out pairings with and without the line), `skill_lift_mean`, `skill_lift_min` (over the probed skill
    texts; NaN when no held-out episode reaches any of their situations)."""
    summary = report["skills_summary"]
    return {
        f"{prefix}heldout_with": report["heldout"]["with"],
        f"{prefix}heldout_without": report["heldout"]["without"],
        f"{prefix}skill_lift_mean": _or_nan(summary["mean_lift"]),
        f"{prefix}skill_lift_min": _or_nan(summary["min_lift"]),
    }


class EvaluationProbe:
    """The light probe `rw train` takes at every held-out evaluation (train.probe_at_eval): `metrics(model,
    codec)` -> `probe_metrics` of `probe(..., light=True)`. Keeps the episode contexts, which depend on the
    environment alone, from the first call on."""

    def __init__(self, env, language, spec: CorpusSpec) -> None:
        self.env, self.language, self.spec = env, language, spec
        self._contexts = None

    def metrics(self, model, codec) -> dict[str, float]:
        if self._contexts is None:
            self._contexts = episode_contexts(self.env, self.language)
        report = probe(model, codec, self.env, self.language, self.spec, light=True, contexts=self._contexts)
        return probe_metrics(report)


def _first_texts(parsed) -> list[str]:
    """The first probed text of each situation -> move pairing (what a prompt showing every skill holds)."""
    seen, texts = set(), []
    for text, pair in parsed:
        if pair is not None and pair not in seen:
            seen.add(pair)
            texts.append(text)
    return texts


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _or_nan(value) -> float:
    return float("nan") if value is None else float(value)


def format_probe(report: dict) -> str:
    """The full probe (not the light mode, which has no distractors-only or all-skills figures) as a few lines
    and a table, for the terminal."""
    chance = report["chance"]
    h = report["heldout"]
    lines = [
        f"held-out pairings ({len(h['pairs'])}, {h['contexts_per_pair']} contexts each, never in the corpus): "
        f"P(hinted move) {h['with']:.3f} with the guidance line, {h['without']:.3f} without it, "
        f"{h['distractors_only']:.3f} with only the other lines (chance {chance:.3f})"
    ]
    summary = report["skills_summary"]
    if summary["probed"]:
        lines.append(
            f"environment skill texts at their situation ({summary['probed']} probed, "
            f"{summary['not_probed']} name no single move): P(move) {summary['mean_with']:.3f} with the "
            f"text vs {summary['mean_without']:.3f} without; lift min {summary['min_lift']:+.3f}, "
            f"mean {summary['mean_lift']:+.3f}"
        )
    lines.append(f"{'with':>6} {'without':>7} {'lift':>6} {'all':>6}  situation -> move  text")
    for skill in report["skills"]:
        if not skill["probed"]:
            lines.append(f"{'':>6} {'':>7} {'':>6} {'':>6}  (not probed)  {skill['text']}")
        elif "lift" not in skill:
            lines.append(
                f"{'':>6} {'':>7} {'':>6} {'':>6}  {skill['situation']} -> {skill['move']} "
                f"(no held-out episode reaches it)  {skill['text']}"
            )
        else:
            lines.append(
                f"{skill['with']:6.3f} {skill['without']:7.3f} {skill['lift']:+6.3f} "
                f"{skill['among_all_skills']:6.3f}  {skill['situation']} -> {skill['move']}  {skill['text']}"
            )
    return "\n".join(lines)
