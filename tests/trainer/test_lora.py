"""LoRA adapters (`model.lora.rank > 0`) through peft: only the adapters train, the fused loss still reads the
LM head through hidden states (never [T, V] logits), rollout engines get the merged weights, a LoRA checkpoint
holds the adapter and the optimizer (plus a digest of the base it was trained on) and resumes exactly - also
after a kill -9 - and DeepSpeed ZeRO trains the adapters alone.

The named model is a tiny Llama saved to a folder (tests/trainer/test_trainer_pretrained.py); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from _util import TESTS, metrics_rows, save_tiny_chat_model, without_timing

from rwcore.trainer import cli
from rwcore.trainer.config import load_config, save_config
from rwcore.trainer.envs.negotiation import NegotiationEnv
from rwcore.trainer.lora import policy_with_adapters
from rwcore.trainer.trainer import Trainer

RANK, ALPHA = 4, 8.0
NAMED = [  # a short run of the tiny named model with rank-4 adapters
    "train.method=outcome_only",
    "env.options.num_train=10",
    "env.options.num_eval=2",
    "rollout.tasks_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "train.eval_every=0",
    "train.checkpoint_every=2",
    f"model.lora.rank={RANK}",
    f"model.lora.alpha={ALPHA}",
    "optim.lr=2e-2",
]
BUILT_IN = [  # the built-in model with adapters
    "model.init=random",
    "train.method=outcome_only",
    "env.options.num_train=10",
    "env.options.num_eval=2",
    "rollout.tasks_per_step=2",
    "rollout.group_size=4",
    "train.eval_every=0",
    "train.checkpoint_every=1",
    f"model.lora.rank={RANK}",
    f"model.lora.alpha={ALPHA}",
    "optim.lr=2e-2",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "model"
    save_tiny_chat_model(folder)
    return folder


@pytest.fixture
def one_thread():
    """In-process runs compared with subprocess runs (OMP_NUM_THREADS=1) use one thread too: float sums
    depend on how many threads split them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def named(model_folder: Path, *extra: str) -> list[str]:
    return [f"model.name={model_folder}", *NAMED, *extra]


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


# ---- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.lora.rank=-1", "model.lora.rank"),
        ("model.lora.rank=two", "model.lora.rank"),
        ("model.lora.alpha=0", "model.lora.alpha"),
        ("model.lora.alpha=1e308", "model.lora.alpha"),
        ("model.lora.alpha=inf", "model.lora.alpha"),
        ("model.lora.alpha=nan", "model.lora.alpha"),
        ("model.lora.rank=1000000000", "model.lora.rank"),
        ("model.lora.rank=65", "model.lora.rank"),  # above the built-in model's hidden size, 64
        ("model.lora.dropout=1.0", "model.lora.dropout"),
        ("model.lora.dropout=-0.1", "model.lora.dropout"),
        ("model.lora.target_modules=[]", "model.lora.target_modules"),
        ("model.lora.target_modules=q_proj", "model.lora.target_modules"),
        ("model.lora.target_modules=[q_proj, '']", "model.lora.target_modules"),
        ("model.lora.target_modules=[q_proj, q_proj]", "model.lora.target_modules"),
        ("model.lora.ranks=4", "model.lora.ranks"),
        ("model.lora=4", "model.lora"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_key(override, key):
    with pytest.raises(ValueError, match=f"'{key}'") as caught:
        load_config(None, [override])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("override", ["model.lora.rank=1000000000", "model.lora.alpha=1e308"])
def test_an_unusable_lora_value_is_one_line_before_anything_is_written(tmp_path, capsys, override):
    from rwcore.trainer.cli import main

    out = tmp_path / "run"
    assert main(["train", "--out", str(out), override]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rw: error:") and override.split("=")[0] in lines[0]
    assert not out.exists()


def test_lora_settings_load_from_a_file_and_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  lora:\n    rank: 8\n    alpha: 32\n    target_modules: [q_proj, v_proj]\n")
    cfg = load_config(path, ["model.lora.dropout=0.05"])
    assert (cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.dropout) == (8, 32.0, 0.05)
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert load_config(None).model.lora.rank == 0  # off by default
    assert load_config(None).model.lora.target_modules == "all-linear"
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg
    with pytest.raises(ValueError, match="unknown config key 'model.lora.rnk'.*rank, alpha, dropout, target_modules"):
        load_config(path, ["model.lora.rnk=3"])


def test_the_lm_head_and_unknown_modules_are_refused_naming_target_modules(model_folder):
    env = NegotiationEnv(num_train=4, num_eval=2)
    for targets in ("[lm_head]", "[embed_tokens]", "[no_such_layer]"):
        cfg = load_config(
            None, [f"model.name={model_folder}", "model.lora.rank=4", f"model.lora.target_modules={targets}"]
        )
        with pytest.raises(ValueError, match="model.lora.target_modules"):
            policy_with_adapters(cfg, env, torch.device("cpu"))


# ---- what trains, what the loss reads, the merged weights -------------------------------------------


@pytest.fixture(scope="module")
def trained(model_folder, tmp_path_factory):
    """(trainer after 2 steps, the initial state dict): the tiny named model with rank-4 adapters."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    trainer = Trainer(load_config(None, named(model_folder, "train.steps=2")), tmp_path_factory.mktemp("t") / "run")
    trainer.quiet = True
    trainer.setup()
    initial = {name: tensor.detach().clone() for name, tensor in trainer.policy.model.state_dict().items()}
    trainer.train()
    yield trainer, initial
    trainer.cleanup()
    torch.set_num_threads(threads)


def test_only_adapter_parameters_train_and_every_base_tensor_stays_bit_exact(trained):
    from rwcore.trainer.lora import trainable_parameters

    trainer, initial = trained
    model = trainer.policy.model
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter(name) for name in trainable)
    assert {id(p) for p in trainable_parameters(model)} == {
        id(p) for n, p in model.named_parameters() if n in trainable
    }
    optimized = [p for group in trainer.engine.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in trainable_parameters(model)}
    after = model.state_dict()
    base = [name for name in after if not is_adapter(name)]
    assert len(base) > 5
    for name in base:
        assert torch.equal(after[name], initial[name]), name  # bit-exact
    changed = [name for name in after if is_adapter(name) and not torch.equal(after[name], initial[name])]
    assert any(".lora_B." in name for name in changed)  # B starts at zero: the adapters did learn


def test_the_update_never_calls_the_lm_head_and_the_loss_falls_on_a_fixed_batch(model_folder, tmp_path, one_thread):
    """Repeated LoRA updates on one batch with fixed advantages (+1 for half the rollouts, -1 for the others)
    lower the objective the trainer optimizes; the LM head module is never called (the fused loss reads its
    weight). Checked on seeds 0-4 with one margin."""
    falls = []
    for seed in range(5):
        trainer = Trainer(
            load_config(None, named(model_folder, f"train.seed={seed}", "optim.grad_clip=0")), tmp_path / f"s{seed}"
        )
        trainer.quiet = True
        trainer.setup()
        rollouts, _ = trainer._rollout(trainer.method.sample(0), seed, "fixed", trainer.env.system_prompt)
        advantages = torch.tensor([1.0, -1.0]).repeat(len(rollouts) // 2).numpy()
        calls = []
        hook = trainer.policy.head.register_forward_hook(lambda *_: calls.append(1))
        losses = [trainer._update_policy(rollouts, advantages)["loss"] for _ in range(8)]
        hook.remove()
        trainer.cleanup()
        assert not calls  # no [T, V] logits from the head module
        falls.append(losses[0] - losses[-1])
    assert min(falls) > 0.1, falls  # seeds 0-4 fall by 0.14 to 0.30 (from about 0)


def test_merged_weights_are_w_plus_scale_b_a_and_leave_the_training_model_alone(trained, model_folder):
    import peft
    from transformers import AutoModelForCausalLM

    from rwcore.trainer.lora import merged_state_dict, peft_model

    trainer, _ = trained
    model = trainer.policy.model
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    merged = merged_state_dict(model)
    plain = AutoModelForCausalLM.from_pretrained(model_folder)
    assert set(merged) == set(plain.state_dict())  # the base model's own names
    scale = ALPHA / RANK
    modules = dict(model.named_modules())
    adapted = [name for name, module in modules.items() if hasattr(module, "lora_A") and hasattr(module, "base_layer")]
    assert len(adapted) == 7  # all-linear: q, k, v, o, gate, up, down of the one layer
    for name in adapted:
        state = {k: v for k, v in before.items() if k.startswith(name + ".")}
        w = state[f"{name}.base_layer.weight"]
        a, b = state[f"{name}.lora_A.default.weight"], state[f"{name}.lora_B.default.weight"]
        assert torch.allclose(merged[f"{name}.weight"], w + scale * (b @ a), rtol=1e-6, atol=1e-7), name
        assert not torch.equal(merged[f"{name}.weight"], w)
    for name, tensor in merged.items():
        if not any(name == f"{m}.weight" for m in adapted):
            assert torch.equal(tensor, plain.state_dict()[name]), name  # the untouched base weights
    after = model.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)  # the training model is unchanged
    assert not any(getattr(m, "merged", False) for m in model.modules())
    # peft's own merge of the same adapters gives the same weights and the same outputs
    wrapper = peft_model(model)
    assert isinstance(wrapper, peft.PeftModel)
    copy = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(model_folder), wrapper.peft_config["default"])
    copy.load_state_dict(wrapper.state_dict())
    theirs = copy.merge_and_unload().state_dict()
    assert all(torch.allclose(merged[name], theirs[name], rtol=1e-6, atol=1e-7) for name in theirs)
    plain.load_state_dict(merged)
    ids = torch.tensor([[3, 9, 12, 20, 7, 5]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)


def test_on_a_bf16_base_the_merged_weights_are_peft_merge_and_unload_bit_for_bit():
    import copy

    from rwcore.trainer.lora import merged_state_dict, peft_model, wrap
    from rwcore.trainer.policy import build_model

    model = wrap(
        build_model(60, 32, 1, 2, 64, 64, seed=0).to(torch.bfloat16),
        load_config(None, ["model.lora.rank=4"]).model.lora,
    )
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert adapters and {p.dtype for p in adapters} == {torch.float32}  # peft keeps fp32 adapters on a bf16 base
    with torch.no_grad():
        for parameter in adapters:
            parameter.normal_(0.0, 0.3)
    ours = merged_state_dict(model)
    theirs = copy.deepcopy(peft_model(model)).merge_and_unload().state_dict()
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == torch.bfloat16 and torch.equal(ours[k], theirs[k]) for k in theirs)


# ---- checkpoints ------------------------------------------------------------------------------------


def test_a_named_lora_checkpoint_holds_the_adapter_and_rw_eval_loads_it(trained):
    trainer, _ = trained
    folder = trainer.out / "checkpoints" / "step_000002"
    saved = torch.load(folder / "model.pt", weights_only=True)
    assert saved and all(is_adapter(name) for name in saved)  # the base comes from model.name
    assert set(saved) == {n for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    evaluated = Trainer.from_checkpoint(trainer.out)
    ours, theirs = trainer.policy.model.state_dict(), evaluated.policy.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    evaluated.cleanup()


def test_resume_against_another_base_is_refused_naming_model_name(model_folder, tmp_path, one_thread):
    import shutil

    base = tmp_path / "model"
    shutil.copytree(model_folder, base)
    out = tmp_path / "run"
    assert cli.main(["train", "--out", str(out), "--quiet", *named(base, "train.steps=2")]) == 0
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3  # one weight of the base differs
    other.save_pretrained(base)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    trainer = Trainer.resume(out, quiet=True)
    with pytest.raises(ValueError, match="model.name") as caught:
        trainer.setup()
    assert "base" in str(caught.value)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing changed


def _wait_for_row(run: Path, step: int, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        path = run / "metrics.jsonl"
        if path.exists() and any(r.get("kind") == "train" and r["step"] >= step for r in _complete_rows(path)):
            return
        if process.poll() is not None:
            raise AssertionError(f"rw train ended ({process.returncode}) before step {step}")
        if time.monotonic() > deadline:
            raise AssertionError(f"step {step} was not logged within {timeout} s")
        time.sleep(0.05)


def _complete_rows(path: Path) -> list[dict]:
    text = path.read_text()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]  # the last line may be torn


def test_kill_minus_nine_then_resume_reproduces_the_uninterrupted_metrics(model_folder, tmp_path, one_thread):
    overrides = named(model_folder, "train.steps=6")
    assert cli.main(["train", "--out", str(tmp_path / "straight"), "--quiet", *overrides]) == 0
    cut = tmp_path / "cut"
    process = subprocess.Popen(
        [sys.executable, "-m", "rwcore.trainer", "train", "--quiet", "--out", str(cut), *overrides],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_row(cut, 3, process)  # past the step-2 checkpoint, mid-run
        assert process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    steps = [r["step"] for r in metrics_rows(cut) if r["kind"] == "train"]
    assert steps and steps[-1] < 6  # it was stopped before the end
    assert cli.main(["train", "--resume", str(cut), "--quiet"]) == 0
    assert without_timing(metrics_rows(cut)) == without_timing(metrics_rows(tmp_path / "straight"))


# ---- the built-in model, the asynchronous rollout process, DeepSpeed, vLLM ------------------------


def test_the_built_in_model_trains_adapters_and_its_checkpoint_restores_base_and_adapter(tmp_path, one_thread):
    trainer = Trainer(load_config(None, [*BUILT_IN, "train.steps=1"]), tmp_path / "run", quiet=True)
    trainer.setup()
    initial = {name: tensor.clone() for name, tensor in trainer.policy.model.state_dict().items()}
    trainer.train()
    after = trainer.policy.model.state_dict()
    assert all(torch.equal(after[n], initial[n]) for n in after if not is_adapter(n))
    assert any(not torch.equal(after[n], initial[n]) for n in after if ".lora_B." in n)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step_000001" / "model.pt", weights_only=True)
    assert set(saved) == set(after)  # no model.name to rebuild the base from: base and adapter
    evaluated = Trainer.from_checkpoint(tmp_path / "run")
    assert all(torch.equal(evaluated.policy.model.state_dict()[n], t) for n, t in after.items())
    evaluated.cleanup()
    trainer.cleanup()


@pytest.mark.parametrize("key,value", [("alpha", ALPHA * 8), ("dropout", 0.1), ("target_modules", ["q_proj"])])
def test_adapters_trained_with_other_lora_settings_than_config_yaml_are_refused_everywhere(
    tmp_path, capsys, key, value
):
    """config.yaml edited after training (alpha 8 -> 64, a dropout, other modules): rw train --resume, rw eval and
    rw export each refuse in one line naming the key, instead of merging or training adapters at values they
    were not trained with."""
    run = tmp_path / "run"
    assert cli.main(["train", "--out", str(run), "--quiet", *BUILT_IN, "train.steps=1"]) == 0
    config = run / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    saved["model"]["lora"][key] = value
    config.write_text(yaml.safe_dump(saved, sort_keys=False))
    assert load_config(config).model.lora != load_config(None, list(BUILT_IN)).model.lora  # the edit took
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    for argv in (
        ["train", "--resume", str(run), "--quiet"],
        ["eval", str(run), "--tasks", "1"],
        ["export", str(run), "--out", str(tmp_path / "exported")],
    ):
        assert cli.main(argv) != 0, argv
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"model.lora.{key}=" in lines[0] and "trained with" in lines[0], (argv, lines)
    assert not (tmp_path / "exported").exists()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before


def test_the_rollout_process_samples_from_the_merged_weights(tmp_path):
    """rollout.max_lag: the rollout process holds a plain model and gets the merged weights; its behavior
    log-probs equal the training (LoRA) model's own scoring of the same tokens."""
    from rwcore.trainer.rollout import score_behavior

    trainer = Trainer(
        load_config(None, [*BUILT_IN, "train.steps=2", "rollout.max_lag=1", "rollout.action_words=off"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    try:
        with torch.no_grad():  # adapters far from zero, so that merged and base weights differ a lot
            generator = torch.Generator().manual_seed(0)
            for _name, parameter in trainer.policy.model.named_parameters():
                if parameter.requires_grad:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
        trainer._sync_generator()
        trainer._request_rollouts(0)
        _, rollouts = trainer.rollouts_ahead.take(0)
        engine = [r.behavior_logprobs.clone() for r in rollouts]
        score_behavior(trainer.policy, rollouts, trainer.config.rollout.temperature, "torch")
        gap = max(float((a - r.behavior_logprobs).abs().max()) for a, r in zip(engine, rollouts))
        assert gap < 1e-4, gap
        for module in trainer.policy.model.modules():  # the base alone would not explain the engine's log-probs
            if hasattr(module, "lora_A") and hasattr(module, "enable_adapters"):
                module.enable_adapters(False)
        score_behavior(trainer.policy, rollouts, trainer.config.rollout.temperature, "torch")
        base_gap = max(float((a - r.behavior_logprobs).abs().max()) for a, r in zip(engine, rollouts))
        assert base_gap > 1e-2, base_gap
    finally:
        trainer.cleanup()


DEEPSPEED_RUN = """
import json, sys, torch
import rwcore
from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer
trainer = Trainer(load_config(None, sys.argv[2:]), sys.argv[1], quiet=True)
trainer.setup()
initial = {n: t.clone() for n, t in trainer.policy.model.state_dict().items()}
trainer.train()
after = trainer.policy.model.state_dict()
adapter = lambda n: ".lora_A." in n or ".lora_B." in n
print(json.dumps({
    "engine": trainer.engine.name,
    "base_equal": all(torch.equal(after[n], initial[n]) for n in after if not adapter(n)),
    "adapters_moved": sum(not torch.equal(after[n], initial[n]) for n in after if adapter(n)),
    "trainable": sorted(n for n, p in trainer.policy.model.named_parameters() if p.requires_grad),
    "rows": [r for r in map(json.loads, open(trainer.out / "metrics.jsonl")) if r["kind"] == "train"],
}))
trainer.cleanup()
"""


def test_deepspeed_zero_trains_only_the_adapters(model_folder, tmp_path):
    out = tmp_path / "ds"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            DEEPSPEED_RUN,
            str(out),
            *named(model_folder, "train.steps=2", "train.engine=deepspeed", "train.zero_stage=2"),
        ],
        env={k: v for k, v in ENV.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["engine"] == "deepspeed" and result["base_equal"] and result["adapters_moved"] > 0
    assert result["trainable"] and all(is_adapter(name) for name in result["trainable"])
    assert [row["step"] for row in result["rows"]] == [1, 2]
    checkpoint = out / "checkpoints" / "step_000002"
    saved = torch.load(checkpoint / "model.pt", weights_only=True)
    assert set(saved) == set(result["trainable"])
    # DeepSpeed's own module file leaves the frozen base out as well
    module = torch.load(next((checkpoint / "deepspeed").glob("*model_states.pt")), weights_only=False)["module"]
    assert module and all(is_adapter(name) for name in module)


def test_vllm_gets_the_merged_weights_after_every_lora_update(tmp_path):
    from test_vllm_real import SMALL, run

    result = run(
        str(TESTS / "scripts" / "vllm_check.py"),
        "train",
        str(tmp_path / "run"),
        "2",
        *SMALL,
        "train.method=outcome_only",
        f"model.lora.rank={RANK}",
        f"model.lora.alpha={ALPHA}",
        "optim.lr=3e-2",
    )
    assert result["synced"] == 2 and len(result["gaps"]) == 3
    assert max(result["gaps"]) < 1e-3, result["gaps"]
    assert result["moved"] > 1e-3  # the adapters moved the model, so agreement is not trivial
