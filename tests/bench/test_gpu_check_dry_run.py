"""bench/gpu_check.sh --dry-run: the prepared device script runs end to end on a CPU, every step invoked with
tiny shapes and every GPU-only part reported as skipped with its reason (no CUDA machine has been lent yet;
this keeps the script working until one is)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile

from _util import ROOT

STEPS = [
    "environment",
    "install",
    "flash_attn",
    "compile",
    "kernels",
    "benchmark",
    "model",
    "train",
    "train_vllm",
    "export",
]
# What the device tool returns from $OUT: at most 8 files, at most two folders down, plain names.
DEVICE_FILES, DEVICE_NAME = 8, re.compile(r"^[A-Za-z0-9._-]+$")


def test_gpu_check_dry_run_end_to_end(tmp_path):
    out = tmp_path / "gpu-check"
    # As a user runs it: not under the test suite's TRITON_INTERPRET (the script sets it where it needs it).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    device_out = tmp_path / "device-out"  # as the device tool sets OUT: the export step copies the results there
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RWCORE_PYTHON=sys.executable, OUT=str(device_out))
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert [s[0] for s in steps] == STEPS
    status = {s[0]: (s[1], s[3]) for s in steps}
    assert status["install"] == ("skipped", f"dry run: uses the existing environment ({sys.executable})")
    assert status["flash_attn"][0] == "skipped" and "CUDA" in status["flash_attn"][1]
    for name in ("compile", "kernels", "benchmark", "model", "train"):
        assert status[name][0] == "ok", (name, status[name], (out / "logs" / f"{name}.log").read_text()[-2000:])
    assert "rollout.engine=hf" in status["train"][1]  # the dry run says what it replaced
    assert status["train_vllm"][0] == "skipped" and "GPU_CHECK_DRY_VLLM=1" in status["train_vllm"][1]
    assert status["export"][0] == "ok"

    kernel_check = json.loads((out / "kernel-check.json").read_text())
    assert kernel_check["failed"] == 0 and len(kernel_check["checks"]) == 5
    assert all(c["status"] == "passed" for c in kernel_check["checks"])

    bench = json.loads((out / "kernels-cuda.json").read_text())
    logits = bench["logits"][0]
    assert logits["rwcore"]["seconds"] > 0 and logits["eager"]["seconds"] > 0
    for peer in ("liger_triton", "flash_attn_ce", "compile"):
        assert "CUDA" in logits[peer]["skipped"]  # GPU-only peers: skipped, with the reason
    assert "skipped" in bench["launch_configs"]

    metrics = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("step") == 1 for m in metrics)
    assert (out / "model" / "config.json").is_file()
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "qwen2"

    summary = (out / "summary.md").read_text()
    assert "dry run on a CPU" in summary
    for name in STEPS:
        assert f"| {name} |" in summary
    assert "token_logprobs bf16: passed" in summary

    # The export under $OUT fits what the device tool brings back, and holds the run without the weights.
    exported = sorted(p for p in device_out.rglob("*") if p.is_file())
    assert len(exported) <= DEVICE_FILES, exported
    for path in exported:
        parts = path.relative_to(device_out).parts
        assert len(parts) <= 3 and all(DEVICE_NAME.match(part) for part in parts), path
    assert {p.name for p in exported} == {
        "summary.md",
        "steps.tsv",
        "kernel-check.json",
        "kernels-cuda.json",
        "results.tar.gz",
    }
    assert (device_out / "gpu-check" / "summary.md").read_text() == summary
    with tarfile.open(device_out / "gpu-check" / "results.tar.gz") as archive:
        names = archive.getnames()
    for member in (
        "gpu-check/logs/train.log",
        "gpu-check/train/metrics.jsonl",
        "gpu-check/model/config.json",
        "gpu-check/kernels-cuda.json",
        "gpu-check/versions.txt",
    ):
        assert member in names, (member, names)
    assert not [n for n in names if n.endswith((".safetensors", ".bin", ".pt")) or "/checkpoints" in n]
