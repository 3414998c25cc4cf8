"""Helpers shared by several test modules."""

from pathlib import Path

import numpy as np

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
