"""`python -m specregen.cli`, as `python -m specregen` (specregen/__main__.py)."""

from specregen.__main__ import main

if __name__ == "__main__":
    main()
