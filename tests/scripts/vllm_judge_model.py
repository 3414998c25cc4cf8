"""A tiny random judge model for a real vLLM OpenAI-compatible server (tests/rwcore/judges/test_judges_vllm_real.py).

    python tests/scripts/vllm_judge_model.py DIR     # writes the model and its tokenizer to DIR

A randomly initialized Llama-architecture causal LM (one layer, head_dim 64: vLLM's CPU attention
refuses head dims below 32) with a byte-level tokenizer built here (the 256 byte symbols, no merges,
so every text and every JSON byte is expressible and the grammar backend can constrain it) and a
plain chat template. Nothing is downloaded. Its replies are random bytes unless vLLM constrains them.
"""

from __future__ import annotations

import sys

MAX_LENGTH = 8192
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build(folder: str, seed: int = 0) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_LENGTH,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


if __name__ == "__main__":
    build(sys.argv[1])
