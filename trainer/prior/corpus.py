"""The reading corpus: conversations whose system prompt holds guidance, for the built-in model's prior.

The papers start RL from instruction-following models that read the skills Arise puts in their prompt. The
built-in model is pretrained on this corpus first so that it can read guidance too - and nothing else: the
corpus teaches *reading*, not the task.

What an example holds
---------------------
- A system prompt: the environment's own base prompt, and in `guided_share` of the examples a skills section
  rendered exactly as Arise renders active skills (`rwcore.arise.pool.prompt.render_system_prompt`) with 1 to
  `max_lines` guidance lines. Each line names one situation of the environment's `GuidanceLanguage` (one of
  its phrases, e.g. "the buyer agrees") and one move word, in one of the `TEMPLATES` ("when <situation> say
  <move>", "if <situation> <move> the ...", "after ..."), sometimes with filler words that name neither a
  situation nor a move. No two lines of an example name the same situation.
- 1 to the environment's `max_turns` agent turns. Before each, the partner's message is an observation drawn
  from the language's `observe` for a situation chosen at random: in a guided example, with probability
  `named_share` one its lines name, else any situation (so some lines are distractors that name nothing on
  screen). Consecutive observations are independent draws - no episode, no task, no dynamics behind them.
- At each agent turn the target: the move of the line that names the situation on screen, or, when no line
  does (no guidance, or only distractors), the uniform distribution over the move words. The move the
  example then shows is that target, or a uniformly random move.

Why it cannot leak a solution
-----------------------------
- Every line's move is drawn uniformly at random, independently of its situation, per example: no
  situation -> move pairing is more frequent than another, so nothing about which move a situation needs can
  be learned without reading the line. Without guidance the target is uniform, so the prior's own move at
  any situation stays at chance (the probe measures it: `rwcore.trainer.prior.probe`).
- `heldout_pairs` pairings, drawn uniformly among all of them, never occur in a line: the probe tests
  reading on them. The environment's own skill texts (`GuidanceLanguage.skill_texts`) never occur as a line
  either (a line that would equal one is drawn again); their pairings occur exactly as often as any other.
- Observations are drawn independently per turn and moves are the lines' random ones, so an example's moves
  replayed on a held-out task win no more often than random moves (a test measures it).
- The corpus is drawn from `CorpusSpec.seed` alone (example i from its own generator), the same on every
  machine; it is never written to disk.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from rwcore.arise.pool.prompt import render_system_prompt
from rwcore.trainer.envs.base import GuidanceLanguage

__all__ = [
    "CorpusSpec",
    "Example",
    "GUIDANCE_WORDS",
    "TEMPLATES",
    "fillers_for",
    "heldout_pairs",
    "encode_conversation",
    "make_example",
    "parse_guidance",
    "render_line",
]

CONNECTORS: tuple[str, ...] = ("when", "if", "after")
TEMPLATES: tuple[str, ...] = (
    "{c} {s} say {a}",
    "{c} {s} say {a} {f}",
    "{c} {s} {a} {f}",
)
"""Line forms: {c} a connector, {s} a situation phrase, {a} the move word, {f} one to three filler words
(optionally after "the"). The situation comes first: a model this small learns to read lines of one shape
within the pretraining budget, and the environments' skill texts take that shape."""
GUIDANCE_WORDS: tuple[str, ...] = (*CONNECTORS, "say")
"""Words the templates add to an environment's language: its vocabulary must hold them."""


@dataclass(frozen=True)
class CorpusSpec:
    """What the corpus draws; every field is part of the prior's cache key."""

    seed: int = 0
    guided_share: float = 0.8  # examples with a skills section
    max_lines: int = 10  # guidance lines per guided example, at most
    named_share: float = 0.6  # in guided examples: turns whose situation a line names
    heldout_pairs: int = 12  # situation -> move pairings kept out of the corpus for the probe
    max_length: int = 256  # tokens per example at most (turns are dropped to fit)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Example:
    """One conversation of the corpus.

    token_ids: [L] the conversation as the built-in codec encodes it (`WordCodec.start` / `reply`, every agent
    message a move word then `<end>`, as rollouts build it); positions: [T] index of each agent turn's cue,
    whose next token is the move; targets: [T] index into language.actions of the target move, or -1 (no
    line names the situation: the target is uniform over the moves); moves: [T] the move words shown;
    lines: the guidance lines as (situation, move, text); situations: [T] the situation of each turn;
    line_moves: [len(lines)] index in token_ids of each line's move word (where the line's meaning is
    complete: the auxiliary loss asks which situation it names there)."""

    token_ids: list[int]
    positions: list[int]
    targets: list[int]
    moves: list[str]
    lines: list[tuple[str, str, str]]
    situations: list[str]
    system_prompt: str
    observations: list[str]
    line_moves: list[int]


def _phrases(language: GuidanceLanguage) -> list[tuple[list[str], str]]:
    """(phrase words, situation) longest first, so that "the buyer likes bundle budget" wins over its prefix."""
    found = [(phrase.split(), s.name) for s in language.situations for phrase in s.phrases]
    return sorted(found, key=lambda entry: -len(entry[0]))


def parse_guidance(text: str, language: GuidanceLanguage) -> tuple[str, str] | None:
    """(situation, move) a guidance line names: exactly one situation phrase (longest match) and exactly one
    move word outside it; None otherwise (a line about every turn, or an ambiguous one)."""
    words = text.lower().split()
    taken = [False] * len(words)
    situations = []
    for phrase, name in _phrases(language):
        width = len(phrase)
        for i in range(len(words) - width + 1):
            if words[i : i + width] == phrase and not any(taken[i : i + width]):
                taken[i : i + width] = [True] * width
                situations.append(name)
    moves = [w for w, inside in zip(words, taken) if not inside and w in language.actions]
    if len(set(situations)) != 1 or len(situations) != 1 or len(moves) != 1:
        return None
    return situations[0], moves[0]


def heldout_pairs(language: GuidanceLanguage, spec: CorpusSpec) -> list[tuple[str, str]]:
    """`spec.heldout_pairs` situation -> move pairings drawn uniformly at random (from the spec's seed) among all
    of them, whichever a skill text makes included, so that leaving them out favours no pairing; no corpus line
    makes them, and the probe tests reading on them."""
    pool = sorted((s.name, a) for s in language.situations for a in language.actions)
    return sorted(random.Random(f"rwcore-prior-heldout-{spec.seed}").sample(pool, min(spec.heldout_pairs, len(pool))))


def fillers_for(language: GuidanceLanguage, vocabulary: Sequence[str]) -> list[str]:
    """Words a line may carry besides its situation and move: none a move, a connector or a phrase word."""
    banned = set(language.actions) | set(GUIDANCE_WORDS)
    for situation in language.situations:
        for phrase in situation.phrases:
            banned |= set(phrase.split())
    return sorted(w for w in vocabulary if w not in banned and w.isalpha())


def render_line(
    rng: random.Random,
    situation: str,
    move: str,
    language: GuidanceLanguage,
    fillers: Sequence[str],
    forbidden: frozenset[str] | set[str] = frozenset(),
) -> str:
    """A guidance line naming `situation` and `move` in a random template (parses back to both), never one
    of the `forbidden` texts (the environment's own skill texts)."""
    phrases = language.situation(situation).phrases
    for _ in range(1000):
        template = rng.choice(TEMPLATES)
        filler = " ".join(rng.choice(fillers) for _ in range(rng.randint(1, 3))) if fillers else ""
        if filler and rng.random() < 0.5:
            filler = f"the {filler}"
        text = " ".join(template.format(c=rng.choice(CONNECTORS), s=rng.choice(phrases), a=move, f=filler).split())
        if text not in forbidden and parse_guidance(text, language) == (situation, move):
            return text
    raise ValueError(
        f"no guidance line for situation {situation!r} and move {move!r} parses back to both: "
        "its phrases must not contain a second situation's phrase"
    )


def make_example(
    index: int,
    spec: CorpusSpec,
    language: GuidanceLanguage,
    codec,
    base_prompt: str,
    max_turns: int,
    heldout: set[tuple[str, str]],
    fillers: Sequence[str],
    forbidden: frozenset[str] | set[str] = frozenset(),
) -> Example:
    """Example `index` of the corpus (its own generator, seeded by spec.seed and index)."""
    rng = random.Random(f"rwcore-prior-{spec.seed}-{index}")
    names = [s.name for s in language.situations]
    actions = list(language.actions)
    lines: list[tuple[str, str, str]] = []
    if rng.random() < spec.guided_share:
        for situation in rng.sample(names, rng.randint(1, min(spec.max_lines, len(names)))):
            allowed = [a for a in actions if (situation, a) not in heldout]
            move = rng.choice(allowed)
            lines.append((situation, move, render_line(rng, situation, move, language, fillers, forbidden)))
    named = {situation: move for situation, move, _ in lines}
    system = render_system_prompt(base_prompt, [text for _, _, text in lines])
    turns = rng.randint(1, max_turns)
    situations, observations, targets, moves = [], [], [], []
    for _ in range(turns):
        if named and rng.random() < spec.named_share:
            situation = rng.choice(sorted(named))
        else:
            situation = rng.choice(names)
        situations.append(situation)
        observations.append(language.observe(situation, rng))
        move = named.get(situation)
        targets.append(actions.index(move) if move is not None else -1)
        moves.append(move if move is not None else rng.choice(actions))
    ids, positions = encode_conversation(codec, system, observations, moves, spec.max_length)
    kept = len(positions)
    if not kept:
        raise ValueError(
            f"corpus example {index}: the system prompt alone exceeds {spec.max_length} tokens; "
            "raise model.max_length or lower the corpus' max_lines"
        )
    return Example(
        ids,
        positions,
        targets[:kept],
        moves[:kept],
        lines,
        situations[:kept],
        system,
        observations[:kept],
        _line_moves(system, lines),
    )


def _line_moves(system: str, lines: Sequence[tuple[str, str, str]]) -> list[int]:
    """Token index of each line's move word in a conversation that `WordCodec.start` opens with `system`
    (`<bos> <system>` then one token per word): the last occurrence of the move in the line's words."""
    words = system.lower().split()
    found, cursor = [], 0
    for _, move, text in lines:
        line = text.lower().split()
        while words[cursor : cursor + len(line)] != line:
            cursor += 1
        found.append(2 + cursor + max(i for i, word in enumerate(line) if word == move))
        cursor += len(line)
    return found


def encode_conversation(
    codec, system: str, observations: Sequence[str], moves: Sequence[str], max_length: int | None = None
) -> tuple[list[int], list[int]]:
    """(token ids, positions): a conversation as rollouts encode it (`codec.start`, then per agent turn the
    move word and `<end>`, then `codec.reply` with the next observation) and the index of each agent turn's
    cue, whose next token is its move. With len(moves) == len(observations) - 1 it ends at the last cue;
    turns that would pass `max_length` tokens are left out. The `<end>` after the last move is dropped: the
    loss reads only the positions, and no position follows it."""
    ids = codec.start(system, observations[0])
    positions: list[int] = []
    for turn in range(len(observations)):
        if turn:
            ids = ids + codec.reply("partner", observations[turn])
        if max_length is not None and len(ids) > max_length - 1:
            break
        positions.append(len(ids) - 1)
        if turn < len(moves):
            ids = ids + [codec.vocab[moves[turn]], codec.end_id]
    cut = positions[-1] + (2 if len(positions) <= len(moves) else 1) if positions else 0
    return ids[:cut], positions
