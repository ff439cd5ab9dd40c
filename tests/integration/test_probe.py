"""The provider probe against the emulator: every profile classified, the refusal gates `infer`.

Every emulator profile is probed with the mini tokenizer and the bundled glaive sample; the
weather question names the declared tool, so the emulated model calls it in every scenario.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specregen.cli import app
from specregen.client.config import EndpointConfig
from specregen.emulator.config import PROFILES, RECOVERABLE_PROFILES, EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.kimi_k25 import KimiK25
from specregen.probe import (
    ProbeRefusal,
    build_scenarios,
    load_profile,
    probe_endpoint,
    require_recoverable_tool_calls,
)
from specregen.probe.scenarios import WEATHER_TOOL, glaive_probe_prompt, rules_of
from specregen.records import ProviderTraits, TraitMap
from specregen.sources import BUNDLED_SAMPLES
from tests.support import get_tokenizer

# The families' own traits (K2.5's, Qwen3's).
SPACES = "spaces_around_added_tokens"
K25, QWEN3 = rules_of("kimi-k2.5"), rules_of("qwen3")  # their probe rules (history ids)
STRIPS = "strips_content_beside_calls"

pytestmark = pytest.mark.integration

MODEL = "moonshotai/kimi-k2.5"
GLAIVE = str(BUNDLED_SAMPLES["B1_glaive"][1])
# The API each emulated stack speaks; `raw` is a vLLM without tool parsing.
DIALECT = {"openrouter": "openrouter", "vllm": "vllm", "vllm-legacy": "vllm", "vllm-k25": "vllm",
           "sglang": "sglang",
           "sglang-noforce": "sglang", "moonshot": "moonshot", "raw": "vllm",
           "stripped": "openrouter"}
# The profiles whose calls and reasoning come back the same way on every path. (vLLM 0.32,
# `vllm`, cuts a tool section out of the content when the request has no tools: docs/vllm-0.32.md.)
PLAIN_PROFILES = ("openrouter", "vllm-legacy", "sglang", "moonshot", "raw", "stripped")
TOOLS_WHERE = {"openrouter": "structured", "vllm-legacy": "structured", "sglang": "structured",
               "moonshot": "structured", "raw": "raw_content", "stripped": "stripped"}
REASONING_FIELD = {"openrouter": "reasoning", "vllm-legacy": "reasoning",
                   "sglang": "reasoning_content",
                   "moonshot": "reasoning_content", "raw": "reasoning_content",
                   "stripped": "reasoning"}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("mini")


@pytest.fixture(scope="module")
def glaive_prompt():
    return glaive_probe_prompt(GLAIVE)


def emulator(profile: str, tok, **overrides):
    config = EmulatorConfig(profile=profile, seed=7, tool_call_rate=1.0,
                            literal_marker_rate=0.0, **overrides)
    return serve_in_thread(config, tok)


def url_of(emu, profile: str) -> str:
    return emu.openrouter_url if DIALECT[profile] == "openrouter" else emu.url


def endpoint(emu, profile: str, **extra) -> EndpointConfig:
    return EndpointConfig.load({"base_url": url_of(emu, profile), "model": MODEL,
                                "dialect": DIALECT[profile], **extra})


@pytest.mark.parametrize("profile", PLAIN_PROFILES)
def test_every_profile_is_classified(tok, glaive_prompt, profile):
    with emulator(profile, tok) as emu:
        result = probe_endpoint(endpoint(emu, profile), None,
                                build_scenarios(2, glaive_prompt, rules=K25),
                                fmt=KimiK25(tok), tokenizer="mini")
    s = {x.name: x for x in result.scenarios}
    assert list(s) == ["tools", "system_prompt", "glaive", "thinking_on", "thinking_off",
                       "history", "plain", "logprobs"]
    assert all(not x.errors and x.where_counts for x in s.values())
    recoverable = profile in RECOVERABLE_PROFILES
    # Every scenario asks for a call but `plain` and `logprobs`, which ask questions without
    # tools.
    for name in ("plain", "logprobs"):
        assert (s[name].calls_where, s[name].recoverable) == ("none", None), name
        s.pop(name)
    # No emulated stack puts spaces around added tokens when asked not to (the client does).
    assert result.findings.family.get(SPACES) is False, result.findings.evidence
    # With tools: structured where the stack parses calls, raw text where it does not.
    for name in ("tools", "thinking_on", "thinking_off", "history"):
        assert s[name].calls_where == TOOLS_WHERE[profile], name
        assert s[name].where_counts == {TOOLS_WHERE[profile]: 2}
    # Without tools no stack parses calls: the markers stay in content (or are stripped).
    for name in ("system_prompt", "glaive"):
        assert s[name].calls_where == ("raw_content" if recoverable else "stripped"), name
    assert result.reasoning_field == REASONING_FIELD[profile]
    for name in ("tools", "system_prompt", "glaive", "thinking_on"):
        assert s[name].reasoning_field == REASONING_FIELD[profile], name
    assert s["thinking_off"].reasoning_field == "none"
    assert all(o.reasoning_chars == 0 for o in s["thinking_off"].observations)
    for x in s.values():
        assert x.prompt_offsets == [0]
        assert x.latency_s_max > 0
    if recoverable:
        for x in s.values():
            assert x.recoverable is True
            # After two earlier calls K2.5 writes the running count; streamed, no stack here
            # renumbers it.
            first = "functions.get_weather:2" if x.name == "history" else "functions.get_weather:0"
            assert (x.id_form, x.id_example) == ("functions.NAME:IDX", first), x.name
            assert x.arguments_json == "valid"
            assert x.completion_offsets == [0], x.name
        assert result.tool_calls_recoverable is True
        assert result.tool_calls_recoverable_by_mode == {"tools": True, "system_prompt": True}
        require_recoverable_tool_calls(result, "tools")
        require_recoverable_tool_calls(result, "system_prompt")
    else:
        assert all(x.recoverable is False and x.id_form == "none" for x in s.values())
        # The deleted markers show in the counts: the provider counted tokens we cannot rebuild.
        assert all(x.completion_offsets and min(x.completion_offsets) > 0 for x in s.values())
        assert all(o.finish_reason == "tool_calls" for x in s.values() for o in x.observations)
        assert result.tool_calls_recoverable is False
        assert result.tool_calls_recoverable_by_mode == {"tools": False, "system_prompt": False}
        for mode in ("tools", "system_prompt"):
            with pytest.raises(ProbeRefusal) as info:
                require_recoverable_tool_calls(result, mode, probe_file="p.json")
            host = f"127.0.0.1:{emu.port}"
            assert str(info.value).startswith(
                f"the endpoint {MODEL} at {host} returns tool calls with the markers stripped")
            assert (f"when tools are sent as {mode}: they cannot be rebuilt token-exact;"
                    " refusing to start. Probe: p.json") in str(info.value)
    if profile == "openrouter":
        assert all(x.providers == ["Moonshot AI"] for x in s.values())
    if profile in ("openrouter", "vllm-legacy", "sglang", "moonshot"):
        # Structured calls and no token ids: nothing to compare the arguments with.
        assert (s["tools"].arguments, s["tools"].whitespace) == ("unknown", "unknown")
    if profile == "raw":
        assert (s["tools"].arguments, s["tools"].whitespace) == ("verbatim", "kept")


# What each emulated stack's parsers do (docs/upstream-parsers.md), not streamed:
# (renumbers_tool_ids, deletes_no_content, splits_reasoning, counts_stop_token,
#  ends_reasoning_at_tools -- unknown while the model always closes its thinking first,
#  forces_reasoning)
FINDINGS = {
    "openrouter": (False, False, True, True, None, False),
    "vllm": (False, False, True, True, None, False),  # 0.32: no placeholder filter
    "vllm-legacy": (False, True, True, True, None, False),  # kimi_k2's `_clean_content`
    "vllm-k25": (False, False, True, True, None, True),  # forced thinking, no placeholder filter
    "sglang": (True, False, True, True, None, False),  # {name}:{history + index written}
    "sglang-noforce": (True, False, False, True, None, False),  # K2.5's output unsplit
    "moonshot": (False, False, True, True, None, False),
    "raw": (False, False, True, True, None, False),
    "stripped": (None, None, True, True, None, False),  # no call survives to tell
}
# Streamed, SGLang numbers calls by their position in the answer (history + 0, 1, ...), which
# is the running count K2.5 writes, and vLLM's streamed path keeps the placeholder.
STREAMED = {"vllm-legacy": {"deletes_no_content": False}, "sglang": {"renumbers_tool_ids": False},
            "sglang-noforce": {"renumbers_tool_ids": False}}
FINDING_NAMES = ("renumbers_tool_ids", "deletes_no_content", "splits_reasoning",
                 "counts_stop_token", "ends_reasoning_at_tools", "forces_reasoning")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("profile", PROFILES)
def test_the_probe_learns_each_stacks_parser_traits(tok, profile, stream):
    """The model writes `(no content)` before every call; the probe must read each stack's
    behaviour back from its answers alone, and store it as the traits reconstruction takes."""
    with emulator(profile, tok, no_content_before_calls_rate=1.0) as emu:
        cfg = endpoint(emu, profile, stream=stream)
        result = probe_endpoint(cfg, None, build_scenarios(2, rules=K25), fmt=KimiK25(tok),
                                tokenizer="mini")
    expected = dict(zip(FINDING_NAMES, FINDINGS[profile], strict=True))
    if stream:
        expected.update(STREAMED.get(profile, {}))
    found = {name: getattr(result.findings, name) for name in FINDING_NAMES}
    assert found == expected, result.findings.evidence
    assert result.traits() == ProviderTraits(**{n: expected[n] for n in FINDING_NAMES[:5]},
                                             family=TraitMap({SPACES: False}))
    # Seven scenarios (the six with and without tools, logprobs) of two requests each.
    assert result.probe_requests == 14 and result.probe_cost_usd > 0
    assert sum(o.attempts for s in result.scenarios for o in s.observations) == 14


# The model opens its tool section before `</think>`: vLLM's kimi_k2 parser before 0.32 leaves
# it in the reasoning; a forced parser ends the reasoning there and parses the calls (SGLang;
# vLLM 0.32's kimi_k2; vLLM's kimi_k25 only streamed); SGLang unforced never splits, so there
# is nothing to end.
IN_THINK = {"vllm": (True, True), "vllm-legacy": (False, False), "vllm-k25": (False, True),
            "sglang": (True, True), "sglang-noforce": (None, None)}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("profile", sorted(IN_THINK))
def test_the_probe_learns_whether_a_section_ends_the_reasoning(tok, profile, stream):
    with emulator(profile, tok, section_in_think_rate=1.0) as emu:
        result = probe_endpoint(endpoint(emu, profile, stream=stream), None,
                                build_scenarios(2, rules=K25),
                                fmt=KimiK25(tok), tokenizer="mini")
    found = result.findings.ends_reasoning_at_tools
    assert found is IN_THINK[profile][stream], result.findings.evidence
    assert result.traits().ends_reasoning_at_tools is found


@pytest.mark.parametrize(("profile", "expected"), [("vllm-legacy", ("trimmed", "lost")),
                                                   ("vllm", ("verbatim", "kept")),
                                                   ("moonshot", ("verbatim", "kept"))])
def test_token_ids_show_whether_arguments_survive(tok, profile, expected):
    """The model writes whitespace around every argument string, and the probe streams: vLLM
    before 0.32 trims it, 0.32's stream sends the raw arguments, Moonshot keeps them."""
    with emulator(profile, tok, tool_args_whitespace_rate=1.0) as emu:
        cfg = EndpointConfig.load({"base_url": emu.url, "model": MODEL, "dialect": "vllm",
                                   "return_token_ids": True})
        result = probe_endpoint(cfg, None, build_scenarios(2, rules=K25), fmt=KimiK25(tok),
                                tokenizer="mini")
    tools = result.scenario("tools")
    assert tools is not None and (tools.arguments, tools.whitespace) == expected
    matches = {o.reference_match for o in tools.observations}
    assert matches == ({"text_diff"} if profile == "vllm-legacy" else {"exact"})


# ---------------------------------------------------------------------------------------------
# The command line, and `infer --provider-profile`


def probe_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["probe", "--base-url", url, "--model", MODEL, "--tokenizer", "mini",
            "--requests", "2", "--out", str(out), *extra]


def tool_prompts(path: Path) -> Path:
    user = {"role": "user", "content": "What's the weather in Paris?"}
    rows = [
        {"sample_id": "t0", "tools": [WEATHER_TOOL],
         "messages": [{"role": "system", "content": "You are helpful."}, user]},
        {"sample_id": "g0", "tool_mode": "system_prompt", "tools": [WEATHER_TOOL],
         "messages": [{"role": "system", "content": "Functions: get_weather"}, user]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def infer_args(prompts: Path, out: Path, url: str, profile: Path) -> list[str]:
    return ["infer", str(prompts), "--out", str(out), "--base-url", url, "--model", MODEL,
            "--provider-profile", str(profile)]


def test_cli_probe_writes_the_profile_and_prints_the_table(tmp_path, tok):
    out = tmp_path / "profile.json"
    with emulator("openrouter", tok) as emu:
        result = CliRunner().invoke(app, probe_args(emu.openrouter_url, out, "--glaive-source",
                                                    GLAIVE, "--provider-only", "moonshotai",
                                                    "--no-allow-fallbacks"))
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.routing == {"only": ["moonshotai"], "allow_fallbacks": False}
    assert profile.tool_calls_recoverable and profile.glaive_source == GLAIVE
    assert [s.name for s in profile.scenarios][2] == "glaive"
    assert "structured" in result.output and "raw_content" in result.output
    assert "tool calls recoverable as tools: yes" in result.output


def test_infer_refuses_a_stripped_endpoint_before_any_request(tmp_path, tok):
    profile = tmp_path / "profile.json"
    prompts = tool_prompts(tmp_path / "prompts.jsonl")
    with emulator("stripped", tok) as emu:
        probed = CliRunner().invoke(app, probe_args(emu.openrouter_url, profile))
        assert probed.exit_code == 0, probed.output
        assert load_profile(profile).tool_calls_recoverable is False
        emu.reset()
        result = CliRunner().invoke(app, infer_args(prompts, tmp_path / "raw",
                                                    emu.openrouter_url, profile))
        stats = emu.stats()
    assert result.exit_code == 2, result.output
    assert stats["chat_requests"] == 0
    text = " ".join(result.output.split())
    assert "returns tool calls with the markers stripped" in text
    assert f"refusing to start. Probe: {profile}" in text


def test_infer_runs_with_a_good_profile_and_without_tool_prompts(tmp_path, tok):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    with emulator("openrouter", tok) as emu:
        assert CliRunner().invoke(app, probe_args(emu.openrouter_url, good)).exit_code == 0
        emu.reset()
        result = CliRunner().invoke(app, infer_args(tool_prompts(tmp_path / "p.jsonl"),
                                                    tmp_path / "raw", emu.openrouter_url, good))
        assert result.exit_code == 0, result.output
        assert emu.stats()["chat_requests"] == 2
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"sample_id": "c0", "messages": [
        {"role": "user", "content": "Write a sort function."}]}) + "\n")
    with emulator("stripped", tok) as emu:
        assert CliRunner().invoke(app, probe_args(emu.openrouter_url, bad)).exit_code == 0
        result = CliRunner().invoke(app, infer_args(plain, tmp_path / "raw2",
                                                    emu.openrouter_url, bad))
    assert result.exit_code == 0, result.output  # no prompt relies on tool calls


def test_401_names_the_variable_not_the_key(tmp_path, tok, monkeypatch):
    wrong = "sk-or-v1-WRONG-key-that-must-not-be-printed-77"
    monkeypatch.setenv("PROBE_TEST_KEY", wrong)
    out = tmp_path / "profile.json"
    with emulator("openrouter", tok, require_key="sk-or-v1-the-right-key-000000000") as emu:
        result = CliRunner().invoke(app, probe_args(emu.openrouter_url, out, "--api-key-env",
                                                    "PROBE_TEST_KEY"))
    assert result.exit_code == 3, result.output
    assert "PROBE_TEST_KEY" in result.output
    assert wrong not in result.output
    assert not out.exists()


def test_the_profile_never_holds_the_key(tmp_path, tok, monkeypatch):
    secret = "sk-or-v1-SECRET-probe-key-that-must-never-leak-42"
    monkeypatch.setenv("PROBE_TEST_KEY", secret)
    out = tmp_path / "profile.json"
    with emulator("openrouter", tok, require_key=secret) as emu:
        result = CliRunner().invoke(app, probe_args(emu.openrouter_url, out, "--api-key-env",
                                                    "PROBE_TEST_KEY"))
    assert result.exit_code == 0, result.output
    assert load_profile(out).api_key_env == "PROBE_TEST_KEY"
    assert secret not in result.output
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the key leaked into {path}"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--tool-mode", "json"], "--tool-mode"),
     (["--dialect", "vllm", "--provider-only", "x"], "provider"),
     (["--quantizations", "int3"], "quantizations"),
     (["--glaive-source", "/nonexistent/glaive.json"], "cannot read the glaive source"),
     (["--tokenizer", "/nonexistent/tok"], "tokenizer")],
)
def test_bad_usage_exits_2_before_any_request(tmp_path, tok, args, message):
    with emulator("openrouter", tok) as emu:
        result = CliRunner().invoke(app, probe_args(emu.openrouter_url,
                                                    tmp_path / "p.json", *args))
        assert emu.stats()["chat_requests"] == 0
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_remote_endpoint_without_a_key_is_bad_usage(tmp_path, monkeypatch):
    monkeypatch.delenv("PROBE_ABSENT_KEY", raising=False)
    result = CliRunner().invoke(app, ["probe", "--base-url", "https://example.invalid/v1",
                                      "--model", MODEL, "--api-key-env", "PROBE_ABSENT_KEY",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2
    assert "PROBE_ABSENT_KEY is not set" in result.output


# ---------------------------------------------------------------------------------------------
# Qwen3 (`models/qwen3/probe.py`): vLLM with the hermes parser, OpenRouter in front of it, SGLang
# with the qwen25 detector. The model writes no call ids (the server makes them) and calls only
# tools sent in `tools`, so the system-prompt scenario gets no call and stays inconclusive.

QWEN3_MODEL = "Qwen/Qwen3-8B"
QWEN3_DIALECT = {"vllm-hermes": "vllm", "openrouter": "openrouter", "sglang": "sglang"}
QWEN3_ID_PREFIX = {"vllm-hermes": "chatcmpl-tool-", "openrouter": "chatcmpl-tool-",
                   "sglang": "call_"}
QWEN3_REASONING = {"vllm-hermes": "reasoning", "openrouter": "reasoning",
                   "sglang": "reasoning_content"}
# SGLang strips the text before the calls in a plain answer, not in a stream (docs/qwen3.md);
# vLLM's hermes returns it as written either way.
QWEN3_STRIPS = {("vllm-hermes", False): False, ("vllm-hermes", True): False,
                ("openrouter", False): False, ("openrouter", True): False,
                ("sglang", False): True, ("sglang", True): False}


@pytest.fixture(scope="module")
def qwen3_tok():
    from specregen.models.tokenizer import load_tokenizer

    return load_tokenizer("mini-qwen3")


def qwen3_emulator(profile: str, tok, **overrides):
    config = EmulatorConfig(profile=profile, model=QWEN3_MODEL, seed=7, tool_call_rate=1.0,
                            literal_marker_rate=0.0, **overrides)
    return serve_in_thread(config, tok)


def qwen3_endpoint(emu, profile: str, **extra) -> EndpointConfig:
    dialect = QWEN3_DIALECT[profile]
    url = emu.openrouter_url if dialect == "openrouter" else emu.url
    return EndpointConfig.load({"base_url": url, "model": QWEN3_MODEL, "dialect": dialect,
                                **extra})


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("profile", sorted(QWEN3_DIALECT))
def test_qwen3_endpoints_are_probed(qwen3_tok, profile, stream):
    from specregen.models.registry import get_format

    with qwen3_emulator(profile, qwen3_tok) as emu:
        cfg = qwen3_endpoint(emu, profile, stream=stream)
        assert cfg.format_name == "qwen3"
        result = probe_endpoint(cfg, None, build_scenarios(3, rules=QWEN3),
                                fmt=get_format("qwen3", qwen3_tok), tokenizer="mini-qwen3")
    s = {x.name: x for x in result.scenarios}
    assert all(not x.errors for x in s.values())
    for name in ("tools", "thinking_on", "thinking_off", "history"):
        x = s[name]
        assert (x.calls_where, x.where_counts, x.recoverable) == (
            "structured", {"structured": 3}, True), name
        # The server's ids: the form the probe expects of Qwen3, never counted as wrong.
        assert x.id_form == "server" and x.id_example.startswith(QWEN3_ID_PREFIX[profile])
        assert x.arguments_json == "valid" and x.prompt_offsets == [0]
        assert x.completion_offsets == [0], name
    # Tools declared only in the system prompt: no parser runs (no `tools`), so the model's
    # `<tool_call>` blocks come back as content, read by the format's own parser.
    assert (s["system_prompt"].calls_where, s["system_prompt"].recoverable) == (
        "raw_content", True)
    assert (s["plain"].calls_where, s["plain"].recoverable) == ("none", None)
    assert result.tool_calls_recoverable is True
    assert result.tool_calls_recoverable_by_mode == {"tools": True, "system_prompt": True}
    require_recoverable_tool_calls(result, "tools")  # no refusal for recoverable calls
    assert result.reasoning_field == QWEN3_REASONING[profile]
    assert s["thinking_off"].reasoning_field == "none"
    f = result.findings
    assert (f.counts_stop_token, f.splits_reasoning, f.forces_reasoning) == (True, True, False)
    assert (f.renumbers_tool_ids, f.deletes_no_content, f.ends_reasoning_at_tools) == (
        None, None, None)
    assert "nothing to renumber" in f.evidence["renumbers_tool_ids"]
    assert f.family.get(STRIPS) is QWEN3_STRIPS[(profile, stream)], f.evidence
    assert not any("tool_id_rewritten" in n for n in result.notes)
    # The emulator sends no logprobs; Qwen3's fast tokenizer puts no spaces in (not examined).
    assert (f.returns_logprobs, f.family.get(SPACES)) == (False, None), f.evidence
    assert result.probe_requests == 21 and result.probe_cost_usd > 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_qwen3_token_ids_show_the_arguments_and_content_as_written(qwen3_tok, stream):
    from specregen.models.registry import get_format

    with qwen3_emulator("vllm-hermes", qwen3_tok) as emu:
        cfg = qwen3_endpoint(emu, "vllm-hermes", stream=stream, return_token_ids=True)
        result = probe_endpoint(cfg, None, build_scenarios(2, rules=QWEN3),
                                fmt=get_format("qwen3", qwen3_tok), tokenizer="mini-qwen3")
    tools = result.scenario("tools")
    assert tools is not None and (tools.arguments, tools.whitespace) == ("verbatim", "kept")
    assert {o.reference_match for o in tools.observations} == {"exact"}
    assert result.findings.family.get(STRIPS) is False
    assert "by the model's ids returned as written" in (
        result.findings.evidence["strips_content_beside_calls"])


def test_cli_probes_a_qwen3_endpoint(tmp_path, qwen3_tok):
    out = tmp_path / "profile.json"
    with qwen3_emulator("vllm-hermes", qwen3_tok) as emu:
        result = CliRunner().invoke(app, ["probe", "--base-url", emu.url, "--model",
                                          QWEN3_MODEL, "--dialect", "vllm", "--tokenizer",
                                          "mini-qwen3", "--requests", "2", "--out", str(out)])
        sent = emu.stats()["chat_requests"]
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.model == QWEN3_MODEL and profile.tokenizer == "mini-qwen3"
    assert profile.tool_calls_recoverable is True and sent == profile.probe_requests == 14
    assert profile.findings.family.get(STRIPS) is False
    assert "tool calls recoverable as tools: yes" in result.output
    text = " ".join(result.output.split())
    assert "strips_content_beside_calls: returns the text before tool calls as written" in text


@pytest.mark.parametrize("profile", ["vllm", "vllm-legacy"])
def test_the_probe_counts_without_the_spaces_a_server_inserts(tok, profile):
    """Asked the server's default way, vLLM's detokenizer puts spaces around K2.5's added
    tokens: the probe names them, and reads the counts without them (vLLM counts the stop
    token, as asked the client's way)."""
    with emulator(profile, tok) as emu:
        result = probe_endpoint(endpoint(emu, profile, text_as_written=False), None,
                                build_scenarios(2, rules=K25), fmt=KimiK25(tok), tokenizer="mini")
    f = result.findings
    assert f.family.get(SPACES) is True, f.evidence
    assert f.counts_stop_token is True, f.evidence
    assert result.traits().get(SPACES) is True
