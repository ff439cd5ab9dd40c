"""Checks made before the first request of `specregen infer`: nothing is paid for a run that
cannot finish or a prompt that cannot be answered.

* the prompts file: every line is read, decoded as strict UTF-8, parsed, built into its request
  body and fingerprinted up front; a line that fails any of these becomes a reject (line number
  and reason), never a crash and never a silently altered prompt;
* the context length: each prompt's token count (the chat format's rendering, given tokenizer)
  plus `max_tokens` must fit the limit (`max_context_tokens`, else the tokenizer folder's
  `model_max_length`);
* the source is readable (missing file, no storage credentials: one line, not a traceback).

The output location is checked by taking its lease (specregen.store.lease), which writes there.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specregen.client.config import EndpointConfig
from specregen.client.request import build_request
from specregen.errors import StorageError, UsageError, is_missing_credentials, storage_error
from specregen.records import Prompt
from specregen.store.rawlog import RejectRecord
from specregen.wire.request import request_fingerprint

log = logging.getLogger(__name__)

# The longest token of the K2.5 vocabulary is 256 bytes (not checked for other formats'
# vocabularies): a prompt with more bytes than this
# times the limit cannot fit, whatever it says (and is refused without tokenizing megabytes).
MAX_TOKEN_BYTES = 256


@dataclass
class Preflight:
    """The prompts that may be sent, in file order, and the rows refused with their reasons."""

    prompts: list[Prompt] = field(default_factory=list)
    rejects: list[RejectRecord] = field(default_factory=list)
    lines: int = 0


class ContextCheck:
    """`check(prompt, body)` -> why the prompt cannot fit the model's context, or None."""

    def __init__(self, fmt: Any, limit: int, cfg: EndpointConfig, tokenizer_name: str) -> None:
        self.fmt = fmt
        self.limit = limit
        self.max_tokens = cfg.sampling.max_tokens or 0
        self.thinking = cfg.thinking is not False
        self.tokenizer_name = tokenizer_name

    def __call__(self, prompt: Prompt, body: dict[str, Any]) -> str | None:
        size = len(json.dumps(prompt.messages, ensure_ascii=False).encode())
        if prompt.tools:
            size += len(json.dumps(prompt.tools, ensure_ascii=False).encode())
        room = self.limit - self.max_tokens
        if size > self.limit * MAX_TOKEN_BYTES:
            return f"prompt of {size:,} bytes cannot fit the context of {self.limit:,} tokens"
        tools = prompt.tools if prompt.tool_mode == "tools" else None
        try:
            count = len(self.fmt.encode_prompt(prompt.messages, tools, thinking=self.thinking))
        except Exception as exc:  # a shape the renderer does not know: the server may
            log.debug("sample %s: prompt not counted (%s)", prompt.sample_id, exc)
            return None
        if count > room:
            extra = f" + max_tokens {self.max_tokens:,}" if self.max_tokens else ""
            return (
                f"prompt of {count:,} tokens{extra} exceeds the context length of"
                f" {self.limit:,} tokens ({self.tokenizer_name} tokenizer)"
            )
        return None


def context_check(
    cfg: EndpointConfig, tokenizer: str | None, limit: int | None
) -> ContextCheck | None:
    """The context check for this run, or None when there is no tokenizer to count with.

    `tokenizer`: 'mini', a folder or a hub id; default the folder the format's tokenizer
    variable names (`registry.tokenizer_env`) when it is set.
    `limit`: tokens; default the endpoint config's `max_context_tokens`, else the tokenizer
    folder's `model_max_length`.
    """
    from specregen.models.registry import (
        UnknownFormatError,
        bundled_tokenizer_folders,
        get_format,
        tokenizer_env,
    )
    from specregen.models.tokenizer import TokenizerError, load_tokenizer

    limit = limit or cfg.max_context_tokens
    try:
        format_name = cfg.format_name
    except UnknownFormatError:
        if tokenizer is None and limit is None:
            log.warning("no chat format for model %s: prompts are not checked against the"
                        " model's context length (pass --format)", cfg.model)
            return None
        raise  # counting needs the format's rendering
    # Only the run's own format's variable: another family's tokenizer would count wrongly.
    variable = tokenizer_env(format_name)
    spec = tokenizer or (os.environ.get(variable) if variable else None) or None
    if spec is None:
        or_set = f" or set {variable}" if variable else ""
        if limit is not None:
            raise UsageError(
                "a context limit is set but there is no tokenizer to count prompts with",
                hint=f"pass --tokenizer (a folder, 'mini' or a hub id){or_set}",
            )
        log.warning(
            "no tokenizer: prompts are not checked against the model's context length"
            " (pass --tokenizer%s)", or_set
        )
        return None
    try:
        fmt = get_format(format_name, load_tokenizer(spec))
    except TokenizerError as exc:
        raise UsageError(str(exc), hint="pass --tokenizer with a tokenizer folder") from None
    if limit is None:
        limit = model_max_length(spec)
    if limit is None:
        # A bundled test tokenizer states no length on purpose: nothing there to act on.
        bundled = set(bundled_tokenizer_folders())
        log.log(
            logging.INFO if str(spec) in bundled else logging.WARNING,
            "tokenizer %s states no model_max_length: prompts are not checked against the"
            " context length (set max_context_tokens)",
            spec,
        )
        return None
    return ContextCheck(fmt, limit, cfg, str(spec))


def model_max_length(spec: str) -> int | None:
    """The tokenizer folder's `model_max_length` (None when it states none)."""
    config = Path(spec).expanduser() / "tokenizer_config.json"
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get("model_max_length")
    except (OSError, ValueError, AttributeError):
        return None
    # transformers writes a huge sentinel when the length is unknown.
    return int(value) if isinstance(value, int) and 0 < value < 10**9 else None


def decode_line(raw: bytes | str) -> str:
    """A prompts-file line as text; bytes that are not UTF-8 are an error naming the column."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1})"
        ) from None


def iter_lines(prompts_path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) of a local or remote prompts file; read errors become one line."""
    import fsspec

    try:
        handle = fsspec.open(prompts_path, "rb").open()
    except FileNotFoundError:
        raise UsageError(f"cannot read {prompts_path}: it does not exist",
                         hint="check the PROMPTS path") from None
    except IsADirectoryError:
        raise UsageError(f"cannot read {prompts_path}: it is a folder",
                         hint="give the JSONL file") from None
    except Exception as exc:
        raise _read_error(exc, prompts_path) from None
    with handle:
        try:
            yield from enumerate(handle, start=1)
        except Exception as exc:
            raise _read_error(exc, prompts_path) from None


def _read_error(exc: BaseException, where: str) -> StorageError | UsageError:
    if isinstance(exc, OSError) or is_missing_credentials(exc):
        return storage_error(exc, where, "read")
    return UsageError(f"cannot read {where}: {type(exc).__name__}", hint="check the PROMPTS path")


def preflight(
    prompts_path: str,
    cfg: EndpointConfig,
    check: ContextCheck | None,
    parse: Any,
) -> Preflight:
    """Read, decode, parse, build, fingerprint and size-check every line before any request.

    `parse(text) -> Prompt` raises ValueError with the reason for a bad line.
    """
    out = Preflight()
    for number, raw in iter_lines(prompts_path):
        out.lines = number
        if not raw.strip():
            continue
        sample_id = None
        try:
            prompt = parse(decode_line(raw))
            sample_id = prompt.sample_id
            body = build_request(prompt, cfg)
            request_fingerprint(body)
            reason = check(prompt, body) if check is not None else None
        except (ValueError, TypeError, RecursionError) as exc:
            reason = str(exc)
        if reason is not None:
            out.rejects.append(RejectRecord(reason=reason, line=number, sample_id=sample_id))
            continue
        out.prompts.append(prompt)
    return out
