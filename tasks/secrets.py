"""The Prefect side of the API key: a Secret block read by name, for
`specregen.pipeline.apikey.load_api_key` (the one place a key is loaded)."""

from __future__ import annotations


async def read_prefect_secret(name: str) -> str | None:
    """The value of the Prefect Secret `name`, or None when no such block exists. Prefect's
    own error for a missing block names the block only; the value goes straight back to the
    caller, which wraps it in an `ApiKey` (never logged, stored nor put in a message)."""
    from prefect.blocks.system import Secret

    try:
        block = await Secret.aload(name)
    except ValueError:  # no block of that name
        return None
    return block.get()
