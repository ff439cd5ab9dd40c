"""The mandatory tool-call correctness gate: TokenSamples -> accepted | quarantined, and a verdict.

    report = run_gate(samples, fmt, GateConfig(), dataset="B1_glaive",
                      on_accept=write_accepted, on_quarantine=write_quarantined)
    report.passed, report.to_json(), report.to_markdown()

Per sample (`check_sample`), each check either passes or gives a reason (check name + detail):

- `reconstruction`: the sample's status is not `ok` (its trust-breaking flags, or its error).
- `round_trip`: the completion ids, decoded and parsed with the format's own parser, give back
  the calls the API returned (count, ids after the id policy, names, arguments compared trimmed),
  and the special ids sit where the completion layout puts them. A mismatch on an `ok` sample
  is a reconstruction bug: a hard invariant break that fails the dataset whatever the threshold.
- `arguments_json`, `arguments_schema`, `schema_invalid`: arguments are a JSON object
  (no NaN/Infinity) that satisfies the declared tool's parameters (quirks: `gate.schema`).
- `name_declared`: the function is declared: in `tools`, or in the system prompt (a glaive
  row's), as the dataset's adapter read the prompt (`Prompt.declaration`, handed to
  `run_gate` as `declarations`; the gate reads no system prompt itself).
- `tool_id_form`: ids follow the format's id rule (`ChatFormat.tool_id_problems`; the report
  words it as the family's descriptor does, `Family.tool_id_rule`): K2.5's are
  `functions.NAME:IDX`, NAME the call's name, indices counting on from the conversation's
  earlier calls; Qwen3's and K3's are the server's (nothing in the tokens to check).
- `marker_text`: no marker text of the format (`ChatFormat.find_marker_text`: tool-call
  markers, think tags) in reasoning, content or arguments.
- `finish_reason`: `tool_calls` iff there are calls; `stop` with calls only when allowed;
  `length` only when truncated samples are accepted.
- `usage_lengths`: our token counts agree with the provider's `usage` within the tolerance.

A conversation sample (`conversation_id` set) also trains on the earlier answers of its user
turn's tool loop (in its prompt, under its loss mask): their calls get the same
`arguments_json`, `arguments_schema`, `name_declared` and `tool_id_form` checks, ids counted on
from the calls before them in the conversation; the report counts conversations regenerated to
the end vs stopped, by stop reason, and user turns reached per conversation.

Per dataset: `fail` when the quarantined share exceeds `max_quarantine_share` or any hard
invariant breaks (or there is no sample at all), else `pass`. The gate has no off switch.
"""

from specregen.gate.checks import CHECKS, GateDecision, Reason, check_sample
from specregen.gate.config import GateConfig
from specregen.gate.report import GateReport, render_markdown, run_gate

__all__ = [
    "CHECKS",
    "GateConfig",
    "GateDecision",
    "GateReport",
    "Reason",
    "check_sample",
    "render_markdown",
    "run_gate",
]
