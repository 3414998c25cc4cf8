"""transformers 5.25 renamed the KV-cache keyword and output field (`past_key_values` -> `cache`, the old names
deprecated and to be removed from forward in 5.40) and `is_gradient_checkpointing` ->
`is_activation_checkpointing`. The policy's helpers pick whichever the installed version has: checked here on
the installed transformers' real models and on stand-ins of the other convention, and the rollout and the
shared-prefix forward must not use a deprecated name (no deprecation warning from them) on either."""

from __future__ import annotations

import inspect
import logging
import warnings

import torch
import transformers

from rwcore.trainer.generation import HFGenerator, own_decoding
from rwcore.trainer.policy import (
    Policy,
    WordCodec,
    build_model,
    cache_keyword,
    is_checkpointing,
    output_cache,
    supports_shared_prefix,
)

WORDS = [f"w{i}" for i in range(40)]


def test_cache_keyword_is_the_one_the_installed_forward_and_backbone_take():
    """Passed by the chosen keyword, a DynamicCache is filled by the real model and backbone (a keyword the
    forward does not know would raise or be swallowed by **kwargs, leaving the cache empty)."""
    from transformers import DynamicCache

    model = build_model(len(WORDS) + 9, 32, 1, 4, 48, 64, 0, True)
    ids = torch.arange(5)[None]
    for module in (model, model.model):
        keyword = cache_keyword(module)
        assert keyword in inspect.signature(type(module).forward).parameters
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            output = module(input_ids=ids, use_cache=True, **{keyword: cache})
        assert cache.get_seq_length() == 5 and output_cache(output) is cache


def test_cache_keyword_and_output_cache_on_either_convention():
    class NewStyle(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=None):
            return input_ids

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=None):
            return input_ids

    assert cache_keyword(NewStyle()) == "cache" and cache_keyword(OldStyle()) == "past_key_values"

    class NewOutput:
        cache = "kv-new"

        @property
        def past_key_values(self):  # 5.25's alias, which warns
            raise AssertionError("read the deprecated alias")

    class OldOutput:
        past_key_values = "kv-old"

    assert output_cache(NewOutput()) == "kv-new" and output_cache(OldOutput()) == "kv-old"


def test_checkpointing_flag_under_either_name():
    class Renamed:
        is_activation_checkpointing = True

        @property
        def is_gradient_checkpointing(self):
            raise AssertionError("read the deprecated name")

    class Older:
        is_gradient_checkpointing = True

    class Neither:
        pass

    assert is_checkpointing(Renamed()) and is_checkpointing(Older()) and not is_checkpointing(Neither())
    model = build_model(len(WORDS) + 9, 32, 1, 4, 48, 64, 0, True)
    assert not is_checkpointing(model) and supports_shared_prefix(model)
    # transformers 5.25's name for it, or the older one
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert is_checkpointing(model) and not supports_shared_prefix(model)


def test_rollout_and_shared_prefix_forward_use_no_deprecated_name(caplog):
    """One rollout (own decode loop and generate, a shared prefix) and one shared-prefix forward with every
    warning recorded: none may name past_key_values or is_gradient_checkpointing."""
    codec = WordCodec(WORDS)
    model = build_model(len(codec), 32, 1, 4, 48, 128, 0, True)
    model.eval()
    policy = Policy(model, codec, torch.device("cpu"), shared_prefix=True)
    prompts = [[codec.vocab[w] for w in WORDS[:12]] + [codec.vocab[WORDS[12 + i % 3]]] for i in range(6)]
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = HFGenerator(policy)
        with torch.no_grad():
            decoded = engine(prompts, list(range(6)), 1.0, 3, False)  # the own loop (own_decoding is true)
            input_ids, attention, cache = engine._inputs(prompts)  # the shared prefix's cache
            generated, _ = engine._generate(input_ids, attention, cache, 1.0, 3, False)  # generate's path
        ids = torch.tensor(prompts)
        hidden = policy.hidden_states(ids, torch.ones_like(ids))
    assert own_decoding(model) and cache is not None
    assert len(decoded) == 6 and generated.shape == (6, 3) and hidden.shape == (6, 13, 32)
    texts = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    deprecated = [t for t in texts if "past_key_values" in t or "is_gradient_checkpointing" in t]
    assert not deprecated, f"transformers {transformers.__version__}: {deprecated}"
