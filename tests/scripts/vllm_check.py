"""Run by tests/trainer/test_vllm_real.py in a subprocess (vLLM's CPU backend binds threads and patches torch in
the process that builds it, so it stays out of the pytest process).

    python tests/scripts/vllm_check.py train RUN_DIR STEPS OVERRIDE...   # train with real vLLM, check every push
    python tests/scripts/vllm_check.py resume RUN_DIR                    # resume; check the engine's weights

Prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys

import torch


def model_logprobs(model, sequence: list[int]) -> list[float]:
    """The training model's log-probs of sequence[1:] (full vocabulary, temperature 1)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sequence])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[t, sequence[t + 1]]) for t in range(len(sequence) - 1)]


def fixed_sequence(trainer) -> list[int]:
    codec = trainer.policy.codec
    words = trainer.env.action_vocabulary()
    return codec.start(trainer.env.system_prompt, "hello i want a lamp") + [codec.vocab[w] for w in words[:4]]


def engine_gap(trainer) -> float:
    sequence = fixed_sequence(trainer)
    theirs = trainer.generator.logprobs([sequence])[0]
    ours = model_logprobs(trainer.policy.model, sequence)
    return max(abs(a - b) for a, b in zip(theirs, ours))


def train(run_dir: str, steps: int, overrides: list[str]) -> dict:
    from rwcore.trainer.config import load_config
    from rwcore.trainer.trainer import Trainer

    trainer = Trainer(load_config(None, [*overrides, f"train.steps={steps}"]), run_dir, quiet=True)
    trainer.setup()
    gaps = [engine_gap(trainer)]
    initial = model_logprobs(trainer.policy.model, fixed_sequence(trainer))
    for _ in range(steps):
        trainer._log(trainer.train_step())
        gaps.append(engine_gap(trainer))
    trainer.save_checkpoint()
    # the same request seeds give the same rollouts; sampled tokens stay within the action words
    tasks = trainer.method.sample(steps)
    first, _ = trainer._rollout(tasks, 123, "check", trainer.env.system_prompt)
    second, _ = trainer._rollout(tasks, 123, "check", trainer.env.system_prompt)
    allowed = set(trainer.policy.allowed.tolist())
    sampled = {t for r in first for t, flag in zip(r.token_ids, r.generated) if flag}
    final = model_logprobs(trainer.policy.model, fixed_sequence(trainer))
    trainer.cleanup()
    return {
        "gaps": gaps,
        "synced": trainer.generator.synced_updates,
        "same_rollouts": [r.token_ids for r in first] == [r.token_ids for r in second],
        "within_allowed": sampled <= allowed,
        "sampled": len(sampled),
        "engine_logprobs": all(r.behavior_logprobs.numel() == len(r.token_ids) for r in first),
        "moved": max(abs(a - b) for a, b in zip(initial, final)),
    }


def resume(run_dir: str) -> dict:
    from rwcore.trainer.trainer import Trainer

    trainer = Trainer.resume(run_dir, quiet=True)
    trainer.setup()
    result = {"step": trainer.step, "gap": engine_gap(trainer)}
    trainer.cleanup()
    return result


if __name__ == "__main__":
    command, run_dir = sys.argv[1], sys.argv[2]
    if command == "train":
        out = train(run_dir, int(sys.argv[3]), sys.argv[4:])
    else:
        out = resume(run_dir)
    print(json.dumps(out))
