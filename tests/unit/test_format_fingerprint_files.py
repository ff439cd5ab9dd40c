"""The reconstruct fingerprint holds the files that decide the ids, and only those: a module left
out must really be outside reconstruction (checked by importing the path in a fresh process)."""

import subprocess
import sys

from specregen.models.registry import format_source_files

PROBE = """
import sys
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
fmt = get_format({name!r}, load_tokenizer({tok!r}))
request = {{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}
response = {{"choices": [{{"message": {{"role": "assistant", "content": "hello"}},
              "finish_reason": "stop"}}], "usage": {{}}}}
reconstruct("s", request, response, fmt)
print("\\n".join(sorted(sys.modules)))
"""


def _imported(name: str, tok: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(name=name, tok=tok)],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_files_left_out_are_never_imported_by_reconstruction():
    for name, tok, package in (("kimi-k2.5", "mini", "specregen.models.kimi_k25"),
                               ("qwen3", "mini-qwen3", "specregen.models.qwen3")):
        files = {p.stem for p in format_source_files(name) if p.parent.name in package}
        modules = _imported(name, tok)
        used = {m.rsplit(".", 1)[1] for m in modules if m.startswith(package + ".")}
        # The family's descriptor is read by the registry (names, where things are); the ids
        # are the format's files' doing, and it is never in the fingerprint.
        assert "family" in used and "family" not in files
        used.discard("family")
        # Whatever reconstruction imports from the package is fingerprinted...
        assert used <= files, (name, used - files)
        # ...and the emulator's served side is not (editing it reruns nothing).
        assert "served" not in files
    # Nor the Qwen3 fidelity bench's answer corpus (emulator/bench code only).
    qwen3 = {p.name for p in format_source_files("qwen3")}
    assert "corpus.py" not in qwen3 and {"format.py", "servers.py"} <= qwen3


def test_kimi_fingerprint_keeps_the_readings_and_the_template():
    names = {p.name for p in format_source_files("kimi-k2.5")}
    assert {"common.py", "format.py", "readings.py", "checks.py", "chat_template.jinja"} <= names
    assert not names & {"served.py", "servers.py", "serverside.py"}


def test_reconstruction_imports_of_the_server_kit_are_fingerprinted():
    # models/serverkit is served-side code, but K3's readings run its restated parsers, whose
    # types are the kit's `stream`: what a format's reconstruction imports of the kit is in
    # its fingerprint, and K2.5's and Qwen3's import none of it.
    for name, tok in (("kimi-k2.5", "mini"), ("qwen3", "mini-qwen3"), ("kimi-k3", "mini-k3")):
        kit = {m.rsplit(".", 1)[1] for m in _imported(name, tok)
               if m.startswith("specregen.models.serverkit.")}
        files = {p.stem for p in format_source_files(name) if p.parent.name == "serverkit"}
        assert kit == files, (name, kit, files)
        assert kit == ({"stream"} if name == "kimi-k3" else set()), (name, kit)
    qwen3 = {p.name for p in format_source_files("qwen3")}
    assert not qwen3 & {"vllm.py", "vllm_legacy.py", "hermes.py", "sglang.py"}
