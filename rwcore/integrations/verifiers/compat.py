"""Importing verifiers: a clear message when it is missing, one warning when its release is outside the tested range."""

from __future__ import annotations

from rwcore.integrations.versions import TESTED, check_version

VERIFIERS_RANGE = TESTED["verifiers"][0]
INSTALL_HINT = "pip install 'verifiers==0.4.0' (or RWCORE_EXTRAS=...,verifiers bash scripts/setup.sh)"


def require_verifiers():
    """The `verifiers.v1` module, or ImportError saying what to install; warns once outside `VERIFIERS_RANGE`."""
    try:
        import verifiers
        import verifiers.v1 as vf
    except ImportError as error:
        raise ImportError(
            f"rwcore.integrations.verifiers needs verifiers (its v1 API): {INSTALL_HINT}; tested range: "
            f"verifiers{VERIFIERS_RANGE}. Import error: {error}"
        ) from error
    check_version("verifiers", getattr(verifiers, "__version__", "unknown"))
    return vf
