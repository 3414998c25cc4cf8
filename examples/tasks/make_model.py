"""A tiny random chat model for the task-file example, saved with transformers' own writers (nothing is
downloaded): a one-layer Llama and a word-level tokenizer over the words of the example's task files, with a
chat template. Use the folder as `model.name`:

    python examples/tasks/make_model.py /tmp/tiny-chat
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIAL = ["<pad>", "<unk>", "<end>", "<system>", "<user>", "<assistant>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% if m['role'] == 'assistant' %}<end> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)


def task_words() -> list[str]:
    """Every word of the example's task files' prompts and openings."""
    words = set()
    for name in ("train.jsonl", "eval.jsonl", "more_eval.jsonl"):
        for line in (HERE / name).read_text().splitlines():
            row = json.loads(line)
            texts = [row["prompt"]] if "prompt" in row else [m["content"] for m in row["messages"]]
            for text in texts:
                words |= set(text.lower().split())
    return sorted(words)


def make_model(folder: str | Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL + task_words())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<end>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=vocab["<end>"],
        pad_token_id=vocab["<pad>"],
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return Path(folder)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/tasks/make_model.py FOLDER")
    print(make_model(sys.argv[1]))
