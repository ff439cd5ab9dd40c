"""Dataset tool specs are only JSON-Schema-like: each documented quirk, and invalid schemas."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specregen.gate import GateConfig, check_sample, run_gate
from specregen.gate.declared import by_prompt, declared_tools
from specregen.gate.schema import validate_arguments
from specregen.pipeline.prompts import prompt_from_json, prompt_to_json
from specregen.records import Prompt, TokenSample, ToolCall
from specregen.sources import read_source
from specregen.sources.declared import declared_by
from tests.unit.test_gate import build, call


def outcome(parameters, arguments):
    return validate_arguments(parameters, arguments)


@pytest.mark.parametrize("parameters", [{}, None])
def test_empty_parameters_mean_any_object(parameters):
    result = outcome(parameters, {"anything": [1, 2]})
    assert result.error is None and result.problem is None
    assert result.quirks == ("empty_parameters",)


def test_missing_top_level_type_means_object():
    params = {"properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert outcome(params, {"n": 3}).quirks == ("top_type_missing",)
    assert "required" in outcome(params, {}).error


def test_required_names_that_properties_do_not_declare_are_dropped():
    params = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}
    result = outcome(params, {"a": "x"})
    assert result.error is None and "required_undeclared" in result.quirks
    assert "required" in outcome(params, {}).error  # the declared one still counts


@pytest.mark.parametrize(
    "spelling, good, bad",
    [("int", 3, "3"), ("float", 1.5, "1.5"), ("str", "x", 1), ("bool", True, 1),
     ("list", [1], {}), ("dict", {}, []), ("Integer", 2, 2.5), ("None", None, 0)],
)
def test_python_type_spellings_map_to_json_types(spelling, good, bad):
    params = {"type": "object", "properties": {"v": {"type": spelling}}}
    ok = outcome(params, {"v": good})
    assert ok.error is None and "python_type_name" in ok.quirks
    assert "type at $.v" in outcome(params, {"v": bad}).error


def test_type_lists_and_any():
    params = {"type": "object", "properties": {"v": {"type": ["str", "null"]},
                                               "w": {"type": "any"}}}
    assert outcome(params, {"v": None, "w": {"x": 1}}).error is None
    assert "type_any" in outcome(params, {"w": 1}).quirks


def test_enum_is_type_strict_and_widens_its_type():
    params = {"type": "object", "properties": {
        "level": {"type": "string", "enum": ["low", 2, True]},
        "n": {"type": "integer", "enum": [1, 2]},
    }}
    result = outcome(params, {"level": 2})
    assert result.error is None and "enum_type_widened" in result.quirks
    assert outcome(params, {"level": True}).error is None
    assert "enum" in outcome(params, {"level": "2"}).error  # "2" is not 2
    assert "enum" in outcome(params, {"level": 1}).error  # 1 is not true
    assert outcome(params, {"n": 1.0}).error is None  # 1.0 is the number 1
    assert outcome(params, {"n": True}).error is not None


def test_unknown_keywords_are_ignored_and_format_is_an_annotation():
    params = {"type": "object", "x-vendor": {"a": 1}, "properties": {
        "when": {"type": "string", "format": "date", "example": "2024-01-01", "units": "days"}}}
    assert outcome(params, {"when": "not a date"}).error is None


def test_draft3_required_flags_and_openapi_nullable():
    params = {"type": "object", "properties": {
        "a": {"type": "string", "required": True},
        "b": {"type": "string", "required": False, "nullable": True},
    }}
    result = outcome(params, {"a": "x", "b": None})
    assert result.error is None
    assert {"required_boolean", "openapi_nullable"} <= set(result.quirks)
    assert "required" in outcome(params, {"b": "y"}).error


def test_tuple_items_and_empty_property_list():
    params = {"type": "object", "properties": {
        "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}}}
    assert outcome(params, {"pair": ["a", 1]}).error is None
    assert "type at $.pair[1]" in outcome(params, {"pair": ["a", "b"]}).error
    assert outcome({"type": "object", "properties": []}, {"x": 1}).quirks == (
        "properties_empty_list",)


def test_draft7_by_schema_uri():
    params = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"pair": {"type": "array", "items": [{"type": "string"}],
                                      "additionalItems": False}}}
    assert outcome(params, {"pair": ["a"]}).error is None
    assert outcome(params, {"pair": ["a", "b"]}).error is not None


def test_nested_schemas_are_normalised_too():
    params = {"type": "object", "properties": {"filters": {
        "type": "dict", "properties": {"tags": {"type": "list", "items": {"type": "str"}}},
        "required": ["tags", "ghost"]}}}
    assert outcome(params, {"filters": {"tags": ["a"]}}).error is None
    assert "type at $.filters.tags[0]" in outcome(params, {"filters": {"tags": [1]}}).error


@pytest.mark.parametrize(
    "parameters, words",
    [
        ({"type": "object", "properties": {"d": {"type": "date"}}}, "unknown type 'date'"),
        ({"type": "array"}, "top-level type is 'array'"),
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "5"}}},
         "is not of type 'number'"),
        ({"type": "object", "properties": "city"}, "is not of type 'object'"),
        ({"type": "object", "properties": {"p": {"type": "string", "pattern": "(["}}},
         "regex"),
        ("not a schema", "parameters is a str"),
        ({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}},
         "Unresolvable"),
    ],
)
def test_invalid_schemas_are_problems_not_crashes(parameters, words):
    result = outcome(parameters, {"x": 1, "n": 1, "d": 1, "p": "a"})
    assert result.error is None
    assert result.problem is not None and words in result.problem, result.problem


def test_local_refs_resolve():
    params = {"type": "object", "$defs": {"city": {"type": "string"}},
              "properties": {"c": {"$ref": "#/$defs/city"}}}
    assert outcome(params, {"c": "Paris"}).error is None
    assert "type" in outcome(params, {"c": 1}).error


def test_schema_invalid_reason_names_the_tool(mini_fmt):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object",
                                              "properties": {"city": {"type": "place"}}}}}]
    request = {"messages": [{"role": "system", "content": "s"},
                            {"role": "user", "content": "u"}], "tools": tools}
    sample = build(mini_fmt, {"reasoning": "r", "content": None, "tool_calls": [call()]},
                   "tool_calls", request)
    decision = check_sample(sample, mini_fmt, GateConfig())
    assert [r.check for r in decision.reasons] == ["schema_invalid"]
    assert "tool 'get_weather'" in decision.reasons[0].detail
    assert "unknown type 'place'" in decision.reasons[0].detail


def test_quirks_are_counted_in_the_report(mini_fmt):
    from specregen.gate import run_gate

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "properties": {"city": {"type": "str"}}, "required": ["city", "country"]}}}]
    request = {"messages": [{"role": "system", "content": "s"},
                            {"role": "user", "content": "u"}], "tools": tools}
    sample = build(mini_fmt, {"reasoning": "r", "content": None, "tool_calls": [call()]},
                   "tool_calls", request)
    report = run_gate([sample, sample], mini_fmt, GateConfig(), dataset="d")
    assert report.passed
    assert report.schema_quirks == {"python_type_name": 2, "required_undeclared": 2,
                                    "top_type_missing": 2}
    assert "| `python_type_name` | 2 |" in report.to_markdown()


def test_declarations_that_cannot_be_read():
    twice = [{"type": "function", "function": {"name": "f", "parameters": {}}},
             {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}]
    sent = dataclasses.replace(TokenSample.failed("s", "x"), tools=twice)
    declared = declared_tools(sent)
    assert declared.source == "tools" and "declared twice" in declared.problem
    bare = declared_tools(dataclasses.replace(sent, tools=[{"name": "g"}]))
    assert list(bare.schemas) == ["g"] and bare.problem is None
    # A glaive-style system prompt that does not parse: the adapter states why, and the gate
    # keeps it as the declaration's problem.
    glaive_broken = [{"role": "system", "content": "You are a helpful assistant with access "
                      "to the following functions. Use them if required -\n{\"name\": "}]
    statement = declared_by(None, glaive_broken)
    assert statement.tools is None and "not valid JSON" in statement.problem
    broken = declared_tools(TokenSample.failed("s", "x"), statement)
    assert broken.source == "system_prompt" and broken.problem == statement.problem


BROKEN_SYSTEM = ("You are a helpful assistant with access to the following functions. Use them "
                 "if required -\n{oops")
# What the gate said before adapters stated declarations (it parsed the system prompt itself).
UNREADABLE = (
    "name_declared: 'get_weather' is not declared in the system prompt; declared: no function "
    "declared (the declaration could not be read: system prompt: system function #0 is not "
    "valid JSON (Expecting property name enclosed in double quotes at character 2 of the "
    "function list): 'oops')"
)


def test_undeclared_call_names_the_unreadable_declaration(mini_fmt):
    sample = build(mini_fmt, {"reasoning": "r", "content": None, "tool_calls": [call()]},
                   "tool_calls")
    broken_system = [{"role": "system", "content": BROKEN_SYSTEM},
                     {"role": "user", "content": "u"}]
    forged = dataclasses.replace(sample, tools=None, tool_mode="system_prompt",
                                 messages=broken_system,
                                 tool_calls=[ToolCall("functions.get_weather:0", "get_weather",
                                                      '{"city": "Paris"}')])
    statement = declared_by(None, broken_system)
    reasons = check_sample(forged, mini_fmt, GateConfig(), statement).reason_strings()
    assert reasons == [UNREADABLE]


def test_a_row_whose_system_prompt_does_not_parse_is_quarantined_as_before(tmp_path, mini_fmt):
    """A messages row without tools whose system prompt is a broken glaive declaration is still
    a prompt; its problem travels with it (through a prompt chunk) and the gate quarantines the
    calls with the words it used when it parsed the system prompt itself."""
    row = {"id": "r0", "messages": [{"role": "system", "content": BROKEN_SYSTEM},
                                    {"role": "user", "content": "Weather in Paris?"}]}
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(row) + "\n")
    (prompt,) = read_source("messages", str(source), dataset="d")
    assert isinstance(prompt, Prompt) and prompt.tools is None
    assert prompt.declared_tools is None
    assert prompt.declaration_problem.startswith("system prompt: system function #0 is not valid")
    prompt = prompt_from_json(prompt_to_json(prompt))
    sample = build(mini_fmt, {"reasoning": "r", "content": None, "tool_calls": [call()]},
                   "tool_calls", {"messages": prompt.messages}, sample_id=prompt.sample_id)
    quarantined = []
    run_gate([sample], mini_fmt, GateConfig(max_quarantine_share=1.0), dataset="d",
             declarations=by_prompt({prompt.sample_id: prompt.declaration}),
             on_quarantine=lambda s, decision: quarantined.append(decision.reason_strings()))
    assert [r for r in quarantined[0] if r.startswith("name_declared")] == [UNREADABLE]
