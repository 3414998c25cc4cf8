"""Importing TRL: a clear message when it is missing, one warning when its release is outside the tested range."""

from __future__ import annotations

from rwcore.integrations.versions import TESTED, check_version

TRL_RANGE = TESTED["trl"][0]


def require_trl():
    """(trl, transformers) modules, or ImportError saying what to install; warns once outside `TRL_RANGE`."""
    try:
        import transformers
        import trl
    except ImportError as error:
        raise ImportError(
            f"rwcore.integrations.trl needs TRL (and transformers): pip install trl "
            f"(tested range: trl{TRL_RANGE}). Import error: {error}"
        ) from error
    check_version("trl", trl.__version__)
    return trl, transformers
