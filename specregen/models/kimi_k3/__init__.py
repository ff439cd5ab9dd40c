"""Kimi K3 as a chat format (docs/kimi-k3.md).

encoding.py: K3's prompt rendering as segments (our own encoder; the real-vLLM folder carries
it as `encoding_k3.py`); tokens.py: K3's added-token table and tokenizer folders; completion.py:
the completion's layout as segments, `Assembled`, the raw tool-call parser (what format.py and
readings.py share); format.py: prompt encoding, completion assembly, the gate's rules;
readings.py: what vLLM 0.32's kimi_k3 parsers leave open; servers.py: those parsers and vLLM's
prompt handling, restated. The emulator's side: served.py; the fidelity corpus: corpus.py; the
real-vLLM folder: realvllm.py + hf_tokenizer.py; the endpoint probe's rules: probe.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specregen.models.family import lazy_exports

if TYPE_CHECKING:
    from specregen.models.kimi_k3.completion import (
        Assembled,
        completion_segments,
        parse_calls,
    )
    from specregen.models.kimi_k3.encoding import (
        CLOSE,
        END_OF_MSG,
        MARKERS,
        OPEN,
        SEP,
        EncodingError,
        render_segments,
    )
    from specregen.models.kimi_k3.format import (
        THINKING_SWITCH,
        TOOL_ID_IN_TOKENS,
        KimiK3,
        is_server_tool_id,
        make_format,
        source_files,
    )
    from specregen.models.kimi_k3.probe import make_probe_rules
    from specregen.models.kimi_k3.tokens import (
        ADDED_IDS,
        ADDED_TOKENS,
        REQUIRED_TOKENS,
        check_tokenizer,
        write_tokenizer_folder,
    )

# Reconstruction reads the probe's `counts_stop_token` (reconstruct.py, any format); the probe
# also refuses a tool-call dataset whose calls come back unrecoverable before anything is paid.
READS_PROVIDER_TRAITS = True

# Where each name lives: loading the package (the registry reads its `family` descriptor)
# imports none of the family's code until a name is asked for.
_WHERE = {
    "Assembled": "completion",
    "completion_segments": "completion",
    "parse_calls": "completion",
    "CLOSE": "encoding",
    "END_OF_MSG": "encoding",
    "MARKERS": "encoding",
    "OPEN": "encoding",
    "SEP": "encoding",
    "EncodingError": "encoding",
    "render_segments": "encoding",
    "THINKING_SWITCH": "format",
    "TOOL_ID_IN_TOKENS": "format",
    "KimiK3": "format",
    "is_server_tool_id": "format",
    "make_format": "format",
    "source_files": "format",
    "make_probe_rules": "probe",
    "ADDED_IDS": "tokens",
    "ADDED_TOKENS": "tokens",
    "REQUIRED_TOKENS": "tokens",
    "check_tokenizer": "tokens",
    "write_tokenizer_folder": "tokens",
}


__getattr__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "ADDED_IDS",
    "ADDED_TOKENS",
    "CLOSE",
    "END_OF_MSG",
    "MARKERS",
    "OPEN",
    "READS_PROVIDER_TRAITS",
    "REQUIRED_TOKENS",
    "SEP",
    "THINKING_SWITCH",
    "TOOL_ID_IN_TOKENS",
    "Assembled",
    "EncodingError",
    "KimiK3",
    "check_tokenizer",
    "completion_segments",
    "is_server_tool_id",
    "make_format",
    "make_probe_rules",
    "parse_calls",
    "render_segments",
    "source_files",
    "write_tokenizer_folder",
]
