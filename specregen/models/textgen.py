"""Deterministic model-like text: prose, code, CJK, emoji, whitespace runs, literal markers
(the format's marker strings, handed in by its served side, written as plain text).

The emulator writes its completions with it, the families' fidelity corpora
(`models/<family>/corpus.py`) the text of their answers, and the benchmarks use it for realistic
lengths; it names no family. Everything is drawn from a `random.Random`, so a seed gives the
same text every time.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "all",
    "can",
    "one",
    "has",
    "their",
    "more",
    "will",
    "would",
    "there",
    "if",
    "about",
    "so",
    "what",
    "when",
    "other",
    "into",
    "data",
    "model",
    "token",
    "request",
    "response",
    "stream",
    "value",
    "function",
    "result",
    "error",
    "retry",
    "batch",
    "sample",
    "pipeline",
    "schema",
    "argument",
    "first",
    "then",
    "check",
    "need",
    "should",
    "because",
    "however",
    "since",
    "let",
    "me",
    "think",
    "user",
    "asks",
    "weather",
    "city",
    "price",
    "order",
    "list",
    "number",
    "string",
    "parse",
    "return",
    "call",
    "tool",
    "answer",
    "step",
    "compute",
    "average",
    "maximum",
    "sorted",
    "index",
    "memory",
    "cache",
    "latency",
    "server",
    "client",
    "provider",
    "budget",
]
CJK = [
    "我们需要先检查输入数据的格式。",
    "这个函数返回排序后的列表。",
    "请注意边界条件和空列表的情况。",
    "東京の天気は晴れです。",
    "데이터를 다시 확인하겠습니다.",
]
EMOJI = ["🙂", "🚀", "✅", "🔥", "👩‍💻", "📦", "🇫🇷"]
CODE = [
    "def average(xs: list[float]) -> float:\n    if not xs:\n        return 0.0\n"
    "    return sum(xs) / len(xs)\n",
    "for i in range(n):\n    if a[i] > best:\n        best = a[i]\n",
    "const total = items.reduce((acc, x) => acc + x.price, 0);\n",
    "#include <vector>\nint main() {\n    std::vector<int> v{3, 1, 2};\n    return 0;\n}\n",
    "SELECT city, AVG(temp) FROM weather GROUP BY city ORDER BY 2 DESC;\n",
]

def sentence(rng: random.Random) -> str:
    # `choices` draws all words in one call: the emulator writes most of its text here.
    words = rng.choices(WORDS, k=rng.randint(6, 18))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", ":", "!"])


def prose(rng: random.Random, n_tokens: int, *, literal_rate: float = 0.0,
          literals: Sequence[str] = ()) -> str:
    """About `n_tokens` tokens of reasoning-like prose; with `literals` (strings a model writes
    as text now and then, e.g. when it talks about its own format) at `literal_rate`."""
    out: list[str] = []
    size = 0
    while size < n_tokens:
        roll = rng.random()
        if roll < 0.06:
            piece = rng.choice(CJK)
        elif roll < 0.09:
            piece = rng.choice(EMOJI)
        elif literals and roll < 0.09 + literal_rate:
            piece = f"the string {rng.choice(literals)} is plain text"
        else:
            piece = sentence(rng)
        out.append(piece)
        size += max(1, len(piece) // 4)
        out.append(rng.choice([" ", " ", " ", "\n", "\n\n", "  "]))
    return "".join(out).rstrip()


def answer(rng: random.Random, n_tokens: int, *, literal_rate: float = 0.0,
           literals: Sequence[str] = ()) -> str:
    """About `n_tokens` tokens of an answer: prose with markdown and fenced code."""
    out: list[str] = []
    size = 0
    while size < n_tokens:
        if rng.random() < 0.3:
            code = rng.choice(CODE)
            if rng.random() < literal_rate and literals:
                code += f"marker = {rng.choice(literals)!r}\n"
            piece = f"```python\n{code}```"
        else:
            piece = prose(rng, rng.randint(20, 80), literal_rate=literal_rate, literals=literals)
        out.append(piece)
        size += max(1, len(piece) // 4)
        out.append("\n\n")
    return "".join(out).rstrip()


def arguments(rng: random.Random, schema: dict | None = None) -> str:
    """A JSON arguments object, filled from a parameters schema where one is given."""
    props = (schema or {}).get("properties") or {}
    obj: dict = {}
    for name, spec in props.items():
        obj[name] = _value(rng, spec if isinstance(spec, dict) else {})
    if not props:
        obj = {"query": " ".join(rng.choice(WORDS) for _ in range(3))}
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5)


def _value(rng: random.Random, spec: dict):
    kind = spec.get("type")
    if spec.get("enum"):
        return rng.choice(spec["enum"])
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_value(rng, spec.get("items") or {"type": "string"}) for _ in range(2)]
    if kind == "object":
        return {k: _value(rng, v) for k, v in (spec.get("properties") or {}).items()}
    return rng.choice([rng.choice(WORDS), rng.choice(CJK), "New York", "Paris"])
