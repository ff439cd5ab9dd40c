"""The tokenizer type and its loaders: Kimi's tiktoken layout, a Hugging Face hub id, any
`tokenizer.json` folder, the bundled `mini`. `load_tokenizer` with the families' bundled aliases
(`mini-qwen3`, ...) is `specregen.models.tokenizer`'s, which asks the registry for them.

Every backend is wrapped in the same small `Tokenizer` interface. Two encodings matter:
`encode_ordinary` treats special-token strings as plain text (model-written text: a literal
`<|im_end|>` in code stays text), `encode_with_specials` turns them into their ids (a rendered
prompt, as servers tokenize it).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import tiktoken

from specregen.errors import UsageError

# Kimi K2 / K2.5 pre-tokenizer (SPEC 1.2): the alternatives are joined with "|" in this order.
# The `&&` class intersections need tiktoken's fancy-regex; Python's `re` cannot compile this.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# The Kimi wrapper reserves this many ids after the BPE ranks for added tokens (SPEC 1.2).
KIMI_NUM_RESERVED_SPECIAL_TOKENS = 256

# Kimi's encode() cuts input into pieces (a workaround for tiktoken issue #195); the cut points
# change the ids of pathological strings, so a faithful encoder cuts at the same places.
_KIMI_MAX_ENCODE_CHARS = 400_000
_KIMI_MAX_RUN_CHARS = 25_000
# Segments between special tokens up to this length have their ids kept per tokenizer.
_SHORT_SEGMENT_CHARS = 32
_SHORT_SEGMENTS_KEPT = 4096
_LONG_RUN = re.compile(rf"\s{{{_KIMI_MAX_RUN_CHARS + 1},}}|\S{{{_KIMI_MAX_RUN_CHARS + 1},}}")

TOKENIZER_FILES = (
    "tiktoken.model",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
)

# The bundled 4,096-rank BPE with the K2.5 added-token table (`mini`); the families' own
# bundled tokenizers are declared by their descriptors (`models/<family>/family.py`).
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
MINI_TOKENIZER_DIR = ASSETS_DIR / "mini_tokenizer"


class TokenizerError(UsageError, ValueError):
    """The tokenizer could not be loaded, or does not have what the format needs."""


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: encoders, decoder and the added-token table by name."""

    name: str
    encode_ordinary: Callable[[str], list[int]]
    encode_with_specials: Callable[[str], list[int]]
    decode_bytes: Callable[[list[int]], bytes]
    added_tokens: dict[str, int]
    n_vocab: int
    chat_template: str | None = None
    # The ids of ordinary text are below this; added tokens sit at or above it.
    base_vocab_size: int = 0
    source: str = ""
    _id_to_added: dict[int, str] = field(default_factory=dict, repr=False)
    # The id of ordinary-text token whose bytes are exactly these, or None (logprobs name
    # tokens by their bytes: specregen/logprobs.py).
    token_of_bytes: Callable[[bytes], int | None] | None = field(default=None, repr=False)

    def decode(self, ids: list[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_id(self, name: str) -> int:
        """The id of an added token, by name, with an error that names it when absent."""
        try:
            return self.added_tokens[name]
        except KeyError:
            raise TokenizerError(
                f"tokenizer {self.name!r} has no token {name!r} (from {self.source})"
            ) from None

    def is_added(self, token_id: int) -> bool:
        return token_id in self._id_to_added

    def added_name(self, token_id: int) -> str | None:
        return self._id_to_added.get(token_id)


def load_tokenizer_spec(spec: str | Path, bundled: Mapping[str, Path] | None = None
                        ) -> Tokenizer:
    """Load a tokenizer from `mini` or an alias of `bundled` (the families' bundled folders, by
    `load_tokenizer` alias), a local folder, or a hub id.

    A folder with `tiktoken.model` + `tokenizer_config.json` is read as the Kimi layout; a folder
    with `tokenizer.json` goes through `transformers.AutoTokenizer`. Anything else that is not an
    existing path is taken as a hub id, and only the tokenizer files are downloaded.
    """
    if str(spec) == "mini":
        return load_kimi_tiktoken(MINI_TOKENIZER_DIR, name="specregen-mini")
    if bundled and str(spec) in bundled:
        return load_folder(bundled[str(spec)])
    path = Path(spec).expanduser()
    if path.is_dir():
        return load_folder(path)
    if path.exists():
        raise TokenizerError(f"tokenizer path {str(path)!r} is a file; give its folder")
    if "/" in str(spec) and not str(spec).startswith((".", "/", "~")):
        return load_folder(_download_from_hub(str(spec)))
    raise TokenizerError(
        f"tokenizer {str(spec)!r} is neither 'mini'"
        + (f" (nor {', '.join(repr(a) for a in bundled)})" if bundled else "")
        + ", an existing folder, nor a hub id 'org/name'"
    )


def load_folder(path: Path) -> Tokenizer:
    if (path / "tiktoken.model").is_file():
        return load_kimi_tiktoken(path)
    if (path / "tokenizer.json").is_file():
        return load_hf_tokenizer(path)
    raise TokenizerError(
        f"folder {str(path)!r} has neither tiktoken.model (Kimi layout) nor tokenizer.json"
    )


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, allow_patterns=list(TOKENIZER_FILES))
    except Exception as exc:  # the hub client raises many types; the caller needs one
        raise TokenizerError(f"could not download tokenizer files of {repo_id!r}: {exc}") from exc
    return Path(folder)


def load_kimi_tiktoken(path: Path, name: str | None = None) -> Tokenizer:
    """Build the Kimi tokenizer the way its `TikTokenTokenizer` does: ranks, pat_str, added ids."""
    ranks = read_tiktoken_ranks(path / "tiktoken.model")
    config_path = path / "tokenizer_config.json"
    if not config_path.is_file():
        raise TokenizerError(f"{str(path)!r} has tiktoken.model but no tokenizer_config.json")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    n_base = len(ranks)
    if sorted(ranks.values()) != list(range(n_base)):
        raise TokenizerError(f"{str(path / 'tiktoken.model')!r}: ranks are not 0..{n_base - 1}")
    decoder = config.get("added_tokens_decoder", {})
    # The Kimi wrapper numbers its reserved block right after the ranks; a smaller vocabulary
    # (the bundled mini tokenizer) keeps the K2.5 ids, so the block starts at the config's ids.
    first = min((int(k) for k in decoder), default=n_base)
    if first < n_base:
        raise TokenizerError(
            f"{str(config_path)!r}: added token id {first} collides with the BPE ranks"
            f" 0..{n_base - 1}"
        )
    added: dict[str, int] = {}
    for i in range(first, first + KIMI_NUM_RESERVED_SPECIAL_TOKENS):
        entry = decoder.get(str(i))
        added[entry["content"] if entry else f"<|reserved_token_{i}|>"] = i
    enc = tiktoken.Encoding(
        name or path.name, pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens=added
    )

    find_special = special_finder(added)
    # Short text between special tokens repeats in every prompt (role names such as `user`
    # between `<|im_user|>` and `<|im_middle|>`): the same text always gives the same ids, so
    # they are kept (bounded) instead of being handed to the BPE each time.
    short_ids: dict[str, list[int]] = {}

    def encode_segment(segment: str) -> list[int]:
        if len(segment) > _SHORT_SEGMENT_CHARS:
            return enc.encode_ordinary(segment)
        ids = short_ids.get(segment)
        if ids is None:
            ids = enc.encode_ordinary(segment)
            if len(short_ids) < _SHORT_SEGMENTS_KEPT:
                short_ids[segment] = ids
        return ids

    def encode_with_specials(text: str) -> list[int]:
        # Same ids as tiktoken's encode(allowed_special="all"), without its slow special regex.
        ids: list[int] = []
        # (A prompt block is nearly always one piece: no generator for it.)
        for piece in (text,) if is_whole_piece(text) else kimi_encode_pieces(text):
            pos = 0
            start = 0
            while (m := find_special(piece, start)) is not None:
                token_id = added.get(m.group())
                if token_id is None:
                    start = m.start() + 1  # a look-alike; a real token may begin inside it
                    continue
                if m.start() > pos:
                    ids.extend(encode_segment(piece[pos : m.start()]))
                ids.append(token_id)
                pos = start = m.end()
            if pos < len(piece):
                ids.extend(encode_segment(piece[pos:]))
        return ids

    def encode_ordinary(text: str) -> list[int]:
        if not text:
            return []  # an absent field (content of a tool-call answer): no call into the BPE
        if len(text) <= _KIMI_MAX_RUN_CHARS or is_whole_piece(text):  # (no call when short)
            return enc.encode_ordinary(text)
        ids: list[int] = []
        for piece in kimi_encode_pieces(text):
            ids.extend(enc.encode_ordinary(piece))
        return ids

    template = config.get("chat_template")
    template_file = path / "chat_template.jinja"
    if template is None and template_file.is_file():
        template = template_file.read_text(encoding="utf-8")
    return Tokenizer(
        name=name or path.name,
        encode_ordinary=encode_ordinary,
        encode_with_specials=encode_with_specials,
        decode_bytes=enc.decode_bytes,
        added_tokens=added,
        n_vocab=enc.n_vocab,
        chat_template=template if isinstance(template, str) else None,
        base_vocab_size=n_base,
        source=str(path),
        _id_to_added={v: k for k, v in added.items()},
        token_of_bytes=ranks.get,
    )


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """`base64-token rank` lines. (tiktoken's own loader caches by path name in /tmp, so a file
    changed in place would be read stale.)"""
    ranks: dict[bytes, int] = {}
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as exc:
                raise TokenizerError(f"{path}:{number}: not a 'base64 rank' line ({exc})") from None
    return ranks


# Shapes every Kimi added-token name has. Searching for the shapes and then looking the match up
# is several times faster than an alternation of 256 literal names.
_SPECIAL_SHAPES = (r"<\|[^<>|\s]{1,64}\|>", r"</?[a-z_]{1,32}>", r"\[[A-Z]{2,16}\]")
# The characters every shape begins with: a match can start only where one stands.
_SHAPE_STARTS = ("<", "[")
# Candidates tried one by one before handing the rest of the text to the regex search (text
# full of `<` or `[`, such as code, is scanned faster by the regex alone).
_SHAPE_CANDIDATES_TRIED = 4


def special_finder(names: dict[str, int]) -> Callable[[str, int], re.Match[str] | None]:
    """A search function for added-token names: by shape where they all fit one, else by name."""
    shapes = [re.compile(shape) for shape in _SPECIAL_SHAPES]
    if not all(any(s.fullmatch(name) for s in shapes) for name in names):
        pattern = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)))
        return pattern.search
    pattern = re.compile("|".join(_SPECIAL_SHAPES))
    match, search = pattern.match, pattern.search
    if not all(shape.startswith(("<", "\\[")) for shape in _SPECIAL_SHAPES):
        return search  # a shape that may begin elsewhere: only the full scan is right
    lt, br = _SHAPE_STARTS

    def find(text: str, start: int) -> re.Match[str] | None:
        # The leftmost match starts at the leftmost `<` or `[` where the pattern matches, so
        # trying the pattern at those places (found by memchr) gives what `search` gives; the
        # regex scan over every character is the slow part of encoding a prompt block.
        a, b = text.find(lt, start), text.find(br, start)
        for _ in range(_SHAPE_CANDIDATES_TRIED):
            if a < 0 and b < 0:
                return None
            if b < 0 or 0 <= a < b:
                m = match(text, a)
                if m is not None:
                    return m
                start = a + 1
                a = text.find(lt, start)
            else:
                m = match(text, b)
                if m is not None:
                    return m
                start = b + 1
                b = text.find(br, start)
        return search(text, start)

    return find


def is_whole_piece(text: str) -> bool:
    """True when Kimi's encode() would not cut `text` (the common case, checked cheaply)."""
    n = len(text)
    return n <= _KIMI_MAX_RUN_CHARS or (n <= _KIMI_MAX_ENCODE_CHARS and not _LONG_RUN.search(text))


def kimi_encode_pieces(text: str) -> Iterator[str]:
    """The pieces Kimi's `TikTokenTokenizer.encode` hands to tiktoken, one by one."""
    if is_whole_piece(text):
        yield text
        return
    for i in range(0, len(text), _KIMI_MAX_ENCODE_CHARS):
        yield from _split_long_runs(text[i : i + _KIMI_MAX_ENCODE_CHARS], _KIMI_MAX_RUN_CHARS)


def _split_long_runs(s: str, max_run: int) -> Iterator[str]:
    # Same loop as the Kimi wrapper's `_split_whitespaces_or_nonwhitespaces`.
    run_len = 0
    run_is_space = s[0].isspace() if s else False
    start = 0
    for i, ch in enumerate(s):
        is_space = ch.isspace()
        if run_is_space ^ is_space:
            run_len = 1
            run_is_space = is_space
        else:
            run_len += 1
            if run_len > max_run:
                yield s[start:i]
                start = i
                run_len = 1
    yield s[start:]


def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable character -> byte map used by ByteLevel tokenizers (inlined:
    transformers 5 no longer exports `bytes_to_unicode`)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def load_hf_tokenizer(path: Path) -> Tokenizer:
    """Any tokenizer `transformers.AutoTokenizer` loads, for model families beyond Kimi."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # transformers raises OSError, ValueError and its own types
        raise TokenizerError(f"transformers could not load a tokenizer from {path}: {exc}") from exc
    added = {tok.content: int(i) for i, tok in hf.added_tokens_decoder.items()}
    base = min(added.values()) if added else len(hf)

    def encode_ordinary(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False, split_special_tokens=True))

    def encode_with_specials(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False))

    def decode_bytes(ids: list[int]) -> bytes:
        # transformers types decode for a batch too (list[str]); one sequence is a str.
        return cast(str, hf.decode(ids, skip_special_tokens=False)).encode("utf-8")

    if type(hf.backend_tokenizer.decoder).__name__ == "ByteLevel":
        # A byte-level BPE token can hold part of a UTF-8 character, which `hf.decode([id])`
        # turns into U+FFFD: map each token's characters back to its bytes instead, so
        # token-by-token bytes re-join to the exact text (as Kimi's tiktoken decode does).
        byte_of = _byte_level_table()
        id_to_added = {v: k for k, v in added.items()}

        def decode_bytes(ids: list[int]) -> bytes:
            out = bytearray()
            for i in ids:
                name = id_to_added.get(i)
                out += name.encode() if name is not None else bytes(
                    byte_of[c] for c in hf.convert_ids_to_tokens(i))
            return bytes(out)

    token_of_bytes = None
    if type(hf.backend_tokenizer.decoder).__name__ == "ByteLevel":
        char_of = {b: c for c, b in _byte_level_table().items()}
        vocab = hf.backend_tokenizer.get_vocab(with_added_tokens=False)

        def token_of_bytes(data: bytes) -> int | None:
            return vocab.get("".join(char_of[b] for b in data))

    template = hf.chat_template if isinstance(hf.chat_template, str) else None
    return Tokenizer(
        name=path.name,
        encode_ordinary=encode_ordinary,
        encode_with_specials=encode_with_specials,
        decode_bytes=decode_bytes,
        added_tokens=added,
        n_vocab=len(hf),
        chat_template=template,
        base_vocab_size=base,
        source=str(path),
        _id_to_added={v: k for k, v in added.items()},
        token_of_bytes=token_of_bytes,
    )
