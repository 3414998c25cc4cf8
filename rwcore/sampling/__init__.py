"""Task sampling: the sampler registry, the ablations' baseline samplers, and a torch batch sampler.

- `register_sampler`, `build_sampler`, `sampler_names`: the registry (`registry`); "capability" is
  Arise's sampler (`rwcore.arise.sampler.CapabilitySampler`), "outcome" and "uniform" the baselines.
- `UniformSampler`, `OutcomeSampler` (`baselines`); `AdaptiveBatchSampler` (`batch`): any sampler as a
  `torch.utils.data` batch sampler (`rwcore.tasks` holds the task set and checks every sampler shares);
  `demo`: `python -m rwcore.sampling.demo`, a simulated run showing where the sampling mass goes.

`rwcore.sampling` was a module holding `CapabilitySampler` before; that name still resolves here, with a
DeprecationWarning (import it from `rwcore.arise` or `rwcore`).
"""

from rwcore.sampling.registry import SamplerEntry, build_sampler, register_sampler, sampler_names

__all__ = ["SamplerEntry", "build_sampler", "register_sampler", "sampler_names"]


def __getattr__(name: str):
    if name == "CapabilitySampler":
        from rwcore._deprecated import warn_moved
        from rwcore.arise.sampler import CapabilitySampler

        warn_moved("rwcore.sampling.CapabilitySampler", "rwcore.arise.sampler.CapabilitySampler")
        return CapabilitySampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
