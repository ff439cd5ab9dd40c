# Sourced by scripts/setup.sh for the test command: a second virtual environment with the real
# EAGLE-3 trainers (speculators, SpecForge), whose loaders the interop tests run in a subprocess.
# Kept apart from .venv because their pins (torch, transformers 5, sglang) fight ours.
# CPU torch only: torch==2.13.0 is pinned first so pip never pulls a CUDA build, and the trainer
# packages go in with --no-deps plus only what their data-loading code imports.
trainers_venv=${SPECREGEN_TRAINERS_VENV:-$root/.venv-trainers}
trainers_stamp="$trainers_venv/.specregen-trainers-v1"
if [ ! -f "$trainers_stamp" ]; then
    trainers_started=$(date +%s)
    echo "setting up the trainers' environment in $trainers_venv (once)" >&2
    rm -rf "$trainers_venv"
    python3 -m venv "$trainers_venv"
    trainers_pip=("$trainers_venv/bin/python" -m pip install --quiet --disable-pip-version-check)
    # --no-deps leaves the trainers' declared pins (CUDA torch, sglang, ...) unmet on purpose:
    # pip's note about them is expected, and so are the local indexes' "ignored" lines.
    trainers_noise="is ignored: it is neither|dependency resolver does not|requires .*which is"
    if "${trainers_pip[@]}" "torch==2.13.0" 2> >(grep -Ev "$trainers_noise" >&2) \
        && "${trainers_pip[@]}" --no-deps "speculators==0.9.0" "specforge==0.2.0" \
            "hs-connectors==0.9.0" 2> >(grep -Ev "$trainers_noise" >&2) \
        && "${trainers_pip[@]}" "transformers>=5.0,<=5.19.0" "datasets>=4.0,<=5.1.0" \
            "huggingface-hub" "numpy>=2.0,<=2.5.4" "pydantic>=2.0" "pydantic-settings>=2.0" \
            "loguru>=0.7.2,<=0.7.3" "typer>=0.12" "rich" "tqdm" "safetensors" "openai>=2.0" \
            "psutil" "pyyaml" "protobuf" "tiktoken" "click" "httpx" "aiohttp" \
            2> >(grep -Ev "$trainers_noise" >&2); then
        echo "$(($(date +%s) - trainers_started)) s" > "$trainers_stamp"
        echo "trainers' environment ready in $(cat "$trainers_stamp")" >&2
    else
        # The interop tests skip, naming this, rather than the whole test command failing.
        echo "warning: could not install the trainers in $trainers_venv;" \
            "tests/integration/test_trainers.py will skip" >&2
    fi
fi
export SPECREGEN_TRAINERS_PYTHON="$trainers_venv/bin/python"
