"""bench/gpu_static.py (`rw bench --gpu-static`): the roofline arithmetic against hand-worked figures, and the
command end to end on a few real kernel variants (the full grid is the report's job, not the test's)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from _util import ROOT

from rwcore.kernels import _aot
from rwcore.trainer.cli import main


@pytest.fixture(scope="module")
def gpu_static():
    spec = importlib.util.spec_from_file_location("gpu_static_under_test", ROOT / "bench" / "gpu_static.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bounds_hand_worked(gpu_static):
    device = {"bandwidth": 1e12, "bf16": 1e15, "fp32": 1e14}
    phases = [
        gpu_static._phase("gemm", 1e9, 2e12),  # 2 ms of compute, 1 ms of memory: compute bound
        gpu_static._phase("pass", 3e9),  # 3 ms of memory
        gpu_static._phase("fp32 gemm", 0.0, 1e11, "fp32"),
    ]  # 1 ms at the fp32 rate
    result = gpu_static.bounds(phases, device, useful_flops=2e12)
    assert result["in_sequence_s"] == pytest.approx(2e-3 + 3e-3 + 1e-3)
    assert result["overlapped_s"] == pytest.approx(max(2e-3 + 1e-3, 4e-3))
    assert result["best_fraction"] == pytest.approx(2e-3 / 6e-3)
    assert [p["bound"] for p in result["phases"]] == ["compute", "memory", "compute"]


def test_rwcore_fused_model_follows_the_code(gpu_static):
    n, h, v = 32_768, 3584, 151_936
    phases, info = gpu_static.rwcore_fused_phases(n, h, v)
    # chunk_rows: ceil(N H / V) = ceil(772.9) = 773 rows, rounded up to a power of two: 1024, so 32 chunks.
    assert info == {"rows_per_chunk": 1024, "chunks": 32}
    assert sum(p["flops"] for p in phases) == 6 * n * h * v  # the three GEMMs, nothing recomputed
    by_name = {p["name"]: p for p in phases}
    assert by_name["d weight: fp32 accumulator += temporary"]["bytes"] == 32 * 12 * v * h  # read 4 + 4, write 4
    assert by_name["token_logprobs forward kernel (reads fp32 logits)"]["bytes"] == 4 * n * v + 16 * n


def test_liger_model_recomputes_logits_and_runs_two_gemms_in_fp32(gpu_static):
    n, h, v = 8192, 3584, 151_936
    phases, info = gpu_static.liger_chunked_phases(n, h, v)
    assert sum(p["flops"] for p in phases) == 8 * n * h * v
    assert sum(p["flops"] for p in phases if p["precision"] == "fp32") == 4 * n * h * v
    assert info["row_tiles"] == 2 * 2  # two sequences of 4,096 tokens, 2,048-row tiles


def test_rw_bench_gpu_static_end_to_end_on_a_few_variants(tmp_path, monkeypatch, capsys):
    every = _aot.variants

    def policy_loss_only(archs=_aot.ARCHS, full=True):
        return [v for v in every(archs, full=False) if v.kernel.startswith("policy_loss.")]

    monkeypatch.setattr(_aot, "variants", policy_loss_only)
    out = tmp_path / "static"
    assert main(["bench", "--gpu-static", "--out", str(out)]) == 0
    report = json.loads((out / "gpu-static.json").read_text())
    # 3 dtypes x 2 archs, each without and with the rollout correction's per-token weight
    assert report["variants"] == 12 and {r["arch"] for r in report["rows"]} == {80, 90}
    assert all(r["registers"] > 0 and r["kernel"] == "_policy_loss_fwd_kernel" for r in report["rows"])
    table = (out / "gpu-static.md").read_text()
    assert "| _policy_loss_fwd_kernel | sm_90 | bf16 | 1024 | 4 |" in table
    assert "| _policy_loss_fwd_kernel +correction weight | sm_90 | bf16 | 1024 | 4 |" in table
    roofline = (out / "roofline.md").read_text()
    assert "Liger chunked GRPO" in roofline and "32,768" in roofline
    assert json.loads((out / "roofline.json").read_text())["shapes"]["vocab"] == 151_936
    assert "wrote" in capsys.readouterr().out


def test_rw_bench_gpu_static_rejects_quick(capsys):
    assert main(["bench", "--gpu-static", "--quick"]) == 2
    assert "--gpu-static takes no --quick" in capsys.readouterr().err
