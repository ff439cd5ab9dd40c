"""Whole conversations as input (issue 10 item 1): adapters, prompt lines, config, fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specregen.client.prompts import PromptLineError, parse_prompt_line
from specregen.client.request import build_request
from specregen.config import parse_config
from specregen.conversation import plan_conversation
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.prompts import prompt_from_json, prompt_to_json
from specregen.records import Prompt, SourceReject
from specregen.sources import read_source
from tests.support import SHARED
from tests.unit.test_client_support import make_cfg

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
GLAIVE_ROW = {
    "system": "SYSTEM: You are a helpful assistant with access to the following functions. Use"
              " them if required -\n" + json.dumps(WEATHER, indent=4) + "\n\n\n",
    "chat": "USER: Weather in Paris?\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\","
            " \"arguments\": '{\"city\": \"Paris\"}'} <|endoftext|>\n\n\nFUNCTION RESPONSE:"
            " {\"temp\": 20}\n\n\nASSISTANT: It is 20 degrees in Paris. <|endoftext|>\n\n\n"
            "USER: And in Rome?\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\","
            " \"arguments\": '{\"city\": \"Rome\"}'} <|endoftext|>\n\n\nFUNCTION RESPONSE:"
            " {\"temp\": 25}\n\n\nASSISTANT: 25 in Rome. <|endoftext|>",
}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one(adapter: str, path: Path, **options) -> Prompt | SourceReject:
    (record,) = list(read_source(adapter, path, dataset="D", **options))
    return record


def call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def test_glaive_whole_conversation(tmp_path):
    src = write_jsonl(tmp_path / "g.jsonl", [GLAIVE_ROW])
    first = one("glaive", src)
    whole = one("glaive", src, turns="all")
    assert isinstance(whole, Prompt) and isinstance(first, Prompt)
    assert whole.sample_id == first.sample_id  # the conversation keeps the row's stable id
    assert first.turns == "first" and whole.turns == "all"
    assert whole.tools == first.tools and whole.meta == first.meta
    assert whole.messages == [
        first.messages[0],
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("call_0", "get_weather", '{"city": "Paris"}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"temp": 20}'},
        {"role": "assistant", "content": "It is 20 degrees in Paris."},
        {"role": "user", "content": "And in Rome?"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("call_1", "get_weather", '{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 25}'},
        {"role": "assistant", "content": "25 in Rome."},
    ]
    plan = plan_conversation(whole)
    assert [len(t.steps) for t in plan.turns] == [2, 2]


def test_glaive_whole_conversation_keeps_the_rejects_and_refuses_an_unanswered_call(tmp_path):
    unanswered = {**GLAIVE_ROW, "chat": GLAIVE_ROW["chat"].split("\n\n\nFUNCTION")[0]
                  + "\n\n\nUSER: hello?"}
    broken = {**GLAIVE_ROW, "chat": "ASSISTANT: hi"}
    src = write_jsonl(tmp_path / "g.jsonl", [unanswered, broken])
    reasons = [r.reason for r in read_source("glaive", src, dataset="D", turns="all")]
    assert reasons == [
        "row g.jsonl#0: messages[2] has 1 tool call(s) but 0 tool result(s) follow it",
        "row g.jsonl#1: chat starts with a ASSISTANT turn, not USER",
    ]
    # the first-turn prompt of the unanswered row is still fine
    assert isinstance(one("glaive", write_jsonl(tmp_path / "u.jsonl", [unanswered])), Prompt)


def test_messages_whole_conversation(tmp_path):
    row = {"id": "r1", "tools": [WEATHER], "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            call("a", "get_weather", '{"city":"Paris"}'),
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "20"},
        {"role": "tool", "content": "25"},
        {"role": "assistant", "content": "20 and 25."}]}
    whole = one("messages", write_jsonl(tmp_path / "m.jsonl", [row]), turns="all")
    assert isinstance(whole, Prompt) and whole.turns == "all"
    assert whole.sample_id == one("messages", tmp_path / "m.jsonl").sample_id
    assert whole.messages[0] == {"role": "system", "content": "be brief"}
    assert whole.messages[2]["tool_calls"] == [
        call("a", "get_weather", '{"city":"Paris"}'),  # the row's own id and argument text
        call("call_1", "get_weather", '{"city": "Rome"}')]  # synthesized id, JSON text
    plan = plan_conversation(whole)
    assert plan.turns[0].steps[0].results == [whole.messages[3], whole.messages[4]]
    legacy = {"messages": [{"role": "user", "content": "x"},
                           {"role": "function", "content": "y"}]}
    reject = one("messages", write_jsonl(tmp_path / "l.jsonl", [legacy]), turns="all")
    assert isinstance(reject, SourceReject) and "legacy 'function' message" in reject.reason


def test_sharegpt_whole_conversation(tmp_path):
    row = {"id": "s1", "tools": json.dumps([WEATHER]), "conversations": [
        {"from": "human", "value": "Paris and Rome?"},
        {"from": "gpt", "value": "Let me look."},
        {"from": "function_call", "value": json.dumps([
            {"name": "get_weather", "arguments": {"city": "Paris"}},
            {"name": "get_weather", "arguments": {"city": "Rome"}}])},
        {"from": "observation", "value": "20"},
        {"from": "observation", "value": "25"},
        {"from": "gpt", "value": "20 and 25."},
        {"from": "human", "value": "thanks"},
        {"from": "gpt", "value": "welcome"}]}
    whole = one("sharegpt", write_jsonl(tmp_path / "s.jsonl", [row]), turns="all")
    assert isinstance(whole, Prompt)
    assert whole.messages == [
        {"role": "user", "content": "Paris and Rome?"},
        # the gpt text right before the calls is the calling message's content
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            call("call_0", "get_weather", '{"city": "Paris"}'),
            call("call_1", "get_weather", '{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "call_0", "content": "20"},
        {"role": "tool", "tool_call_id": "call_1", "content": "25"},
        {"role": "assistant", "content": "20 and 25."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "welcome"}]


def test_real_glaive_conversations_convert(tmp_path):
    src = SHARED / "datasets" / "B1_glaive_llamafactory_sharegpt_demo.jsonl"
    records = list(read_source("sharegpt", src, dataset="B1", turns="all"))
    prompts = [r for r in records if isinstance(r, Prompt)]
    rejects = [r for r in records if isinstance(r, SourceReject)]
    assert len(prompts) == 265 and all("duplicate of sample_id" in r.reason for r in rejects)
    with_tools = [p for p in prompts if any(m.get("tool_calls") for m in p.messages)]
    assert len(with_tools) > 100
    for p in prompts:
        plan_conversation(p)


def test_options_refuse_unknown_turns(tmp_path):
    with pytest.raises(ValueError, match="turns must be one of"):
        list(read_source("glaive", tmp_path / "x.jsonl", dataset="D", turns="some"))


def test_prompt_lines_carry_turns_and_the_flag_overrides():
    line = json.dumps({"sample_id": "c", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"}]})
    assert parse_prompt_line(line).turns == "first"
    assert parse_prompt_line(line, turns="all").turns == "all"
    row = json.loads(line)
    assert parse_prompt_line(json.dumps({**row, "turns": "all"})).turns == "all"
    with pytest.raises(PromptLineError, match="'turns' must be one of"):
        parse_prompt_line(json.dumps({**row, "turns": "two"}))
    bad = json.dumps({"sample_id": "b", "messages": [{"role": "assistant", "content": "x"},
                                                     {"role": "user", "content": "y"}]})
    with pytest.raises(PromptLineError, match=r"sample b: messages\[0\] is an assistant"):
        parse_prompt_line(bad, turns="all")


def test_a_conversations_request_body_is_its_first_request():
    prompt = parse_prompt_line(json.dumps({"sample_id": "c", "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]}),
        turns="all")
    assert build_request(prompt, make_cfg())["messages"] == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]


def test_prompt_chunks_keep_turns_only_when_all():
    first = Prompt("a", [{"role": "user", "content": "x"}])
    whole = Prompt("b", [{"role": "user", "content": "x"}], turns="all")
    assert "turns" not in json.loads(prompt_to_json(first))
    assert json.loads(prompt_to_json(whole))["turns"] == "all"
    assert prompt_from_json(prompt_to_json(whole)) == whole
    assert prompt_from_json(prompt_to_json(first)) == first


def config(tmp_path, **dataset):
    return parse_config({"storage": str(tmp_path), "endpoint": {
        "base_url": "http://localhost:1/v1", "model": "moonshotai/kimi-k2.5"},
        "datasets": [{"name": "D", "adapter": "glaive", "source": "bundled:B1_glaive",
                      **dataset}]})


def test_dataset_turns_config_and_fingerprints(tmp_path):
    plain = config(tmp_path)
    first = config(tmp_path, turns="first")
    whole = config(tmp_path, turns="all")
    assert plain.datasets[0].adapter_options == {"tool_mode": "tools"}
    assert whole.datasets[0].adapter_options == {"tool_mode": "tools", "turns": "all"}
    fp = {name: DatasetRun(c, c.datasets[0]).prompts_fp
          for name, c in (("plain", plain), ("first", first), ("whole", whole))}
    assert fp["plain"] == fp["first"] != fp["whole"]
    from specregen.config import ConfigError

    with pytest.raises(ConfigError, match="turns: all needs an adapter with whole"):
        parse_config({"storage": str(tmp_path), "endpoint": {
            "base_url": "http://localhost:1/v1", "model": "moonshotai/kimi-k2.5"},
            "datasets": [{"name": "D", "adapter": "magicoder", "source": "x", "turns": "all"}]})
    with pytest.raises(ConfigError, match=r"needs endpoint\.mode realtime"):
        parse_config({"storage": str(tmp_path), "endpoint": {
            "base_url": "http://localhost:1/v1", "model": "moonshotai/kimi-k2.5", "mode": "batch",
            "provider": {"only": ["moonshotai"]}},
            "datasets": [{"name": "D", "adapter": "glaive", "source": "x", "turns": "all"}]})


def test_conversation_progress_counts_conversations_and_requests_in_flight():
    from specregen.client.engine import ProgressSnapshot
    from specregen.progress import Progress, engine_observer

    progress = Progress("infer", total=10)
    observe = engine_observer(progress)  # the one observer of the CLI and the Prefect task
    # 7 answers so far, 5 of them to conversations' requests; 3 conversations stopped
    observe(ProgressSnapshot(done=7, failed=0, in_flight=4, requests_per_s=1.0,
                             tokens_per_s=1.0, cost_usd=0.5, completion_tokens=70,
                             conversations=6, conversations_done=3,
                             conversation_requests_done=5))
    state = progress.state()
    assert (state.done, state.in_flight, state.tokens, state.total) == (3 + 2, 4, 70, 10)
