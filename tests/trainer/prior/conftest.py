"""Fixtures of the reading prior's tests."""

import pytest
from _util import prior_config

from rwcore.trainer import envs
from rwcore.trainer.prior import ensure_prior


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The override `prior.cache_dir=<folder>` of a folder that holds the TINY_PRIOR prior, built once per module."""
    folder = tmp_path_factory.mktemp("priors")
    ensure_prior(prior_config(folder), envs.make("negotiation"), progress=False, log=print)
    return f"prior.cache_dir={folder}"
