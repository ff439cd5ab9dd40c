"""The API's wire format, in one place: what goes into a chat-completions request and what comes
back, for every dialect (OpenRouter, vLLM, SGLang, Moonshot).

- `request`: a request body from plain inputs (messages, tools, `WireOptions`, the chat
  format's thinking switch), its fingerprint (the raw log's key) and the form it is stored in;
- `response`: a response body read into a `records.Completion`, and the readers of what a
  request asked (thinking on/off, reasoning left out) that the chat formats use;
- `stream`: server-sent events decoded and a stream assembled into the body a plain answer has;
- `token_ids`: vLLM's token-id arrays (`prompt_token_ids`, a choice's `token_ids`) read or
  lifted out of a body.

It sits on its own floor, below the model families and above only the bottom floor
(`records`, `fingerprint`, ...): it knows field names, never a model's markers or a config.
"""
