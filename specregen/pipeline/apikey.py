"""The pipeline's API key, loaded one way wherever a stage needs it (the library runner, every
Prefect task, the estimate): the config's Prefect Secret when it names one, else the endpoint's
environment variable, else nothing for a loopback endpoint (the emulator, a local vLLM).

The library imports no Prefect: the flow side hands in a `SecretReader` (tasks/secrets.py) that
reads a named Secret. The value is wrapped in an `ApiKey` at once, which never prints itself;
every message here names the variable or the Secret, never a value.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from specregen.client.reach import is_loopback
from specregen.client.secrets import ApiKey
from specregen.config import PipelineConfig
from specregen.errors import AuthError

# The value of the named secret, or None when no secret of that name exists.
SecretReader = Callable[[str], Awaitable[str | None]]


class MissingKeyError(AuthError, RuntimeError):
    """No API key where one is needed; the message names the variable, never a value."""


class MissingSecretError(AuthError, LookupError):
    """The config names a Prefect Secret that does not exist."""


def resolve_api_key(config: PipelineConfig, secret_value: str | None = None) -> ApiKey | None:
    """The key from a secret's value (already read), else from the environment; None for a
    loopback endpoint without one; else MissingKeyError naming where it was looked for."""
    value = secret_value or os.environ.get(config.endpoint.api_key_env)
    if value:
        return ApiKey(value)
    if is_loopback(config.endpoint.base_url):
        return None
    raise MissingKeyError(
        f"no API key: set the environment variable {config.endpoint.api_key_env}"
        + (f" or the Prefect Secret {config.api_key_secret!r}" if config.api_key_secret else "")
    )


async def load_api_key(
    config: PipelineConfig, read_secret: SecretReader | None = None, *, required: bool = True
) -> ApiKey | None:
    """The config's key: its Secret (read with `read_secret` when the config names one), else
    its environment variable. A named Secret that does not exist is an error even when the
    variable is set: the config asked for that Secret. Without a key for a remote endpoint:
    MissingKeyError, or None when not `required` (the caller reports it later, in its order)."""
    value: str | None = None
    name = config.api_key_secret
    if name and read_secret is not None:
        value = await read_secret(name)
        if value is None:
            raise MissingSecretError(
                f"the Prefect Secret {name!r} does not exist",
                hint="create it (infra/deploy.sh with the key in OPENROUTER_API_KEY) or remove"
                     " api_key_secret from the config")
    try:
        return resolve_api_key(config, value)
    except MissingKeyError:
        if required:
            raise
        return None
