"""The `specregen` command: the top floor (docs/ARCHITECTURE.md, "Layers").

One module a command (or a pair: run.py has demo and run, deploy.py deploy and retry), each
registered below in the order `specregen --help` lists them. Commands parse options and print;
the work is the library's. No library module imports this package; it alone may import the
Prefect side (`flows`, `deployments`), inside the commands that run it, after checkout.py has
found the project checkout they live in (they are not in the wheel).
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="specregen",
    help="Regenerate draft-model training data from a served model, token-exact.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks (also: SPECREGEN_DEBUG=1)")
    ] = False,
) -> None:
    """Regenerate draft-model training data from a served model, token-exact."""
    from specregen.errors import set_debug

    set_debug(debug)


def _register_commands() -> None:
    """Every command, in the order `specregen --help` lists them."""
    from specregen.cli.deploy import deploy, retry
    from specregen.cli.emulator import emulator
    from specregen.cli.estimate import estimate
    from specregen.cli.export import export
    from specregen.cli.gate import gate
    from specregen.cli.infer import infer
    from specregen.cli.inspect import inspect
    from specregen.cli.probe import probe_command
    from specregen.cli.reconstruct import reconstruct
    from specregen.cli.report import report
    from specregen.cli.run import demo, run

    app.command()(reconstruct)
    app.command()(demo)
    app.command()(run)
    app.command()(deploy)
    app.command()(retry)
    app.command(name="infer")(infer)
    app.command(name="estimate")(estimate)
    app.command(name="gate")(gate)
    app.command(name="inspect")(inspect)
    app.command(name="report")(report)
    app.command(name="probe")(probe_command)
    app.command(name="emulator")(emulator)
    app.command(name="export")(export)


_register_commands()
