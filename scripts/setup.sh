# Sourced by the README's commands: a virtual environment in .venv with specregen and its dev
# tools, installed on first use and refreshed when pyproject.toml changes.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SPECREGEN_VENV:-$root/.venv}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
stamp="$venv/.specregen-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[dev]" \
        2> >(grep -v "is ignored: it is neither" >&2)
    touch "$stamp"
fi
# The real Kimi vocabulary, where the shared reference data is beside the checkout.
if [ -z "${KIMI_TOKENIZER_DIR:-}" ] && [ -f "$root/../shared/kimi/tiktoken.model" ]; then
    export KIMI_TOKENIZER_DIR="$root/../shared/kimi"
fi
export PATH="$venv/bin:$PATH"
# The test command also builds the trainers' environment (speculators, SpecForge) that
# tests/integration/test_trainers.py runs their loaders in: once, about a minute from PyPI.
# SPECREGEN_TRAINERS=1 asks for it anywhere else, SPECREGEN_TRAINERS=0 never.
if [ "${SPECREGEN_TRAINERS:-}" = 1 ] || { [ "${SPECREGEN_TRAINERS:-}" != 0 ] \
    && [ "$(basename "${BASH_SOURCE[1]:-}")" = test.sh ]; }; then
    source "$root/scripts/setup_trainers.sh"
fi
# The test command also builds the real vLLM server's environment (scripts/setup_vllm.sh) that
# the real-server tests (tests/realvllm/) and bench/real_vllm.py run: once, about 2 minutes.
# SPECREGEN_VLLM=1 asks for it anywhere else, SPECREGEN_VLLM=0 never.
if [ "${SPECREGEN_VLLM:-}" = 1 ] || { [ "${SPECREGEN_VLLM:-}" != 0 ] \
    && [ "$(basename "${BASH_SOURCE[1]:-}")" = test.sh ]; }; then
    source "$root/scripts/setup_vllm.sh"
fi
# The browser tests (tests/integration/test_browser.py) open the HTML pages in Debian's
# Chromium: the test command installs it where it is missing and we are root (as in CI).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1 \
    && { [ "${CI:-}" = true ] || [ "$(basename "${BASH_SOURCE[1]:-}")" = test.sh ]; }; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
        >/dev/null; } || echo "warning: could not install chromium; browser tests fail" >&2
fi
# The cluster tests (tests/integration/test_cluster.py) start a real PostgreSQL with
# infra/postgres.sh: the test command installs Debian's server where it is missing and we are
# root (as in CI); the server then runs as the `postgres` user the package creates.
if ! command -v pg_ctl >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" \
    >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && { [ "${CI:-}" = true ] || [ "$(basename "${BASH_SOURCE[1]:-}")" = test.sh ]; }; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql \
        >/dev/null; } || echo "warning: could not install postgresql; cluster tests fail" >&2
fi
