"""Kimi K2.5 as a chat format (`specregen.models.chat_format.ChatFormat`).

common.py: the marker strings, the call-id rule and `Assembled` (what the others share);
format.py: prompt rendering, completion assembly, raw tool-call markers, the id policy;
readings.py: what the servers' lossy parsers leave open (docs/evidence.md); checks.py: the
gate's K2.5 rules; tools_ts.py: K2.5's TypeScript-style tool declaration; chat_template.jinja:
the template written from the SPEC; corpus.py: the fidelity corpus (the requests and answer
shapes K2.5 writes, for the benches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specregen.models.family import lazy_exports

if TYPE_CHECKING:
    from specregen.models.kimi_k25.common import (
        ARG_BEGIN,
        CALL_BEGIN,
        CALL_END,
        CANONICAL_ID,
        IM_ASSISTANT,
        IM_END,
        IM_MIDDLE,
        IM_SYSTEM,
        IM_USER,
        SECTION_BEGIN,
        SECTION_END,
        THINK,
        THINK_END,
        TOOL_MARKERS,
        Assembled,
        count_history_tool_calls,
        tojson,
    )
    from specregen.models.kimi_k25.format import (
        DEFAULT_SYSTEM_PROMPT,
        MEDIA_IMAGE,
        READS_PROVIDER_TRAITS,
        REQUIRED_TOKENS,
        THINKING_SWITCH,
        FormatError,
        KimiK25,
        RawToolSection,
        ToolsFormat,
        check_tokenizer,
        find_tool_section,
        has_marker_text,
        make_format,
        name_from_tool_id,
        render_prompt_blocks,
        render_prompt_text,
        resolve_tool_id,
        source_files,
        tools_declaration,
    )
    from specregen.models.kimi_k25.probe import make_probe_rules
    from specregen.models.kimi_k25.readings import (
        looks_stripped,
        reserialize_history_arguments,
    )

# Where each name lives: loading the package (the registry reads its `family` descriptor)
# imports none of the family's code until a name is asked for.
_WHERE = {
    "ARG_BEGIN": "common",
    "CALL_BEGIN": "common",
    "CALL_END": "common",
    "CANONICAL_ID": "common",
    "IM_ASSISTANT": "common",
    "IM_END": "common",
    "IM_MIDDLE": "common",
    "IM_SYSTEM": "common",
    "IM_USER": "common",
    "SECTION_BEGIN": "common",
    "SECTION_END": "common",
    "THINK": "common",
    "THINK_END": "common",
    "TOOL_MARKERS": "common",
    "Assembled": "common",
    "count_history_tool_calls": "common",
    "tojson": "common",
    "DEFAULT_SYSTEM_PROMPT": "format",
    "MEDIA_IMAGE": "format",
    "READS_PROVIDER_TRAITS": "format",
    "REQUIRED_TOKENS": "format",
    "THINKING_SWITCH": "format",
    "FormatError": "format",
    "KimiK25": "format",
    "RawToolSection": "format",
    "ToolsFormat": "format",
    "check_tokenizer": "format",
    "find_tool_section": "format",
    "has_marker_text": "format",
    "make_format": "format",
    "name_from_tool_id": "format",
    "render_prompt_blocks": "format",
    "render_prompt_text": "format",
    "resolve_tool_id": "format",
    "source_files": "format",
    "tools_declaration": "format",
    "make_probe_rules": "probe",
    "looks_stripped": "readings",
    "reserialize_history_arguments": "readings",
}


__getattr__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "ARG_BEGIN",
    "CALL_BEGIN",
    "CALL_END",
    "CANONICAL_ID",
    "DEFAULT_SYSTEM_PROMPT",
    "IM_ASSISTANT",
    "IM_END",
    "IM_MIDDLE",
    "IM_SYSTEM",
    "IM_USER",
    "MEDIA_IMAGE",
    "READS_PROVIDER_TRAITS",
    "REQUIRED_TOKENS",
    "SECTION_BEGIN",
    "SECTION_END",
    "THINK",
    "THINKING_SWITCH",
    "THINK_END",
    "TOOL_MARKERS",
    "Assembled",
    "FormatError",
    "KimiK25",
    "RawToolSection",
    "ToolsFormat",
    "check_tokenizer",
    "count_history_tool_calls",
    "find_tool_section",
    "has_marker_text",
    "looks_stripped",
    "make_format",
    "make_probe_rules",
    "name_from_tool_id",
    "render_prompt_blocks",
    "render_prompt_text",
    "reserialize_history_arguments",
    "resolve_tool_id",
    "source_files",
    "tojson",
    "tools_declaration",
]
