"""Golden tests for the port of Kimi K2.5's `tool_declaration_ts.py`.

Every expected string was derived by reading the upstream source
(thinking-machines-lab/tinker-cookbook `tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`
@3cd853c, a copy of the HF moonshotai/Kimi-K2.5 file) and then checked by running that source.
The first cases reproduce the tools used in tinker-cookbook's `kimi_k25_test.py`, whose own
assertions are substring checks; those substrings are asserted here too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from specregen.models.kimi_k25.tools_ts import (
    ToolDeclarationError,
    deep_sort,
    encode_tools_to_typescript,
)

HEADER = "# Tools\n\n## functions\nnamespace functions {\n"
FOOTER = "\n}\n"


def function_tool(
    name: str, parameters: dict[str, Any] | None, description: str | None = None
) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def declare(*tools: dict[str, Any]) -> str:
    return encode_tools_to_typescript(list(tools))


# --- tinker-cookbook kimi_k25_test.py cases ----------------------------------------------------

TINKER_WEATHER = function_tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "The city and state, e.g. San Francisco, CA",
            },
            "unit": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "description": "Temperature unit",
            },
        },
        "required": ["location"],
    },
    "Get the current weather for a location",
)


def test_tinker_weather_tool() -> None:
    out = declare(TINKER_WEATHER)
    assert out == (
        HEADER + "// Get the current weather for a location\n"
        "type get_weather = (_: {\n"
        "  // The city and state, e.g. San Francisco, CA\n"
        "  location: string,\n"
        "  // Temperature unit\n"
        '  unit?: "celsius" | "fahrenheit"\n'
        "}) => any;" + FOOTER
    )
    # tinker's own assertions
    for needle in ("# Tools", "## functions", "namespace functions {", "type get_weather = (_:"):
        assert needle in out
    assert '"celsius"' in out and '"fahrenheit"' in out
    assert "// Get the current weather" in out


def test_tinker_multiple_tools_are_joined_by_newline() -> None:
    weather = function_tool(
        "get_weather",
        {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
        "Get the current weather for a location",
    )
    search = function_tool(
        "search_web",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        "Search the web for information",
    )
    assert declare(weather, search) == (
        HEADER + "// Get the current weather for a location\n"
        "type get_weather = (_: {\n"
        "  location: string\n"
        "}) => any;\n"
        "// Search the web for information\n"
        "type search_web = (_: {\n"
        "  query: string\n"
        "}) => any;" + FOOTER
    )


def test_empty_tool_list_is_empty_string() -> None:
    assert encode_tools_to_typescript([]) == ""


# --- field ordering, integer, enum, defaults, constraints --------------------------------------


def test_weather_tool_with_required_optional_enum_integer_default() -> None:
    tool = function_tool(
        "get_weather",
        {
            "type": "object",
            "properties": {
                "unit": {
                    "type": "string",
                    "enum": ["celsius", "fahrenheit"],
                    "description": "Temperature unit",
                    "default": "celsius",
                },
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "days": {
                    "type": "integer",
                    "description": "Forecast days",
                    "minimum": 1,
                    "maximum": 7,
                    "default": 1,
                },
                "country": {"type": "string", "maxLength": 2, "pattern": "^[A-Z]{2}$"},
                "verbose": {"type": "boolean", "default": False},
                "ratio": {"type": "number", "default": 0.5},
            },
            "required": ["location", "country"],
        },
        "Get the current weather for a location",
    )
    assert declare(tool) == (
        HEADER + "// Get the current weather for a location\n"
        "type get_weather = (_: {\n"
        "  // maxLength: 2, pattern: ^[A-Z]{2}$\n"
        "  country: string,\n"
        "  // The city and state, e.g. San Francisco, CA\n"
        "  location: string,\n"
        "  // Forecast days\n"
        "  // maximum: 7, minimum: 1\n"
        "  // Default: 1\n"
        "  days?: number,\n"
        "  // Default: 0.5\n"
        "  ratio?: number,\n"
        "  // Temperature unit\n"
        '  // Default: "celsius"\n'
        '  unit?: "celsius" | "fahrenheit",\n'
        "  // Default: False\n"
        "  verbose?: boolean\n"
        "}) => any;" + FOOTER
    )


def test_python_spellings_in_enums_and_defaults_are_kept() -> None:
    tool = function_tool(
        "pick",
        {
            "type": "object",
            "properties": {
                "flag": {"enum": [True, None, 1.0]},
                "tags": {"type": "array", "items": {"type": "string"}, "default": ["a", "ü"]},
                "filters": {"type": "object", "default": {"b": 1, "a": None}},
                "nothing": {"type": "string", "default": None},
            },
        },
    )
    assert declare(tool) == (
        HEADER + "type pick = (_: {\n"
        '  // Default: {"a": null, "b": 1}\n'
        "  filters?: {},\n"
        "  flag?: True | None | 1.0,\n"
        "  nothing?: string,\n"
        '  // Default: ["a", "ü"]\n'
        "  tags?: Array<string>\n"
        "}) => any;" + FOOTER
    )


def test_multiline_description_keeps_empty_lines_bare() -> None:
    tool = function_tool(
        "note",
        {"type": "object", "properties": {"text": {"type": "string", "description": "a\n\nb"}}},
        "First line.\n\nSecond line.",
    )
    assert declare(tool) == (
        HEADER + "// First line.\n\n// Second line.\n"
        "type note = (_: {\n"
        "  // a\n\n  // b\n"
        "  text?: string\n"
        "}) => any;" + FOOTER
    )


# --- nested objects and arrays ------------------------------------------------------------------


def test_nested_object() -> None:
    tool = function_tool(
        "create_user",
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "description": "The user to create",
                    "properties": {
                        "name": {"type": "string"},
                        "age": {"type": "integer"},
                        "address": {
                            "type": "object",
                            "properties": {"zip": {"type": "string", "description": "Postcode"}},
                            "required": ["zip"],
                        },
                    },
                    "required": ["name"],
                }
            },
            "required": ["user"],
        },
        "Create a new user record.",
    )
    assert declare(tool) == (
        HEADER + "// Create a new user record.\n"
        "type create_user = (_: {\n"
        "  // The user to create\n"
        "  user: {\n"
        "    name: string,\n"
        "    address?: {\n"
        "      // Postcode\n"
        "      zip: string\n"
        "    },\n"
        "    age?: number\n"
        "  }\n"
        "}) => any;" + FOOTER
    )


def test_array_of_described_objects_uses_multiline_form() -> None:
    tool = function_tool(
        "place_order",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "description": "Line items",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "description": "One line item",
                        "properties": {
                            "sku": {"type": "string", "description": "Stock unit"},
                            "qty": {"type": "integer"},
                        },
                        "required": ["sku"],
                    },
                },
                "notes": {"type": "array", "items": {"type": "string", "maxLength": 80}},
                "rows": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"a": {"type": "string"}}},
                },
                "anything": {"type": "array"},
            },
            "required": ["items"],
        },
    )
    assert declare(tool) == (
        HEADER + "type place_order = (_: {\n"
        "  // Line items\n"
        "  // minItems: 1\n"
        "  items: Array<\n"
        "    // One line item\n"
        "    {\n"
        "      // Stock unit\n"
        "      sku: string,\n"
        "      qty?: number\n"
        "    }\n"
        "  >,\n"
        "  anything?: Array<any>,\n"
        "  notes?: Array<\n"
        "    // maxLength: 80\n"
        "    string\n"
        "  >,\n"
        # A one-line array item is rendered at the field's indent, not one level deeper.
        "  rows?: Array<{\n"
        "    a?: string\n"
        "  }>\n"
        "}) => any;" + FOOTER
    )


# --- unions, additionalProperties ---------------------------------------------------------------


def test_any_of_and_type_lists() -> None:
    tool = function_tool(
        "lookup",
        {
            "type": "object",
            "properties": {
                "id": {
                    "anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}],
                    "description": "An id",
                },
                "maybe": {"type": ["string", "null"]},
                "shape": {
                    "anyOf": [
                        {"type": "object", "properties": {"x": {"type": "number"}}},
                        {"type": "array", "items": {"type": "integer"}},
                        {"enum": ["auto"]},
                    ]
                },
                "loose": {"type": ["object", "array", "integer", "boolean"]},
            },
            "required": ["id"],
        },
    )
    assert declare(tool) == (
        HEADER + "type lookup = (_: {\n"
        "  // An id\n"
        "  id: string | number | null,\n"
        "  loose?: {} | Array<any> | number | boolean,\n"
        "  maybe?: string | null,\n"
        "  shape?: {\n"
        "    x?: number\n"
        '  } | Array<number> | "auto"\n'
        "}) => any;" + FOOTER
    )


def test_additional_properties() -> None:
    tool = function_tool(
        "tag",
        {
            "type": "object",
            "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "additionalProperties": True},
                "meta": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}},
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
            },
            "required": ["labels"],
            "additionalProperties": False,
        },
    )
    assert declare(tool) == (
        HEADER + "type tag = (_: {\n"
        "  labels: {\n"
        "    [k: string]: string\n"
        "  },\n"
        "  extra?: {\n"
        "    [k: string]: any\n"
        "  },\n"
        "  meta?: {\n"
        "    id?: number,\n"
        "    [k: string]: Array<string>\n"
        "  },\n"
        "  [k: string]: never\n"
        "}) => any;" + FOOTER
    )


# --- $defs / $ref -------------------------------------------------------------------------------


def test_defs_become_interfaces_in_sorted_order() -> None:
    tool = function_tool(
        "save_contact",
        {
            "type": "object",
            "$defs": {
                "Color": {"type": "string", "enum": ["red", "green"]},
                "Address": {
                    "type": "object",
                    "description": "A postal address",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    "required": ["street", "city"],
                },
            },
            "properties": {
                "home": {"$ref": "#/$defs/Address", "description": "Home address"},
                "color": {"$ref": "#/$defs/Color"},
                "others": {"type": "array", "items": {"$ref": "#/$defs/Address"}},
            },
            "required": ["home"],
        },
        "Save a contact",
    )
    assert declare(tool) == (
        HEADER + "// A postal address\n"
        "interface Address {\n"
        "  city: string,\n"
        "  street: string\n"
        "}\n"
        # A non-object definition keeps upstream's odd `interface X <type>` shape.
        'interface Color "red" | "green"\n'
        "// Save a contact\n"
        "type save_contact = (_: {\n"
        "  // Home address\n"
        "  home: Address,\n"
        "  color?: Color,\n"
        "  others?: Array<Address>\n"
        "}) => any;" + FOOTER
    )


def test_self_reference_declares_root_interface_in_key_order() -> None:
    tool = function_tool(
        "tree",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#"}},
            },
            "required": ["name"],
        },
    )
    # The root interface lists fields in (deep-sorted) key order, not required-first.
    assert declare(tool) == (
        HEADER + "interface parameters {\n"
        "  children?: Array<parameters>,\n"
        "  name: string\n"
        "}\n"
        "type tree = (_: parameters) => any;" + FOOTER
    )


# --- empty parameters, no description, skipped tools -------------------------------------------


@pytest.mark.parametrize(
    "parameters",
    [{}, None, {"type": "object"}, {"type": "object", "properties": {}}],
    ids=["empty", "missing", "no-properties", "empty-properties"],
)
def test_empty_parameters(parameters: dict[str, Any] | None) -> None:
    tool = function_tool("ping", parameters, "Check the service is up")
    assert declare(tool) == (
        HEADER + "// Check the service is up\ntype ping = (_: {}) => any;" + FOOTER
    )


def test_tool_without_description_has_no_comment() -> None:
    tool = function_tool(
        "set_status",
        {
            "type": "object",
            "properties": {"status": {"enum": ["active", "paused", "done"]}},
            "required": ["status"],
        },
    )
    assert declare(tool) == (
        HEADER + "type set_status = (_: {\n"
        '  status: "active" | "paused" | "done"\n'
        "}) => any;" + FOOTER
    )


def test_non_function_tools_are_skipped() -> None:
    retrieval = {"type": "retrieval"}
    assert declare(retrieval) == ""
    assert declare(retrieval, function_tool("ping", {})) == (
        HEADER + "type ping = (_: {}) => any;" + FOOTER
    )


# --- deep_sort ----------------------------------------------------------------------------------


def test_deep_sort_sorts_every_dict_and_keeps_list_order() -> None:
    data = {"z": [{"b": 1, "a": [{"d": 0, "c": 0}]}, 3], "a": {"y": 1, "x": (2, 1)}}
    result = deep_sort(data)
    assert result == data
    assert list(result) == ["a", "z"]
    assert list(result["a"]) == ["x", "y"]
    assert list(result["z"][0]) == ["a", "b"]
    assert list(result["z"][0]["a"][0]) == ["c", "d"]
    assert result["a"]["x"] == (2, 1)
    assert list(data) == ["z", "a"], "the input must not be reordered in place"


def test_encoding_does_not_depend_on_input_key_order() -> None:
    parameters = {
        "type": "object",
        "$defs": {"B": {"type": "string"}, "A": {"type": "integer"}},
        "properties": {"b": {"$ref": "#/$defs/B"}, "a": {"$ref": "#/$defs/A"}},
    }
    reordered = dict(reversed(list(parameters.items())))
    assert declare(function_tool("f", parameters)) == declare(function_tool("f", reordered))
    assert "interface A number\ninterface B string\n" in declare(function_tool("f", parameters))


# --- schemas the original rejects (the wrapper then falls back to JSON) ------------------------


@pytest.mark.parametrize(
    ("schema", "field", "reason"),
    [
        ({"oneOf": [{"type": "string"}]}, "parameters.properties.value", "none of"),
        ({"description": "untyped"}, "parameters.properties.value", "none of"),
        ({"type": "string", "enum": ["a", 1]}, "parameters.properties.value.enum", "1"),
        ({"type": ["string", "float"]}, "parameters.properties.value.type[1]", "float"),
        ({"$ref": "#/$defs/Missing"}, "parameters.properties.value.$ref", "not found"),
        ({"$ref": "#/definitions/X"}, "parameters.properties.value.$ref", "unsupported"),
        (
            {"type": "object", "additionalProperties": "yes"},
            "parameters.properties.value.additionalProperties",
            "additionalProperties",
        ),
        ({"type": "string", "description": 5}, "parameters.properties.value.description", "int"),
        ({"type": "array", "items": "string"}, "parameters.properties.value.items", "str"),
    ],
    ids=[
        "oneOf",
        "only-description",
        "enum-type-mismatch",
        "unknown-type-in-list",
        "missing-ref",
        "definitions-ref",
        "bad-additionalProperties",
        "non-string-description",
        "string-items",
    ],
)
def test_unsupported_schema_raises_naming_tool_and_field(
    schema: dict[str, Any], field: str, reason: str
) -> None:
    tool = function_tool("broken", {"type": "object", "properties": {"value": schema}})
    with pytest.raises(ToolDeclarationError) as caught:
        declare(function_tool("fine", {}), tool)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.tool == "tools[1] ('broken')"
    assert error.field_path == field
    assert reason in error.reason
    assert "'broken'" in str(error) and field in str(error)


def test_malformed_tool_entry_raises() -> None:
    with pytest.raises(ToolDeclarationError, match=r"tools\[0\]"):
        encode_tools_to_typescript(["not a tool"])  # type: ignore[list-item]


# --- real tokenizer -----------------------------------------------------------------------------

# SPEC §1.2: Kimi's pre-tokenizer pattern, alternatives joined with "|".
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
HEADER_IDS = [2, 30391, 382, 798, 8271, 198, 6370, 8271, 440]


def test_header_token_ids_with_real_vocabulary() -> None:
    folder = os.environ.get("KIMI_TOKENIZER_DIR")
    if not folder:
        pytest.skip("KIMI_TOKENIZER_DIR is not set")
    model_path = Path(folder) / "tiktoken.model"
    if not model_path.is_file():
        pytest.skip(f"no tiktoken.model in {folder}")
    encoding = tiktoken.Encoding(
        name="kimi-k2.5",
        pat_str=KIMI_PAT_STR,
        mergeable_ranks=load_tiktoken_bpe(str(model_path)),
        special_tokens={},
    )
    assert encoding.encode(HEADER) == HEADER_IDS
    # The header stays a token-aligned prefix once a real declaration follows it.
    ids = encoding.encode(declare(TINKER_WEATHER))
    assert ids[: len(HEADER_IDS)] == HEADER_IDS
    assert encoding.decode(ids) == declare(TINKER_WEATHER)
