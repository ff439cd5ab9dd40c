"""A run's accounting: error classes, final outcomes, tokens, cost, and the budget stop.

One `Accounting` per run, realtime (client/engine.py) and batch (client/batch.py) alike: it
writes the run's `InferenceSummary` counts and keeps a `CostView` of what was paid. What one
answer costs is client/cost.py's.

Budget: the projected cost of one request is the mean cost of the answers paid so far, or, before
any, `max_tokens` x the completion price (in the run's mode). Realtime, a request may start while
spent + (in flight + 1) x projected stays within `budget_usd` (`allows`); batch mode submits as
many requests as spent + (requests in open batches + n) x projected allows (`affordable`).
"""

from __future__ import annotations

from typing import Any

from specregen.client.config import EndpointConfig, Prices
from specregen.client.cost import CostView, as_count, usage_cost
from specregen.client.summary import InferenceSummary


def response_cost(response: dict[str, Any] | None, prices: Prices | None) -> float | None:
    """USD of one response: `usage.cost` when the API reports it, else usage x prices."""
    # Cached prompt tokens at their own price (client/cost.py, shared with batch mode).
    return usage_cost(response, prices, "realtime")


class Accounting:
    """Counts of `summary` and the cost of a run in `mode` (realtime or batch)."""

    def __init__(self, summary: InferenceSummary, cfg: EndpointConfig,
                 mode: str = "realtime") -> None:
        self.summary = summary
        self.cfg = cfg
        self.mode = mode
        self.cost = CostView()

    def attempt(self, result: Any, cost: float | None, realtime: float | None = None) -> None:
        """One finished attempt (an `AttemptResult`): its error class, its cost (`realtime`:
        the same answer's realtime price, when it differs), the tokens of a final answer."""
        s = self.summary
        if result.error_class:
            s.errors[result.error_class] = s.errors.get(result.error_class, 0) + 1
        if cost is not None:
            s.cost_usd += cost
        self.cost.add(cost, realtime)
        usage = result.response.get("usage") if isinstance(result.response, dict) else None
        if result.final_answer and isinstance(usage, dict):
            s.prompt_tokens += as_count(usage.get("prompt_tokens"))
            s.completion_tokens += as_count(usage.get("completion_tokens"))
            details = usage.get("completion_tokens_details")
            if isinstance(details, dict):
                s.reasoning_tokens += as_count(details.get("reasoning_tokens"))

    def final(self, status: str) -> None:
        """A sample's final record is durable with `status`."""
        if status == "ok":
            self.summary.ok += 1
        elif status == "truncated":
            self.summary.truncated += 1
        elif status == "failed":
            self.summary.failed += 1

    def merge(self, sub: InferenceSummary) -> None:
        """A realtime run's summary (batch mode's fallback) into this one."""
        s = self.summary
        for name in ("ok", "truncated", "failed", "abandoned", "retries",
                     "prompt_tokens", "completion_tokens", "reasoning_tokens"):
            setattr(s, name, getattr(s, name) + getattr(sub, name))
        s.cost_usd += sub.cost_usd
        self.cost.spent_usd += sub.cost_usd
        self.cost.realtime_usd += sub.cost_usd
        for name, count in sub.errors.items():
            s.errors[name] = s.errors.get(name, 0) + count
        if sub.stopped_reason and not s.stopped_reason:
            s.stopped_reason = sub.stopped_reason

    def per_request(self) -> float:
        """The projected cost of one more request (0.0: unknown)."""
        if self.cost.answered:
            return self.cost.per_request
        prices, max_tokens = self.cfg.prices, self.cfg.sampling.max_tokens
        if prices is not None and max_tokens is not None:
            return max_tokens * prices.completion_per_million / 1e6 * prices.factor(self.mode)
        return 0.0

    def allows(self, in_flight: int) -> bool:
        """Whether one more request may start with `in_flight` requests unpaid (realtime)."""
        budget = self.cfg.budget_usd
        if budget is None:
            return True
        return self.summary.cost_usd + (in_flight + 1) * self.per_request() <= budget

    def affordable(self, n: int, committed: int) -> int:
        """How many of `n` requests fit the budget beside `committed` ones unpaid (batch)."""
        budget = self.cfg.budget_usd
        if budget is None:
            return n
        per = self.per_request()
        if per <= 0:
            return n
        spent = self.cost.spent_usd + committed * per
        return max(0, min(n, int((budget - spent) / per)))
