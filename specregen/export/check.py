"""How lossy the `messages` export is: render each conversation through a chat template the way
a re-tokenizing trainer does (the whole conversation, no generation prompt), tokenize it, and
count the samples whose ids differ from the published ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from specregen.export.rows import messages_row
from specregen.models.chat_format import ChatFormat
from specregen.records import TokenSample


@dataclass
class RetokenizeReport:
    template: str
    samples: int = 0
    differ: int = 0
    # A few differing samples: id and the first position where the ids part.
    examples: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.differ} of {self.samples} samples re-tokenize through {self.template} "
                f"to other ids than the published ones")


def retokenize(row: dict[str, Any], fmt: ChatFormat, template: str) -> list[int]:
    """The ids a re-tokenizing trainer gets from one `messages` row (the format's own template
    is `fmt.template_text()`; a tokenizer folder's own one can be given). A format whose
    tokenizer renders ids itself, segment by segment (K3: no Jinja template, its
    `apply_chat_template(tokenize=True)`), gives them through its optional `trainer_ids`;
    the others render text that is tokenized with special tokens allowed."""
    thinking = row.get("thinking", True)
    trainer_ids = getattr(fmt, "trainer_ids", None)
    if trainer_ids is not None:
        return trainer_ids(row["conversations"], row.get("tools"), thinking=thinking,
                           template=template)
    rendered = fmt.trainer_render(row["conversations"], row.get("tools"),
                                  thinking=thinking, template=template)
    return fmt.tok.encode_with_specials(rendered)


def check_messages(
    samples: Iterable[TokenSample], fmt: ChatFormat, template: str, template_name: str,
    max_examples: int = 5,
) -> RetokenizeReport:
    report = RetokenizeReport(template=template_name)
    for sample in samples:
        report.samples += 1
        ids = retokenize(messages_row(sample), fmt, template)
        if ids != sample.input_ids:
            report.differ += 1
            if len(report.examples) < max_examples:
                at = next((i for i, (a, b) in enumerate(zip(ids, sample.input_ids, strict=False))
                           if a != b), min(len(ids), len(sample.input_ids)))
                report.examples.append({"id": sample.sample_id, "first_difference": at,
                                        "published_len": len(sample.input_ids),
                                        "retokenized_len": len(ids)})
    return report
