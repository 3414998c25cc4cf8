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

`rw probe` prints it for the cached prior or any checkpoint; `rw pretrain` runs it on the prior it builds
and keeps it in prior.json.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

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

__all__ = ["probe", "format_probe", "episode_contexts"]

CONTEXTS_PER_PAIR = 24
CONTEXTS_PER_SKILL = 24


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
    prompts: Sequence[tuple[str, list[str], list[str]]],
    actions: Sequence[str],
    max_length: int,
    batch: int = 64,
) -> torch.Tensor:
    """[N, len(actions)] probabilities of each move at the last cue of each (system, observations, moves)."""
    from rwcore.trainer.policy import Policy
    from rwcore.trainer.prior.scoring import move_logprobs

    allowed = torch.tensor([codec.vocab[a] for a in actions] + [codec.end_id], dtype=torch.long)
    device = next(model.parameters()).device
    policy = Policy(model, codec, device)
    out = []
    was_training = model.training
    model.eval()
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
    if was_training:
        model.train()
    return torch.cat(out).cpu()


def probe(model, codec, env, language, spec: CorpusSpec, *, seed: int = 12345) -> dict:
    """The probe's figures as plain data (see the module docstring)."""
    actions = list(language.actions)
    base = env.system_prompt
    names = [s.name for s in language.situations]
    fillers = fillers_for(language, env.vocabulary())
    rng = random.Random(f"rwcore-probe-{seed}")
    # held-out pairings, synthetic contexts
    prompts, index = [], []
    for situation, move in heldout_pairs(language, spec):
        for _ in range(CONTEXTS_PER_PAIR):
            others = rng.sample([n for n in names if n != situation], rng.randint(0, 5))
            lines = [(situation, move)] + [(o, rng.choice(actions)) for o in others]
            rng.shuffle(lines)
            texts = [render_line(rng, s, a, language, fillers, set(language.skill_texts)) for s, a in lines]
            earlier = [rng.choice(names) for _ in range(rng.randint(0, 2))]
            observations = [language.observe(s, rng) for s in earlier] + [language.observe(situation, rng)]
            moves = [rng.choice(actions) for _ in earlier]
            distractors = [t for (s, _), t in zip(lines, texts) if s != situation]
            prompts += [
                (render_system_prompt(base, texts), observations, moves),
                (base, observations, moves),
                (render_system_prompt(base, distractors), observations, moves),
            ]
            index.append((situation, move))
    probs = _probabilities(model, codec, prompts, actions, spec.max_length)
    pairs: dict[str, dict] = {}
    for k, (situation, move) in enumerate(index):
        column = actions.index(move)
        entry = pairs.setdefault(f"{situation} -> {move}", {"with": [], "without": [], "distractors_only": []})
        entry["with"].append(float(probs[3 * k, column]))
        entry["without"].append(float(probs[3 * k + 1, column]))
        entry["distractors_only"].append(float(probs[3 * k + 2, column]))
    pairs = {name: {key: _mean(values) for key, values in entry.items()} for name, entry in pairs.items()}
    heldout = {key: _mean([entry[key] for entry in pairs.values()]) for key in ("with", "without", "distractors_only")}
    # the environment's own skill texts, in real episodes
    contexts = episode_contexts(env, language)
    parsed = [(text, parse_guidance(text, language)) for text in language.skill_texts]
    firsts = _first_texts(parsed)
    prompts, index, skills = [], [], []
    for text, pair in parsed:
        if pair is None:
            skills.append({"text": text, "probed": False})
            continue
        situation, move = pair
        for observations, moves in contexts[situation]:
            prompts += [
                (render_system_prompt(base, [text]), observations, moves),
                (base, observations, moves),
                (render_system_prompt(base, firsts), observations, moves),
            ]
            index.append(len(skills))
        skills.append(
            {"text": text, "probed": True, "situation": situation, "move": move, "contexts": len(contexts[situation])}
        )
    probs = _probabilities(model, codec, prompts, actions, spec.max_length) if prompts else torch.zeros(0, 1)
    gathered: dict[int, list] = {}
    for k, position in enumerate(index):
        column = actions.index(skills[position]["move"])
        gathered.setdefault(position, []).append([float(probs[3 * k + j, column]) for j in range(3)])
    for position, rows in gathered.items():
        skills[position].update(
            {
                "with": _mean([r[0] for r in rows]),
                "without": _mean([r[1] for r in rows]),
                "among_all_skills": _mean([r[2] for r in rows]),
            }
        )
        skills[position]["lift"] = skills[position]["with"] - skills[position]["without"]
    probed = [s for s in skills if s.get("probed") and "lift" in s]
    return {
        "chance": 1.0 / len(actions),
        "heldout": {**heldout, "pairs": pairs, "contexts_per_pair": CONTEXTS_PER_PAIR},
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


def format_probe(report: dict) -> str:
    """The probe as a few lines and a table, for the terminal."""
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
