"""Pretraining the built-in model's reading prior, and the key of the per-machine cache that holds it.

`rw train` with the built-in model starts RL from this prior by default (`model.init=pretrained`): the model
is first trained on the reading corpus (`rwcore.trainer.prior.corpus`), where it learns to follow a guidance
line in its system prompt that names the situation on screen and, without such a line, to pick a move
uniformly at random. Every variant of a comparison, outcome-only included, starts from the same prior.

The loss: at every agent turn of an example, cross-entropy over the policy's action space (the move words
and `<end>`, the restricted softmax RL samples from) against the target - the line's move, or the uniform
distribution over the moves where no line names the situation - plus `prior.aux_weight` times an auxiliary
cross-entropy, read by a linear head from the residual stream after the first layer, of which situation the
screen shows (at every agent turn) and which situation each guidance line names (at its move word). The
auxiliary head is dropped afterwards; it only makes the two things reading needs - recognising the situation
on screen and the one a line names - form early: following the right line among several appears suddenly,
after 700 to 1400 steps in the runs measured with it (seeds 0-2, one or two threads), and in one of four
runs without it within 1500 steps. It names situations, never moves. AdamW, `prior.lr` after
`prior.warmup_steps` of linear warm-up, constant, then a linear decay to a tenth over the last 30% of `prior.steps`;
batches of `prior.batch_size` examples of similar
length (pools of 8 batches sorted by length, in a seeded order).

The cache key is a sha256 of everything the result depends on (`prior_spec`: the corpus spec, the model's
shape, the prior settings, the environment's language and vocabulary, and the code of the modules that shape
the weights, as syntax trees without docstrings, so comments, formatting and docs do not retrain it). Where the
prior is kept, which cache entries are trusted and how one is written are `rwcore.trainer.prior.cache`'s, whose
code is not hashed: changing it rebuilds no prior.

Deterministic from `prior.seed` on a given machine and thread count (both recorded in prior.json); float
rounding may differ between CPUs, so the priors of the default configurations ship as files built on one machine
(`rwcore.trainer.prior.shipped`) rather than being rebuilt on each.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rwcore.trainer.prior.corpus import GUIDANCE_WORDS, CorpusSpec, Example, fillers_for, heldout_pairs, make_example
from rwcore.trainer.prior.scoring import _head_logprobs

__all__ = [
    "PRIOR_FORMAT",
    "corpus_loss",
    "corpus_spec",
    "example_maker",
    "language_of",
    "pretrain",
    "prior_spec",
]

PRIOR_FORMAT = 1
_POOL = 8  # batches per length-sorted pool
_CODE = (
    "corpus.py",
    "pretrain.py",
    "scoring.py",
)  # this package's sources that shape the weights (with the modules below); cache.py is not one of them


def language_of(env):
    """The environment's GuidanceLanguage, or None when it has none (or no move words)."""
    provider = getattr(env, "guidance_language", None)
    language = provider() if callable(provider) else None
    return language if language is not None and language.actions else None


def _code_tree(source: str) -> ast.Module:
    """A module's syntax tree without docstrings."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _code_digest(source: str) -> str:
    """sha256 of a module's code as its syntax tree, without docstrings: comments, formatting and docs do not
    change a prior, so editing them does not retrain it."""
    return hashlib.sha256(ast.dump(_code_tree(source), include_attributes=False).encode()).hexdigest()


def _sources() -> str:
    """sha256 over the code (`_code_digest`) of every module whose code changes the prior."""
    import rwcore.arise.pool.prompt as prompt
    import rwcore.trainer.policy as policy

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in [here / name for name in _CODE] + [Path(policy.__file__), Path(prompt.__file__)]:
        digest.update(path.name.encode() + b"\0" + _code_digest(path.read_text()).encode())
    return digest.hexdigest()


def _env_sources(env) -> str:
    """sha256 over the code of the environment's modules that shape the prior (`_env_modules`): their top-level
    statements without imports, `__all__` and docstrings (`_code_tree`), sorted, so that moving a definition from
    one of them to another (splitting a module) changes no key and changing its code does; neither does reordering
    top-level statements (which matters only where a name is bound twice). "" for a class with no source file."""
    statements = [
        ast.dump(node, include_attributes=False)
        for module in _env_modules(env)
        for node in _code_tree(Path(module.__file__).read_text()).body
        if not isinstance(node, (ast.Import, ast.ImportFrom))
        and not (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets))
    ]
    return hashlib.sha256("\n".join(sorted(statements)).encode()).hexdigest() if statements else ""


def _env_modules(env) -> list:
    """The module that defines the environment's class and every module of the same package that it imports at
    module level, directly or through another of them (an environment package's language, tasks and episodes;
    not what it imports inside a function, such as the rubrics it hands out on request), sorted by name. A class
    of a top-level module: that module alone; a class with no source file: none."""
    root = sys.modules.get(type(env).__module__)
    if root is None or not getattr(root, "__file__", None):
        return []
    inside = f"{root.__package__}." if root.__package__ else None
    found: dict = {}
    todo = [root.__name__]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        module = found[name] = importlib.import_module(name)
        for node in _code_tree(Path(module.__file__).read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                todo += [m for m in _imported_modules(node, module) if inside and m.startswith(inside)]
    return [found[name] for name in sorted(found)]


def _imported_modules(node: ast.Import | ast.ImportFrom, module) -> list[str]:
    """The modules an import statement of `module` names: `import a.b` a.b; `from a import b` a, and a.b where
    that is a module; relative imports resolved against `module`'s package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        base = importlib.util.resolve_name("." * node.level + base, module.__package__)
    return [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in sys.modules]


def corpus_spec(config) -> CorpusSpec:
    return CorpusSpec(seed=config.prior.seed, max_length=config.model.max_length)


def prior_spec(config, env) -> dict:
    """Everything the prior depends on, as plain data (its sha256 is the cache key)."""
    language = language_of(env)
    if language is None:
        raise ValueError(
            f"model.init=pretrained: env.name={env.name!r} has no guidance language "
            "(guidance_language()) to pretrain a reading prior on; use model.init=random"
        )
    m = config.model
    vocabulary = sorted(env.vocabulary())
    missing = sorted(set(GUIDANCE_WORDS) - set(vocabulary))
    if missing:
        raise ValueError(
            f"model.init=pretrained: env.name={env.name!r}'s vocabulary lacks the guidance lines' words {missing}"
        )
    return {
        "format": PRIOR_FORMAT,
        "env": env.name,
        "base_prompt": env.system_prompt,
        "max_turns": env.max_turns,
        "vocabulary": hashlib.sha256("\n".join(vocabulary).encode()).hexdigest(),
        "language": {
            "situations": [[s.name, list(s.phrases)] for s in language.situations],
            "actions": list(language.actions),
            "skill_texts": list(language.skill_texts),
        },
        "model": {
            "hidden_size": m.hidden_size,
            "num_layers": m.num_layers,
            "num_heads": m.num_heads,
            "intermediate_size": m.intermediate_size,
            "head_dim": m.head_dim,
            "max_length": m.max_length,
            "tie_embeddings": m.tie_embeddings,
        },
        "prior": dataclasses.asdict(config.prior) | {"cache_dir": None},
        "corpus": corpus_spec(config).to_dict(),
        "code": _sources() + _env_sources(env),
    }


def _key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------------- training


def _batches(spec: CorpusSpec, size: int, make: Callable[[int], Example], seed: int):
    """Endless batches of `size` examples: pools of _POOL batches, sorted by length, in a seeded order."""
    index = 0
    order = random.Random(f"rwcore-prior-batches-{seed}")
    while True:
        pool = sorted((make(index + i) for i in range(size * _POOL)), key=lambda e: len(e.token_ids))
        index += size * _POOL
        chunks = [pool[i * size : (i + 1) * size] for i in range(_POOL)]
        order.shuffle(chunks)
        yield from chunks


def _tensors(examples: list[Example], pad_id: int, situations: dict[str, int]):
    """Batch tensors for a batch's N agent turns and M guidance lines: ids [B, W], mask [B, W] (long), then
    rows, positions, targets [N] (long) of the turns, then rows, positions, situations [N + M] (long) where
    the auxiliary loss asks which situation: every turn's cue and every line's move word."""
    width = max(len(e.token_ids) for e in examples)
    ids = torch.tensor([e.token_ids + [pad_id] * (width - len(e.token_ids)) for e in examples], dtype=torch.long)
    mask = torch.tensor([[1] * len(e.token_ids) + [0] * (width - len(e.token_ids)) for e in examples], dtype=torch.long)
    rows = [r for r, e in enumerate(examples) for _ in e.positions]
    positions = [p for e in examples for p in e.positions]
    targets = [t for e in examples for t in e.targets]
    aux_rows = rows + [r for r, e in enumerate(examples) for _ in e.line_moves]
    aux_positions = positions + [p for e in examples for p in e.line_moves]
    aux_labels = [situations[s] for e in examples for s in e.situations] + [
        situations[s] for e in examples for s, _, _ in e.lines
    ]
    return (
        ids,
        mask,
        torch.tensor(rows),
        torch.tensor(positions),
        torch.tensor(targets),
        torch.tensor(aux_rows),
        torch.tensor(aux_positions),
        torch.tensor(aux_labels),
    )


def _loss(logprobs: torch.Tensor, targets: torch.Tensor, moves: int) -> tuple[torch.Tensor, dict]:
    """Cross-entropy against the targets: the line's move where a line names the situation (targets >= 0),
    the even spread over the move words elsewhere (-1). logprobs [N, K] over the moves then <end>."""
    guided = targets >= 0
    picked = logprobs[guided].gather(1, targets[guided][:, None]).squeeze(1)
    spread = logprobs[~guided][:, :moves].mean(dim=1)  # cross-entropy against 1/moves on each move word
    loss = -torch.cat([picked, spread]).mean()
    with torch.no_grad():
        accuracy = (logprobs[guided].argmax(dim=1) == targets[guided]).float().mean().item() if guided.any() else 0.0
    return loss, {"loss": float(loss.detach()), "guided_accuracy": accuracy}


def corpus_loss(
    model,
    ids: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    allowed: torch.Tensor,
    moves: int,
    *,
    output_hidden_states: bool = False,
):
    """(loss, stats, the backbone's outputs) of a corpus batch (`_tensors`' ids, mask [B, W] and the N turns'
    rows, positions, targets [N], all long): the reading loss `_loss` over the action space `allowed` [K]
    (the move words then `<end>`, `moves` of them move words), read from the final hidden states through the
    LM head. What pretraining minimizes (with its auxiliary loss, from the outputs' hidden states) and what
    loss.reading_retention adds to RL (`rwcore.trainer.prior.retention`)."""
    out = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=output_hidden_states)
    loss, stats = _loss(
        _head_logprobs(out.last_hidden_state[rows, positions], model.lm_head.weight[allowed]), targets, moves
    )
    return loss, stats, out


def example_maker(spec: CorpusSpec, env, language, codec) -> Callable[[int], Example]:
    """index -> example `index` of the reading corpus for `env` (`make_example`: the environment's base prompt
    and turn limit, no line making a held-out pairing or equal to one of its skill texts): the examples
    pretraining reads and loss.reading_retention draws."""
    heldout = set(heldout_pairs(language, spec))
    fillers = fillers_for(language, env.vocabulary())
    texts = set(language.skill_texts)

    def make(index: int) -> Example:
        return make_example(
            index, spec, language, codec, env.system_prompt, env.max_turns, heldout, fillers, forbidden=texts
        )

    return make


def learning_rate(step: int, base: float, warmup: int, total: int) -> float:
    """Linear warm-up, constant, then linear decay to base / 10 over the last 30% of `total`."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    decay_from = int(0.7 * total)
    if step < decay_from:
        return base
    return base * (1.0 - 0.9 * (step - decay_from) / max(1, total - decay_from))


def pretrain(config, env, *, progress: bool = True, log: Callable[[str], None] | None = None) -> tuple[dict, dict]:
    """(state dict, report) of the reading prior for `config` and `env` (not cached: see ensure_prior)."""
    from rwcore.trainer.policy import WordCodec, build_model
    from rwcore.trainer.prior.probe import probe

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    language = language_of(env)
    if language is None:
        raise ValueError(f"model.init=pretrained: env.name={env.name!r} has no guidance language to pretrain on")
    p, m = config.prior, config.model
    spec = corpus_spec(config)
    codec = WordCodec(env.vocabulary())
    model = build_model(
        len(codec),
        m.hidden_size,
        m.num_layers,
        m.num_heads,
        m.intermediate_size,
        m.max_length,
        p.seed,
        m.tie_embeddings,
        m.head_dim,
    )
    model.train()
    actions = list(language.actions)
    allowed = torch.tensor([codec.vocab[a] for a in actions] + [codec.end_id], dtype=torch.long)
    make = example_maker(spec, env, language, codec)
    with torch.random.fork_rng():
        torch.manual_seed(p.seed)
        # the auxiliary head: which situation, read after the first layer (dropped after pretraining)
        situation_index = {situation.name: i for i, situation in enumerate(language.situations)}
        aux_head = torch.nn.Linear(model.config.hidden_size, len(situation_index))
        optimizer = torch.optim.AdamW([*model.parameters(), *aux_head.parameters()], lr=p.lr, weight_decay=0.0)
        batches = _batches(spec, p.batch_size, make, p.seed)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=p.steps, desc="rw pretrain", unit="step", dynamic_ncols=True, file=sys.stderr)
        log(
            f"rw: pretraining the reading prior ({m.num_layers} layers x {m.hidden_size}, {p.steps} steps of "
            f"{p.batch_size} examples; once per machine, then cached)"
        )
        curve, window, start = [], [], time.perf_counter()
        for step in range(p.steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, p.lr, p.warmup_steps, p.steps)
            ids, mask, rows, positions, targets, aux_rows, aux_positions, aux_labels = _tensors(
                next(batches), codec.pad_id, situation_index
            )
            loss, stats, out = corpus_loss(
                model,
                ids,
                mask,
                rows,
                positions,
                targets,
                allowed,
                len(actions),
                output_hidden_states=bool(p.aux_weight),
            )
            if p.aux_weight:
                aux_logits = aux_head(out.hidden_states[1][aux_rows, aux_positions].float())
                aux = torch.nn.functional.cross_entropy(aux_logits, aux_labels)
                loss = loss + p.aux_weight * aux
                stats["situation_loss"] = float(aux.detach())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            window.append(stats)
            if (step + 1) % 100 == 0 or step + 1 == p.steps:
                point = {"step": step + 1, **{k: sum(s[k] for s in window) / len(window) for k in window[0]}}
                curve.append(point)
                window = []
                if bar is not None:
                    bar.set_postfix(loss=f"{point['loss']:.3f}", read=f"{point['guided_accuracy']:.2f}", refresh=False)
                elif (step + 1) % max(100, p.steps // 10 // 100 * 100) == 0 or step + 1 == p.steps:
                    log(
                        f"rw pretrain: step {step + 1}/{p.steps} loss {point['loss']:.3f} guided accuracy "
                        f"{point['guided_accuracy']:.3f} ({time.perf_counter() - start:.0f} s)"
                    )
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    model.eval()
    report = {
        "curve": curve,
        "seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "machine": {
            "cpu": _cpu(),
            "cpu_capability": _capability(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "probe": probe(model, codec, env, language, spec),
    }
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return state, report


def _cpu() -> str | None:
    from rwcore.trainer.machine import cpu_model

    return cpu_model()


def _capability() -> str | None:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # pragma: no cover - older torch
        return None
