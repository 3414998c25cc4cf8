"""An `AdaptiveMethod`'s checkpoint state (`MethodState`, a base of `AdaptiveMethod`): everything an exact resume
needs, as plain types, and its restoration, which refuses a state of another variant or other settings."""

from __future__ import annotations

from collections.abc import Mapping

from rwcore.method.settings import CREDIT_SETTINGS, MethodSettings

__all__ = ["MethodState"]

_FORMAT = "rwcore.adaptive_method"
_VERSION = 1


class MethodState:
    """`state_dict` / `load_state_dict` of `AdaptiveMethod` (its sampler, pool, window, RewardWeaver state, open
    stages, instance rubrics, diagnostics and error counts)."""

    def state_dict(self) -> dict:
        """Everything an exact resume needs (JSON-serializable apart from nothing: plain types only)."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "variant": self.variant.name,
            "settings": self.settings.to_dict(),
            "sampler": self.sampler.state_dict(),
            "pool": self.pool.state_dict() if self.pool is not None else None,
            "window": self.window.state_dict() if self.window is not None else None,
            "weaver": self.weaver.state_dict() if self.weaver is not None else None,
            "open_stages": self._process.state_dict() if hasattr(self._process, "new_stage") else [],
            "instance_rubrics": self._process.state_dict() if hasattr(self._process, "set_contexts") else {},
            "diagnostic_scores": self.diagnostic_scores(),
            "reflection_errors": self._reflection_errors,
            "stage_errors": self._stage_errors,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()`; refuses another variant or other settings, naming them."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT or state.get("version") != _VERSION:
            raise ValueError(f"state must be a {_FORMAT!r} version {_VERSION} mapping")
        if state.get("variant") != self.variant.name:
            raise ValueError(
                f"train.method: the state was written by variant {state.get('variant')!r}, this method is "
                f"{self.variant.name!r}; resume with the variant the run started with"
            )
        saved, mine = dict(state.get("settings") or {}), self.settings.to_dict()
        for name in CREDIT_SETTINGS:  # written before these existed: the papers' rule, then the default
            saved.setdefault(name, getattr(MethodSettings(), name))
        # written before these existed, when the pool retired while shown and Select had only the paper's rule
        saved.setdefault("retire_while_shown", True)
        saved.setdefault("release_uninformative", False)
        if "rank_by" not in saved:  # written before rank_by existed, when attribution ranked by support
            saved["rank_by"] = "support" if self.variant.uses_library else mine["rank_by"]
        for key in mine:
            if saved.get(key) != mine[key]:
                hint = (
                    (
                        "; a state saved before rank_by existed ranked by support: resume it with rank_by='support' "
                        "(rw train: `rank_by: support` under `rewardweaver:` in the run's config.yaml)"
                    )
                    if key == "rank_by"
                    else ""
                )
                raise ValueError(
                    f"method setting {key!r}: the state has {saved.get(key)!r}, this method {mine[key]!r}{hint}"
                )
        for name, part in (("pool", self.pool), ("window", self.window), ("weaver", self.weaver)):
            if (state.get(name) is None) != (part is None):
                raise ValueError(f"state[{name!r}] does not match variant {self.variant.name!r}")
        self.sampler.load_state_dict(state["sampler"])
        if self.pool is not None:
            self.pool.load_state_dict(state["pool"])
        if self.window is not None:
            self.window.load_state_dict(state["window"])
        if self.weaver is not None:
            self.weaver.load_state_dict(state["weaver"])
        if hasattr(self._process, "new_stage"):
            self._process.load_state_dict(state["open_stages"])
        if hasattr(self._process, "set_contexts"):
            self._process.load_state_dict(state["instance_rubrics"])
        self._diagnostic_scores = [dict(p) for p in state["diagnostic_scores"]]
        self._reflection_errors = int(state["reflection_errors"])
        self._stage_errors = int(state["stage_errors"])
        self._sync_sampler()
