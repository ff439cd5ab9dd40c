"""A local OpenAI/OpenRouter-compatible server that answers like Kimi K2.5 behind a provider.

It is the ground truth of the tests (with `"return_token_ids": true` a response carries the ids
the emulated model saw and wrote), the demo's default endpoint and the load target of the
benchmarks.

* `config.EmulatorConfig`: the profile (openrouter | vllm | vllm-k25 | sglang | sglang-noforce |
  moonshot | raw | stripped), seed, latency, fault rates, model knobs (answer shapes included),
  prices, key and credits.
* `generate`: one deterministic completion per request, as token ids and segments.
* `profiles`: how each provider returns that completion (body, SSE frames).
* `upstream`, `serverside`: vLLM's and SGLang's Kimi parsers and prompt handling, restated from
  their code (docs/upstream-parsers.md), which the vllm* and sglang* profiles run.
* `fidelity`: the corpus bench/fidelity.py measures reconstruction on.
* `faults`: which fault strikes an attempt, and how a connection is reset or cut.
* `app.create_app(config, tokenizer)`: the Starlette app.
* `server.serve_in_thread(config, tokenizer, host, port) -> RunningEmulator` with `.url`
  (`http://127.0.0.1:PORT/v1`), `.openrouter_url` (`.../api/v1`), `.base_url`, `.stats()`,
  `.reset()`, `.stop()`; also a context manager.
* `command.emulator`: `specregen emulator`.
* `textgen`: the model-like text everything is written from.
"""
