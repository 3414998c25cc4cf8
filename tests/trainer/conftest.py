"""Fixtures of the trainer's tests."""

import pytest


class _NoTrainer:
    """Fails the test if the CLI gets as far as building a trainer."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("a trainer was built although the command should have been refused before it")


@pytest.fixture
def no_trainer(monkeypatch):
    """`rw train` (through the real CLI) fails the test if it builds a trainer: for refusals that must come first."""
    from rwcore.trainer.cli import training  # imported when a test asks: the trainer's tests need not all load the CLI

    monkeypatch.setattr(training, "_trainer_class", lambda: _NoTrainer)
