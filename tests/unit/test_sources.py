"""Dataset adapters: upstream-schema fixtures, the glaive defect catalogue, the real rows."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from specregen.pipeline.prompts import prompt_from_json, prompt_to_json
from specregen.records import Declaration, Prompt, SourceReject
from specregen.sources import (
    ADAPTERS,
    BUNDLED_SAMPLES,
    DEFAULT_SYSTEM_PROMPT,
    glaive,
    read_source,
)
from specregen.sources._common import RowError
from specregen.sources._io import iter_json_array, iter_rows
from specregen.sources.ids import canonical_json, content_id
from specregen.sources.magicoder import OSS_INSTRUCTION_PREFIX

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
GLAIVE_DEFECTS = FIXTURES / "glaive_defects.json"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"

TOOLS_SYSTEM = (
    "You are a helpful assistant with access to the following functions. Use them if required."
)
NO_FUNCTIONS_SYSTEM = "You are a helpful assistant, with no access to external functions."


def records(adapter: str, source: Path | str, **kwargs: Any) -> list[Prompt | SourceReject]:
    kwargs.setdefault("dataset", "test")
    return list(read_source(adapter, str(source), **kwargs))


def by_row(items: list[Prompt | SourceReject]) -> dict[int, Prompt | SourceReject]:
    """Records keyed by their 0-based source row number."""
    keyed = {}
    for item in items:
        label = item.row if isinstance(item, SourceReject) else item.meta["source_row"]
        keyed[int(label.rsplit("#", 1)[1])] = item
    return keyed


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


def function_call_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# --- registry and arguments -----------------------------------------------------------------


def test_adapters_are_registered_and_add_no_system_prompt_of_their_own():
    assert set(ADAPTERS) == {"glaive", "opencodeinstruct", "magicoder", "messages", "sharegpt"}
    # A row without a system text gets none: the chat format's template decides (K2.5 injects
    # its default), not the adapter.
    assert DEFAULT_SYSTEM_PROMPT is None


def test_unknown_adapter_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown adapter 'alpaca'.*glaive.*magicoder"):
        read_source("alpaca", str(GLAIVE_DEFECTS), dataset="x")


def test_options_are_checked_before_reading():
    missing = "/nonexistent/never-opened.json"
    with pytest.raises(
        ValueError, match=r"does not take instruction_prefix; it takes: .*tool_mode"
    ):
        read_source("glaive", missing, dataset="x", instruction_prefix=True)
    with pytest.raises(ValueError, match="tool_mode must be one of"):
        read_source("glaive", missing, dataset="x", tool_mode="tool")
    with pytest.raises(ValueError, match="instruction_prefix must be a bool"):
        read_source("magicoder", missing, dataset="x", instruction_prefix="yes")
    with pytest.raises(ValueError, match="takes: no options"):
        read_source("opencodeinstruct", missing, dataset="x", tool_mode="tools")
    with pytest.raises(ValueError, match="limit"):
        read_source("glaive", missing, dataset="x", limit=-1)


# --- glaive: the defect fixture -------------------------------------------------------------

# Row number in glaive_defects.json -> the words its reject reason must hold.
GLAIVE_DEFECT_REASONS = {
    10: "chat turn #1 (ASSISTANT): arguments are not valid JSON: Invalid \\escape",
    11: "chat turn #1 (ASSISTANT): arguments are not valid JSON: Infinity is not JSON",
    12: "chat turn #1 (ASSISTANT): arguments are not valid JSON: Expecting value",
    13: "arguments are not a JSON object (got array)",
    14: "arguments are not a JSON object (got null)",
    15: "call has 'parameters' instead of 'arguments'",
    16: "truncated call: the quoted arguments never close",
    17: "one '}' too many after the call",
    18: "text before <functioncall>",
    19: "chat turn #2: FUNCTION RESPONSE follows no call",
    20: "chat turn #1 (ASSISTANT): stray 'ASSISTANT:' inside the turn",
    21: "chat turn #2 (FUNCTION RESPONSE): stray 'ASSISTANT:' inside the turn",
    22: "chat turn #0 (USER): stray 'ASSISTANT:' inside the turn",
    23: "calls undeclared function 'create_to_do_list' (declared: 'create_to-do_list')",
    24: "system declares function 'convert_currency' twice with different definitions",
    25: "duplicate of sample_id",
}
GLAIVE_GOOD_ROWS = range(10)


@pytest.fixture(scope="module")
def glaive_defects() -> dict[int, Prompt | SourceReject]:
    return by_row(records("glaive", GLAIVE_DEFECTS, dataset="glaive_defects"))


@pytest.mark.parametrize(("row", "words"), sorted(GLAIVE_DEFECT_REASONS.items()))
def test_each_glaive_defect_is_rejected_with_its_reason(glaive_defects, row, words):
    record = glaive_defects[row]
    assert isinstance(record, SourceReject)
    assert record.row == f"glaive_defects.json#{row}"
    assert record.reason.startswith(f"row glaive_defects.json#{row}: ")
    assert words in record.reason


def test_glaive_good_rows_all_become_prompts(glaive_defects):
    assert len(glaive_defects) == 26
    for row in GLAIVE_GOOD_ROWS:
        prompt = glaive_defects[row]
        assert isinstance(prompt, Prompt), prompt
        assert [m["role"] for m in prompt.messages] == ["system", "user"]
        assert prompt.meta["source_row"] == f"glaive_defects.json#{row}"


def test_glaive_no_function_row(glaive_defects):
    prompt = glaive_defects[0]
    assert prompt.messages == [
        {"role": "system", "content": NO_FUNCTIONS_SYSTEM},
        {"role": "user", "content": "Assign this occupation to the appropriate category\nNurse"},
    ]
    assert prompt.tools is None
    assert prompt.meta["reference_first_turn"] == {"kind": "text", "content": "Healthcare"}
    assert prompt.sample_id == content_id(
        "glaive_defects", json.loads(GLAIVE_DEFECTS.read_text())[0]
    )


def test_glaive_two_function_row_with_a_first_call(glaive_defects):
    prompt = glaive_defects[2]
    assert prompt.messages[0] == {"role": "system", "content": TOOLS_SYSTEM}
    assert (
        prompt.messages[-1]["content"] == "What's the weather like in Tokyo right now? Use celsius."
    )
    assert prompt.tool_mode == "tools"
    assert [t["function"]["name"] for t in prompt.tools] == ["get_weather", "get_stock_price"]
    assert prompt.tools[1] == function_call_tool(
        "get_stock_price",
        "Get the current price of a stock",
        {
            "type": "object",
            "properties": {"symbol": {"type": "string", "description": "The stock ticker symbol"}},
            "required": ["symbol"],
        },
    )
    assert prompt.meta["reference_first_turn"] == {
        "kind": "tool_call",
        "name": "get_weather",
        "arguments": '{"city": "Tokyo", "unit": "celsius"}',
    }


def test_glaive_pretty_printed_arguments_with_an_apostrophe(glaive_defects):
    reference = glaive_defects[4].meta["reference_first_turn"]
    assert reference["name"] == "send_email"
    assert reference["arguments"] == (
        '{"recipient": "sam@example.com", "subject": "Lunch", '
        '"message": "Hey, let\'s meet at noon tomorrow."}'
    )


def test_glaive_unicode_is_kept_raw(glaive_defects):
    prompt = glaive_defects[1]
    assert prompt.messages[-1]["content"] == "Can you translate something into French for me?"
    turns = glaive.parse_chat(json.loads(GLAIVE_DEFECTS.read_text())[1]["chat"])
    assert turns[3].call == (
        "translate_text",
        {"text": "Grüße aus München – see you at the café", "target_language": "French"},
    )


def test_glaive_identical_duplicate_definitions_keep_one(glaive_defects):
    prompt = glaive_defects[5]
    assert [t["function"]["name"] for t in prompt.tools] == ["get_random_joke"]
    assert prompt.tools[0]["function"]["parameters"] == {}
    assert prompt.meta["duplicate_functions_dropped"] == ["get_random_joke"]


def test_glaive_arguments_written_as_an_object(glaive_defects):
    assert glaive_defects[6].meta["reference_first_turn"] == {
        "kind": "tool_call",
        "name": "calculate_bmi",
        "arguments": '{"weight": 70, "height": 1.75}',
    }
    strict = by_row(records("glaive", GLAIVE_DEFECTS, accept_object_arguments=False))
    assert isinstance(strict[6], SourceReject)
    assert "arguments written as a JSON object" in strict[6].reason


def test_glaive_role_words_inside_a_line_do_not_split_turns(glaive_defects):
    prompt = glaive_defects[7]
    assert prompt.messages[-1]["content"] == (
        "In a chat log, what does the prefix 'USER: ' mean? And 'ASSISTANT: '?"
    )


def test_glaive_reference_is_none_when_the_next_turn_is_not_an_answer(glaive_defects):
    assert glaive_defects[8].messages[-1]["content"] == "I have a question about sorting."
    assert glaive_defects[8].meta["reference_first_turn"] is None


def test_glaive_missing_final_end_of_text(glaive_defects):
    assert glaive_defects[9].meta["reference_first_turn"] == {
        "kind": "text",
        "content": "Hello! How can I help you today?",
    }


def test_glaive_system_prompt_mode_keeps_the_functions_in_the_system_text():
    rows = json.loads(GLAIVE_DEFECTS.read_text())
    modes = {
        mode: by_row(records("glaive", GLAIVE_DEFECTS, tool_mode=mode))
        for mode in ("tools", "system_prompt")
    }
    for row in (2, 5):
        as_tools, in_system = modes["tools"][row], modes["system_prompt"][row]
        assert in_system.tool_mode == "system_prompt"
        assert in_system.messages[0]["content"] == rows[row]["system"].removeprefix("SYSTEM: ")
        assert in_system.messages[0]["content"].startswith(
            "You are a helpful assistant with access to the following functions. "
            "Use them if required -\n{\n"
        )
        assert in_system.tools == as_tools.tools
        assert in_system.messages[1] == as_tools.messages[1]
        assert in_system.sample_id == as_tools.sample_id
    no_functions = modes["system_prompt"][0]
    assert no_functions.messages[0]["content"] == NO_FUNCTIONS_SYSTEM
    assert no_functions.tools is None


@pytest.mark.parametrize("turns", ["first", "all"])
def test_glaive_states_the_declared_functions_in_both_tool_modes(turns):
    """The adapter puts the row's functions on the prompt, whether they are sent as `tools` or
    written in the system prompt: what the system prompt declares, read by glaive's parser."""
    rows = json.loads(GLAIVE_DEFECTS.read_text())
    modes = {
        mode: by_row(records("glaive", GLAIVE_DEFECTS, tool_mode=mode, turns=turns))
        for mode in ("tools", "system_prompt")
    }
    for row in (2, 5):
        as_tools, in_system = modes["tools"][row], modes["system_prompt"][row]
        specs, _dropped = glaive.parse_system(rows[row]["system"])
        expected = [{"type": "function", "function": spec} for spec in specs]
        assert as_tools.declared_tools == as_tools.tools == expected
        assert in_system.declared_tools == expected
        # glaive refuses a row whose system field does not parse: no problem to state.
        assert as_tools.declaration_problem is in_system.declaration_problem is None
        assert in_system.declaration == as_tools.declaration
    for mode in ("tools", "system_prompt"):
        no_functions = modes[mode][0]
        assert no_functions.declared_tools is None and no_functions.declaration_problem is None


def test_other_adapters_state_their_tools_or_a_glaive_style_system_prompt(tmp_path):
    weather = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    glaive_system = glaive.FUNCTIONS_LEAD_IN + "\n" + json.dumps(weather, indent=4)
    rows = [
        {"id": "tools", "tools": [weather],
         "messages": [{"role": "system", "content": glaive_system},
                      {"role": "user", "content": "Hi"}]},
        {"id": "system", "messages": [{"role": "system", "content": glaive_system},
                                      {"role": "user", "content": "Hi"}]},
        {"id": "broken", "messages": [{"role": "system", "content": glaive_system[:-3]},
                                      {"role": "user", "content": "Hi"}]},
        {"id": "plain", "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hi"}]},
    ]
    got = {p.sample_id.rsplit(":", 1)[-1]: p
           for p in records("messages", write_jsonl(tmp_path / "m.jsonl", rows))}
    wrapped = [{"type": "function", "function": weather}]
    assert got["tools"].declared_tools == got["tools"].tools == wrapped
    # Sent as nothing (no `tools`), declared in the system prompt: the request is unchanged.
    assert got["system"].tools is None and got["system"].declared_tools == wrapped
    broken = got["broken"]
    assert isinstance(broken, Prompt) and broken.declared_tools is None
    assert broken.declaration_problem.startswith("system prompt: system function #0 is not valid")
    assert got["plain"].declared_tools is None and got["plain"].declaration_problem is None
    shared = {"conversations": [{"from": "system", "value": glaive_system},
                                {"from": "human", "value": "Hi"}]}
    (prompt,) = records("sharegpt", write_jsonl(tmp_path / "s.jsonl", [shared]))
    assert prompt.tools is None and prompt.declared_tools == wrapped


def test_a_prompt_chunk_written_before_adapters_stated_declarations_reads_the_same():
    """An older chunk's line has no `declared_tools`: it gets what its adapter states today, so
    its samples gate as they did; a new line states its own, even when it is none."""
    prompts = [p for p in records("glaive", GLAIVE_DEFECTS, tool_mode="system_prompt")
               if isinstance(p, Prompt)]
    assert any(p.declared_tools for p in prompts)
    for prompt in prompts:
        line = json.loads(prompt_to_json(prompt))
        assert "declared_tools" in line and "declaration_problem" not in line
        del line["declared_tools"]
        assert prompt_from_json(json.dumps(line)) == prompt
        assert prompt_from_json(prompt_to_json(prompt)) == prompt
    stated_none = Prompt("s", [{"role": "system", "content": glaive.FUNCTIONS_LEAD_IN + "\n{}"},
                               {"role": "user", "content": "u"}])
    assert prompt_from_json(prompt_to_json(stated_none)).declaration == Declaration()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            """ {"name": "detect_language", "arguments": '{"text": "Je suis un étudiant"}'} """,
            ("detect_language", {"text": "Je suis un étudiant"}),
        ),
        (
            """ {"name": "get_lyrics", "arguments": '{\n  "title": "Shape of You"\n}'} """,
            ("get_lyrics", {"title": "Shape of You"}),
        ),
        (' {"name": "generate_random_id", "arguments": {}} ', ("generate_random_id", {})),
        (
            """ {"name": "echo", "arguments": '{"text": "it's a '} test"}'} """,
            ("echo", {"text": "it's a '} test"}),
        ),
    ],
)
def test_glaive_call_forms(text, expected):
    assert glaive.parse_call(text) == expected


def test_glaive_chat_that_does_not_start_with_a_user_turn_is_rejected(tmp_path):
    source = write_jsonl(
        tmp_path / "g.jsonl",
        [
            {
                "system": glaive.SYSTEM_TAG + NO_FUNCTIONS_SYSTEM,
                "chat": "ASSISTANT: Hi <|endoftext|>",
            },
            {"system": "You are helpful.", "chat": "USER: Hi"},
            {"system": glaive.SYSTEM_TAG + NO_FUNCTIONS_SYSTEM, "chat": "Hi there\n\nUSER: Hi"},
        ],
    )
    rejects = records("glaive", source)
    assert [type(r) for r in rejects] == [SourceReject] * 3
    assert "chat starts with a ASSISTANT turn, not USER" in rejects[0].reason
    assert "system does not start with 'SYSTEM: '" in rejects[1].reason
    assert "chat does not start with a turn tag" in rejects[2].reason


# --- the bundled samples --------------------------------------------------------------------


def test_bundled_glaive_sample_is_clean():
    adapter, path = BUNDLED_SAMPLES["B1_glaive"]
    prompts = records(adapter, path, dataset="B1_glaive")
    assert len(prompts) == 24
    assert all(isinstance(p, Prompt) for p in prompts)
    with_tools = [p for p in prompts if p.tools]
    assert len(with_tools) == 13
    kinds = [
        p.meta["reference_first_turn"]["kind"] for p in prompts if p.meta["reference_first_turn"]
    ]
    assert kinds.count("tool_call") == 11
    assert len({p.sample_id for p in prompts}) == 24
    assert all(p.sample_id.startswith("B1_glaive-") for p in prompts)


def test_bundled_opencodeinstruct_sample():
    import pyarrow.parquet as pq

    adapter, path = BUNDLED_SAMPLES["B2_opencodeinstruct"]
    table = pq.read_table(path)
    assert table.column_names == [
        "id",
        "input",
        "output",
        "domain",
        "generation_algorithm",
        "llm_judgement",
        "unit_tests",
        "tests_execution_status",
        "average_test_score",
    ]
    assert all(str(field.type) == "string" for field in table.schema)
    rows = table.to_pylist()
    prompts = records(adapter, path, dataset="B2_opencodeinstruct")
    assert len(prompts) == 24
    for row, prompt in zip(rows, prompts, strict=True):
        assert prompt.sample_id == row["id"]
        assert prompt.messages == [{"role": "user", "content": row["input"]}]
        assert prompt.tools is None
        assert prompt.meta["domain"] == row["domain"]
        assert prompt.meta["generation_algorithm"] == row["generation_algorithm"]
        assert prompt.meta["reference_first_turn"] == {"kind": "text", "content": row["output"]}


def test_bundled_magicoder_sample_with_and_without_the_prefix():
    adapter, path = BUNDLED_SAMPLES["B3_magicoder"]
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert all(
        list(r)
        == ["lang", "raw_index", "index", "seed", "openai_fingerprint", "problem", "solution"]
        for r in rows
    )
    plain = records(adapter, path, dataset="B3_magicoder")
    prefixed = records(adapter, path, dataset="B3_magicoder", instruction_prefix=True)
    assert len(plain) == len(prefixed) == 24
    for row, a, b in zip(rows, plain, prefixed, strict=True):
        assert a.messages[-1]["content"] == row["problem"]
        assert b.messages[-1]["content"] == OSS_INSTRUCTION_PREFIX + row["problem"]
        assert a.sample_id == b.sample_id
        assert a.meta["variant"] == "oss"
        assert a.meta["lang"] == row["lang"]


def test_bundled_samples_stay_small():
    total = sum(path.stat().st_size for _, path in BUNDLED_SAMPLES.values())
    total += sum(path.stat().st_size for path in FIXTURES.iterdir())
    assert total < 200_000


# --- other adapters -------------------------------------------------------------------------


def test_opencodeinstruct_jsonl_and_row_problems(tmp_path):
    source = write_jsonl(
        tmp_path / "oci.jsonl",
        [
            {"id": "abc123", "input": "Write fizzbuzz.", "output": "...", "domain": "generic"},
            {"id": "no-input", "output": "..."},
            {"id": "bad-input", "input": ["not", "a", "string"]},
            {"input": "Reverse a string.", "output": "s[::-1]"},
        ],
    )
    got = records("opencodeinstruct", source, dataset="oci")
    assert got[0].sample_id == "abc123"
    assert got[0].meta["domain"] == "generic"
    assert "generation_algorithm" not in got[0].meta
    assert got[1].reason == "row oci.jsonl#1: missing field 'input'"
    assert got[1].sample_id == "no-input"
    assert got[2].reason == "row oci.jsonl#2: field 'input' is not a string (got array)"
    assert got[3].sample_id == content_id(
        "oci", {"input": "Reverse a string.", "output": "s[::-1]"}
    )


def test_magicoder_detects_evol_rows_and_rejects_unknown_ones(tmp_path):
    source = write_jsonl(
        tmp_path / "mc.jsonl",
        [
            {"instruction": "Fix this loop.", "response": "Done."},
            {"prompt": "neither"},
        ],
    )
    evol, unknown = records("magicoder", source, instruction_prefix=True)
    assert evol.messages[-1]["content"] == "Fix this loop."
    assert evol.meta["variant"] == "evol"
    assert evol.meta["reference_first_turn"] == {"kind": "text", "content": "Done."}
    assert "neither 'problem' (OSS-Instruct) nor 'instruction' (Evol)" in unknown.reason


WEATHER_SPEC = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_messages_adapter(tmp_path):
    wrapped = {"type": "function", "function": WEATHER_SPEC}
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    source = write_jsonl(
        tmp_path / "msgs.jsonl",
        [
            {
                "id": "m1",
                "messages": [
                    {"role": "system", "content": "  Be brief.  "},
                    {"role": "user", "content": "Weather in Oslo?\n"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                ],
                "tools": [wrapped],
            },
            {
                "prompt_id": "u7",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                ],
                "tools": json.dumps([WEATHER_SPEC]),
            },
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [call]},
                ]
            },
            {"messages": [{"role": "assistant", "content": "I speak first"}]},
            {"messages": "nope"},
        ],
    )
    got = records("messages", source)
    first = got[0]
    assert first.sample_id == "m1"
    # byte-exact: no stripping outside glaive
    assert first.messages == [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Weather in Oslo?\n"},
    ]
    assert first.tools == [wrapped]
    assert first.meta["reference_first_turn"] == {
        "kind": "tool_call",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
    }
    second = got[1]
    assert second.sample_id == "u7"
    assert second.messages[0]["role"] == "user"
    assert second.tools == [wrapped]
    assert second.meta["reference_first_turn"] == {"kind": "text", "content": "Hello"}
    assert "messages[0].content is not a string (got array)" in got[2].reason
    assert "messages[1] calls undeclared function 'get_weather'" in got[3].reason
    assert "messages[0] is a 'assistant' turn, not 'user'" in got[4].reason
    assert "field 'messages' is not a list (got string)" in got[5].reason


def test_sharegpt_adapter(tmp_path):
    source = write_jsonl(
        tmp_path / "sg.jsonl",
        [
            {
                "id": "sg-1",
                "conversations": [
                    {"from": "system", "value": "You are terse."},
                    {"from": "human", "value": "2+2?"},
                    {"from": "chatgpt", "value": "4"},
                ],
            },
            {
                "conversations": [
                    {"from": "human", "value": "Weather in Rome?"},
                    {
                        "from": "function_call",
                        "value": '{"name": "get_weather", "arguments": {"city": "Rome"}}',
                    },
                    {"from": "observation", "value": '{"temp": 21}'},
                    {"from": "gpt", "value": "21 degrees."},
                ],
                "tools": json.dumps([WEATHER_SPEC]),
            },
            {"conversations": [{"from": "gpt", "value": "Hi"}, {"from": "human", "value": "Hey"}]},
            {
                "conversations": [
                    {"from": "human", "value": "a"},
                    {"from": "narrator", "value": "b"},
                ]
            },
            {
                "conversations": [
                    {"from": "human", "value": "a"},
                    {"from": "observation", "value": "{}"},
                ]
            },
            {
                "conversations": [
                    {"from": "human", "value": "a"},
                    {"from": "function_call", "value": "{'name': 'x'}"},
                ],
            },
        ],
    )
    got = records("sharegpt", source)
    assert got[0].sample_id == "sg-1"
    assert got[0].messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
    ]
    assert got[0].meta["reference_first_turn"] == {"kind": "text", "content": "4"}
    assert got[1].tools == [{"type": "function", "function": WEATHER_SPEC}]
    assert got[1].messages[0]["role"] == "user"
    assert got[1].meta["reference_first_turn"] == {
        "kind": "tool_call",
        "name": "get_weather",
        "arguments": '{"city": "Rome"}',
    }
    assert "conversations[0] is a 'assistant' turn, not a human turn" in got[2].reason
    assert "conversations[1] has unknown role 'narrator'" in got[3].reason
    assert "conversations[1]: observation follows no function_call" in got[4].reason
    assert "conversations[1]: function_call is not valid JSON" in got[5].reason


# --- reading, ids, duplicates, limit --------------------------------------------------------


def test_sample_ids_do_not_depend_on_row_order(tmp_path):
    rows = json.loads(GLAIVE_DEFECTS.read_text())[:-1]  # without the duplicate row
    reordered = tmp_path / "reordered.json"
    reordered.write_text(json.dumps(rows[::-1]), "utf-8")
    forward = records("glaive", GLAIVE_DEFECTS, dataset="g")[:-1]
    backward = records("glaive", reordered, dataset="g")
    assert [r.sample_id for r in backward] == [r.sample_id for r in forward][::-1]
    assert len({r.sample_id for r in forward}) == len(forward)
    # the id is the hash of the canonical row: key order and whitespace do not matter
    shuffled_keys = {"chat": rows[0]["chat"], "system": rows[0]["system"]}
    assert canonical_json(shuffled_keys) == canonical_json(rows[0])


def test_duplicate_rows_keep_the_first(glaive_defects):
    first, again = glaive_defects[0], glaive_defects[25]
    assert isinstance(first, Prompt)
    assert again.sample_id == first.sample_id
    assert again.reason == (
        f"row glaive_defects.json#25: duplicate of sample_id {first.sample_id} "
        "(an earlier row has the same id)"
    )


def test_limit_counts_prompts_only():
    got = records("glaive", GLAIVE_DEFECTS, limit=3)
    assert [type(r) for r in got] == [Prompt] * 3
    # rows 10.. are rejects; a limit past them stops right after the 10th prompt
    got = records("glaive", GLAIVE_DEFECTS, limit=10)
    assert len(got) == 10
    assert records("glaive", GLAIVE_DEFECTS, limit=0) == []
    assert len(records("glaive", GLAIVE_DEFECTS, limit=1000)) == 26


def test_bad_jsonl_line_and_missing_field_do_not_stop_the_iteration(tmp_path):
    source = tmp_path / "mixed.jsonl"
    good = {"problem": "Sum two ints.", "solution": "a + b"}
    lines = [
        json.dumps(good),
        '{"problem": "unterminated',
        "",
        json.dumps({"solution": 1}),
        json.dumps({"problem": "Multiply."}),
    ]
    source.write_text("\n".join(lines) + "\n", "utf-8")
    got = records("magicoder", source, dataset="mc")
    assert [type(r) for r in got] == [Prompt, SourceReject, SourceReject, Prompt]
    assert got[1].row == "mixed.jsonl#1"
    assert got[1].reason.startswith("row mixed.jsonl#1: line is not valid JSON: ")
    assert got[1].sample_id.startswith("mc-")
    assert got[2].row == "mixed.jsonl#3"  # the blank line keeps its number
    assert "neither 'problem'" in got[2].reason
    assert got[3].meta["source_row"] == "mixed.jsonl#4"


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
def test_json_array_streaming_matches_json_load(chunk_bytes):
    expected = json.loads(GLAIVE_DEFECTS.read_text("utf-8"))
    with GLAIVE_DEFECTS.open("rb") as stream:
        rows = list(iter_json_array(stream, "g.json", chunk_bytes=chunk_bytes))
    assert [r.value for r in rows] == expected
    assert all(r.error is None for r in rows)
    assert rows[3].label == "g.json#3"


@pytest.mark.parametrize(
    ("text", "values", "error"),
    [
        (b"[]", [], None),
        (b"  \n", [], None),
        (b'\xef\xbb\xbf[1, 22, "\xc3\xa9"]', [1, 22, "é"], None),
        (b'[{"a": 1}, {"a": 2}', [{"a": 1}, {"a": 2}], "the array is not closed"),
        (b'[{"a": 1} {"a": 2}]', [{"a": 1}], "expected ',' or ']'"),
        (b'[{"a": 1}, {"a": }]', [{"a": 1}], "not valid JSON: Expecting value"),
        (b"[1] 2", [1], "text after the closing ']'"),
    ],
)
def test_json_array_edge_cases(text, values, error):
    rows = list(iter_json_array(io.BytesIO(text), "a.json", chunk_bytes=3))
    assert [r.value for r in rows if r.error is None] == values
    errors = [r.error for r in rows if r.error is not None]
    if error is None:
        assert errors == []
    else:
        assert len(errors) == 1
        assert error in errors[0]
        assert rows[-1].error == errors[0]


def test_format_is_detected_from_content_and_compression_is_inferred(tmp_path):
    jsonl_named_json = write_jsonl(tmp_path / "rows.json", [{"a": 1}, {"a": 2}])
    assert [r.value for r in iter_rows(str(jsonl_named_json))] == [{"a": 1}, {"a": 2}]
    packed = tmp_path / "rows.json.gz"
    packed.write_bytes(gzip.compress(GLAIVE_DEFECTS.read_bytes()))
    plain = records("glaive", GLAIVE_DEFECTS, dataset="g")
    unpacked = records("glaive", packed, dataset="g")
    assert [(type(r), r.sample_id) for r in unpacked] == [(type(r), r.sample_id) for r in plain]
    assert unpacked[0].meta["source_row"] == "rows.json.gz#0"


def test_any_fsspec_url_is_read():
    fs = fsspec.filesystem("memory")
    fs.pipe("/specregen-test/glaive.json", GLAIVE_DEFECTS.read_bytes())
    try:
        got = records("glaive", "memory://specregen-test/glaive.json", limit=2)
    finally:
        fs.rm("/specregen-test", recursive=True)
    assert [p.meta["source_row"] for p in got] == ["glaive.json#0", "glaive.json#1"]


def test_a_row_that_is_not_an_object_is_rejected(tmp_path):
    source = tmp_path / "odd.json"
    source.write_text('["just a string", {"system": 1, "chat": "USER: hi"}]', "utf-8")
    got = records("glaive", source)
    assert got[0].reason == "row odd.json#0: row is not a JSON object (got string)"
    assert got[1].reason == "row odd.json#1: field 'system' is not a string (got number)"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (' {"name": "f", "arguments": {"a": ', "truncated call: it stops at"),
        (' {"name": "f", "arguments": {"a": Infinity}} ', "arguments are not valid JSON: Infinity"),
        (' {"arguments": \'{}\', "name": "f"} ', "call is not of the form"),
        (""" {"name": "f", "arguments": '{}'} trailing""", "unexpected text after the call"),
        (""" {"name": "f", "arguments": '{}'}}} """, "2 '}' too many after the call"),
    ],
)
def test_more_broken_calls(text, words):
    with pytest.raises(RowError) as refused:
        glaive.parse_call(text)
    assert words in str(refused.value)


# --- the real rows in ../shared/datasets ----------------------------------------------------


def shared(name: str) -> Path:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is not available")
    return path


def test_real_glaive_rows_parse_as_the_readme_says():
    path = shared("B1_glaive.jsonl")
    prompts = records("glaive", path, dataset="B1_glaive")
    assert len(prompts) == 5
    assert all(isinstance(p, Prompt) for p in prompts)
    row1 = prompts[1]
    assert row1.messages == [
        {"role": "system", "content": TOOLS_SYSTEM},
        {
            "role": "user",
            "content": "Can you tell me the latest news headlines for the United States?",
        },
    ]
    reference = row1.meta["reference_first_turn"]
    assert reference["kind"] == "tool_call"
    assert reference["name"] == "get_news_headlines"
    assert json.loads(reference["arguments"]) == {"country": "United States"}
    assert reference["arguments"] == '{"country": "United States"}'
    assert [t["function"]["name"] for t in prompts[2].tools] == ["generate_password", "create_task"]

    # the whole of row 1: two call rounds (US, then France), each answered
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    turns = glaive.parse_chat(rows[1]["chat"])
    assert [t.role for t in turns] == ["USER", "ASSISTANT", "FUNCTION RESPONSE", "ASSISTANT"] * 2
    assert [t.call for t in turns if t.call] == [
        ("get_news_headlines", {"country": "United States"}),
        ("get_news_headlines", {"country": "France"}),
    ]
    assert "<|endoftext|>" not in "".join(t.content for t in turns)


def test_real_glaive_row_25475():
    path = shared("B1_glaive_row25475_from_test.jsonl")
    (prompt,) = records("glaive", path, dataset="B1_glaive")
    assert prompt.tools == [
        function_call_tool(
            "detect_language",
            "Detect the language of a given text",
            {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "The text to detect the language of"}
                },
                "required": ["text"],
            },
        )
    ]
    assert prompt.meta["reference_first_turn"] == {
        "kind": "text",
        "content": "Of course, I can help with that. Please provide me with the text.",
    }
    row = json.loads(path.read_text("utf-8"))
    turns = glaive.parse_chat(row["chat"])
    assert turns[2].content == 'Here it is - "Je suis un étudiant"'
    assert turns[3].call == ("detect_language", {"text": "Je suis un étudiant"})
    assert turns[4].content == '{"language": "French"}'
    (in_system,) = records("glaive", path, dataset="B1_glaive", tool_mode="system_prompt")
    assert in_system.messages[0]["content"] == row["system"].removeprefix("SYSTEM: ")


def test_real_magicoder_rows():
    oss = shared("B3_magicoder_oss.jsonl")
    evol = shared("B3_magicoder_evol.jsonl")
    (o,) = records("magicoder", oss, dataset="B3_magicoder", instruction_prefix=True)
    (e,) = records("magicoder", evol, dataset="B3_magicoder", instruction_prefix=True)
    assert o.messages[-1]["content"].startswith(
        "Write a solution to the following coding problem:\nYou are given two arrays, A and B"
    )
    assert (o.meta["variant"], o.meta["lang"], o.meta["index"]) == ("oss", "cpp", 4626)
    assert e.meta["variant"] == "evol"
    assert e.messages[-1]["content"] == json.loads(evol.read_text("utf-8"))["instruction"]


def test_real_llamafactory_sharegpt_demo():
    path = shared("B1_glaive_llamafactory_sharegpt_demo.jsonl")
    got = records("sharegpt", path, dataset="B1_glaive_lf")
    prompts = [r for r in got if isinstance(r, Prompt)]
    rejects = [r for r in got if isinstance(r, SourceReject)]
    assert len(got) == 300
    # the demo repeats 35 rows verbatim (e.g. rows 4, 6 and 196); nothing else is refused
    assert len(rejects) == 35
    assert all("duplicate of sample_id" in r.reason for r in rejects)
    assert rejects[0].row == "B1_glaive_llamafactory_sharegpt_demo.jsonl#6"
    assert sum(p.tools is None for p in prompts) > 0  # tools "[]" means none
    first = prompts[0]
    assert first.messages[-1]["content"].startswith("Hi, I have some ingredients")
    assert first.tools[0]["function"]["name"] == "search_recipes"
    assert first.meta["reference_first_turn"]["kind"] == "text"
    calls = [p.meta["reference_first_turn"] for p in prompts if p.meta["reference_first_turn"]]
    assert any(ref["kind"] == "tool_call" for ref in calls)
