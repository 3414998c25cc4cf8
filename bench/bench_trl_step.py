"""One GRPO training step, rwcore's trainer vs TRL's `GRPOTrainer`, at equal work.

    .venv/bin/python bench/bench_trl_step.py                       # 16 prompts x 8 completions x 16 tokens
    .venv/bin/python bench/bench_trl_step.py --quick               # 4 x 4 x 8
    .venv/bin/python bench/bench_trl_step.py --out bench/results/trl-step.json

Equal work: the same tiny Llama (the embedded default's shape: hidden 64, 2 layers, 4 heads, MLP
128, the same random weights loaded by both), the same word-level tokenizer built here, the same
prompts (B per step, one token sequence each), G completions per prompt of exactly T tokens (the
special tokens, end included, are suppressed in both, so neither stops early; both runs check it),
the same reward function, AdamW at the same learning rate, one optimizer step per batch, and the same
loss terms: no KL term and no entropy bonus (TRL's GRPO loss has neither, so rwcore's
`loss.entropy_coef`, 0.01 by default, is 0 here; TRL still computes each token's entropy in its
forward, for its logs). rwcore's step with the default entropy bonus is timed beside them and reported
for reference, not as equal work.

TRL's side is `GRPOTrainer.train()` (HF generate, its reward and advantage code, its loss). rwcore's
side is the code `rw train` runs for a step: `run_episodes` on a one-turn environment (HFGenerator's
decode loop over the same HF model, which samples exactly as HF generate does; behavior log-probs from
the engine), group advantages, and `Trainer._update_policy` (the fused filtered dual-clip loss),
synchronous (max_lag 0) as TRL's step is. Step times are medians over the steps after the first
(warm-up); the ratio is TRL / rwcore from this one run, one thread each. The trainers take turns step
by step (a TRL callback runs an rwcore step after each of TRL's, outside TRL's clock), so a slow spell
of a shared machine falls on both rather than on whichever ran second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine, publish  # noqa: E402

from rwcore.trainer.config import LossConfig  # noqa: E402
from rwcore.trainer.policy import SPECIAL_TOKENS  # noqa: E402

DEFAULT_ENTROPY_COEF = LossConfig().entropy_coef

WORDS = [f"w{i}" for i in range(40)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def reward(texts: list[str]) -> list[float]:
    """The fraction of completion words that are w0 ... w9 (something the policy can learn)."""
    out = []
    for text in texts:
        words = text.split()
        out.append(sum(w in WORDS[:10] for w in words) / max(1, len(words)))
    return out


def build(folder: Path, seed: int):
    """The tiny model and its tokenizer, saved for TRL; returns (model, codec)."""
    import torch

    from rwcore.trainer.policy import WordCodec, build_model

    codec = WordCodec(WORDS + ["please", "write"])
    codec.tokenizer.chat_template = CHAT_TEMPLATE
    model = build_model(len(codec), 64, 2, 4, 128, 256, seed, tie_embeddings=True)
    model.config.bos_token_id, model.config.eos_token_id = codec.bos_id, codec.end_id
    model.config.pad_token_id = codec.pad_id
    model.save_pretrained(folder)
    codec.tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    return model, codec


def prompts(count: int) -> list[str]:
    return [f"please write {' '.join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(6))}" for i in range(count)]


def rwcore_stepper(folder: Path, args, entropy_coef: float = 0.0):
    """rwcore's trainer for the bench; returns step(k) -> seconds, which runs training step k (k = 0, 1, ...)
    with its own seed, leaving torch's global generator as it found it (TRL's sampling draws from it)."""
    import numpy as np
    import torch

    from rwcore.arise.advantages import compute_advantages
    from rwcore.trainer.config import load_config
    from rwcore.trainer.envs.base import Episode, Outcome, Task
    from rwcore.trainer.policy import Policy
    from rwcore.trainer.rollout import run_episodes
    from rwcore.trainer.trainer import Trainer
    from rwcore.trainer.update import PolicyUpdate

    class OneTurn:
        """A one-turn environment: the prompt, one completion, the reward."""

        max_turns = 1
        system_prompt = ""

        def reset(self, task, seed):
            return Episode(task, observation=task.data["prompt"])

        def step(self, episode, message):
            return Episode(episode.task, observation="", done=True, state={"reply": message})

        def outcome(self, episode):
            value = reward([episode.state["reply"]])[0]
            return Outcome(reward=value, success=value > 0.5)

    model, codec = build(folder, args.seed)
    config = load_config(
        None,
        [
            f"optim.lr={args.lr}",
            f"rollout.group_size={args.group_size}",
            f"rollout.tasks_per_step={args.prompts}",
            f"rollout.max_new_tokens={args.tokens}",
            "rollout.action_words=off",
            f"loss.entropy_coef={entropy_coef}",
        ],
    )
    trainer = Trainer(config, folder / "rw", quiet=True)
    trainer.config = config
    trainer.device = torch.device("cpu")
    trainer.policy = Policy(model, codec, trainer.device)
    trainer.policy.allowed = None
    special = [codec.vocab[t] for t in SPECIAL_TOKENS]
    trainer.policy.suppressed = lambda: special  # words only, exactly T of them, as on TRL's side
    trainer.engine = trainer._build_engine()
    trainer.policy_update = PolicyUpdate(config, trainer.policy, trainer.engine, trainer.device)  # what setup() builds
    trainer.rank, trainer.world_size = 0, 1
    env = OneTurn()
    texts = prompts(args.prompts)

    def step(index: int) -> float:
        with torch.random.fork_rng(devices=[]):
            started = time.perf_counter()
            torch.manual_seed(args.seed + index)
            jobs = [
                (Task(f"t{i}", ("x",), {"prompt": texts[i]}), index * 1000 + i * 31 + j, f"s{index}/t{i}")
                for i in range(args.prompts)
                for j in range(args.group_size)
            ]
            rollouts = run_episodes(env, trainer.policy, jobs, "", 1.0, args.tokens)
            rewards = np.array([r.trajectory.outcome for r in rollouts], dtype=np.float64)
            groups = np.repeat(np.arange(args.prompts), args.group_size)
            advantages = compute_advantages(rewards, np.zeros((len(rewards), 0)), groups)  # outcome-only, as TRL's
            trainer.engine.set_lr(args.lr)
            trainer._update_policy(rollouts, advantages)
            trainer.policy.version += 1
            seconds = time.perf_counter() - started
        assert all(r.trajectory.generated_length == args.tokens for r in rollouts)  # equal work
        return seconds

    return step


def time_trl(folder: Path, args, between) -> list[float]:
    """Seconds of each of TRL's training steps; `between()` runs after each (outside TRL's clock)."""
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    build(folder, args.seed)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    special = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)
    rows = [{"prompt": [{"role": "user", "content": text}]} for text in prompts(args.prompts)] * args.steps

    def reward_fn(completions, **_):
        return reward([c[0]["content"] if isinstance(c, list) else c for c in completions])

    class Clock(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_begin(self, *a, **k):
            self.marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            self.marks[-1] = time.perf_counter() - self.marks[-1]
            between()

    clock = Clock()
    config = GRPOConfig(
        output_dir=str(folder / "trl"),
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size,
        max_completion_length=args.tokens,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        learning_rate=args.lr,
        seed=args.seed,
        beta=0.0,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        weight_decay=0.0,
        generation_kwargs={"suppress_tokens": special},
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=reward_fn,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "completions/mean_length" in row]
    assert lengths and all(length == args.tokens for length in lengths), lengths  # equal work
    return clock.marks


def main(argv=None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16, help="B: prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="T: tokens per completion")
    parser.add_argument(
        "--steps",
        type=int,
        default=30,
        help="steps per trainer, taken in turns; the medians are over all but the first",
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group_size, args.tokens, args.steps = 4, 4, 8, 3
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first is warm-up); got {args.steps}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import trl

    try:
        with tempfile.TemporaryDirectory() as tmp:
            equal = rwcore_stepper(Path(tmp) / "a", args)
            # for reference, not equal work: rw train's default loss adds an entropy bonus TRL's lacks
            with_bonus = rwcore_stepper(Path(tmp) / "c", args, DEFAULT_ENTROPY_COEF)
            rw, bonus = [], []

            def between():  # one rwcore step of each kind after each TRL step: a slow spell hits all three
                rw.append(equal(len(rw)))
                bonus.append(with_bonus(len(bonus)))

            theirs = time_trl(Path(tmp) / "b", args, between)
    finally:
        torch.set_num_threads(threads)  # run_all runs the next benchmark in this process
    rw_median, trl_median, bonus_median = (statistics.median(times[1:]) for times in (rw, theirs, bonus))
    report = {
        "machine": machine(torch=torch.__version__, trl=trl.__version__),
        "config": {k: getattr(args, k) for k in ("prompts", "group_size", "tokens", "steps", "lr")},
        "rwcore_step_s": rw,
        "trl_step_s": theirs,
        "rwcore_median_s": rw_median,
        "trl_median_s": trl_median,
        "speedup": trl_median / rw_median,
        # each TRL step over the rwcore step right after it, the median (a second figure of the same run)
        "paired_speedup": statistics.median(b / a for a, b in zip(rw[1:], theirs[1:])),
        "entropy_bonus": {
            "entropy_coef": DEFAULT_ENTROPY_COEF,
            "step_s": bonus,
            "median_s": bonus_median,
            "speedup": trl_median / bonus_median,
        },
    }
    publish(report, render(report), args.out)
    return report


def render(report: dict) -> str:
    m, c, bonus = report["machine"], report["config"], report["entropy_bonus"]
    return (
        "\n".join(
            [
                "# One GRPO step: rwcore's trainer vs TRL's GRPOTrainer at equal work",
                "",
                f"Machine: {m.get('cpu', '?')}, {m['cpus']} logical CPUs, torch {m.get('torch', '?')}, TRL "
                f"{m.get('trl', '?')}, "
                f"one thread. {c['prompts']} prompts x {c['group_size']} completions x {c['tokens']} tokens per step, "
                "the "
                "embedded default's model shape, the same GRPO loss terms (no KL term, no entropy bonus). "
                f"{c['steps']} steps "
                f"each, taken in turns (a TRL step, then an rwcore step); medians over steps 2..{c['steps']}.",
                "",
                "| trainer | median step | steps |",
                "|---|---:|---:|",
                f"| rwcore (`run_episodes` + `_update_policy`, max_lag 0) | {report['rwcore_median_s']:.3f} s "
                f"| {', '.join(f'{t:.3f}' for t in report['rwcore_step_s'])} |",
                f"| TRL `GRPOTrainer` | {report['trl_median_s']:.3f} s | "
                f"{', '.join(f'{t:.3f}' for t in report['trl_step_s'])} |",
                "",
                f"TRL / rwcore step time: **{report['speedup']:.2f}x** (the median of each TRL step over the rwcore "
                "step after "
                f"it: {report['paired_speedup']:.2f}x).",
                "",
                f"Not equal work, for reference: rwcore with `rw train`'s default entropy bonus (`loss.entropy_coef="
                f"{bonus['entropy_coef']}`, a loss term with its own backward that TRL's step does not have), in the "
                "same "
                f"turns: {bonus['median_s']:.3f} s, TRL / rwcore **{bonus['speedup']:.2f}x**.",
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
