"""`specregen gate --help` shows every default its options name.

Typer renders help through rich markup, where "[default: 0.02]" is a tag and disappears
unless escaped.
"""

from __future__ import annotations

import re

import typer
from rich.markup import render
from typer.testing import CliRunner

from specregen.cli import app


def _flat(text: str) -> str:
    # Rich wraps help into table rows: drop the borders and join the lines.
    return " ".join(text.replace("│", " ").split())


def test_gate_help_keeps_default_texts() -> None:
    command = typer.main.get_command(app).commands["gate"]  # type: ignore[attr-defined]
    # What each option's help says, as a reader should see it (markup escapes undone).
    named = [render(p.help).plain for p in command.params
             if getattr(p, "help", None) and "default:" in p.help]
    assert len(named) >= 5, named  # max-quarantine-share, tokenizer, dataset, min-evidence, format
    result = CliRunner().invoke(app, ["gate", "--help"], env={"COLUMNS": "240",
                                                              "TERMINAL_WIDTH": "240"})
    assert result.exit_code == 0, result.output
    shown = _flat(result.output)
    for text in named:
        default = re.search(r"\[default: [^\]]*\]", text)
        assert default is not None, text
        assert _flat(default.group(0)) in shown, (default.group(0), shown)
    assert "[default: 0.02]" in shown
    assert "[default: usage_tolerated]" in shown
