"""Training engines: DeepSpeed ZeRO (on the CPU through DeepSpeed's CPU accelerator and gloo) against
plain PyTorch.

- a two-process ZeRO update on each rank's share of a batch equals a one-process AdamW update on the
  whole batch (stages 0, 1, 2; micro-batches; clipping);
- `rw train train.engine=deepspeed` on one process logs the same metrics as train.engine=torch;
- on two processes (torchrun): rank 0 alone writes the run folder, every rank ends with the same
  model, sampler, pool and RewardWeaver state, and a run killed after an uncheckpointed step and
  resumed logs exactly what the uninterrupted run logs;
- bad engine settings fail with the setting named.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _util import SMALL_RUN, TESTS, free_port, metrics_rows, normalize, overrides_with, rw_command, without_timing

from rwcore.trainer.config import load_config
from rwcore.trainer.engines import deepspeed_config
from rwcore.trainer.trainer import Trainer

SMALL = overrides_with(SMALL_RUN, "rollout.tasks_per_step=5", "train.steps=4", "optim.minibatches=2")


def _environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS / "scripts"), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def torchrun(*args: str, processes: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *args,
    ]
    done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_two_process_zero_update_equals_one_process_update_on_the_whole_batch(tmp_path):
    out = tmp_path / "result"
    torchrun(str(TESTS / "scripts" / "engine_worker.py"), str(out), "0,1,2", "2")
    results = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["world"] == 2
        for stage, run in result["stages"].items():
            assert run["moved"] > 1e-2, stage  # the comparison is not between two untouched models
            assert run["difference"] < 1e-6, (stage, run["difference"])
            assert run["clipped"], stage  # the clip was active in some step: its scale is compared too
            np.testing.assert_allclose(run["norms"], run["reference_norms"], rtol=1e-5)
    for stage in results[0]["stages"]:
        assert results[0]["stages"][stage]["params"] == results[1]["stages"][stage]["params"]


def test_one_process_deepspeed_run_logs_what_the_torch_engine_logs(tmp_path):
    for engine in ("torch", "deepspeed"):
        done = subprocess.run(
            rw_command("train", "--quiet", "--out", str(tmp_path / engine), *SMALL, f"train.engine={engine}"),
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    torch_rows, deepspeed_rows = metrics_rows(tmp_path / "torch"), metrics_rows(tmp_path / "deepspeed")
    assert len(torch_rows) == len(deepspeed_rows) == 4 + 3 + 1  # + the starting policy's exploration row
    for ours, theirs in zip(torch_rows, deepspeed_rows):
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            if key.startswith("time/"):
                continue
            if isinstance(value, float):
                assert theirs[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (ours["step"], key)
            else:
                assert theirs[key] == value, (ours["step"], key)
    checkpoint = tmp_path / "deepspeed" / "checkpoints" / "step_000004"
    assert (checkpoint / "deepspeed").is_dir() and (checkpoint / "model.pt").is_file()
    # rw eval reads a DeepSpeed checkpoint without DeepSpeed (its consolidated model.pt)
    metrics = Trainer.evaluate_checkpoint(tmp_path / "deepspeed")
    assert metrics["eval/success_rate"] == deepspeed_rows[-1]["eval/success_rate"]


def test_two_processes_share_one_state_write_once_and_resume_exactly(tmp_path):
    overrides = [*SMALL, "train.engine=deepspeed", "train.method=combined"]
    worker = str(TESTS / "scripts" / "dp_worker.py")
    torchrun(worker, "straight", str(tmp_path / "straight"), *overrides)
    torchrun(worker, "cut", str(tmp_path / "cut"), *overrides)
    torchrun(worker, "resume", str(tmp_path / "cut"))

    straight = metrics_rows(tmp_path / "straight")
    assert [r["step"] for r in straight if r["kind"] == "train"] == [1, 2, 3, 4]  # written once, by rank 0
    assert [r["step"] for r in straight if r["kind"] == "eval"] == [0, 2, 4]
    assert all(r["eval/episodes"] == 8 for r in straight if r["kind"] == "eval")  # both ranks' halves
    assert without_timing(metrics_rows(tmp_path / "cut")) == without_timing(straight)

    states = {
        (name, rank): pickle.loads((tmp_path / name / f"state.{rank}.pkl").read_bytes())
        for name in ("straight", "cut")
        for rank in (0, 1)
    }
    reference = normalize(states["straight", 0])
    assert states["straight", 0]["step"] == 4 and states["straight", 0]["pool"] is not None
    for key, state in states.items():
        assert normalize(state) == reference, key
    checkpoint = tmp_path / "straight" / "checkpoints" / "step_000004"
    assert (checkpoint / "rng_rank1.pt").is_file() and (checkpoint / "state.pt").is_file()
    assert not list((tmp_path / "straight" / "checkpoints").glob(".*.tmp"))


def test_resume_with_another_number_of_processes_is_refused(tmp_path):
    torchrun(
        str(TESTS / "scripts" / "dp_worker.py"),
        "straight",
        str(tmp_path / "run"),
        *SMALL,
        "train.engine=deepspeed",
        "train.steps=2",
    )
    done = subprocess.run(
        [sys.executable, "-m", "rwcore.trainer", "train", "--resume", str(tmp_path / "run")],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    assert "2 process(es)" in done.stderr and "same number" in done.stderr


# ---------------------------------------------------------------------------------------------- bad settings


def test_zero_stage_3_is_refused_by_the_config():
    with pytest.raises(ValueError, match="train.zero_stage"):
        load_config(None, ["train.zero_stage=3"])
    with pytest.raises(ValueError, match="stage 3"):
        deepspeed_config(3, 1.0, 1, 1, "float32")


def test_deepspeed_config_file_is_merged_but_may_not_set_batch_sizes(tmp_path):
    extra = tmp_path / "ds.json"
    extra.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 1000}, "gradient_clipping": 0.5}))
    merged = deepspeed_config(2, 1.0, 3, 2, "bfloat16", str(extra))
    assert merged["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 1000}
    assert merged["gradient_clipping"] == 0.5 and merged["bf16"] == {"enabled": True}
    assert merged["gradient_accumulation_steps"] == 3 and merged["train_batch_size"] == 6
    extra.write_text(json.dumps({"train_batch_size": 64}))
    with pytest.raises(ValueError, match="train.deepspeed_config.*train_batch_size"):
        deepspeed_config(2, 1.0, 1, 1, "float32", str(extra))
    extra.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    with pytest.raises(ValueError, match="train.deepspeed_config.*stage=3"):
        deepspeed_config(2, 1.0, 1, 1, "float32", str(extra))
    extra.write_text("{not json")
    with pytest.raises(ValueError, match="train.deepspeed_config.*not valid JSON"):
        deepspeed_config(2, 1.0, 1, 1, "float32", str(extra))
    with pytest.raises(ValueError, match="train.deepspeed_config.*not a file"):
        deepspeed_config(2, 1.0, 1, 1, "float32", str(tmp_path / "missing.json"))


def test_batch_too_small_for_the_processes_or_micro_batches_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    trainer = Trainer(load_config(None, [*SMALL, "rollout.tasks_per_step=3", "train.engine=deepspeed"]), tmp_path / "a")
    with pytest.raises(ValueError, match=r"rollout.tasks_per_step=3 .* \(4\)"):
        trainer.setup()
    monkeypatch.delenv("WORLD_SIZE")
    trainer = Trainer(
        load_config(None, [*SMALL, "rollout.tasks_per_step=1", "rollout.group_size=2", "optim.minibatches=3"]),
        tmp_path / "b",
    )
    with pytest.raises(ValueError, match="optim.minibatches=3"):
        trainer.setup()
    assert not (tmp_path / "b").exists()  # nothing written before the check


def test_missing_deepspeed_is_a_clear_error_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed raises ImportError
    trainer = Trainer(load_config(None, [*SMALL, "train.engine=deepspeed"]), tmp_path / "run")
    with pytest.raises(ValueError, match=r"train.engine=deepspeed needs DeepSpeed.*pip install"):
        trainer.setup()
    assert not (tmp_path / "run").exists()
