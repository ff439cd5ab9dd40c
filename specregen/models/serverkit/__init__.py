"""The server kit: family-neutral pieces of the restated inference servers (the emulator's
served side, `models/<family>/served.py` and the parser restatements behind it).

* `stream`: what a restated server's parsers see (`Delta`, `Output`: the detokenizer's steps)
  and return (`ServerCall`, `Parsed`), and the stream-delta helpers (a tag's partial end, a
  partial token, a common prefix, complete JSON);
* `partial_json`: `partial_json_parser.loads` as SGLang's detectors call it;
* `ids`: tool-call ids as the servers write them from random bits.

It names no family's markers (a tag is always an argument). `stream` is also run by Kimi K3's
reconstruction (its readings are its restated parsers), so it is in K3's reconstruct
fingerprint; the rest is served-side code only, never imported by reconstruction and in no
fingerprint (tests/unit/test_format_fingerprint_files.py).
"""
