"""A small random Qwen2-architecture chat model for `rw train model.name=DIR rollout.engine=vllm` (bench/gpu_check.sh).

    .venv/bin/python bench/gpu_tiny_model.py DIR              # 4 layers, hidden 512, V = 151,936 (Qwen2's vocabulary
    size)
    .venv/bin/python bench/gpu_tiny_model.py DIR --tiny       # 1 layer, hidden 64, V = 1,024 (the CPU dry run)

Nothing is downloaded: the weights are random (seeded), the tokenizer is byte-level, built here (256 byte
symbols, no merges, plus three specials), with a plain chat template. The model's vocabulary is padded
beyond the tokenizer's, as Qwen2's is, so the LM head and the fused kernels see the production V.
head_dim is 64 (vLLM's attention backends refuse smaller ones on the CPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MAX_LENGTH = 4096


def build(folder: Path, tiny: bool = False, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(sorted(alphabet))}
    for special in ("<s>", "</s>", "<pad>"):
        vocab[special] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = MAX_LENGTH
    if tiny:
        size = dict(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
        )
    else:
        size = dict(
            vocab_size=151_936,
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
        )
    config = Qwen2Config(
        **size,
        head_dim=64,
        max_position_embeddings=MAX_LENGTH,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    print(build(args.folder, args.tiny))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
