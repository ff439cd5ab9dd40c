"""A local OpenAI/OpenRouter-compatible server that answers like a model behind a provider.

It is the ground truth of the tests (with `"return_token_ids": true` a response carries the ids
the emulated model saw and wrote), the demo's default endpoint and the load target of the
benchmarks. Nothing here knows a model's markers: the model's chat format brings its served side
(`models/<format>/served.py`, found by `registry.get_server`), which turns what the model says
into ids and returns them the way each provider's stack does.

* `config.EmulatorConfig`: the profile (`config.all_profiles()`: the built-in ones, K2.5's:
  openrouter | vllm (vLLM 0.32) | vllm-legacy | vllm-k25 | sglang | sglang-noforce | moonshot |
  raw | stripped; then those the families' descriptors declare, e.g. Qwen3's vllm-hermes and
  K3's vllm-k3; each family is served with the ones its descriptor names), seed,
  latency, fault rates, model knobs (answer shapes included), prices, key and credits, and the
  conversation mode (`conversations`, `divergence_rate`).
* `generate`: request digests and seeds, the declared tools, the `WRITER` a served side writes
  its text with (model-like text from `models/textgen.py`), non-canonical BPE splits.
* `served`: the answer of a served side that takes text (Qwen3, K3): what the model says, then the
  format's ids and parsers.
* `conversations`: conversation mode: the dataset's next step of a known conversation, or a
  seeded divergence from it (issue 10).
* `profiles`: how each provider returns a message (body, SSE frames).
* `fidelity`: the fidelity harness: a family's corpus (`models/<family>/corpus.py`, found by
  the family's name) served through its profiles, rebuilt and classified (bench/fidelity.py,
  bench/fidelity_corpus.py), and its cases for the real server (specregen.realserver).
* `faults`: which fault strikes an attempt, and how a connection is reset or cut.
* `app.create_app(config, tokenizer)`: the Starlette app.
* `server.serve_in_thread(config, tokenizer, host, port) -> RunningEmulator` with `.url`
  (`http://127.0.0.1:PORT/v1`), `.openrouter_url` (`.../api/v1`), `.base_url`, `.stats()`,
  `.reset()`, `.stop()`; also a context manager.
"""
