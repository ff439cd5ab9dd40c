"""Prefect artifacts whose body shows wherever the UI links to them.

Prefect's UI (both its versions) renders an artifact's body only on the page of one artifact
id; the page of an artifact KEY -- where the Artifacts list links, and what a person opens by
key -- shows the latest version's description above a timeline, and the flow run's artifact
cards preview the description too. So every markdown, table and link artifact here carries its
body in its description as well, in markdown: the key page and the cards show the report, the
id page shows it rendered by the artifact's own type (tables sortable, links clickable).
Progress artifacts already describe themselves (their line of numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_table_artifact,
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)


def described(description: str, body: str) -> str:
    """The description an artifact carries: its title, then its body (markdown)."""
    return f"{description}\n\n{body}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a markdown table (columns in first-seen order; `|` and line breaks escaped)."""
    columns: list[str] = []
    for row in rows:
        columns.extend(c for c in row if c not in columns)
    if not columns:
        return "(no rows)"

    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def markdown_artifact(markdown: str, *, key: str, description: str) -> Any:
    return create_markdown_artifact(markdown, key=key,
                                    description=described(description, markdown))


async def amarkdown_artifact(markdown: str, *, key: str, description: str) -> Any:
    return await acreate_markdown_artifact(markdown, key=key,
                                           description=described(description, markdown))


def table_artifact(rows: list[dict[str, Any]], *, key: str, description: str) -> Any:
    return create_table_artifact(rows, key=key,
                                 description=described(description, markdown_table(rows)))


async def atable_artifact(rows: list[dict[str, Any]], *, key: str, description: str) -> Any:
    return await acreate_table_artifact(
        rows, key=key, description=described(description, markdown_table(rows)))


def link_artifact(url: str, *, link_text: str, key: str, description: str) -> Any:
    return create_link_artifact(url, link_text=link_text, key=key,
                                description=described(description, f"[{link_text}]({url})"))
