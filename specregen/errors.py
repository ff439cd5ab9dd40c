"""User-facing errors: one base class, one exit code per kind, one line on the terminal.

Every failure a user can cause or fix (bad input, a refused key, a full disk, a busy output)
is a `SpecregenError` carrying the cause (its message) and what to do (`hint`). The CLI turns
it into ONE line on stderr and a documented exit code; the traceback is shown only with
`specregen --debug ...` or `SPECREGEN_DEBUG=1`. Anything else that escapes a command is a bug:
exit code 1 with a one-line message that says so.

Exit codes, the same in every command (docs/exit-codes.md lists them for users):

    0    done
    1    unexpected internal error (a bug; rerun with --debug and report the traceback)
    2    bad input or usage (options, config, prompts file, tokenizer, a missing deployment)
    3    authentication / account (missing or rejected API key, no credits)
    4    stopped by the budget
    5    storage (output not writable, disk full, missing storage credentials, raw log failed)
    6    failed in part (samples failed permanently, a gate failed, datasets failed for
         causes of several kinds)
    7    output busy (another writer holds the output's lease)
    8    unavailable (the Prefect server or the shared-limit store did not answer)
    9    endpoint unreachable (nothing answers at the model endpoint's URL: refused, DNS,
         no connection within the connect timeout) before it ever answered
    130  interrupted (Ctrl-C); finished results are kept, run again to continue

Messages must never contain a secret: callers build them from names (variables, fields,
paths), never from values that could be keys.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_BUDGET = 4
EXIT_STORAGE = 5
EXIT_PARTIAL = 6
EXIT_BUSY = 7
EXIT_UNAVAILABLE = 8
EXIT_UNREACHABLE = 9
EXIT_INTERRUPTED = 130

DEBUG_ENV = "SPECREGEN_DEBUG"


class SpecregenError(Exception):
    """A failure the user can act on. `str(exc)` is the cause; `hint` says what to do."""

    exit_code: int = EXIT_INTERNAL
    hint: str | None = None

    def __init__(self, message: str = "", *args: Any, hint: str | None = None) -> None:
        super().__init__(message, *args)
        if hint is not None:
            self.hint = hint

    def one_line(self) -> str:
        """Cause and remedy on one line (newlines folded: a terminal line, a log line)."""
        text = " ".join(str(self).split()) or type(self).__name__
        if self.hint:
            text += " -- " + " ".join(self.hint.split())
        return text


class UsageError(SpecregenError):
    """Bad options, config, input file or tokenizer."""

    exit_code = EXIT_USAGE


class AuthError(SpecregenError):
    """The API key is missing or refused, or the account cannot pay."""

    exit_code = EXIT_AUTH


class BudgetError(SpecregenError):
    """The run stopped at its spending limit."""

    exit_code = EXIT_BUDGET


class StorageError(SpecregenError):
    """An output or input location cannot be used (not writable, full, no credentials)."""

    exit_code = EXIT_STORAGE


class PartialFailureError(SpecregenError):
    """The run finished but some samples failed permanently."""

    exit_code = EXIT_PARTIAL


class OutputBusyError(SpecregenError):
    """Another process holds the output's lease (one writer per output)."""

    exit_code = EXIT_BUSY


class UnavailableError(SpecregenError):
    """A service the run needs (the Prefect server, the shared-limit store) did not answer or
    start; nothing is wrong with the input, so trying again later is the remedy."""

    exit_code = EXIT_UNAVAILABLE


class EndpointUnreachableError(SpecregenError):
    """No connection to the model endpoint could be made before it ever answered (refused,
    DNS, connect timeout): nothing was sent, so nothing counts against a sample's attempts.
    The message names the URL and the error; the hint what to check."""

    exit_code = EXIT_UNREACHABLE


# -- mapping OS errors ---------------------------------------------------------------------------

_OS_HINTS = {
    errno.EROFS: ("is on a read-only filesystem", "choose a writable location"),
    errno.ENOSPC: ("has no space left on the device", "free space or choose another location"),
    errno.EDQUOT: ("is over the disk quota", "free space or choose another location"),
    errno.EFBIG: ("hit the file size limit", "raise the limit (ulimit -f) or free space"),
    errno.ENOTDIR: (
        "has a regular file in the way (the path or a parent of it is a file, not a folder)",
        "remove that file or choose another path",
    ),
    errno.EISDIR: ("is a folder, not a file", "give a file path"),
    errno.EACCES: ("is not accessible (permission denied)", "fix its permissions"),
    errno.EPERM: ("is not accessible (operation not permitted)", "choose another location"),
    errno.ENOENT: ("does not exist", "check the path"),
}


def storage_error(exc: BaseException, where: str, action: str = "write") -> StorageError:
    """A StorageError for an OSError (or an object-store error) while using `where`."""
    code = getattr(exc, "errno", None)
    if code is None and isinstance(exc, OSError):
        # pyarrow and fsspec raise plain OSErrors that carry the errno only in their text.
        found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(found.group(1)) if found else None
    if isinstance(exc, OSError) and code in _OS_HINTS:
        what, hint = _OS_HINTS[code]
        return StorageError(f"cannot {action} {where}: it {what}", hint=hint)
    if is_missing_credentials(exc):
        return StorageError(
            f"cannot {action} {where}: no storage credentials found",
            hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
            " (or the store's credential variables)",
        )
    detail = getattr(exc, "strerror", None) or type(exc).__name__
    return StorageError(f"cannot {action} {where}: {detail}", hint="check the location")


def is_missing_credentials(exc: BaseException) -> bool:
    """botocore's NoCredentialsError / PartialCredentialsError, without importing botocore."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
    )


# -- the CLI side --------------------------------------------------------------------------------


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def set_debug(on: bool) -> None:
    """`specregen --debug`: tracebacks for every error, in this process and its children."""
    if on:
        os.environ[DEBUG_ENV] = "1"


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, SpecregenError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_INTERNAL


def message_for(exc: BaseException) -> str:
    """The one line printed for `exc` (prefix included)."""
    if isinstance(exc, SpecregenError):
        return f"error: {exc.one_line()}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted: finished results are kept; run again to continue"
    detail = " ".join(str(exc).split())
    return (
        f"internal error: {type(exc).__name__}" + (f": {detail}" if detail else "")
        + f" -- this is a bug; rerun with `specregen --debug` (or {DEBUG_ENV}=1) and report"
        " the traceback"
    )


def fail(exc: BaseException) -> NoReturn:
    """Print the one line for `exc` (and the traceback when debugging) and exit with its code."""
    import typer

    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    _print(message_for(exc))
    raise typer.Exit(exit_code_for(exc))


@contextmanager
def user_errors() -> Iterator[None]:
    """Around a command's body: every failure becomes one line and its exit code.

    typer.Exit / click exceptions pass through untouched (they are already an exit).
    """
    import click
    import typer

    try:
        yield
    except (typer.Exit, click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise
    except (Exception, KeyboardInterrupt) as exc:
        fail(exc)
