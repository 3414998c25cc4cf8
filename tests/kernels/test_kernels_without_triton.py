"""rwcore.kernels imports and runs its PyTorch backend where Triton is not installed."""

import subprocess
import sys
import textwrap


def test_kernels_work_without_triton_and_name_what_is_missing():
    script = textwrap.dedent(
        """
        import sys

        class BlockTriton:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("triton is not installed here")

        sys.meta_path.insert(0, BlockTriton())
        import torch
        from rwcore.kernels import token_logprobs
        from rwcore.kernels._backend import HAS_TRITON

        assert not HAS_TRITON
        logits = torch.tensor([[0.0, 1.0, 2.0]], requires_grad=True)
        logp = token_logprobs(logits, torch.tensor([2]), backend="auto")
        expected = 2.0 - torch.logsumexp(torch.tensor([0.0, 1.0, 2.0]), 0)
        assert abs(float(logp) - float(expected)) < 1e-6
        try:
            token_logprobs(logits, torch.tensor([2]), backend="triton")
        except ValueError as error:
            assert "pip install triton" in str(error)
        else:
            raise AssertionError("backend='triton' without triton must fail")
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
