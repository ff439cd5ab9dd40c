#!/usr/bin/env bash
# Sets up the project on a fresh machine (scripts/setup.sh) and runs the whole test suite:
# ruff, then pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$root"
ruff check .
exec python -m pytest "$@"
