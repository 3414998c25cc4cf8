"""Helpers shared by several test modules: paths, comparable states, tiny models, run settings, the files a run
writes, child processes, hand-made negotiation tasks, judge inputs and upstream trainers' modules. Fixtures are
in the conftest.py files (tests/ and the folders whose tests alone use them)."""

import importlib
import importlib.util
import json
import os
import socket
import sys
import types
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rwcore.types import Trajectory, Turn

TESTS = Path(__file__).resolve().parent  # the tests folder: helper modules, workers and fixtures' files
ROOT = TESTS.parent  # the repository's root


def normalize(obj):
    """A canonical, comparable form of a (nested) state_dict.

    dict -> sorted (key, value) tuples, set -> sorted list, numpy array ->
    (dtype, shape, bytes), sequences element-wise; everything else as is.
    Two states are equal iff their normalized forms are equal.
    """
    if isinstance(obj, dict):
        return (
            "dict",
            tuple(sorted(((repr(normalize(k)), normalize(v)) for k, v in obj.items()), key=lambda kv: kv[0])),
        )
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted((normalize(x) for x in obj), key=repr)))
    if isinstance(obj, np.ndarray):
        return ("nd", str(obj.dtype), obj.shape, obj.tobytes())
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(normalize(x) for x in obj))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(obj))
    if isinstance(obj, float) and obj != obj:
        return ("nan",)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


# The chat template of the tiny named models the tests build: `<role> content` per message, an assistant message
# ending with `<end>`, and `<assistant>` as the generation prompt.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% if m['role'] == 'assistant' %}<end> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)


def save_tiny_chat_model(folder, hidden_size: int = 32, max_positions: int = 512) -> None:
    """A tiny random Llama (one layer, two heads: head dim hidden_size / 2; vLLM's CPU attention needs 32, so
    hidden_size=64) with a word-level tokenizer over the negotiation environment's words and a chat template,
    saved with transformers' own writers into `folder`, for use as `model.name`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from rwcore.trainer.envs.negotiation import NegotiationEnv

    specials = ["<pad>", "<unk>", "<end>", "<system>", "<user>", "<assistant>", "<tool>"]
    words = sorted(set(NegotiationEnv(num_train=4, num_eval=2).vocabulary()))
    vocab = {token: i for i, token in enumerate(specials + words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<end>")
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=vocab["<end>"],
        pad_token_id=vocab["<pad>"],
    )
    LlamaForCausalLM(config).save_pretrained(folder)


# ---------------------------------------------------------------------------------------------- run settings

# `rw train` on the built-in negotiation environment at a size where a step takes a second or two on a CPU: a
# random-init model (the tests that use it are about the loop, not the reading prior), a held-out evaluation
# and a checkpoint every other step.
SMALL_LOOP = (
    "model.init=random",
    "env.options.num_train=40",
    "env.options.num_eval=8",
    "rollout.tasks_per_step=4",
    "rollout.group_size=4",
    "train.eval_every=2",
    "train.checkpoint_every=2",
)
# The methods' own schedules brought inside a few steps (of any environment): a pool update and a reward
# adaptation every other step, on small diagnosis sets.
SMALL_METHOD = (
    "pool.delta_pool=2",
    "rewardweaver.adaptation_interval=2",
    "rewardweaver.min_support=1",
    "rewardweaver.diagnosis_tasks=4",
    "rewardweaver.diagnostic_tasks=4",
)
SMALL_RUN = (*SMALL_LOOP, *SMALL_METHOD)
# Two steps of two tasks, a checkpoint after each: the smallest real run, for the run folder's lock and safety.
TINY_RUN = (
    "model.init=random",
    "env.options.num_train=16",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.steps=2",
    "train.eval_every=0",
    "train.checkpoint_every=1",
    "train.method=rw_outcome_grpo",
)
# The runs of a real `rw ablate` grid: two tasks of two rollouts a step, evaluated and checkpointed every step.
ABLATE_RUN = (
    "model.init=random",
    "env.options.num_train=24",
    "env.options.num_eval=6",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.eval_every=1",
    "train.checkpoint_every=1",
)
# A one-layer model of width 16, and its reading prior after 12 steps: it cannot learn to read, which the tests
# that use it (the prior's mechanics, runs that start from it) do not need.
TINY_MODEL = ("model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32")
TINY_PRIOR = (*TINY_MODEL, "prior.steps=12", "prior.batch_size=8", "prior.warmup_steps=2")
# One step of a run from the prior (model.init=pretrained, the default), without the pool's diagnostic tasks.
PRIOR_RUN = (
    "env.options.num_train=24",
    "env.options.num_eval=4",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.eval_every=0",
    "train.checkpoint_every=1",
    "pool.delta_pool=1",
    "rewardweaver.diagnosis_tasks=2",
    "rewardweaver.diagnostic_tasks=0",
    "rewardweaver.min_support=1",
    "train.steps=1",
)


def prior_config(cache: Path, *overrides: str):
    """The configuration of the TINY_PRIOR model with its prior cached in `cache`, and `overrides`."""
    from rwcore.trainer.config import load_config

    return load_config(None, [*TINY_PRIOR, f"prior.cache_dir={cache}", *overrides])


def overrides_with(base: Sequence[str], *changes: str, drop: Iterable[str] = ()) -> list[str]:
    """The `key=value` overrides `base` with `changes`: a change of a key that `base` sets takes that override's
    place, a change of another key comes after them; the keys named in `drop` are left out."""
    changed = dict(change.split("=", 1) for change in changes)
    dropped = set(drop)
    unknown = dropped - {override.split("=", 1)[0] for override in base}
    if unknown:
        raise ValueError(f"drop names keys the base does not set: {sorted(unknown)}")
    result = []
    for override in base:
        key = override.split("=", 1)[0]
        if key not in dropped:
            result.append(f"{key}={changed.pop(key)}" if key in changed else override)
    return result + [f"{key}={value}" for key, value in changed.items()]


# ---------------------------------------------------------------------------------------------- run folders


def train_in_process(run: Path, overrides: Sequence[str]) -> None:
    """Trains the run of `overrides` into the folder `run` in this process, quietly; cleans up even if it fails."""
    from rwcore.trainer.config import load_config
    from rwcore.trainer.trainer import Trainer

    trainer = Trainer(load_config(None, list(overrides)), run, quiet=True)
    trainer.setup()
    try:
        trainer.train()
    finally:
        trainer.cleanup()


def metrics_rows(run: Path, kind: str | None = None) -> list[dict]:
    """The rows of the run folder's metrics.jsonl in order; only those of one `kind` ("train", "eval") if given."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return rows if kind is None else [row for row in rows if row["kind"] == kind]


def train_steps(run: Path) -> list[int]:
    """The steps of the run folder's train rows, in the order metrics.jsonl holds them."""
    return [row["step"] for row in metrics_rows(run, "train")]


def without_timing(rows: list[dict]) -> list[dict]:
    """The rows without their `time/` keys: what two runs of the same settings and seed must agree on."""
    return [{key: value for key, value in row.items() if not key.startswith("time/")} for row in rows]


def checkpoint_folder(run: Path, step: int) -> Path:
    """The folder of the run's checkpoint after `step`."""
    return run / "checkpoints" / f"step_{step:06d}"


# ---------------------------------------------------------------------------------------------- processes


def child_env(**variables: str) -> dict[str, str]:
    """The environment for a child process (`rw train`, `rw ablate`, a worker): this process's, with one OpenMP
    thread (the children share the machine with the test run), and `variables`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **variables}


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rw_command(*args: str) -> list[str]:
    """The command line of `rw ARGS` run by this Python (this checkout's rwcore, whichever `rw` is on PATH)."""
    return [sys.executable, "-m", "rwcore.trainer", *args]


def ablate_command(
    out: Path,
    *overrides: str,
    paper: str = "rewardweaver",
    variants: str,
    seeds: str,
    steps: int,
    jobs: int | None = None,
    options: Sequence[str] = (),
) -> list[str]:
    """The command line of a real `rw ablate` process writing `out`: the grid (comma-separated `variants` and
    `seeds`), then `options` (e.g. the executor) and the config `overrides` of every run."""
    grid = ["--paper", paper, "--variants", variants, "--seeds", seeds, "--steps", str(steps)]
    jobs_option = [] if jobs is None else ["--jobs", str(jobs)]
    return rw_command("ablate", *grid, *jobs_option, "--quiet", "--out", str(out), *options, *overrides)


# ---------------------------------------------------------------------------------------------- the sampler


def populated_sampler(seed=0, batch_size=4):
    """(tasks, a CapabilitySampler of ten tasks over tags A-D) after four recorded groups: passes, fails, NA and
    INVALID verdicts of two rubrics ("e": Execution, "v": Verification), and a group with no verdicts."""
    from rwcore import CapabilitySampler, Verdict

    NA, INVALID = Verdict.NA, Verdict.INVALID
    tasks = {
        f"t{i}": tags
        for i, tags in enumerate([["A"], ["A", "B"], ["B"], ["C"], ["C", "A"], ["D"], ["B"], ["A"], ["C"], ["D", "B"]])
    }
    cs = CapabilitySampler(tasks, batch_size=batch_size, group_size=2, seed=seed)
    cs.set_rubrics({"e": "Execution", "v": "Verification"})
    cs.record_group("t0", {"e": [True, False], "v": [NA, NA]}, 0)
    cs.record_group("t1", {"e": [False, False]}, 0)
    cs.record_group("t3", {"v": [True, True], "e": [INVALID, True]}, 1)
    cs.record_group("t5", {}, 1)
    return tasks, cs


# ---------------------------------------------------------------------------------------------- negotiation


def negotiation_item(kind: str = "standard", item: str = "lamp", **changes) -> dict:
    """One item's sheet in the shape the negotiation task generator draws it: a lamp costing 60, budget 100, list
    120, winnable unless the partner is hostile or the item is sold out; then `changes`."""
    data = {
        "kind": kind,
        "item": item,
        "cost": 60,
        "bundle_cost": None,
        "bundle_budget": None,
        "budget": 100,
        "list": 120,
        "feasible": True,
        "winnable": kind not in ("hostile", "sold_out"),
    }
    data.update(changes)
    return data


def negotiation_task(kind: str = "standard", **changes):
    """A hand-made one-item negotiation task, id "t-<kind>": the sheet `negotiation_item(kind, **changes)`."""
    from rwcore.trainer.envs import Task
    from rwcore.trainer.envs.negotiation import KINDS

    return Task("t-" + kind, KINDS[kind], negotiation_item(kind, **changes))


# ---------------------------------------------------------------------------------------------- judges


def chat_trajectory(
    task_id: str = "t1",
    answer: str = "Refunded 1234.",
    outcome: float = 1.0,
    *,
    request: str = "Refund order 1234.",
    tags: tuple[str, ...] = (),
) -> Trajectory:
    """A two-turn rollout for a judge: the user's `request`, then the policy's generated `answer`; its id is
    "<task_id>/g/0"."""
    return Trajectory(
        task_id,
        [Turn("user", request), Turn("assistant", answer, generated=True)],
        outcome,
        tags=tags,
        trajectory_id=f"{task_id}/g/0",
    )


# ---------------------------------------------------------------------------------------------- upstream trainers


def openrlhf_loss_module():
    """OpenRLHF's `openrlhf.models.loss`, loaded without `openrlhf.models.__init__` (which imports the actor, and
    the actor needs flash-attn): `openrlhf.models` is registered as a bare package, its __path__ only."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None:  # a clear message, never a skip: CI installs it
        raise ImportError(
            "these tests need openrlhf 0.11.2: RWCORE_EXTRAS=test,bench,vllm,upstream bash scripts/setup.sh"
        )
    if "openrlhf.models" not in sys.modules:
        package = types.ModuleType("openrlhf.models")
        package.__path__ = [os.path.join(spec.submodule_search_locations[0], "models")]
        sys.modules["openrlhf.models"] = package
    return importlib.import_module("openrlhf.models.loss")
