"""An endpoint nothing answers at, named at once.

A connection that cannot be made (refused, DNS, no connection within the connect timeout)
before the endpoint ever answered in this run is not a flaky request: every further attempt
would fail the same way, and retrying each sample `max_attempts` times only hides the cause
behind a "partial failure" half a minute later. So the engine and the probe stop at the first
such failure with `EndpointUnreachableError` (its own exit code), naming the URL, the error and
what to check. Nothing was sent, so nothing is recorded and no sample's attempts are used. Once
the endpoint has answered, a refused connection is an ordinary retryable failure (a server
restarting, a load balancer shedding connections).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx

from specregen.errors import EndpointUnreachableError

# The transport's error classes for "no connection was made" (client/transport.py).
UNREACHABLE_CLASSES = frozenset({"connect_error", "connect_timeout"})


def is_unreachable(result: Any) -> bool:
    """An attempt that never reached an HTTP answer because no connection could be made."""
    return result.error_class in UNREACHABLE_CLASSES and result.http_status is None


def shown_url(url: str) -> str:
    """The URL without user:password, should someone have put credentials in it."""
    try:
        return str(httpx.URL(url).copy_with(username=None, password=None))
    except (httpx.InvalidURL, TypeError, ValueError):
        return url


def unreachable_error(base_url: str, detail: str | None) -> EndpointUnreachableError:
    """The error for a failed connection to `base_url`; `detail` is the transport's message
    (already free of the key)."""
    url = shown_url(base_url)
    host, port = _host_port(base_url)
    if host is not None and _is_local(host):
        where = f"{host}:{port}" if port else host
        hint = (f"nothing listens at {where} on this machine: start the server there (the "
                f"built-in emulator: `specregen emulator --port {port or 80}`), or fix the URL "
                "(endpoint.base_url in the config, --base-url)")
    else:
        hint = ("check the URL (endpoint.base_url in the config, --base-url), that the server "
                "runs, and the DNS name, proxy and firewall between here and it")
    # What to check is part of the message, not a separate hint: a Prefect run's state and
    # log show the message alone, and they must say it too.
    return EndpointUnreachableError(
        f"cannot reach the endpoint {url}: {detail or 'no connection'}; nothing was sent and"
        f" no attempt was counted -- {hint}")


def _host_port(url: str) -> tuple[str | None, int | None]:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None, None
    return parsed.host or None, parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)


def is_loopback(url: str) -> bool:
    """Whether an endpoint URL stays on this machine (localhost, 127.x, ::1): such an endpoint
    may go without an API key."""
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL:
        return False
    return _is_local(host)


def _is_local(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
