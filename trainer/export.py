"""`rw export`: a run's trained policy as a Hugging Face folder that transformers, vLLM and PEFT read as it is.

The checkpoint is the newest intact `checkpoints/step_N` of the run (each verified against its manifest, newest
first; a damaged one is skipped with a note) or the one `step` names (which must then be intact). The policy is
rebuilt from the run's config.yaml as the trainer builds it (`rwcore.trainer.lora.policy_with_adapters`: a named
model from `model.name`, the built-in model over the environment's vocabulary), its checkpoint weights
(`model.pt`) are loaded - a LoRA run's adapters onto the base `model.name` gives, which must be the very base the
run trained on (rwcore.trainer.lora) - and the folder gets

- `config.json` and `model.safetensors` (`save_pretrained(safe_serialization=True)`, in the run's parameter
  dtype); a LoRA run's adapters are merged into the weights (`merge_and_unload` on the export's own copy), or,
  with `adapter_only`, PEFT's adapter folder (`adapter_config.json`, `adapter_model.safetensors`) is written
  instead, for the base model the run started from;
- the tokenizer: a named model's own (`AutoTokenizer`), or the built-in model's word-level tokenizer with the
  codec's lowercasing, its role tokens as special tokens and a chat template that renders a conversation to the
  very ids the trainer's codec produces (checked before the folder is put in place);
- `generation_config.json` with eos (the end-of-message token the trainer stops at), pad and bos; where the run
  restricted agent messages to the environment's action words (`rollout.action_words`), the other ids as
  `suppress_tokens`, so that `generate` samples from the distribution the trainer sampled from;
- `rwcore_export.json`: the run, the step, the checkpoint, the sha256 of its model.pt, what was exported and the
  action token ids (for vLLM's `allowed_token_ids`, which does not read `suppress_tokens`).

Everything is checked and loaded before anything is written; the folder is written under a temporary name beside
`out` and renamed into place, so `out` is either absent or complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer.run_paths import kind_of

RECORD = "rwcore_export.json"
RECORD_FORMAT = 1

# The built-in codec's conversation layout (trainer/policy.py WordCodec): `<bos> <system> ... <partner> ...
# <assistant>` for the opening prompt, each agent message `... <end>` after its `<assistant>` cue, and every
# counterpart message `<partner> ...` (a tool's `<tool> ...`). The environment's counterpart speaks as "user".
BUILTIN_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<assistant> {{ message['content'] }} <end> "
    "{% elif message['role'] == 'system' %}<system> {{ message['content'] }} "
    "{% elif message['role'] == 'tool' %}<tool> {{ message['content'] }} "
    "{% else %}<partner> {{ message['content'] }} "
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


class ExportError(ValueError):
    """Bad input to an export (names the argument: RUN, --step, --out, --adapter-only); nothing was written."""


@dataclass
class ExportResult:
    """What an export wrote: the folder, the checkpoint it came from, and the files in it."""

    out: Path
    checkpoint: Path
    step: int
    kind: str  # "model" (LoRA merged where the run had LoRA) or "adapter"
    files: list[str] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # damaged checkpoints passed over, with why


# ---------------------------------------------------------------------------------------- checks


def check_out(out: Path) -> None:
    """Refuses an `out` that exists and is not an empty folder (nothing in it is ever replaced)."""
    found = kind_of(out)  # the run-folder rule's lstat: a link is never followed
    if found is None:
        return
    if found != "folder":
        raise ExportError(f"--out {str(out)!r} is a {found}, not a folder; choose a new folder")
    entries = sorted(entry.name for entry in out.iterdir())
    if entries:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ExportError(
            f"--out {str(out)!r} is not empty ({shown}); export into a new or empty folder (nothing is overwritten)"
        )


def select_checkpoint(run: Path, step: int | None) -> tuple[Path, dict, list[tuple[Path, str]]]:
    """(checkpoint folder, its manifest, damaged checkpoints passed over with why) of `run`: the one `step`
    names, which must be intact, or the newest that verifies. Raises ExportError naming RUN or --step."""
    if not run.is_dir():
        raise ExportError(f"RUN {str(run)!r} is not a folder")
    if not (run / "config.yaml").is_file():
        hint = ""
        if (run / ckpt.MANIFEST).is_file() and run.parent.name == "checkpoints":
            hint = f" (it looks like a checkpoint: rw export {run.parent.parent} --step N)"
        raise ExportError(f"RUN {str(run)!r} is not a run folder of rw train: it has no config.yaml{hint}")
    folders = ckpt.step_folders(run / "checkpoints")
    if not folders:
        raise ExportError(f"RUN {str(run)!r} has no checkpoint (no checkpoints/step_* folder): nothing to export")
    if step is not None:
        steps = {int(folder.name.split("_", 1)[1]): folder for folder in folders}
        if step not in steps:
            shown = ", ".join(str(s) for s in sorted(steps))
            raise ExportError(f"--step {step}: {run} has no checkpoint of that step (its checkpoints: {shown})")
        try:
            return steps[step], ckpt.verify(steps[step]), []
        except ckpt.CheckpointError as error:
            raise ExportError(f"--step {step}: the checkpoint is damaged ({error}); nothing was exported") from None
    skipped = []
    for folder in folders:
        try:
            return folder, ckpt.verify(folder), skipped
        except ckpt.CheckpointError as error:
            skipped.append((folder, str(error)))
    reasons = "; ".join(f"{folder.name}: {reason}" for folder, reason in skipped)
    raise ExportError(f"RUN {str(run)!r} has no intact checkpoint ({reasons}); nothing was exported")


# ---------------------------------------------------------------------------------------- the policy


def peft_wrapper(model: torch.nn.Module):
    """PEFT's PeftModel of a LoRA run's policy (the policy keeps the HF model with its layers adapted in place:
    rwcore.trainer.lora), `model` itself when it is one, or None for a model without adapters."""
    from rwcore.trainer import lora

    if hasattr(model, "peft_config") and callable(getattr(model, "merge_and_unload", None)):
        return model
    return lora.peft_model(model) if lora.is_lora(model) else None


def load_policy(config, checkpoint: Path):
    """(policy, env or None) rebuilt from a run's Config as the trainer builds it, on the CPU, with the
    checkpoint's model.pt loaded (the checkpoint must have been verified): the whole model, or a LoRA run's
    adapters on the base model.name gives, which must be the base the run trained on. The environment is built
    only for the built-in model, whose tokenizer is its vocabulary."""
    from rwcore.trainer import envs, lora

    env = None
    if not config.model.name:
        envs.check_outside(config.env.name, checkpoint.parent.parent)  # never code that came inside the run folder
        env = envs.make(config.env.name, **dict(config.env.options))
    try:
        policy = lora.policy_with_adapters(config, env, torch.device("cpu"))
    except OSError as error:  # a named model that is no longer on disk nor in the cache
        raise ExportError(
            f"RUN: model.name {config.model.name!r} of the run's config.yaml cannot be loaded ({error})"
        ) from None
    weights = ckpt.load(checkpoint / "model.pt", map_location="cpu")
    try:
        if lora.is_lora(policy.model):  # first: adapters of other settings may not even load into this model
            state = ckpt.load(checkpoint / "state.pt", map_location="cpu")
            lora.check_checkpoint(policy.model, state.get("lora"), checkpoint, config.model.name)
        lora.load_checkpoint_state_dict(policy.model, weights, where=str(checkpoint / "model.pt"))
    except ValueError as error:  # the config and the checkpoint disagree (keys, shapes, the LoRA base)
        raise ExportError(f"RUN {str(checkpoint.parent.parent)!r}: {error}") from None
    policy.model.eval()
    return policy, env


def builtin_tokenizer(codec, max_length: int):
    """The built-in model's tokenizer as a PreTrainedTokenizerFast to save: the codec's word-level vocabulary
    (same ids), lowercasing as the codec does, its role tokens as special tokens (decoding with
    skip_special_tokens gives the codec's decode), and a chat template that renders the codec's layout."""
    from tokenizers import Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    from rwcore.trainer.policy import ROLE_TOKENS

    core = Tokenizer.from_str(codec.tokenizer.backend_tokenizer.to_str())
    core.normalizer = normalizers.Lowercase()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<end>",
        additional_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=max_length,
    )
    tokenizer.chat_template = BUILTIN_CHAT_TEMPLATE
    return tokenizer


def check_builtin_tokenizer(folder: Path, codec, system_prompt: str, vocabulary: list[str]) -> None:
    """Reads the saved tokenizer back (AutoTokenizer) and checks that a conversation of the environment's system
    prompt and every vocabulary word renders and encodes to the codec's ids, and that the special ids agree."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    brief = " ".join(vocabulary)
    expected = codec.start(system_prompt, brief)
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": brief}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text)["input_ids"]
    special = (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id)
    if ids != expected or special != (codec.end_id, codec.pad_id, codec.bos_id) or len(tokenizer) != len(codec):
        raise RuntimeError(
            "the exported tokenizer does not reproduce the built-in codec's ids (a bug of rw export; nothing was "
            "exported)"
        )


def generation_config(model, codec, suppressed: list[int] | None, named: bool):
    """The GenerationConfig to save: a named model's own, with the codec's end-of-message token among the eos
    ids and pad and bos set where missing, or for the built-in model (whose config holds LlamaConfig's default
    ids) the codec's; `suppressed` ids as suppress_tokens."""
    from transformers import GenerationConfig

    config = GenerationConfig.from_dict(model.generation_config.to_dict()) if named else GenerationConfig()
    eos = config.eos_token_id
    if eos is None:
        config.eos_token_id = codec.end_id
    elif codec.end_id not in (eos if isinstance(eos, list) else [eos]):
        config.eos_token_id = [*(eos if isinstance(eos, list) else [eos]), codec.end_id]
    if config.pad_token_id is None:
        config.pad_token_id = codec.pad_id
    bos = getattr(codec, "bos_id", None)  # the built-in codec's; a named model's tokenizer may have none
    if bos is None:
        bos = getattr(codec.tokenizer, "bos_token_id", None)
    if config.bos_token_id is None and bos is not None:
        config.bos_token_id = bos
    if suppressed:
        config.suppress_tokens = list(suppressed)
    return config


# ---------------------------------------------------------------------------------------- writing


def _fsync_tree(folder: Path) -> None:
    """Makes every file of `folder` and the folders themselves durable before the rename."""
    for root, _, names in os.walk(folder):
        for name in names:
            with open(Path(root) / name, "rb") as stream:
                os.fsync(stream.fileno())
    for root, _, _ in sorted(os.walk(folder), key=lambda entry: -len(Path(entry[0]).parts)):
        ckpt.fsync_dir(Path(root))


def _write(staging: Path, policy, env, config, *, adapter_only: bool, record: dict) -> str:
    """Writes the export into `staging`; returns its kind ("model" or "adapter")."""
    model, codec = policy.model, policy.codec
    suppressed = policy.suppressed()
    wrapper = peft_wrapper(model)
    if adapter_only:
        wrapper.save_pretrained(staging, safe_serialization=True)  # adapter_config.json + adapter_model.safetensors
        kind = "adapter"
    else:
        if wrapper is not None:
            model = wrapper.merge_and_unload()  # W + alpha / rank * B A, on the export's own copy
        if not config.model.name:  # LlamaConfig's defaults are not the codec's ids
            model.config.bos_token_id, model.config.eos_token_id = codec.bos_id, codec.end_id
            model.config.pad_token_id = codec.pad_id
        model.generation_config = generation_config(model, codec, suppressed, bool(config.model.name))
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Writing model shards" bar: rw export reports what it wrote itself
        try:
            model.save_pretrained(staging, safe_serialization=True)
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        kind = "model"
    if config.model.name:
        codec.tokenizer.save_pretrained(staging)
    else:
        builtin_tokenizer(codec, config.model.max_length).save_pretrained(staging)
        check_builtin_tokenizer(staging, codec, env.system_prompt, sorted(set(env.vocabulary())))
    if adapter_only:  # the adapter folder carries the generation settings too, for whoever loads its base
        generation_config(model, codec, suppressed, bool(config.model.name)).save_pretrained(staging)
    allowed = None if policy.allowed is None else [int(i) for i in policy.allowed.tolist()]
    record = {**record, "kind": kind, "action_token_ids": allowed}
    (staging / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return kind


def export_run(
    run: str | os.PathLike,
    out: str | os.PathLike,
    step: int | None = None,
    adapter_only: bool = False,
    note: Callable[[str], None] | None = None,
) -> ExportResult:
    """Exports a run's trained policy into the new folder `out` (see the module docstring).

    Raises ExportError (a ValueError) naming the argument for bad input - RUN without an intact checkpoint, a
    --step it does not have or whose checkpoint is damaged, a non-empty --out, --adapter-only for a run without
    LoRA - and ckpt.RunFolderError naming the path when the folder cannot be written; in every case nothing is
    left at `out` or beside it. `note` gets one line per damaged checkpoint passed over (default: stderr)."""
    run, out = Path(run), Path(out)
    note = note or (lambda line: print(f"rw export: {line}", file=sys.stderr, flush=True))
    check_out(out)
    checkpoint, manifest, skipped = select_checkpoint(run, step)
    from rwcore.trainer.config import load_config

    try:
        config = load_config(str(run / "config.yaml"))
    except ValueError as error:
        raise ExportError(f"RUN {str(run)!r}: its config.yaml does not load ({error})") from None
    policy, env = load_policy(config, checkpoint)
    has_lora = peft_wrapper(policy.model) is not None
    if adapter_only and not has_lora:
        raise ExportError(
            f"--adapter-only: the run in {run} trained no LoRA adapters (model.lora is off); export the whole "
            "model without --adapter-only"
        )
    if adapter_only and not config.model.name:
        raise ExportError(
            "--adapter-only: the run's base model is the built-in one, which exists only inside the run; export "
            "the merged model without --adapter-only"
        )
    for folder, reason in skipped:
        note(f"checkpoint {folder.name} skipped ({reason}); exporting {checkpoint.name}")
    import rwcore

    record = {
        "format": RECORD_FORMAT,
        "run": str(run.resolve()),
        "step": int(manifest["step"]),
        "checkpoint": f"checkpoints/{checkpoint.name}",
        "model_pt_sha256": manifest["files"]["model.pt"]["sha256"],
        "model": config.model.name or "built-in",
        "lora": ({"rank": config.model.lora.rank, "alpha": config.model.lora.alpha} if has_lora else None),
        "dtype": str(next(policy.model.parameters()).dtype).removeprefix("torch."),
        "rwcore_version": rwcore.__version__,
    }
    out = out.absolute()
    created = _missing_ancestor(out.parent)
    staging = None
    try:
        with ckpt.writing(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".export-tmp", dir=out.parent))
            kind = _write(staging, policy, env, config, adapter_only=adapter_only, record=record)
            files = sorted(path.relative_to(staging).as_posix() for path in staging.rglob("*") if path.is_file())
            _fsync_tree(staging)
            check_out(out)  # still absent or empty: os.replace then takes the name (an empty folder it replaces)
            os.replace(staging, out)
            staging = None
            ckpt.fsync_dir(out.parent)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        _remove_made_folders(out.parent, created)
        raise
    return ExportResult(out, checkpoint, record["step"], kind, files, skipped)


def _remove_made_folders(folder: Path, outermost: Path | None) -> None:
    """Removes the folders an export made for its parent (`folder` up to `outermost`), each only while empty."""
    if outermost is None:
        return
    for path in (folder, *folder.parents):
        try:
            path.rmdir()
        except OSError:
            return
        if path == outermost:
            return


def _missing_ancestor(folder: Path) -> Path | None:
    """The outermost folder of `folder`'s ancestry (itself included) that does not exist yet, or None."""
    missing = None
    for path in (folder, *folder.parents):
        if path.exists() or path.is_symlink():
            break
        missing = path
    return missing
