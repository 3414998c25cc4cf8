"""The policy: a tokenizer, a causal LM, and how conversations become token ids.

The embedded default is a small Llama-architecture transformer built from a
`transformers` config, over a word-level tokenizer built locally from the
environment's vocabulary (nothing is downloaded); it starts from the reading
prior the project pretrains itself (`rwcore.trainer.prior`, model.init=pretrained)
or from random weights. A real model (`model.name=<HF name or local path>`)
brings its own weights, tokenizer and chat template.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ROLE_TOKENS = {
    "system": "<system>",
    "user": "<user>",
    "assistant": "<assistant>",
    "tool": "<tool>",
    "partner": "<partner>",
}
SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<end>", *ROLE_TOKENS.values()]


class WordCodec:
    """Conversations in the built-in word-level language.

    A conversation is `<bos> <role> words ... <role> words ...`; an agent
    message ends with `<end>`, which is where generation stops.
    """

    def __init__(self, vocabulary: Sequence[str]) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = sorted({w for w in vocabulary if w and w not in SPECIAL_TOKENS})
        vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + words)}
        core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        self.tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<end>"
        )
        self.vocab = vocab
        self.words = [None if token in SPECIAL_TOKENS else token for token in vocab]  # id -> word (None: special)
        self.pad_id = vocab["<pad>"]
        self.end_id = vocab["<end>"]
        self.bos_id = vocab["<bos>"]

    def __len__(self) -> int:
        return len(self.vocab)

    def _words(self, text: str) -> list[int]:
        return [self.vocab.get(w, self.vocab["<unk>"]) for w in text.lower().split()]

    def start(self, system_prompt: str, brief: str, opening: Sequence[tuple[str, str]] = ()) -> list[int]:
        """Ids of the conversation up to the first agent turn; `opening`: (role, text) turns ("partner" or
        "assistant") before the brief, an agent message closed by <end> as generation closes it."""
        ids = [self.bos_id, self.vocab["<system>"], *self._words(system_prompt)]
        for role, text in opening:
            ids += [self.vocab[ROLE_TOKENS[role]], *self._words(text)]
            if role == "assistant":
                ids.append(self.end_id)
        return [*ids, self.vocab["<partner>"], *self._words(brief), self.vocab["<assistant>"]]

    def reply(self, role: str, text: str, history=()) -> list[int]:
        """Ids appended after an agent message: the counterpart's message and the next agent cue."""
        return [self.vocab[ROLE_TOKENS[role]], *self._words(text), self.vocab["<assistant>"]]

    def decode(self, ids: Sequence[int]) -> str:
        """The words of `ids`, special tokens left out (ids outside the vocabulary are an IndexError)."""
        return " ".join([w for w in map(self.words.__getitem__, ids) if w is not None])


def build_model(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_length: int,
    seed: int,
    tie_embeddings: bool = False,
    head_dim: int | None = None,
) -> torch.nn.Module:
    """A randomly initialized small Llama-architecture causal LM (input embedding and LM head shared
    when `tie_embeddings`). `head_dim` None = hidden_size / num_heads; a larger one widens the attention
    projections (vLLM's CPU attention refuses head dims below 32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    extra = {"head_dim": int(head_dim)} if head_dim else {}
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_length,
        tie_word_embeddings=bool(tie_embeddings),
        **extra,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


@dataclass
class Policy:
    """The model with its codec; `version` counts optimizer updates."""

    model: torch.nn.Module
    codec: WordCodec
    device: torch.device
    version: int = 0
    allowed: torch.Tensor | None = None  # [K] token ids agent messages may use; None = the whole vocabulary
    shared_prefix: bool = True  # model.shared_prefix: encode prompts the rows share once (see hidden_states)

    def restrict(self, token_ids: Sequence[int]) -> None:
        """Agent messages use only `token_ids`: sampling suppresses the rest, and scoring and the loss
        take the softmax over these alone, so behavior and current log-probs stay the same distribution."""
        self.allowed = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=self.device)

    def suppressed(self) -> list[int] | None:
        """Token ids generation must never produce, for `generate(suppress_tokens=...)`."""
        if self.allowed is None:
            return None
        keep = set(self.allowed.tolist())
        return [i for i in range(self.model.config.vocab_size) if i not in keep]

    def action_space(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(head weight [K, H], labels as indices into it, -100 outside) for the restricted softmax."""
        if self.allowed is None:
            return self.head.weight, labels
        position = torch.full((self.model.config.vocab_size,), -100, dtype=torch.long, device=labels.device)
        position[self.allowed] = torch.arange(len(self.allowed), device=labels.device)
        return self.head.weight.index_select(0, self.allowed), position[labels]

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L, H] final (normed) hidden states, the input of the LM head, of right-padded input_ids [B, L]
        (long) with attention_mask [B, L] (1 = token, 0 = padding).

        Rows share prompts: every rollout of a step starts with the same system prompt (and, under Arise, the
        same skills), and the G rollouts of a group with the same task. With model.shared_prefix on, the rows'
        first P tokens (`prefix_plan`: one prefix for the batch, or one per group of rows) are encoded once per
        distinct prefix (D rows) and their keys and values gathered for the B rows: the same function,
        differentiable through the prefixes (each prefix's gradient is the sum over its rows), at about
        (D P + B (L - P)) / (B L) of the cost. Results agree with the full forward to float rounding (about
        1e-6 in float32)."""
        plan = self.prefix_plan(input_ids, attention_mask)
        if plan is None:
            return self.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        batch, length = input_ids.shape
        head = self.model.model(input_ids=input_ids[plan.firsts, : plan.length], use_cache=True)
        cache = output_cache(head)
        plan.spread_cache(cache)
        positions = torch.arange(plan.length, length, device=input_ids.device)
        tail = self.model.model(
            input_ids=input_ids[:, plan.length :],
            attention_mask=attention_mask,
            position_ids=positions[None].expand(batch, -1),
            cache_position=positions,
            use_cache=True,
            **{cache_keyword(self.model.model): cache},
        ).last_hidden_state
        return torch.cat([plan.spread(head.last_hidden_state, view=True), tail], dim=1)

    def prefix_plan(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> PrefixPlan | None:
        """Which prefix `hidden_states` and HF generation encode once, for input_ids [B, L] (right-padded with
        attention_mask, or unpadded lists' common width without): the length P, shared by every row, whose
        distinct P-token starts are encoded once each. P maximizes the token positions saved, P (B - D(P)) for
        D(P) distinct starts — the whole batch's common prefix (D = 1), or a longer one shared within groups
        (a task's G rollouts) — and must save at least as much as a batch-wide prefix of MIN_SHARED_PREFIX
        tokens would. None takes the plain path: model.shared_prefix off, a single row, nothing worth sharing,
        left padding, gradient checkpointing, or a model whose cache is not HF's plain DynamicCache. At least
        one token of every row stays outside the prefix."""
        batch = input_ids.shape[0]
        if not self.shared_prefix or batch < 2 or not supports_shared_prefix(self.model):
            return None
        limit = input_ids.shape[1]
        if attention_mask is not None:  # the rows' real tokens must start at 0 and cover the prefix
            padded = attention_mask == 0
            limit = int(torch.where(padded.any(dim=1), padded.int().argmax(dim=1), limit).min())
        limit -= 1
        if limit < MIN_SHARED_PREFIX:
            return None
        rows = input_ids[:, :limit].tolist()
        order = sorted(range(batch), key=rows.__getitem__)
        ranked = torch.tensor([rows[i] for i in order], dtype=torch.long)
        # agree[k]: length of the common start of the k-th and (k+1)-th rows in sorted order
        differs = ranked[1:] != ranked[:-1]
        agree = torch.where(differs.any(dim=1), differs.int().argmax(dim=1), limit)
        lengths = torch.arange(1, limit + 1)
        distinct = 1 + (agree[None, :] < lengths[:, None]).sum(dim=1)  # D(P) for P = 1 .. limit
        saved = lengths * (batch - distinct)
        saved[: MIN_SHARED_PREFIX - 1] = 0
        best = int(torch.argmax(saved.flip(0)))  # the longest P among equal savings
        length = limit - best
        if int(saved[length - 1]) < MIN_SHARED_PREFIX * (batch - 1):
            return None
        starts = torch.cat([torch.ones(1, dtype=torch.long), (agree < length).long()])  # sorted row opens a prefix
        group = torch.empty(batch, dtype=torch.long)
        group[torch.tensor(order)] = torch.cumsum(starts, 0) - 1
        # number the prefixes by their first row, so that a batch laid out task by task is runs of 0, 1, 2, ...
        count = int(starts.sum())
        first = torch.full((count,), batch, dtype=torch.long).scatter_reduce_(0, group, torch.arange(batch), "amin")
        firsts, by_first = torch.sort(first)
        rank = torch.empty(count, dtype=torch.long)
        rank[by_first] = torch.arange(count)
        device = input_ids.device
        return PrefixPlan(length, rank[group].to(device), firsts.to(device))

    def prefix_length(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> int:
        """P of `prefix_plan`, or 0 for the plain path."""
        plan = self.prefix_plan(input_ids, attention_mask)
        return 0 if plan is None else plan.length

    @property
    def head(self) -> torch.nn.Linear:
        return self.model.lm_head


MIN_SHARED_PREFIX = 8  # tokens; below this one more forward pass costs more than the prefix saves


@dataclass(frozen=True)
class PrefixPlan:
    """A shared prefix of a batch of B rows: its `length` P, `rows` [B] (long, the index of each row's prefix
    among the D distinct ones) and `firsts` [D] (long, a row that holds each prefix, in prefix order)."""

    length: int
    rows: torch.Tensor
    firsts: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.firsts.numel())

    @functools.cached_property
    def repeats(self) -> int | None:
        """R when the rows are the D prefixes' runs of R rows each, in prefix order (a step's G rollouts of
        each task, or one prefix for the whole batch); None otherwise."""
        batch, count = self.rows.numel(), self.count
        if batch % count:
            return None
        expected = torch.arange(count, device=self.rows.device).repeat_interleave(batch // count)
        return batch // count if torch.equal(self.rows, expected) else None

    def spread(self, per_prefix: torch.Tensor, view: bool = False) -> torch.Tensor:
        """[D, ...] -> [B, ...]: each row gets its prefix's entry. Runs of equal rows repeat (whose backward
        is a reshaped sum), a single prefix as a broadcast view with `view`; any other order gathers with
        index_select (backward: index_add)."""
        repeats = self.repeats
        if view and self.count == 1:
            return per_prefix.expand(repeats, *per_prefix.shape[1:])
        if repeats is not None:  # R > 1: a plan shares each prefix between rows
            return per_prefix.repeat_interleave(repeats, dim=0)
        return per_prefix.index_select(0, self.rows)

    def spread_cache(self, cache) -> None:
        """Spreads an HF DynamicCache of the D prefixes to the B rows in place (as `spread`)."""
        for layer in cache.layers:
            layer.keys, layer.values = self.spread(layer.keys), self.spread(layer.values)


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest common start of token-id lists."""
    if not sequences:
        return 0
    first, count = sequences[0], min(len(s) for s in sequences)
    for i in range(count):
        token = first[i]
        if any(s[i] != token for s in sequences):
            return i
    return count


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword an HF model's forward and `generate` take the KV cache by: `cache` from transformers 5.25
    on (where `past_key_values` is deprecated, to be removed from forward in 5.40), `past_key_values`
    before."""
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_type: type) -> str:  # per class: the rollout asks at every turn
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def output_cache(output):
    """The KV cache an HF model output carries: `.cache` from transformers 5.25 on, `.past_key_values` before
    (in 5.25 the old name is an alias that logs a deprecation warning)."""
    cache = getattr(output, "cache", None)
    return output.past_key_values if cache is None else cache


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether an HF model trains with activation (gradient) checkpointing; transformers 5.25 renamed
    `is_gradient_checkpointing` to `is_activation_checkpointing`."""
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def supports_shared_prefix(model: torch.nn.Module) -> bool:
    """Whether `model` can take a repeated prefix cache: an HF causal LM (a `.model` backbone) with full
    attention in every layer, whose DynamicCache then holds whole keys and values per layer (a sliding
    window or hybrid layers would not), and that is not gradient checkpointing (which turns the cache off
    while training)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "model") or is_checkpointing(model):
        return False
    if getattr(config, "sliding_window", None):
        return False
    layer_types = getattr(config, "layer_types", None) or ()
    return all(kind == "full_attention" for kind in layer_types)


_CHAT_ROLES = {"system": "system", "user": "user", "partner": "user", "tool": "tool", "assistant": "assistant"}


class TemplateCodec:
    """Conversations of a real model through its tokenizer's chat template.

    Roles map onto the template's: the environment's counterpart speaks as
    "user". Each continuation is the template's rendering of the longer
    conversation minus what was already encoded (templates that are not
    prefix-stable are handled at the text level).
    """

    def __init__(self, tokenizer) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("model.name: the tokenizer has no chat template; use a chat/instruct model")
        self.tokenizer = tokenizer
        self.end_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __len__(self) -> int:
        return len(self.tokenizer)

    def render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def start(self, system_prompt: str, brief: str, opening: Sequence[tuple[str, str]] = ()) -> list[int]:
        """Ids of the conversation up to the first agent turn; `opening`: (role, text) turns before the brief."""
        messages = [{"role": "system", "content": system_prompt}]
        messages += [{"role": _CHAT_ROLES[role], "content": text} for role, text in opening]
        messages.append({"role": "user", "content": brief})
        return self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]

    def reply(self, role: str, text: str, history=()) -> list[int]:
        """Ids that extend the conversation `history` (Turns, ending with an agent message) by the
        counterpart's message `text` and the next generation prompt."""
        before = [{"role": _CHAT_ROLES[turn.role], "content": turn.content} for turn in history]
        old = self.tokenizer.apply_chat_template(before, tokenize=False)
        new = self.render(before + [{"role": _CHAT_ROLES[role], "content": text}])
        delta = new[len(old) :] if new.startswith(old) else new
        return self.tokenizer(delta, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def load_pretrained(name: str, device: torch.device, dtype: str):
    """(model, TemplateCodec) from a Hugging Face name or local path (the user's cache or disk)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=getattr(torch, dtype))
    return model.to(device), TemplateCodec(tokenizer)


def build_policy(config, env, device: torch.device, weights: dict | None = None) -> Policy:
    """The run's policy from its `Config`: a pretrained `model.name`, or the built-in model over the
    environment's vocabulary - with `weights` (a state dict: the reading prior of model.init=pretrained) or
    random weights seeded by train.seed - restricted to its action words when rollout.action_words says so.
    The trainer and the asynchronous rollout worker build it alike (the worker gets its weights pushed)."""
    cfg = config.model
    if cfg.name:
        model, codec = load_pretrained(cfg.name, device, cfg.dtype)
    else:
        codec = WordCodec(env.vocabulary())
        model = build_model(
            len(codec),
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            cfg.intermediate_size,
            cfg.max_length,
            config.train.seed,
            cfg.tie_embeddings,
            cfg.head_dim,
        )
        if weights is not None:
            model.load_state_dict(weights)
        model = model.to(device)
    model.train()
    policy = Policy(model, codec, device, shared_prefix=bool(cfg.shared_prefix))
    words = config.rollout.action_words
    if words == "auto":
        words = "on" if not cfg.name and hasattr(env, "action_vocabulary") else "off"
    if words == "on":
        if cfg.name or not hasattr(env, "action_vocabulary"):
            raise ValueError(
                "rollout.action_words=on needs the built-in model (model.name=null) and an "
                "environment with action_vocabulary()"
            )
        policy.restrict([codec.vocab[w] for w in env.action_vocabulary()] + [codec.end_id])
    return policy
