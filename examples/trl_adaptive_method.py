"""TRL's GRPOTrainer driven by rwcore's AdaptiveMethod ("arise": evolving rubric-skill pool, rubric
advantages, skills in the prompt, capability sampler), on the CPU with a tiny local model.

    python examples/trl_adaptive_method.py --workdir /tmp/rw-trl --steps 3

Everything is built here: a 1-layer random Llama and a word-level tokenizer (nothing is downloaded), six
tasks, a rule judge, and a scripted reflector that proposes two rubric-skill pairs at the first pool
update (an LLM reflector goes in the same place: any `rwcore.types.RubricReflector`).
"""

from __future__ import annotations

import argparse
import os

WORDS = "refund order search bulk import yes no the a please done check".split()
SPECIAL = ["<pad>", "<unk>", "<bos>", "<end>", "<user>", "<assistant>", "<system>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% if m['role'] == 'assistant' %}<end> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)


def make_tiny_model(path: str) -> str:
    """A 1-layer random Llama and a word-level chat tokenizer saved to `path` (TRL loads the model by path)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<end>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<end>"],
        pad_token_id=vocab["<pad>"],
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_rows(n: int = 6) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"please {WORDS[i]} {WORDS[i + 1]}"}],
            "task_id": f"t{i}",
            "tags": ["refund" if i % 2 else "search"],
        }
        for i in range(n)
    ]


def generated(trajectory) -> str:
    return " ".join(turn.content for turn in trajectory.turns if turn.generated)


def make_judge():
    from rwcore.judges import RuleJudge

    return RuleJudge(
        {
            "short": lambda t: len(generated(t).split()) <= 4,
            "says-refund": lambda t: ("refund" in generated(t)) if "refund" in t.tags else None,
        }
    )


class ScriptedReflector:
    """Proposes the two rubric-skill pairs once (Arise's reflection model would write them from the window)."""

    def propose_rubric_skills(self, trajectories, existing, max_new):
        from rwcore.types import RubricSkillProposal, RubricSpec

        have = {spec.rubric_id for spec in existing}
        pairs = [
            RubricSkillProposal(
                RubricSpec("short", "the reply has at most four words", capability="Efficiency"),
                "answer in four words or fewer",
            ),
            RubricSkillProposal(
                RubricSpec("says-refund", "a refund task's reply mentions the refund", capability="Verification"),
                "name the refund in a refund task",
            ),
        ]
        return [p for p in pairs if p.rubric.rubric_id not in have][:max_new]

    def refine_skill(self, rubric, skill, failures):
        return skill


def make_method(rows, seed: int = 3):
    from rwcore.method import AdaptiveMethod, MethodSettings, Providers

    tasks = {row["task_id"]: row["tags"] for row in rows}
    settings = MethodSettings(batch_size=2, group_size=2, delta_pool=1, seed=seed, diagnostic_tasks=0)
    return AdaptiveMethod("arise", tasks, settings, Providers(reflector=ScriptedReflector()))


def outcome(trajectory) -> float:
    """The task outcome R_o: here, whether the reply ends the turn within six words."""
    return 1.0 if 0 < len(generated(trajectory).split()) <= 6 else 0.0


def grpo_args(workdir: str, steps: int, **overrides):
    from trl import GRPOConfig

    settings = dict(
        output_dir=os.path.join(workdir, "out"),
        max_steps=steps,
        per_device_train_batch_size=4,
        num_generations=2,
        generation_batch_size=4,
        max_completion_length=6,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        remove_unused_columns=False,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def main(workdir: str, steps: int = 3, trainer_class=None):
    """Trains `steps` steps; returns the trainer (its `rw_scored` holds the last `keep_rounds` (16) rounds'
    trajectories and Scored)."""
    from datasets import Dataset

    from rwcore.integrations.trl import AdaptiveGRPOTrainer

    os.makedirs(workdir, exist_ok=True)
    model = make_tiny_model(os.path.join(workdir, "tiny-llama"))
    rows = make_rows()
    trainer_class = trainer_class or AdaptiveGRPOTrainer
    trainer = trainer_class(
        model,
        method=make_method(rows),
        judge=make_judge(),
        outcome_fn=outcome,
        base_system_prompt="you are a support agent",
        args=grpo_args(workdir, steps),
        train_dataset=Dataset.from_list(rows),
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/trl-adaptive-method")
    parser.add_argument("--steps", type=int, default=3)
    cli = parser.parse_args()
    result = main(cli.workdir, cli.steps)
    for record in result.rw_scored:
        print(
            f"step {record['step']}: tasks {record['task_ids']}, rewards {record['scored'].rewards.round(3).tolist()}, "
            f"advantages {record['scored'].advantages.round(3).tolist()}"
        )
    print("pool:", [row["rubric_id"] for row in result.rw_method.pool_rubrics()])
