"""`specregen` (the installed command) and `python -m specregen`.

The commands' modules take a second or more to import; a Ctrl-C in that second would print a
traceback from the middle of some import. Here it is one line and exit 130, like a Ctrl-C
anywhere else (specregen.errors.user_errors).
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from specregen.cli import app
    except KeyboardInterrupt:
        print("interrupted: nothing was started", file=sys.stderr, flush=True)
        sys.exit(130)
    app()


if __name__ == "__main__":
    main()
