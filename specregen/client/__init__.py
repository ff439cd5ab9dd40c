"""Async OpenAI-compatible client: requests sent and streamed, retries, limits, cost, budget.

`run_inference` (engine) drives a whole run; `send` (transport) is one attempt; `build_request`
(request) is what a prompt asks of the endpoint (the body and its fingerprint are
`specregen.wire.request`'s).
"""

from specregen.client.config import ConfigError, EndpointConfig
from specregen.client.engine import run_inference
from specregen.client.request import build_request
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
    "run_inference",
    "send",
]
