"""LoRA adapters through peft (`model.lora.rank > 0`): only the adapters train.

`wrap(model, settings)` injects peft's LoRA layers into the HF causal LM in place (`peft.get_peft_model`) and
freezes every base weight. The policy keeps the HF model itself (`Policy.model`): its `.model` backbone,
`.lm_head`, `.config`, KV-cache helpers and `generate` work as before, now through the adapters, so the fused
loss still takes the final hidden states and the head's weight (never [T, V] logits). The LM head and the
embeddings never get adapters (refused naming model.lora.target_modules): the loss reads the head's weight
directly, and vLLM ties it to the embedding.

`peft_model(model)` is peft's own wrapper of that model (for `save_pretrained` of the adapter alone),
`trainable_parameters(model)` what the engines optimize and clip, and `merged_state_dict(model)` the weights
under the base model's own names with the adapters merged (W + alpha / rank * B A), computed without touching
the training model: what vLLM, the asynchronous rollout process and an export load.

Checkpoints (`checkpoint_state_dict`, `load_checkpoint_state_dict`): a LoRA run on a named model stores the
adapter (and the engine the optimizer state of the adapter alone); its base comes from model.name again at
resume and at `rw eval`, and must be the very weights the run trained on: `base_digest` (sha256 over every base
tensor's name, dtype, shape and bytes) is saved with the checkpoint and compared on load. The built-in model has
no name to rebuild its base from (random weights or the reading prior), so its checkpoints hold base and
adapter, as they hold the whole model without LoRA.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

# The attribute (in the model's __dict__, so that torch does not register it as a submodule) where a wrapped
# model keeps what `wrap` made: peft's PeftModel and whether checkpoints hold the base too.
_STATE = "_rwcore_lora"


class _LoraState:
    def __init__(self, wrapper, saves_base: bool, settings: dict) -> None:
        self.wrapper = wrapper
        self.saves_base = saves_base
        self.settings = settings  # _adapter_settings(model.lora): what a checkpoint's adapters must match
        self.digest: str | None = None  # base_digest, computed once (the base never changes)


def import_peft():
    """The peft module, or a ValueError naming what to install."""
    try:
        import peft
    except ImportError as error:
        raise ValueError(
            f"model.lora.rank > 0 needs peft: pip install 'rwcore[lora]' (or pip install peft) ({error})"
        ) from None
    return peft


def enabled(settings) -> bool:
    """Whether `model.lora` (a config.LoraConfig) asks for adapters."""
    return settings is not None and int(settings.rank) > 0


def lora_config(settings):
    """peft.LoraConfig of `model.lora`: r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules (a list
    of module-name suffixes, or "all-linear"), no bias training, plain alpha / rank scaling."""
    peft = import_peft()
    targets = settings.target_modules
    return peft.LoraConfig(
        r=int(settings.rank),
        lora_alpha=float(settings.alpha),
        lora_dropout=float(settings.dropout),
        target_modules=list(targets) if isinstance(targets, (list, tuple)) else targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(model: torch.nn.Module, settings, saves_base: bool = False) -> torch.nn.Module:
    """Injects LoRA adapters into the HF causal LM `model` in place and freezes its base weights; returns
    `model` (peft's wrapper: `peft_model(model)`). `saves_base`: checkpoints hold the base weights too (the
    built-in model, which no model.name rebuilds). Raises ValueError naming model.lora.target_modules when
    they name no module of the model, or the LM head or an embedding."""
    if not enabled(settings):
        raise ValueError(f"model.lora.rank={settings.rank}: adapters need a rank > 0")
    peft = import_peft()
    config = lora_config(settings)
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    try:
        wrapper = peft.get_peft_model(model, config)
    except ValueError as error:
        first = _first_line(error)
        if "target modules" in first.lower():  # "Target modules {...} not found in the base model ..."
            raise ValueError(
                f"model.lora.target_modules={settings.target_modules!r}: peft found no such module in the model "
                f"({first})"
            ) from None
        raise ValueError(f"model.lora: peft refused the adapters ({first})") from None
    refused = [
        name
        for name, module in model.named_modules()
        if _is_lora_layer(module) and module.get_base_layer() in (head, embedding)
    ]
    if refused:
        raise ValueError(
            f"model.lora.target_modules={settings.target_modules!r} puts adapters on {', '.join(refused)}, the LM "
            "head or an embedding; adapt the transformer's linear layers (all-linear leaves the head out): the "
            "fused loss reads the head's weight itself"
        )
    model.__dict__[_STATE] = _LoraState(wrapper, bool(saves_base), _adapter_settings(settings))
    return model


def policy_with_adapters(config, env, device: torch.device, weights: dict | None = None):
    """The run's policy as the trainer trains it: `rwcore.trainer.policy.build_policy(config, env, device,
    weights)`, its model wrapped in place (`wrap`) when model.lora.rank > 0. The rollout process builds the plain
    policy instead: it gets merged weights under the base names (`merged_state_dict`). Kept out of
    trainer/policy.py on purpose: that file's code is part of the reading prior's cache key, and adapters do not
    change the prior."""
    from rwcore.trainer.policy import build_policy

    policy = build_policy(config, env, device, weights=weights)
    settings = config.model.lora
    if enabled(settings):
        wrap(policy.model, settings, saves_base=not config.model.name)  # the built-in base has no name to reload
        policy.model.train()
    return policy


def _is_lora_layer(module: torch.nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def _state(model: torch.nn.Module) -> _LoraState | None:
    return getattr(model, "__dict__", {}).get(_STATE)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` was wrapped by `wrap` (its base is frozen and only adapters train)."""
    return _state(model) is not None


def peft_model(model: torch.nn.Module):
    """peft's PeftModel around `model` (itself when given one), for peft's `save_pretrained` (the adapter alone:
    adapter_config.json + adapter_model.safetensors, read back by `peft.PeftModel.from_pretrained`). Raises
    ValueError for a model without adapters."""
    if _is_peft_wrapper(model):
        return model
    state = _state(model)
    if state is None:
        raise ValueError("the model has no LoRA adapters (model.lora.rank is 0)")
    return state.wrapper


def _is_peft_wrapper(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model itself (a PeftModel's base model)."""
    return model.get_base_model() if _is_peft_wrapper(model) else model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer updates and the clip measures: those with requires_grad, in the model's
    order (every parameter of a model without adapters; the adapters alone of a wrapped one)."""
    return [p for p in model.parameters() if p.requires_grad]


def _adapter_part(name: str) -> bool:
    """Whether a state-dict key belongs to an adapter (lora_A / lora_B / embedding adapters)."""
    from peft.tuners.lora import LoraLayer

    return any(part in LoraLayer.adapter_layer_names for part in name.split("."))


def _base_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, tensor) of every base weight of a wrapped model, as the state dict holds it (`.base_layer`
    dropped from the name, adapter tensors left out)."""
    for name, tensor in model.state_dict().items():
        if not _adapter_part(name):
            yield name.replace(".base_layer.", "."), tensor


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{base model's parameter name: tensor} with every active adapter merged into its layer's weight:
    W + alpha / rank * B A (peft's `get_delta_weight`; the result in W's dtype), the other weights as they are (shared
    tensors, not copies). The training model is left as it is (nothing is merged in place). A model without
    adapters gives its state dict. `model`: the wrapped HF model or its PeftModel. What an inference engine (vLLM,
    the asynchronous rollout process's plain model) loads."""
    model = _inner(model)
    if not is_lora(model):
        return model.state_dict()
    merged = dict(_base_items(model))
    for name, module in model.named_modules():
        if not _is_lora_layer(module) or module.merged or module.disable_adapters:
            continue  # (merged: the weight already holds the adapters; disabled: the base alone is the function)
        base = module.get_base_layer()
        weight = base.weight.detach()
        delta = None
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                part = module.get_delta_weight(adapter)
                delta = part if delta is None else delta + part
        if delta is not None:  # summed in the wider dtype (fp32 adapters on a bf16 base), as peft's merge does
            wide = torch.promote_types(weight.dtype, delta.dtype)
            merged[f"{name}.weight"] = (weight.to(wide) + delta.to(wide)).to(weight.dtype)
    return merged


def checkpoint_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint's model.pt holds: the state dict; for a LoRA model on a named base, its adapter
    tensors alone (the base comes from model.name again)."""
    state = _state(model)
    if state is None or state.saves_base:
        return model.state_dict()
    return {name: tensor for name, tensor in model.state_dict().items() if _adapter_part(name)}


def load_checkpoint_state_dict(model: torch.nn.Module, weights: dict, where: str = "model.pt") -> None:
    """Loads what `checkpoint_state_dict` saved: all of it strictly, or a LoRA model's adapter tensors alone
    (exactly the model's adapter keys; its base was built from model.name). Raises ValueError naming `where`
    when the keys do not match (a checkpoint of another model.lora setting)."""
    state = _state(model)
    if state is None or state.saves_base:
        if state is not None:
            state.digest = None  # the base is the checkpoint's now
        try:
            model.load_state_dict(weights)
        except RuntimeError as error:
            raise ValueError(
                f"{where} does not fit the model ({_first_line(error)}); was it written with "
                "other model.* or model.lora.* settings?"
            ) from None
        return
    expected = {name for name in model.state_dict() if _adapter_part(name)}
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise ValueError(
            f"{where} does not hold this run's LoRA adapters (missing {missing[:3]}, unexpected {extra[:3]}); "
            "was it written with other model.lora.* settings?"
        )
    try:
        model.load_state_dict(weights, strict=False)
    except RuntimeError as error:  # a shape mismatch (another rank)
        raise ValueError(f"{where} does not fit the adapters ({_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


@torch.no_grad()
def base_digest(model: torch.nn.Module) -> str:
    """sha256 over the base weights of a wrapped model (sorted names, each with its dtype, shape and bytes),
    computed once per model (the base is frozen): every base tensor goes through the hash once (for a 7B model
    in bf16, 14 GB), at the first checkpoint and at each resume or `rw eval`."""
    model = _inner(model)
    state = _state(model)
    if state is not None and state.digest is not None:
        return state.digest
    digest = hashlib.sha256()
    for name, tensor in sorted(_base_items(model), key=lambda item: item[0]):
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|{data.numel()}\n".encode())
        digest.update(data.numpy().tobytes())
    value = digest.hexdigest()
    if state is not None:
        state.digest = value
    return value


def _adapter_settings(settings) -> dict:
    """The `model.lora` values that shape what the adapters compute: rank, alpha (the update's scale alpha / rank),
    dropout (the update's forward passes) and target_modules (where adapters are)."""
    targets = settings.target_modules
    return {
        "rank": int(settings.rank),
        "alpha": float(settings.alpha),
        "dropout": float(settings.dropout),
        "target_modules": list(targets) if isinstance(targets, (list, tuple)) else targets,
    }


def checkpoint_record(model: torch.nn.Module, settings) -> dict:
    """state.pt's `lora` entry: the adapter settings and the digest of the base the run trains on."""
    return {
        **_adapter_settings(settings),
        "base_digest": base_digest(model),
        "base_saved": bool(_state(model).saves_base),
    }


def check_checkpoint(model: torch.nn.Module, record: dict | None, path, model_name: str | None) -> None:
    """Refuses a checkpoint (`path`, its state.pt `lora` entry `record`) that does not belong to this model:
    one written without adapters for a LoRA run or the other way round, or one whose base weights differ
    from the ones this run loaded (model.name now names other weights)."""
    if not is_lora(model):
        if record:
            raise ValueError(
                f"checkpoint {path} holds LoRA adapters (model.lora.rank={record.get('rank')}); the run's config "
                "has model.lora.rank=0"
            )
        return
    if not record:
        raise ValueError(f"checkpoint {path} was written without LoRA adapters; the run's config has model.lora")
    # Adapters trained at one alpha (or dropout, or on other modules) are another model at another one: a merge or a
    # resume would silently use values they were not trained with. (A record from before dropout was kept has
    # no dropout entry: nothing to compare.)
    ours = _state(model).settings
    differ = [key for key in ours if key in record and record[key] != ours[key]]
    if differ:
        shown = ", ".join(f"model.lora.{key}={record[key]!r} there, {ours[key]!r} here" for key in differ)
        raise ValueError(
            f"checkpoint {path} holds LoRA adapters trained with other settings than the run's config.yaml "
            f"({shown}); set them back to the values the adapters were trained with"
        )
    if record.get("base_saved") or _state(model).saves_base:
        return  # the checkpoint holds its base itself
    ours = base_digest(model)
    if record.get("base_digest") != ours:
        source = f"model.name={model_name!r}" if model_name else "the built-in model"
        raise ValueError(
            f"checkpoint {path} holds LoRA adapters trained on other base weights than {source} gives now "
            f"(base sha256 {str(record.get('base_digest'))[:12]}... there, {ours[:12]}... here); load the base "
            "the run was trained on"
        )
