"""What a response cost, what it would have cost realtime, and what a run will cost in total.

`usage.cost` (OpenRouter reports it, at the batch price for batch results) wins; else the
endpoint's `prices` x usage, with cached prompt tokens at their own price and the batch
discount in batch mode. The realtime equivalent of a batch cost is what the cost view compares
against ("savings"); without prices it is the reported cost / (1 - the default discount).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specregen.client.config import Prices

DEFAULT_BATCH_DISCOUNT = Prices.model_fields["batch_discount"].default


def as_count(value: Any) -> int:
    """A usage count: an int as given, anything else (missing, bool, float) 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def cached_tokens(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details")
    return as_count(details.get("cached_tokens")) if isinstance(details, dict) else 0


def priced(usage: dict[str, Any], prices: Prices, mode: str = "realtime") -> float:
    """USD of `usage` at `prices` in `mode` (realtime or batch)."""
    prompt = as_count(usage.get("prompt_tokens"))
    cached = min(prompt, cached_tokens(usage))
    completion = as_count(usage.get("completion_tokens"))
    cached_price = prices.cached_prompt_per_million
    if cached_price is None:
        cached_price = prices.prompt_per_million
    usd = ((prompt - cached) * prices.prompt_per_million + cached * cached_price
           + completion * prices.completion_per_million) / 1e6
    return usd * prices.factor(mode)


def usage_cost(response: Any, prices: Prices | None, mode: str = "realtime") -> float | None:
    """USD of one response body: `usage.cost` when reported, else usage x prices."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    cost = usage.get("cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and math.isfinite(cost):
        return float(cost)
    if prices is None:
        return None
    return priced(usage, prices, mode)


def realtime_equivalent(
    response: Any, cost: float | None, prices: Prices | None, mode: str
) -> float | None:
    """What the same answer costs through the realtime API."""
    if mode != "batch":
        return cost
    usage = response.get("usage") if isinstance(response, dict) else None
    if prices is not None and isinstance(usage, dict):
        return priced(usage, prices, "realtime")
    if cost is None:
        return None
    discount = prices.batch_discount if prices is not None else DEFAULT_BATCH_DISCOUNT
    return cost / (1.0 - discount) if discount < 1 else None


@dataclass(slots=True)
class CostView:
    """Spent so far, what the whole run will cost, and the savings against realtime."""

    spent_usd: float = 0.0
    realtime_usd: float = 0.0  # the same answers, realtime
    answered: int = 0  # requests whose cost is in spent_usd
    remaining: int = 0  # requests still to pay for

    @property
    def per_request(self) -> float:
        return self.spent_usd / self.answered if self.answered else 0.0

    @property
    def projected_usd(self) -> float:
        return self.spent_usd + self.remaining * self.per_request

    @property
    def savings_usd(self) -> float:
        return max(0.0, self.realtime_usd - self.spent_usd)

    def add(self, cost: float | None, realtime: float | None) -> None:
        if cost is None:
            return
        self.spent_usd += cost
        self.realtime_usd += realtime if realtime is not None else cost
        self.answered += 1

    def as_dict(self) -> dict[str, float]:
        return {
            "spent_usd": round(self.spent_usd, 6),
            "projected_usd": round(self.projected_usd, 6),
            "realtime_equivalent_usd": round(self.realtime_usd, 6),
            "savings_usd": round(self.savings_usd, 6),
        }
