"""rwcore inside OpenRLHF: the filtered dual-clip loss as a drop-in for `openrlhf.models.loss.PolicyLoss`.

One module per job: `loss` (`RwcorePolicyLoss`, with OpenRLHF's vLLM-mismatch correction -- every
is_correction level / mode / gating OpenRLHF accepts, OpenRLHF's arithmetic -- passed to the fused loss
as per-token weights; `openrlhf_is_correction` computes those weights). Nothing here imports OpenRLHF;
the tests run the class against OpenRLHF's real `PolicyLoss` module
(tests/rwcore/integrations/test_integration_openrlhf.py, tests/rwcore/integrations/test_rollout_correction_openrlhf.py).

Only the loss: OpenRLHF computes the advantages itself, so its own advantage and entropy keys
(`--algo.advantage.estimator`, `--algo.advantage.no_std_norm`, `--actor.entropy_coef`) apply unchanged, and
rwcore's credit settings (advantage.scale_rewards, aggregation, process_gate) do not act there.
"""

from .loss import TESTED_OPENRLHF_VERSION, RwcorePolicyLoss, openrlhf_is_correction

__all__ = ["TESTED_OPENRLHF_VERSION", "RwcorePolicyLoss", "openrlhf_is_correction"]
