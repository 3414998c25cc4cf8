"""The trainer releases each integration is tested with, and the one warning a process gets outside them.

The ranges here are the ones `pyproject.toml` declares (extra `integrations`) and CI tests at both ends
(tests/rwcore/integrations/test_integration_versions.py runs the TRL and verl tests on the lowest release too); a
release outside them may work, but nothing here has checked it. verifiers is not a pip extra
(scripts/setup.sh installs it
`--no-deps` when RWCORE_EXTRAS names `verifiers`); its one tested release is 0.4.0 (the `verifiers.v1` API).
"""

from __future__ import annotations

import warnings

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# trainer -> (specifier, lowest tested release, highest tested release)
TESTED = {
    "trl": (">=1.0,<1.17", "1.0.0", "1.16.0"),
    "verl": (">=0.8.0,<0.10", "0.8.0", "0.9.1"),
    "openrlhf": (">=0.11.2,<0.12", "0.11.2", "0.11.2"),
    "verifiers": (">=0.4.0,<0.5", "0.4.0", "0.4.0"),
}

_warned: set[str] = set()


def check_version(trainer: str, version: str) -> bool:
    """True when `version` of `trainer` is inside its tested range; otherwise warns (once per process and trainer).

    Raises:
        KeyError: `trainer` is not one of TESTED's names.
    """
    specifier, low, high = TESTED[trainer]
    try:
        inside = Version(str(version)) in SpecifierSet(specifier)
    except InvalidVersion:
        inside = False
    if not inside and trainer not in _warned:
        _warned.add(trainer)
        warnings.warn(
            f"rwcore.integrations.{trainer} is tested with {trainer}{specifier} (releases {low} to {high}); "
            f"found {trainer} {version}. It may work, but this release is untested.",
            UserWarning,
            stacklevel=3,
        )
    return inside
