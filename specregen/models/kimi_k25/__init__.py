"""Kimi K2.5 as a chat format (`specregen.models.chat_format.ChatFormat`).

format.py: prompt rendering, completion assembly, raw tool-call markers, the id policy;
readings.py: what the servers' lossy parsers leave open (docs/evidence.md); checks.py: the
gate's K2.5 rules; tools_ts.py: K2.5's TypeScript-style tool declaration; chat_template.jinja:
the template written from the SPEC.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specregen.models.kimi_k25.format import (
        ARG_BEGIN,
        CALL_BEGIN,
        CALL_END,
        CANONICAL_ID,
        DEFAULT_SYSTEM_PROMPT,
        IM_ASSISTANT,
        IM_END,
        IM_MIDDLE,
        IM_SYSTEM,
        IM_USER,
        MEDIA_IMAGE,
        READS_PROVIDER_TRAITS,
        REQUIRED_TOKENS,
        SECTION_BEGIN,
        SECTION_END,
        THINK,
        THINK_END,
        THINKING_SWITCH,
        TOOL_MARKERS,
        Assembled,
        FormatError,
        KimiK25,
        RawToolSection,
        ToolsFormat,
        check_tokenizer,
        count_history_tool_calls,
        find_tool_section,
        has_marker_text,
        looks_stripped,
        make_format,
        name_from_tool_id,
        render_prompt_blocks,
        render_prompt_text,
        reserialize_history_arguments,
        resolve_tool_id,
        source_files,
        tojson,
        tools_declaration,
    )
    from specregen.models.kimi_k25.probe import (
        make_probe_rules,
    )

# Where each name lives: loading the package (the registry reads its `family` descriptor)
# imports none of the family's code until a name is asked for.
_WHERE = {
    "ARG_BEGIN": "format",
    "CALL_BEGIN": "format",
    "CALL_END": "format",
    "CANONICAL_ID": "format",
    "DEFAULT_SYSTEM_PROMPT": "format",
    "IM_ASSISTANT": "format",
    "IM_END": "format",
    "IM_MIDDLE": "format",
    "IM_SYSTEM": "format",
    "IM_USER": "format",
    "MEDIA_IMAGE": "format",
    "READS_PROVIDER_TRAITS": "format",
    "REQUIRED_TOKENS": "format",
    "SECTION_BEGIN": "format",
    "SECTION_END": "format",
    "THINK": "format",
    "THINK_END": "format",
    "THINKING_SWITCH": "format",
    "TOOL_MARKERS": "format",
    "Assembled": "format",
    "FormatError": "format",
    "KimiK25": "format",
    "RawToolSection": "format",
    "ToolsFormat": "format",
    "check_tokenizer": "format",
    "count_history_tool_calls": "format",
    "find_tool_section": "format",
    "has_marker_text": "format",
    "looks_stripped": "format",
    "make_format": "format",
    "name_from_tool_id": "format",
    "render_prompt_blocks": "format",
    "render_prompt_text": "format",
    "reserialize_history_arguments": "format",
    "resolve_tool_id": "format",
    "source_files": "format",
    "tojson": "format",
    "tools_declaration": "format",
    "make_probe_rules": "probe",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

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
