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
