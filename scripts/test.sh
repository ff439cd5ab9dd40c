#!/usr/bin/env bash
# Sets up the project on a fresh machine (a virtual environment in .venv, the package and its
# dev tools) and runs the whole test suite: ruff, then pytest. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${SPECREGEN_VENV:-$root/.venv}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]" 2> >(grep -v "is ignored: it is neither" >&2)
# The real Kimi vocabulary, where the shared reference data is beside the checkout.
if [ -z "${KIMI_TOKENIZER_DIR:-}" ] && [ -f "$root/../shared/kimi/tiktoken.model" ]; then
    export KIMI_TOKENIZER_DIR="$root/../shared/kimi"
fi
"$venv/bin/ruff" check .
exec "$venv/bin/python" -m pytest "$@"
