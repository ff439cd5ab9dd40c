"""The Prefect side (`flows`, `tasks`, `deployments`) for the commands that run it: run, demo,
deploy, retry.

The wheel installs only `specregen`: the Prefect side runs from the project checkout (workers
run deployments from it, by file path: deployments/specs.py). A console script does not have
the working directory on sys.path, so a command run from a checkout may not import them
though they are right there; this finds the checkout and puts it on sys.path, or stops at once
with what to do (exit 2, docs/exit-codes.md) rather than failing in the middle of an import.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from specregen.errors import UsageError

PREFECT_SIDE = ("flows", "tasks", "deployments")
ROOT_VARIABLE = "SPECREGEN_ROOT"  # infra/env.sh sets it to its checkout


class NoCheckoutError(UsageError):
    """A command that runs the Prefect flows, with no project checkout to run them from."""


def is_checkout(path: Path) -> bool:
    """`path` holds the project's Prefect side (not just any folder named flows/)."""
    return (path / "flows" / "dataset.py").is_file() and all(
        (path / name / "__init__.py").is_file() for name in PREFECT_SIDE)


def _importable_root() -> Path | None:
    """The checkout the Prefect side already imports from (sys.path, an editable install of
    an older layout), when it is ours."""
    spec = importlib.util.find_spec("flows")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).resolve().parent.parent
    return root if is_checkout(root) else None


def _candidates() -> Iterator[Path]:
    import specregen

    # The checkout this specregen runs from (a source tree, or `pip install -e` of one).
    yield Path(specregen.__file__).resolve().parent.parent
    root = os.environ.get(ROOT_VARIABLE)
    if root:
        yield Path(root).expanduser().resolve()
    cwd = Path.cwd().resolve()
    yield from (cwd, *cwd.parents)


def prefect_side(command: str) -> Path:
    """The checkout holding flows/, tasks/ and deployments/, importable from now on; else
    NoCheckoutError naming the command and what to do."""
    found = _importable_root()
    if found is not None:
        return found
    for root in _candidates():
        if is_checkout(root):
            sys.path.insert(0, str(root))
            return root
    raise NoCheckoutError(
        f"`specregen {command}` runs the project's Prefect flows, which are not part of the"
        " installed package: they run from the project checkout (flows/, tasks/,"
        f" deployments/), and none was found here ({Path.cwd()}) nor in ${ROOT_VARIABLE}",
        hint="cd into the project checkout and run it there, set SPECREGEN_ROOT to the"
             " checkout, or install from it with `pip install -e <checkout>`")
