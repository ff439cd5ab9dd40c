"""`specregen inspect`: tokens by part with names and mask, the reference diff, the terminal view
(rich recording), the HTML page's data, the CLI's selection and errors."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specregen.cli import app
from specregen.inspect.html import render_page
from specregen.inspect.terminal import DIFF_STYLE, MASK_STYLES, SPECIAL_STYLE, render_sample
from specregen.inspect.view import build_view, compare_reference
from specregen.reconstruct import reconstruct
from specregen.store.token_samples import write_token_samples

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
REQUEST = {"model": "moonshotai/kimi-k2.5", "tools": TOOLS, "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Weather in Paris and Rome?"}]}
REASONING = "Two cities, so two calls.\nFirst Paris."
CONTENT = "Checking both now."
CALLS = [("functions.get_weather:0", '{"city": "Paris"}'),
         ("functions.get_weather:1", '{"city": "Rome"}')]


def response(message: dict, finish: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish}], "usage": {}}


def tool_sample(fmt, sample_id="calls", reference=None):
    message = {"reasoning": REASONING, "content": CONTENT, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": a}}
        for i, a in CALLS]}
    return reconstruct(sample_id, REQUEST, response(message, "tool_calls"), fmt,
                       reference_completion_ids=reference)


def text_sample(fmt, sample_id="text", reference=None):
    message = {"reasoning": "Think first.", "content": "It is sunny in Paris today."}
    return reconstruct(sample_id, REQUEST, response(message, "stop"), fmt,
                       reference_completion_ids=reference)


def part_text(view, part, call=None) -> str:
    return "".join(t.text for t in view.tokens
                   if t.part == part and (call is None or t.call == call) and t.special is None)


def test_parts_names_and_mask_follow_the_completion_layout(fmt):
    sample = tool_sample(fmt)
    assert sample.status != "error", sample.error
    view = build_view(sample, fmt.tok, markers=fmt.markers)
    assert len(view.tokens) == len(sample.input_ids)
    # Every part decodes back to the text it was built from.
    assert part_text(view, "reasoning") == REASONING
    assert part_text(view, "content") == CONTENT
    for n, (call_id, args) in enumerate(CALLS):
        assert part_text(view, "tool_id", n) == call_id
        assert part_text(view, "tool_arguments", n) == args
    # The mask: 0 on the prompt (with the prefilled <think>), 1 on every generated token.
    assert {t.mask for t in view.tokens if t.part == "prompt"} == {0}
    assert {t.mask for t in view.completion} == {1}
    # Special and marker tokens carry their names, looked up in the tokenizer.
    names = [t.special for t in view.completion if t.special]
    assert names == ["</think>", "<|tool_calls_section_begin|>",
                     "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                     "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                     "<|tool_calls_section_end|>", "<|im_end|>"]
    assert view.tokens[-1].part == "end"
    assert [t.special for t in view.tokens if t.part == "prompt" and t.special][-1] == "<think>"


def test_reference_diff_finds_the_first_differing_token(fmt):
    plain = text_sample(fmt)
    ours = plain.input_ids[plain.prompt_len :]
    changed = list(ours)
    position = len(ours) - 4  # a content token near the end
    changed[position] = fmt.tok.encode_ordinary(" rainy")[0]
    sample = text_sample(fmt, reference=changed)
    view = build_view(sample, fmt.tok, markers=fmt.markers, reference_ids=changed)
    assert view.diff is not None and view.diff.first == position
    # The same ids are equal; a server that leaves out the final <|im_end|> is no difference.
    same = build_view(plain, fmt.tok, markers=fmt.markers, reference_ids=ours[:-1])
    assert same.diff.equal and "omit" in same.diff.note
    shorter = compare_reference(ours, ours[:5], fmt.tok.token_id("<|im_end|>"))
    assert shorter.first == 5


def test_terminal_view_colours_mask_names_markers_and_marks_the_difference(fmt):
    plain = text_sample(fmt)
    ours = plain.input_ids[plain.prompt_len :]
    changed = list(ours)
    position = 2
    changed[position] = fmt.tok.encode_ordinary(" zebra")[0]
    view = build_view(text_sample(fmt, reference=changed), fmt.tok, markers=fmt.markers,
                      reference_ids=changed)
    console = Console(record=True, force_terminal=True, width=110, file=io.StringIO(),
                      color_system="truecolor")
    console.print(render_sample(view, fmt.tok, prompt_tokens=0))
    text = console.export_text(clear=False)
    for heading in ("prompt ·", "reasoning ·", "content ·", "end of turn ·",
                    "first difference at completion token 2"):
        assert heading in text
    assert "<|im_end|>" in text and "</think>" in text
    # The side-by-side table shows both ids at the differing position.
    row = next(line for line in text.splitlines() if re.match(r"│\s*2\s*│", line))
    assert str(ours[position]) in row and str(changed[position]) in row
    # Styles: specials in the special style; mask 0 / 1 in their own colour families; the
    # differing token in the diff style.
    spans = render_sample(view, fmt.tok, prompt_tokens=0).renderables
    token_texts = [r for r in spans if hasattr(r, "spans") and r.spans]
    used = {str(s.style) for t in token_texts for s in t.spans}
    assert set(MASK_STYLES[0]) & used and set(MASK_STYLES[1]) & used
    assert DIFF_STYLE in used
    special = {str(s.style) for t in token_texts for s in t.spans
               if t.plain[s.start : s.end] == "<|im_end|>"}
    assert special == {SPECIAL_STYLE}
    # The recorded terminal output carries the colours (truecolor escape codes).
    assert "\x1b[" in console.export_text(styles=True)


def test_tool_call_sample_in_the_terminal_names_its_markers(fmt):
    view = build_view(tool_sample(fmt), fmt.tok, markers=fmt.markers)
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(render_sample(view, fmt.tok))
    text = console.export_text()
    assert "tool call 0 ·" in text and "tool call 1 ·" in text
    line = next(x for x in text.splitlines() if "functions.get_weather:0" in x)
    assert "<|tool_call_begin|>" in line and "<|tool_call_argument_begin|>" in line
    assert "tool calls in the ids" in text and '"city": "Rome"' in text


def test_html_page_is_self_contained_and_carries_every_token(fmt):
    views = [build_view(tool_sample(fmt), fmt.tok, markers=fmt.markers),
             build_view(text_sample(fmt), fmt.tok, markers=fmt.markers, reference_note="no ids")]
    page = render_page(views, fmt.tok, title="t </script><b>", source="x.parquet")
    assert "<b>" not in page.split("<script")[0]  # the title is escaped
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    blob = page.split('<script id="data" type="application/json">')[1].split("</script>")[0]
    data = json.loads(blob.replace("<\\/", "</"))
    first = data["samples"][0]
    assert first["ids"] == views[0].sample.input_ids
    assert len(first["mask"]) == len(first["ids"]) == len(first["part"])
    assert data["vocab"][str(fmt.tok.token_id("<|tool_call_begin|>"))][1] == \
        "<|tool_call_begin|>"
    text = "".join(data["vocab"][str(i)][0] for i in first["ids"])
    assert fmt.tok.decode(first["ids"]) == text
    # One run of tokens per tool call, from its begin marker to its end marker.
    assert [c for *_, c in first["call_spans"]] == [0, 1]
    for (start, end, _), (call_id, args) in zip(first["call_spans"], CALLS, strict=True):
        assert fmt.tok.decode(first["ids"][start:end]) == (
            f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>")


@pytest.fixture
def parquet(tmp_path, mini_fmt):
    samples = [text_sample(mini_fmt, "a"), tool_sample(mini_fmt, "b")]
    plain = samples[0].input_ids[samples[0].prompt_len :]
    changed = list(plain)
    changed[3] = mini_fmt.tok.encode_ordinary(" zebra")[0]
    samples.append(text_sample(mini_fmt, "c", reference=changed))
    # A pipeline's layout: the raw log beside the stage folders holds the server's ids.
    path = tmp_path / "ds" / "reconstruct" / "fp" / "chunk-00000.parquet"
    path.parent.mkdir(parents=True)
    write_token_samples(samples, path)
    rawlog = tmp_path / "ds" / "rawlog" / "chunk-00000"
    rawlog.mkdir(parents=True)
    (rawlog / "part-1.jsonl").write_text(json.dumps(
        {"sample_id": "c", "final": True, "status": "ok",
         "reference_completion_ids": changed}) + "\n")
    return path


def test_cli_finds_the_reference_ids_in_the_raw_log_beside_the_file(parquet):
    result = CliRunner().invoke(app, ["inspect", str(parquet), "--sample", "c",
                                      "--tokenizer", "mini"])
    assert result.exit_code == 0, result.output
    assert "first difference at completion token 3" in result.output
    other = CliRunner().invoke(app, ["inspect", str(parquet), "--sample", "a"])
    assert other.exit_code == 0, other.output
    assert "holds no ids the server returned" in " ".join(other.output.split())


def test_cli_selects_by_flag_and_status_and_says_when_nothing_matches(parquet):
    result = CliRunner().invoke(app, ["inspect", str(parquet), "--status", "error"])
    assert result.exit_code == 2 and "no sample" in result.output
    result = CliRunner().invoke(app, ["inspect", str(parquet), "--flag", "no_such_flag"])
    assert result.exit_code == 2
    result = CliRunner().invoke(app, ["inspect", str(parquet), "--status", "maybe"])
    assert result.exit_code == 2


def test_cli_bad_input_is_a_clear_error(tmp_path, parquet):
    missing = CliRunner().invoke(app, ["inspect", str(tmp_path / "nope.parquet")])
    assert missing.exit_code == 2 and "no such file" in missing.output
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    result = CliRunner().invoke(app, ["inspect", str(junk)])
    assert result.exit_code == 2 and "cannot read" in result.output


def test_cli_writes_an_html_page_of_the_matching_samples(parquet, tmp_path):
    out = tmp_path / "page.html"
    result = CliRunner().invoke(app, ["inspect", str(parquet), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    blob = page.split('type="application/json">')[1].split("</script>")[0]
    data = json.loads(blob.replace("<\\/", "</"))
    assert [s["facts"]["sample_id"] for s in data["samples"]] == ["a", "b", "c"]
    assert data["samples"][2]["diff"]["first"] == 3


def test_marker_text_written_by_the_model_is_pointed_at(fmt):
    content = 'Write "<|tool_call_begin|>" in docs, and <think> too.'
    message = {"reasoning": "Plain.", "content": content}
    sample = reconstruct("lit", REQUEST, response(message, "stop"), fmt)
    view = build_view(sample, fmt.tok, markers=fmt.markers)
    marked = sorted(view.literal)
    assert marked, "the literal marker text was not found"
    # The marked tokens are text tokens of the content, and they cover both literals.
    assert all(view.tokens[i].part == "content" and view.tokens[i].special is None
               for i in marked)
    runs, run = [], [marked[0]]
    for i in marked[1:]:
        if i == run[-1] + 1:
            run.append(i)
        else:
            runs.append(run)
            run = [i]
    runs.append(run)
    texts = ["".join(view.tokens[i].text for i in r) for r in runs]
    assert any("<|tool_call_begin|>" in t for t in texts) and any("<think>" in t for t in texts)
    # A sample without such text marks nothing.
    assert build_view(text_sample(fmt), fmt.tok, markers=fmt.markers).literal == set()
    spans = render_sample(view, fmt.tok).renderables
    from specregen.inspect.terminal import LITERAL_STYLE

    used = {str(s.style) for r in spans if hasattr(r, "spans") for s in r.spans}
    assert LITERAL_STYLE in used
