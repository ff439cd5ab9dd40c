"""`python -m specregen.cli`: the command (as `python -m specregen`, specregen/__main__.py)."""

from specregen.cli import app

if __name__ == "__main__":
    app()
