"""What several commands share: the endpoint config file of `infer` and `probe`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from specregen.errors import EXIT_USAGE


def config_file(path: Path, console: Console) -> dict[str, Any]:
    """The mapping of fields in a YAML/JSON endpoint config file; a file that cannot be read or
    is no mapping is one error line and exit 2."""
    import yaml
    from rich.markup import escape

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        console.print(f"[red]error:[/red] cannot read {path}: {exc.strerror}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        console.print(f"[red]error:[/red] {path} is not YAML/JSON: {escape(str(exc))}",
                      highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    if not isinstance(data, dict):
        console.print(f"[red]error:[/red] {path} must hold a mapping of fields", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    return data
