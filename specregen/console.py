"""Rich consoles that read whole wherever the output goes.

At a terminal Rich fits tables and text to the window. Anywhere else (a pipe, a file, a CI log)
it assumes 80 columns and cuts table cells with an ellipsis or folds paths mid-word, which
breaks a copied path and a grep alike. Off a terminal the consoles here are as wide as their
widest line: a table takes the width its cells need, and text is never wrapped (soft wrap), so
every path and every word arrives whole.
"""

from __future__ import annotations

import logging

from rich.console import Console

# Off a terminal: wider than any line specregen prints, so Rich never has to cut or fold one.
UNBOUNDED_WIDTH = 100_000


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width at a terminal, unbounded and
    soft-wrapped elsewhere."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=UNBOUNDED_WIDTH, soft_wrap=True)


def log_handler(console: Console) -> logging.Handler:
    """A handler printing log records on `console`'s stream: Rich's (time, level, wrapped to
    the window) at a terminal; elsewhere one plain line per record, never padded or folded."""
    if console.is_terminal:
        from rich.logging import RichHandler

        return RichHandler(console=console, show_path=False, rich_tracebacks=False)
    return _PlainLines(console)


class _PlainLines(logging.Handler):
    """`LEVEL message`, one line per record, on the console's stream as it is at each record
    (sys.stderr may be replaced after the handler was made, as a test runner does)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=self.console.file, flush=True)
        except Exception:
            self.handleError(record)
