"""`specregen deploy` and `specregen retry`: a pipeline config on the Prefect server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specregen.console import make_console

console = make_console(stderr=True)


def deploy(
    config: Annotated[Path, typer.Option(help="Pipeline YAML config")],
    prune: Annotated[
        bool, typer.Option(help="Delete the dataset deployments of datasets no longer in the"
                                " config (their runs and data are kept)")
    ] = False,
    wait_server: Annotated[
        float, typer.Option(help="Seconds to wait for the Prefect server to answer")
    ] = 60.0,
) -> None:
    """Deploy a pipeline config to the project's Prefect server (PREFECT_API_URL, else
    127.0.0.1:4200 as infra/env.sh): dataset/<NAME> per dataset, pipeline/nightly (03:00 UTC),
    probe/probe, batch-poll/batch-poll, reconstruct-chunks/spread. Run it again after editing
    the config: new datasets are deployed, removed ones reported (--prune deletes them)."""
    from specregen.cli.checkout import prefect_side
    from specregen.errors import user_errors

    with user_errors():
        prefect_side("deploy")  # the checkout's deployments, or one line saying where
        from deployments.deploy import deploy as deploy_config
        from deployments.deploy import report_lines

        report = deploy_config(config, prune=prune, wait_s=wait_server, log=console.print)
    for line in report_lines(report, config):
        console.print(line, highlight=False)


def retry(
    dataset: Annotated[str, typer.Argument(help="The dataset whose failed run to re-run")],
    watch: Annotated[bool, typer.Option(help="Wait for the run to end")] = False,
) -> None:
    """Re-run the newest failed run of dataset/DATASET in place, as the UI's Retry button: the
    same flow run, skipping every finished chunk (a worker must be running)."""
    from specregen.cli.checkout import prefect_side
    from specregen.errors import user_errors

    with user_errors():
        prefect_side("retry")
        from deployments.deploy import retry_dataset

        retry_dataset(dataset, watch=watch, log=console.print)
