"""The thin trainer, environments, rollout engines and the `rw` CLI (rwcore.trainer).

Filled in by the trainer work; it depends on rwcore, never the other way round.
"""
