"""Shared pytest configuration for the rwcore test-suite."""

import os
import sys

# Helper modules (reference_sampler, stats_util) live beside the tests; make
# them importable whatever pytest import mode is configured.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
