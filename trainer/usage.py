"""`LLMUsage`: what the LLM roles of a run (the judge, the reflection model) cost, row by row.

Each client counts its requests as they happen (`rwcore.judges.client.Usage`); every metrics row reports what
happened since the previous row, so the rows partition the run's requests (the first row also holds library
admission and the first diagnosis, which happen before it). With judge.price_in / judge.price_out the cost of
those requests and the run's total so far come with them; the totals go into checkpoints, so a resumed run
keeps counting. The row's keys are formed by rwcore.trainer.metrics (`<role>/requests`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rwcore.judges.client import USAGE_FIELDS, usage_cost


class LLMUsage:
    """The clients of `owners` (role -> the object whose `client` counts its requests; roles without an LLM
    client are left out) and the money each role has cost so far (`totals`, with prices set)."""

    def __init__(self, owners: Mapping[str, object]) -> None:
        self.clients = {
            role: client
            for role, owner in owners.items()
            if (client := getattr(owner, "client", None)) is not None and hasattr(client, "usage")
        }
        self.totals = {role: 0.0 for role in self.clients}  # money so far (judge/cost_total)
        # rows partition the usage: each row reports what happened since the previous one (the first: since the
        # clients were made, so library admission and the first diagnosis count too)
        self._marks: dict[str, dict] = {role: {} for role in self.clients}

    def __bool__(self) -> bool:
        return bool(self.clients)

    def since_last_row(
        self, gathered: Callable[[list], list], price_in: float, price_out: float
    ) -> dict[str, dict[str, float]]:
        """role -> what it cost since the previous call, summed over the processes (`gathered`: every rank's
        items in rank order): the integer counts of `USAGE_FIELDS`, `seconds` as a float, and with a price set
        `cost` and `cost_total`. Collective: every process calls it at the same points."""
        marks = {role: client.usage.snapshot() for role, client in self.clients.items()}
        mine = {
            role: {name: marks[role][name] - self._marks[role].get(name, 0) for name in USAGE_FIELDS}
            for role in self.clients
        }
        self._marks = marks
        parts = gathered([mine])
        figures = {}
        for role in self.clients:
            total = {name: sum(part[role][name] for part in parts) for name in USAGE_FIELDS}
            figures[role] = {name: total[name] if name == "seconds" else int(total[name]) for name in USAGE_FIELDS}
            if price_in or price_out:
                cost = usage_cost(total, price_in, price_out)
                self.totals[role] += cost
                figures[role]["cost"] = cost
                figures[role]["cost_total"] = self.totals[role]
        return figures

    def state_dict(self) -> dict[str, float]:
        """The money each role has cost so far (a checkpoint's `usage_totals`)."""
        return dict(self.totals)

    def load_state_dict(self, state: Mapping[str, float] | None) -> None:
        """Totals from a checkpoint; roles this run has no client for are ignored."""
        self.totals.update({k: float(v) for k, v in (state or {}).items() if k in self.totals})
