"""rwcore inside OpenRLHF: the filtered dual-clip loss as a drop-in for `openrlhf.models.loss.PolicyLoss`.

One module per job: `loss` (`RwcorePolicyLoss`). Nothing here imports OpenRLHF; the tests run the
class through OpenRLHF's real `PolicyLoss` module (see tests/test_integration_openrlhf.py).
"""

from .loss import TESTED_OPENRLHF_VERSION, RwcorePolicyLoss

__all__ = ["TESTED_OPENRLHF_VERSION", "RwcorePolicyLoss"]
