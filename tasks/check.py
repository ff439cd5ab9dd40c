from __future__ import annotations

from prefect import task

from specregen.errors import AuthError
from specregen.pipeline.run import check_before_paying
from tasks.common import dataset_run


@task(name="check-before-paying", retries=0)
async def check_before_paying_task(config_path: str, dataset: str) -> None:
    """The source is readable and the API key present, before the first paid request. Never
    retried: a missing source or key is the same on the next attempt."""
    run = dataset_run(config_path, dataset)
    found = False
    if run.config.api_key_secret:
        from prefect.blocks.system import Secret

        try:
            found = bool((await Secret.aload(run.config.api_key_secret)).get())
        except ValueError:  # no such block
            raise AuthError(
                f"{dataset}: the Prefect Secret {run.config.api_key_secret!r} does not exist",
                hint="create it (infra/deploy.sh with the key in OPENROUTER_API_KEY) or remove"
                " api_key_secret from the config",
            ) from None
    check_before_paying(run, api_key_found=found)
