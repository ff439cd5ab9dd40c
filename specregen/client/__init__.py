"""Async OpenAI-compatible client: request bodies, SSE streams, retries, limits, cost, budget.

`run_inference` (engine) drives a whole run; `send` (transport) is one attempt; `build_request`
and `request_fingerprint` (request) define what is asked and how it is identified in the raw log.
"""

from specregen.client.config import ConfigError, EndpointConfig
from specregen.client.engine import run_inference
from specregen.client.request import build_request, request_fingerprint
from specregen.client.secrets import ApiKey
from specregen.client.summary import FatalAPIError, InferenceSummary, ProgressSnapshot
from specregen.client.transport import AttemptResult, send

__all__ = [
    "ApiKey",
    "AttemptResult",
    "ConfigError",
    "EndpointConfig",
    "FatalAPIError",
    "InferenceSummary",
    "ProgressSnapshot",
    "build_request",
    "request_fingerprint",
    "run_inference",
    "send",
]
