#!/usr/bin/env python3
"""Train specregen's bundled "mini tokenizer": a tiny byte-level BPE shaped like Kimi K2.5's.

The real Kimi vocabulary (163,584 ranks) is not ours to ship, but tests and the demo need a
tokenizer that behaves the same way structurally: tiktoken format, Kimi's exact pre-tokenizer
regex, byte-level ranks 0-255, and the K2.5 added-token table at ids 163584-163839. This script
builds one deterministically from a corpus it generates itself (text written for this project),
so the output is byte-identical on every run and needs no network.

Usage:
    python scripts/train_mini_tokenizer.py --out specregen/assets/mini_tokenizer [--vocab 4096]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import heapq
import itertools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import regex
import tiktoken

# --------------------------------------------------------------------------------------------
# Kimi K2.5 tokenizer facts (SPEC sections 1.2 and 1.3)
# --------------------------------------------------------------------------------------------

KIMI_PAT_ALTERNATIVES: tuple[str, ...] = (
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
)
KIMI_PAT_STR = "|".join(KIMI_PAT_ALTERNATIVES)

FIRST_ADDED_ID = 163_584
NUM_RESERVED_SPECIAL_TOKENS = 256
MODEL_MAX_LENGTH = 262_144

# (id, content, HF "special" flag). Ids missing here are reserved and get no entry, exactly like
# the K2.5 tokenizer_config.json; the runtime names them <|reserved_token_{id}|>.
K25_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (163584, "[BOS]", True),
    (163585, "[EOS]", True),
    (163586, "<|im_end|>", True),
    (163587, "<|im_user|>", True),
    (163588, "<|im_assistant|>", True),
    (163590, "<|start_header_id|>", True),
    (163591, "<|end_header_id|>", True),
    (163593, "[EOT]", True),
    (163594, "<|im_system|>", True),
    (163595, "<|tool_calls_section_begin|>", False),
    (163596, "<|tool_calls_section_end|>", False),
    (163597, "<|tool_call_begin|>", False),
    (163598, "<|tool_call_argument_begin|>", False),
    (163599, "<|tool_call_end|>", False),
    (163601, "<|im_middle|>", True),
    (163602, "<|media_begin|>", True),
    (163603, "<|media_content|>", True),
    (163604, "<|media_end|>", True),
    (163605, "<|media_pad|>", True),
    (163606, "<think>", False),
    (163607, "</think>", False),
    (163838, "[UNK]", True),
    (163839, "[PAD]", True),
)
K25_ADDITIONAL_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
)

# --------------------------------------------------------------------------------------------
# Corpus: text written for this project, expanded deterministically from templates
# --------------------------------------------------------------------------------------------

PROSE_SENTENCES: tuple[str, ...] = (
    "A data pipeline is only as reliable as its slowest, least observed stage.",
    "The tokenizer turns raw text into integer ids, and every later stage trusts those ids.",
    "Byte-level BPE never fails on unknown characters because it can always fall back to bytes.",
    "We split the text with a regular expression first, so merges never cross word boundaries.",
    "Speculative decoding lets a small draft model propose tokens that the large model verifies.",
    "If the draft model sees different token ids than the target model, acceptance rates collapse.",
    "Deduplication runs before shuffling; otherwise near-duplicates leak across the splits.",
    "Each shard is a gzip-compressed JSONL file with one conversation per line.",
    "The scheduler retries a failed task three times, then pages whoever is on call.",
    "Don't trust a metric you can't reproduce from the raw logs.",
    "It's cheaper to validate a record at ingestion than to debug it after training.",
    "They'll ask why the numbers changed, so we keep every manifest under version control.",
    "We've seen providers strip whitespace from tool-call arguments, which changes the tokens.",
    "The chat template inserts role markers, and the markers are single special tokens.",
    "Reasoning text sits between the think tags and is dropped from earlier assistant turns.",
    "A tool call has an id such as functions.get_weather:0, a name, and a JSON argument string.",
    "Numbers are split into groups of at most three digits before any merge is applied.",
    "Chinese characters form their own pre-tokens, separate from Latin letters and punctuation.",
    "Runs of spaces at the start of a line usually become one or two indentation tokens.",
    "The exporter writes Parquet files partitioned by date and by source.",
    "Our validator rejects records whose reconstructed text differs from the provider's text.",
    "Latency is measured at the 50th, 90th, and 99th percentiles for every batch size.",
    "The cache key is the sha256 of the request body, so identical prompts hit the cache.",
    "Streaming responses arrive as server-sent events; each event carries a small JSON delta.",
    "When the stream ends early, the finish_reason is missing and the record is marked partial.",
    "I'm not sure the retry budget is large enough for the nightly backfill.",
    "You'd think UTF-8 is simple until an emoji gets cut in half at a chunk boundary.",
    "Every merge rule joins two existing tokens into a new, longer token.",
    "The vocabulary is ordered by rank: the lower the rank, the earlier the merge was learned.",
    "Special tokens are matched before the regex runs, so they never split into pieces.",
    "A reserved id has no text of its own, but it still counts toward the vocabulary size.",
    "The demo loads a tiny tokenizer so that it starts in milliseconds on a laptop.",
    "Please keep the corpus deterministic; a flaky tokenizer makes every test flaky.",
    "Monitoring dashboards show throughput in tokens per second and cost per million tokens.",
    "The ingestion worker reads from the queue, normalizes the payload, and acknowledges it.",
    "Backpressure matters: when the writer slows down, the reader must slow down too.",
    "Schema drift happens quietly, usually on a Friday evening.",
    "The eval harness compares greedy outputs token by token against a golden file.",
    "Weights are sharded across eight GPUs, and the draft head lives on the first one.",
    "OpenRouter forwards requests to several providers, and each one formats output a bit "
    "differently.",
    "Some providers return reasoning in a separate field; others inline it in the content.",
    "A missing newline at the end of a file is harmless for JSON but annoying in diffs.",
    "When two workers write the same object key, the last writer silently wins.",
    "Idempotent jobs can be retried blindly; everything else needs a careful checkpoint.",
    "The profiler showed that most of the time went into decoding base64 strings.",
    "Unicode normalization is off: the bytes we store are exactly the bytes we received.",
    "Tab characters survive the round trip, and so do carriage returns and zero-width joiners.",
    "Rate limits are per key and per minute, so the client spreads requests evenly.",
    "Quantized weights load faster, but the draft head stays in bfloat16 for accuracy.",
    "Nobody remembers why that flag exists, which is exactly why it needs a comment.",
    "Acceptance length is the average number of draft tokens the target model keeps.",
    "Greedy decoding is deterministic only if the kernels are deterministic as well.",
    "The manifest lists every shard with its byte size, row count, and checksum.",
    "Temperature zero does not guarantee identical outputs across different hardware.",
    "Our golden files are tiny on purpose, so a reviewer can read every line.",
    'Escaped quotes inside JSON strings, like \\"this\\", often trip up naive parsers.',
    "Whitespace-only lines are kept, because indentation carries meaning in Python.",
    "The queue holds at most ten thousand messages before producers start blocking.",
    "Yesterday's run processed 1,234,567 conversations in 3 hours and 12 minutes.",
    "Version 0.14.0 of tiktoken compiles Kimi's pattern, including the class intersections.",
    "Keep secrets out of logs; redact API keys before anything is written to disk.",
    "A good test fails loudly, explains itself, and never depends on wall-clock time.",
    "Merge ranks must be contiguous, starting at zero, with no gaps and no duplicates.",
    "The assistant answered in French, then switched to English halfway through the reply.",
    "Cold starts dominate short jobs; warm pools dominate the monthly bill.",
)

# fmt: off
# Word banks stay packed several to a line; one word per line would be 800 lines of noise.
ADJECTIVES: tuple[str, ...] = (
    "stale", "sharded", "compressed", "nightly", "incremental", "partial", "duplicate",
    "malformed", "streaming", "cached", "deterministic", "asynchronous", "tokenized", "normalized",
    "idempotent", "upstream", "downstream", "encrypted", "verbose", "noisy", "sparse", "dense",
    "quantized", "batched", "ordered", "missing", "truncated", "nested", "flattened", "optional",
    "required", "experimental", "legacy", "stable", "fresh", "expensive", "cheap", "slow", "fast",
    "shared", "private", "temporary", "remote", "local", "global", "hidden", "visible", "empty",
    "full", "large", "small", "tiny", "huge", "narrow", "wide", "early", "late", "recent",
    "ancient", "modern", "simple", "complex", "obvious", "subtle", "strict", "lenient", "careful",
    "careless", "broken", "healthy", "unhealthy", "flaky", "reliable", "unreliable", "readable",
    "unreadable", "portable", "mutable", "immutable", "lazy", "eager", "greedy", "random",
    "sequential", "parallel", "concurrent", "distributed", "central", "regional", "primary",
    "secondary", "internal", "external", "public", "useful", "useless", "valid", "invalid",
    "exact", "approximate", "raw", "clean", "dirty", "binary", "textual", "numeric", "structured",
    "unstructured", "compact", "redundant", "unique", "common", "rare", "frequent", "occasional",
    "manual", "automatic", "interactive", "offline", "online", "synthetic", "organic",
    "multilingual", "bilingual", "monolingual", "weekly", "monthly", "yearly", "hourly",
)
# Single lowercase words, so they double as identifier parts in the code templates.
NOUNS: tuple[str, ...] = (
    "scheduler", "parser", "tokenizer", "vocabulary", "checkpoint", "manifest", "shard",
    "partition", "bucket", "queue", "worker", "consumer", "producer", "buffer", "cursor", "offset",
    "schema", "column", "table", "index", "snapshot", "ledger", "journal", "replica", "cluster",
    "node", "container", "volume", "endpoint", "gateway", "router", "proxy", "request", "response",
    "payload", "header", "timestamp", "timezone", "deadline", "budget", "quota", "throttle",
    "metric", "histogram", "counter", "gauge", "alert", "dashboard", "runbook", "incident",
    "rollback", "migration", "fixture", "assertion", "benchmark", "profiler", "allocator",
    "kernel", "tensor", "gradient", "optimizer", "embedding", "attention", "decoder", "encoder",
    "sampler", "logit", "temperature", "prompt", "completion", "transcript", "argument",
    "signature", "docstring", "changelog", "release", "artifact", "registry", "mirror", "tarball",
    "wheel", "lockfile", "record", "message", "token", "batch", "sample", "conversation", "chunk",
    "event", "draft", "trace", "account", "address", "agent", "algorithm", "analysis", "answer",
    "application", "approach", "archive", "area", "array", "attempt", "author", "backup",
    "balance", "bandwidth", "baseline", "behavior", "binding", "block", "boundary", "branch",
    "bridge", "browser", "bug", "builder", "bundle", "button", "cache", "calendar", "callback",
    "candidate", "capacity", "category", "certificate", "channel", "character", "checksum",
    "choice", "circle", "class", "client", "clock", "code", "collection", "command", "comment",
    "commit", "community", "comparison", "compiler", "component", "computer", "condition",
    "config", "connection", "constant", "constraint", "content", "context", "contract", "control",
    "copy", "core", "corpus", "country", "course", "coverage", "credential", "customer", "cycle",
    "database", "dataset", "date", "debugger", "default", "definition", "delay", "delivery",
    "dependency", "deployment", "description", "design", "detail", "device", "dictionary",
    "difference", "directory", "discussion", "disk", "distance", "document", "domain", "download",
    "driver", "duration", "editor", "effect", "element", "email", "engine", "engineer", "entity",
    "entry", "environment", "error", "estimate", "evaluation", "example", "exception", "execution",
    "experiment", "expression", "extension", "factor", "failure", "feature", "feedback", "field",
    "figure", "file", "filter", "flag", "folder", "font", "format", "formula", "fragment", "frame",
    "framework", "function", "future", "generator", "goal", "graph", "group", "guide", "handler",
    "hardware", "hash", "heap", "history", "host", "hour", "identifier", "image", "import",
    "input", "instance", "instruction", "integer", "interface", "interval", "inventory", "issue",
    "item", "iterator", "job", "key", "keyboard", "label", "language", "latency", "layer",
    "layout", "library", "license", "limit", "line", "link", "list", "listener", "literal",
    "loader", "lock", "log", "loop", "machine", "mailbox", "map", "mask", "matrix", "memory",
    "method", "minute", "mode", "model", "module", "monitor", "month", "namespace", "network",
    "notebook", "notice", "number", "object", "operator", "option", "order", "origin", "output",
    "owner", "package", "page", "parameter", "pattern", "peer", "permission", "person", "pipeline",
    "pixel", "platform", "plugin", "pointer", "policy", "pool", "port", "position", "preview",
    "printer", "priority", "problem", "process", "product", "profile", "program", "project",
    "property", "protocol", "provider", "query", "question", "range", "rank", "rate", "reader",
    "reason", "receiver", "recipe", "reference", "region", "report", "repository", "resource",
    "result", "review", "revision", "role", "rule", "runtime", "scope", "score", "screen",
    "script", "search", "second", "secret", "section", "selector", "sender", "sentence",
    "sequence", "server", "service", "session", "setting", "shell", "size", "slot", "socket",
    "solution", "source", "space", "specification", "stack", "stage", "state", "statement",
    "status", "step", "storage", "store", "strategy", "string", "structure", "student", "subject",
    "summary", "support", "symbol", "system", "target", "task", "team", "template", "tenant",
    "terminal", "test", "thread", "ticket", "timeline", "timer", "tool", "topic", "tracker",
    "transaction", "transform", "tree", "type", "unit", "update", "upgrade", "user", "utility",
    "value", "variable", "vector", "vendor", "version", "view", "visitor", "warning", "website",
    "week", "window", "word", "workflow", "workspace", "writer", "year", "zone",
)
# (base, third person, past participle, gerund), spelled out by hand so the sentences stay
# grammatical without inflection rules; the inflections also give BPE real suffixes to learn.
VERBS: tuple[tuple[str, str, str, str], ...] = (
    ("read", "reads", "read", "reading"),
    ("write", "writes", "written", "writing"),
    ("parse", "parses", "parsed", "parsing"),
    ("validate", "validates", "validated", "validating"),
    ("flush", "flushes", "flushed", "flushing"),
    ("merge", "merges", "merged", "merging"),
    ("split", "splits", "split", "splitting"),
    ("load", "loads", "loaded", "loading"),
    ("dump", "dumps", "dumped", "dumping"),
    ("encode", "encodes", "encoded", "encoding"),
    ("decode", "decodes", "decoded", "decoding"),
    ("compress", "compresses", "compressed", "compressing"),
    ("upload", "uploads", "uploaded", "uploading"),
    ("download", "downloads", "downloaded", "downloading"),
    ("retry", "retries", "retried", "retrying"),
    ("schedule", "schedules", "scheduled", "scheduling"),
    ("cancel", "cancels", "cancelled", "cancelling"),
    ("normalize", "normalizes", "normalized", "normalizing"),
    ("rotate", "rotates", "rotated", "rotating"),
    ("archive", "archives", "archived", "archiving"),
    ("sort", "sorts", "sorted", "sorting"),
    ("filter", "filters", "filtered", "filtering"),
    ("count", "counts", "counted", "counting"),
    ("hash", "hashes", "hashed", "hashing"),
    ("sign", "signs", "signed", "signing"),
    ("verify", "verifies", "verified", "verifying"),
    ("render", "renders", "rendered", "rendering"),
    ("stream", "streams", "streamed", "streaming"),
    ("shuffle", "shuffles", "shuffled", "shuffling"),
    ("truncate", "truncates", "truncated", "truncating"),
    ("pad", "pads", "padded", "padding"),
    ("emit", "emits", "emitted", "emitting"),
    ("collect", "collects", "collected", "collecting"),
    ("publish", "publishes", "published", "publishing"),
    ("subscribe", "subscribes", "subscribed", "subscribing"),
    ("migrate", "migrates", "migrated", "migrating"),
    ("replay", "replays", "replayed", "replaying"),
    ("build", "builds", "built", "building"),
    ("throttle", "throttles", "throttled", "throttling"),
    ("fetch", "fetches", "fetched", "fetching"),
    ("apply", "applies", "applied", "applying"),
    ("index", "indexes", "indexed", "indexing"),
    ("configure", "configures", "configured", "configuring"),
    ("deploy", "deploys", "deployed", "deploying"),
    ("allocate", "allocates", "allocated", "allocating"),
    ("serialize", "serializes", "serialized", "serializing"),
    ("partition", "partitions", "partitioned", "partitioning"),
    ("tokenize", "tokenizes", "tokenized", "tokenizing"),
    ("sample", "samples", "sampled", "sampling"),
    ("quantize", "quantizes", "quantized", "quantizing"),
    ("accept", "accepts", "accepted", "accepting"),
    ("reject", "rejects", "rejected", "rejecting"),
    ("compute", "computes", "computed", "computing"),
    ("convert", "converts", "converted", "converting"),
    ("copy", "copies", "copied", "copying"),
    ("create", "creates", "created", "creating"),
    ("delete", "deletes", "deleted", "deleting"),
    ("detect", "detects", "detected", "detecting"),
    ("disable", "disables", "disabled", "disabling"),
    ("enable", "enables", "enabled", "enabling"),
    ("estimate", "estimates", "estimated", "estimating"),
    ("export", "exports", "exported", "exporting"),
    ("extract", "extracts", "extracted", "extracting"),
    ("format", "formats", "formatted", "formatting"),
    ("generate", "generates", "generated", "generating"),
    ("handle", "handles", "handled", "handling"),
    ("import", "imports", "imported", "importing"),
    ("inspect", "inspects", "inspected", "inspecting"),
    ("install", "installs", "installed", "installing"),
    ("limit", "limits", "limited", "limiting"),
    ("measure", "measures", "measured", "measuring"),
    ("monitor", "monitors", "monitored", "monitoring"),
    ("open", "opens", "opened", "opening"),
    ("close", "closes", "closed", "closing"),
    ("predict", "predicts", "predicted", "predicting"),
    ("process", "processes", "processed", "processing"),
    ("record", "records", "recorded", "recording"),
    ("release", "releases", "released", "releasing"),
    ("remove", "removes", "removed", "removing"),
    ("replace", "replaces", "replaced", "replacing"),
    ("report", "reports", "reported", "reporting"),
    ("resolve", "resolves", "resolved", "resolving"),
    ("restart", "restarts", "restarted", "restarting"),
    ("return", "returns", "returned", "returning"),
    ("scan", "scans", "scanned", "scanning"),
    ("search", "searches", "searched", "searching"),
    ("select", "selects", "selected", "selecting"),
    ("send", "sends", "sent", "sending"),
    ("skip", "skips", "skipped", "skipping"),
    ("store", "stores", "stored", "storing"),
    ("summarize", "summarizes", "summarized", "summarizing"),
    ("test", "tests", "tested", "testing"),
    ("track", "tracks", "tracked", "tracking"),
    ("train", "trains", "trained", "training"),
    ("translate", "translates", "translated", "translating"),
    ("update", "updates", "updated", "updating"),
    ("wrap", "wraps", "wrapped", "wrapping"),
)
# Prefixes that read naturally on a past participle ("the reindexed shard", "unsigned"); the
# empty prefix is listed twice so that most participles stay plain.
VERB_PREFIXES: tuple[str, ...] = ("", "re", "pre", "un", "over", "auto", "")
ADVERBS: tuple[str, ...] = (
    "quickly", "silently", "eventually", "twice", "lazily", "eagerly", "incrementally",
    "safely", "rarely", "usually", "carefully", "manually", "automatically", "again",
)
PREPOSITIONS: tuple[str, ...] = (
    "before", "after", "without", "with", "for", "from", "into", "during", "across",
    "behind", "inside", "under", "beside",
)
# fmt: on
PHRASES: tuple[str, ...] = (
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "tokenizers are fun",
    "What's the weather like in Paris today?",
    "naïve café in Zürich",
    "三个数据管道",
    "def main(): pass",
    "emoji 🚀 test",
)

CHINESE_SENTENCES: tuple[str, ...] = (
    "数据管道把原始文本切分成小块，然后交给分词器处理。",
    "分词器使用字节级的合并算法，所以任何字符串都可以被编码。",
    "我们在训练之前先去掉重复的样本，以免模型记住它们。",
    "这个脚本每天凌晨三点运行一次，并把结果写入对象存储。",
    "如果工具调用失败，系统会记录错误并重新尝试三次。",
    "北京今天的天气是晴天，最高气温二十五摄氏度。",
    "请帮我查询一下上海明天的天气。",
    "模型的上下文长度是二十六万个词元。",
    "推测解码用一个小的草稿模型来预测接下来的几个词元。",
    "验证阶段由大模型一次性检查所有草稿词元。",
    "我们需要精确地重建每一个词元的编号。",
    "日志文件按照日期分区，每个分区大约有两百兆字节。",
    "这段代码读取配置文件并返回一个字典。",
    "测试通过以后，我们会把分词器打包进发布版本。",
    "中文文本在预分词时会被切成连续的汉字片段。",
    "数字会被拆成最多三位一组。",
    "表情符号通常占用四个字节。",
    "请用摄氏度告诉我巴黎现在的温度。",
    "服务器返回的每一条消息都带有角色和内容两个字段。",
    "推理内容放在思考标签里面，最终回答放在后面。",
    "这个函数的参数是一个城市名称和一个温度单位。",
    "我们的评测集包含一千条多轮对话。",
    "训练数据必须和线上模型使用完全相同的分词方式。",
    "如果两个提供商的输出格式不同，就需要分别处理。",
    "缓存命中率在高峰期下降到百分之六十。",
    "工程师们正在同时修改不同的文件。",
    "小模型负责起草，大模型负责验证。",
    "这份文档说明了如何重新生成词表文件。",
)

# fmt: off
# Chinese word banks: Han runs are single pre-tokens, so recombining words keeps BPE from
# simply memorising a few dozen whole clauses.
ZH_TIMES: tuple[str, ...] = (
    "今天", "昨天", "明天", "每天早上", "上周", "下个月", "凌晨三点", "周末", "刚才", "中午",
    "晚上", "去年", "最近", "后来", "现在",
)
ZH_SUBJECTS: tuple[str, ...] = (
    "数据管道", "分词器", "草稿模型", "调度器", "验证脚本", "工程师", "服务器", "缓存系统",
    "评测程序", "日志服务", "目标模型", "客户端", "研究员", "产品经理", "测试团队", "数据库",
    "消息队列", "网关", "监控系统", "编译器", "浏览器", "操作系统", "推理服务", "训练任务",
    "部署工具", "代码审查员", "运维同事", "新同学", "用户", "管理员",
)
ZH_VERBS: tuple[str, ...] = (
    "读取了", "写入了", "处理了", "检查了", "压缩了", "删除了", "合并了", "上传了", "重建了",
    "统计了", "拒绝了", "下载了", "生成了", "修复了", "更新了", "发布了", "迁移了", "导出了",
    "保存了", "打开了", "关闭了", "比较了", "翻译了", "记录了", "忽略了",
)
ZH_OBJECTS: tuple[str, ...] = (
    "新的分片", "所有的对话", "工具调用参数", "词元编号", "配置文件", "错误日志", "推理内容",
    "训练样本", "模型权重", "天气数据", "请求", "缓存条目", "测试用例", "用户反馈", "源代码",
    "文档", "索引", "表格", "图片", "视频", "网页", "接口", "数据集", "检查点", "版本号", "依赖包",
    "环境变量", "密钥", "证书", "报告", "任务列表", "温度单位", "城市名称", "时间戳",
)
ZH_REASONS: tuple[str, ...] = (
    "太大了", "太慢了", "已经过期了", "格式不对", "没有权限", "内容重复", "网络不稳定",
    "磁盘快满了", "版本太旧了", "缺少字段", "编码错误", "超出了限制",
)
JA_TIMES: tuple[str, ...] = ("きょう", "あした", "きのう", "けさ", "こんばん", "まいにち", "いま")
JA_NOUNS: tuple[str, ...] = (
    "データ", "ファイル", "トークン", "モデル", "サーバー", "キャッシュ", "リクエスト", "ログ",
    "スクリプト", "パイプライン", "テスト", "メッセージ", "ツール", "エラー",
)
JA_VERBS: tuple[str, ...] = (
    "よみこみます", "かきこみます", "しらべます", "けします", "おくります", "うけとります",
    "ためします", "なおします", "まとめます", "わけます", "くらべます",
)
# fmt: on
JAPANESE_SENTENCES: tuple[str, ...] = (
    "これはトークナイザーのテストです。",
    "データパイプラインはまいにちうごいています。",
    "きょうはいいてんきですね。",
    "ファイルをよみこんでから、トークンにわけます。",
    "エラーがおきたら、もういちどためしてください。",
    "パリのてんきをしらべてください。",
    "ひらがなとカタカナとかんじをまぜてかきます。",
    "モデルはつぎのトークンをよそくします。",
    "このスクリプトはネットワークをつかいません。",
    "ありがとうございます。またあした。",
    "サーバーからのレスポンスをストリーミングでうけとります。",
    "ツールのよびだしがしっぱいしました。",
    "東京の天気はくもりのちあめです。",
    "ログをみて、どこでおそくなったかをさがします。",
    "キャッシュのヒットりつがあがりました。",
    "すこしまってから、もういちどリクエストをおくります。",
)

EMOJI_LINES: tuple[str, ...] = (
    "✅ build passed 🎉",
    "❌ 3 tests failed, see the log 👇",
    "⚠️ retrying in 5s …",
    "🚀 deployed v2.4.1 to staging",
    "🔥 hot path: tokenizer.encode",
    "👍🏽 looks good to me",
    "👩‍💻 pairing on the parser today",
    "☀️ Paris 24°C, 🌧️ London 14°C, ❄️ Oslo -3°C",
    "🇫🇷 🇯🇵 🇨🇳 🇺🇸 🇩🇪",
    "🙂🙂🙂 tokens: 12 → 9 after merging",
    "📦 shard-00042.jsonl.gz (128 MiB)",
    "🐍 Python 3.11 · 🦀 Rust 1.79 · ☕ Java 21",
)

CITIES: tuple[tuple[str, str], ...] = (
    ("Paris", "celsius"),
    ("Tokyo", "celsius"),
    ("New York", "fahrenheit"),
    ("San Francisco", "fahrenheit"),
    ("Berlin", "celsius"),
    ("北京", "celsius"),
    ("上海", "celsius"),
    ("東京", "celsius"),
    ("São Paulo", "celsius"),
    ("Zürich", "celsius"),
    ("Reykjavík", "celsius"),
    ("Chicago", "fahrenheit"),
    ("Sydney", "celsius"),
    ("Mumbai", "celsius"),
)

TOOLS: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "get_weather",
        "Get the current weather for a location.",
        (
            ("location", "string", "City name, e.g. Paris"),
            ("unit", "string", "celsius or fahrenheit"),
        ),
    ),
    (
        "search_web",
        "Search the web and return the top results.",
        (("query", "string", "The search query"), ("max_results", "integer", "At most 10")),
    ),
    (
        "run_python",
        "Execute a Python snippet in a sandbox.",
        (("code", "string", "Source code to run"), ("timeout", "number", "Seconds")),
    ),
    (
        "read_file",
        "Read a UTF-8 text file from the workspace.",
        (("path", "string", "Relative path"), ("offset", "integer", "Byte offset")),
    ),
)

PYTHON_TEMPLATES: tuple[str, ...] = (
    '''import json


def load_<<noun>>s(path: str, *, limit: int | None = None) -> list[dict]:
    """Read <<noun>> records from a JSONL file."""
    records: list[dict] = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: bad JSON") from exc
            if limit is not None and len(records) >= limit:
                break
    return records
''',
    """from dataclasses import dataclass


@dataclass(frozen=True)
class <<Noun>>Batch:
    ids: list[int]
    mask: list[bool]
    source: str = "<<source>>"

    def __len__(self) -> int:
        return len(self.ids)

    def trimmed(self, max_len: int = <<num>>) -> "<<Noun>>Batch":
        return <<Noun>>Batch(self.ids[:max_len], self.mask[:max_len], self.source)
""",
    """async def fetch_<<noun>>(client: httpx.AsyncClient, url: str, retries: int = <<small>>):
    for attempt in range(retries):
        response = await client.get(url, timeout=<<num>>.0)
        if response.status_code == 200:
            return response.json()
        await asyncio.sleep(2 ** attempt)
    raise RuntimeError(f"giving up on {url} after {retries} attempts")
""",
    """import tiktoken

enc = tiktoken.get_encoding("cl100k_base")
ids = enc.encode("<<phrase>>")
assert enc.decode(ids) == "<<phrase>>"
print(len(ids), ids[:8])
""",
    """def test_<<noun>>_round_trip(tmp_path):
    path = tmp_path / "<<noun>>.jsonl"
    path.write_text('{"id": <<num>>, "text": "<<phrase>>"}\\n')
    rows = load_<<noun>>s(str(path))
    assert rows == [{"id": <<num>>, "text": "<<phrase>>"}]
""",
    """class <<Noun>>Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def most_common(self, k: int = <<small>>) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


if __name__ == "__main__":
    counter = <<Noun>>Counter()
    for word in "<<phrase>>".split():
        counter.add(word)
    print(counter.most_common())
""",
    '''def <<verb>>_<<noun>>(<<noun>>: <<Noun>>, *, <<adj>>: bool = False) -> <<Noun>>:
    """<<Verb>> one <<noun>>; pass <<adj>>=True to keep the <<adj>> copy."""
    if <<adj>>:
        return <<noun>>.copy()
    result = <<noun>>.<<verb>>()
    logger.debug("<<verb>>_<<noun>>: %d items", len(result))
    return result
''',
    """def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
""",
)

JS_TEMPLATES: tuple[str, ...] = (
    """export function <<verb>><<Noun>>(<<noun>>, options = {}) {
  const { <<adj>> = false, retries = <<small>> } = options;
  if (!<<noun>>) {
    return null; // nothing to <<verb>>
  }
  return <<adj>> ? <<noun>> : { ...<<noun>>, retries, updatedAt: new Date().toISOString() };
}
""",
    """export async function get<<Noun>>(id, { signal } = {}) {
  const res = await fetch(`/api/v1/<<noun>>s/${id}`, { signal });
  if (!res.ok) {
    throw new Error(`request failed: ${res.status}`);
  }
  const body = await res.json();
  return body.items.map((item) => ({ ...item, seen: true }));
}
""",
    """const <<noun>>Queue = [];

function push<<Noun>>(item) {
  if (<<noun>>Queue.length >= <<num>>) {
    <<noun>>Queue.shift();
  }
  <<noun>>Queue.push({ ...item, at: Date.now() });
}

module.exports = { push<<Noun>>, <<noun>>Queue };
""",
    """for await (const chunk of stream) {
  const delta = chunk.choices?.[0]?.delta ?? {};
  if (delta.content) {
    process.stdout.write(delta.content);
  }
  if (delta.tool_calls) {
    for (const call of delta.tool_calls) {
      pending[call.index] = (pending[call.index] ?? "") + (call.function?.arguments ?? "");
    }
  }
}
""",
)

CPP_TEMPLATES: tuple[str, ...] = (
    """#include <string>
#include <vector>

std::vector<int> encode_<<noun>>(const std::string& text) {
    std::vector<int> ids;
    ids.reserve(text.size());
    for (unsigned char byte : text) {
        ids.push_back(static_cast<int>(byte) + <<num>>);
    }
    return ids;
}
""",
    """struct <<Noun>>Stats {
    std::size_t count = 0;
    double mean = 0.0;

    void add(double value) {
        ++count;
        mean += (value - mean) / static_cast<double>(count);
    }
};

int main() {
    <<Noun>>Stats stats;
    for (int i = 0; i < <<num>>; ++i) {
        stats.add(i * 0.5);
    }
    std::printf("%zu %f\\n", stats.count, stats.mean);
    return 0;
}
""",
    """template <typename T>
class RingBuffer {
public:
    explicit RingBuffer(std::size_t capacity) : data_(capacity) {}

    void push(const T& value) {
        data_[head_] = value;
        head_ = (head_ + 1) % data_.size();
    }

private:
    std::vector<T> data_;
    std::size_t head_ = 0;
};
""",
)

MARKDOWN_TEMPLATE = """## The `<<noun>>` stage

The `<<noun>>` stage runs after deduplication and before tokenization.

- **input:** `s3://specregen-data/<<noun>>s/2025-<<month>>-<<day>>/*.jsonl.gz`
- **output:** <<num>> shards, about <<size>> MB each
- **owner:** data-platform (see [runbook](docs/runbooks/<<noun>>.md))

| step | rows | seconds |
|------|-----:|--------:|
| read | <<rows>> | <<secs>> |
| validate | <<rows2>> | <<secs2>> |
| write | <<rows2>> | <<secs3>> |

> **Note:** rerun with `--resume` if the job stops halfway.

```bash
python -m specregen.<<noun>> --date 2025-<<month>>-<<day>> --workers 8
```
"""


def fill(template: str, values: dict[str, str]) -> str:
    """Substitute <<key>> placeholders; braces and $ are common in code, so avoid format()."""
    for key, value in values.items():
        template = template.replace(f"<<{key}>>", value)
    return template


T = TypeVar("T")


def pick(items: Sequence[T], i: int, step: int, offset: int = 0) -> T:
    # Distinct strides per slot walk the lists out of phase, giving varied combinations
    # without any randomness; a stride sharing a factor with the length would skip items.
    while math.gcd(step, len(items)) != 1:
        step += 1
    return items[(i * step + offset) % len(items)]


def template_values(i: int) -> dict[str, str]:
    noun = pick(NOUNS, i, 7)
    verb = pick(VERBS, i, 11, 5)[0]
    return {
        "noun": noun,
        "Noun": noun.capitalize(),
        "verb": verb,
        "Verb": verb.capitalize(),
        "adj": pick(ADJECTIVES, i, 13, 2),
        "num": str(16 + (i * 37) % 2033),
        "small": str(2 + i % 6),
        "phrase": pick(PHRASES, i, 3),
        "source": pick(("openrouter", "vllm", "sglang", "moonshot"), i, 1),
        "month": f"{1 + i % 12:02d}",
        "day": f"{1 + (i * 7) % 28:02d}",
        "size": str(64 + (i * 13) % 192),
        "rows": f"{1000 + (i * 7919) % 900000:,}",
        "rows2": f"{900 + (i * 6113) % 800000:,}",
        "secs": f"{1 + (i * 17) % 90}.{i % 10}",
        "secs2": f"{(i * 29) % 40}.{(i * 3) % 10}",
        "secs3": f"{2 + (i * 11) % 60}.{(i * 7) % 10}",
    }


def plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def generated_sentence(i: int) -> str:
    """One English sentence from the word banks, cycling through a few sentence shapes."""
    adj, adj2 = pick(ADJECTIVES, i, 7), pick(ADJECTIVES, i, 17, 9)
    noun, noun2, noun3 = pick(NOUNS, i, 3), pick(NOUNS, i, 19, 4), pick(NOUNS, i, 29, 11)
    verb, verb3, past, ing = pick(VERBS, i, 5)
    _, verb3b, past_b, ing_b = pick(VERBS, i, 13, 3)
    prefix, adverb = pick(VERB_PREFIXES, i, 3, 1), pick(ADVERBS, i, 9, 4)
    prep = pick(PREPOSITIONS, i, 11)
    shapes = (
        f"The {adj} {noun} {verb3} every {noun2} {prep} the {adj2} {noun3}.",
        f"If the {noun} {verb3} the {adj} {noun2}, the {noun3} {verb3b} it within "
        f"{3 + i % 57} seconds.",
        f"Why does the {noun} {verb} the {noun2} {prep} the {noun3}? Because the {adj} "
        f"{noun2} is {adj2}.",
        f"{adj.capitalize()} {plural(noun)} ({noun2}, {noun3}, and more) should never {verb} "
        f'"{adj2}" data.',
        f"We'll {verb} the {noun} {prep} the {adj} {noun2}; it's {adj2} otherwise.",
        f"Each {noun3} {verb3} {2 + i % 98} {adj} {plural(noun)} per {noun2} -- that's the budget.",
        f"While {ing} the {noun}, the {noun2} was {prefix}{past_b} {adverb}.",
        f"{ing_b.capitalize()} {plural(noun3)} {prep} {plural(noun)} is {adj} but {adj2}.",
        f"The {prefix}{past} {noun2} hasn't been {past_b} yet, so the {noun} {verb3b} {adverb}.",
    )
    return pick(shapes, i, 1)


def prose_paragraph(i: int) -> str:
    handwritten = [pick(PROSE_SENTENCES, i * 2 + k, 7) for k in range(2)]
    generated = [generated_sentence(i * 6 + k) for k in range(6)]
    return " ".join(handwritten[:1] + generated + handwritten[1:])


def python_service(i: int) -> str:
    """A small Python class whose names all come from the word banks, one fresh mix per call."""
    adj, adj2, adj3 = (pick(ADJECTIVES, i, s, o) for s, o in ((7, 1), (11, 5), (23, 9)))
    n1, n2, n3, n4, n5 = (
        pick(NOUNS, i, s, o) for s, o in ((5, 0), (13, 3), (17, 7), (31, 2), (37, 8))
    )
    verb, _, past, ing = pick(VERBS, i, 7, 2)
    verb2 = pick(VERBS, i, 19, 5)[0]
    return f'''class {adj.capitalize()}{n1.capitalize()}Service:
    """{generated_sentence(i * 3)}"""

    def __init__(self, {n2}: "{n2.capitalize()}", {adj2}_{n3}: int = {10 + i % 990}) -> None:
        self.{n2} = {n2}
        self.{adj2}_{n3} = {adj2}_{n3}

    def {verb}_{n4}(self, {n4}_id: str) -> "{n4.capitalize()} | None":
        # {generated_sentence(i * 3 + 1)}
        if not {n4}_id:
            return None
        return self.{n2}.{past}_{plural(n4)}.get({n4}_id)

    def {verb2}_{plural(n5)}(self, limit: int = {2 + i % 50}) -> list["{n5.capitalize()}"]:
        return [item for item in self.{n2}.{ing}() if item.is_{adj3}][:limit]
'''


def changelog_entry(i: int) -> str:
    header = f"### v{1 + i % 4}.{i % 17}.{i % 5} ({2024 + i % 2}-{1 + i % 12:02d}-{1 + i % 28:02d})"
    lines = [header, ""]
    for k in range(4):
        values = template_values(i * 4 + k)
        kind = pick(("Fixed", "Added", "Changed", "Removed", "Deprecated"), i + k, 3)
        lines.append(
            f"* {kind}: `{values['verb']}_{values['noun']}()` no longer ignores "
            f"{values['adj']} input. {generated_sentence(i * 5 + k)} "
            f"(#{1000 + (i * 31 + k) % 9000})"
        )
    return "\n".join(lines)


def python_snippet(i: int) -> str:
    return fill(pick(PYTHON_TEMPLATES, i, 1), template_values(i))


def js_snippet(i: int) -> str:
    return fill(pick(JS_TEMPLATES, i, 1), template_values(i))


def cpp_snippet(i: int) -> str:
    return fill(pick(CPP_TEMPLATES, i, 1), template_values(i))


def markdown_doc(i: int) -> str:
    return fill(MARKDOWN_TEMPLATE, template_values(i))


def tool_schema(i: int) -> str:
    name, description, params = TOOLS[i % len(TOOLS)]
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t, "description": d} for p, t, d in params},
                "required": [params[0][0]],
            },
        },
    }
    return json.dumps(schema, indent=2 if i % 2 else None, ensure_ascii=False)


def tool_call_response(i: int) -> str:
    """An OpenAI-style chat completion carrying get_weather calls, as providers return them."""
    n_calls = 1 + i % 3
    calls = []
    for k in range(n_calls):
        city, unit = CITIES[(i * 3 + k) % len(CITIES)]
        arguments = json.dumps({"location": city, "unit": unit}, ensure_ascii=i % 2 == 0)
        calls.append(
            {
                "id": f"functions.get_weather:{k}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        )
    response = {
        "id": f"gen-{1700000000 + i * 7919}-{i % 97:02d}",
        "object": "chat.completion",
        "model": "moonshotai/kimi-k2.5",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": calls},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 80 + i % 400, "completion_tokens": 20 + i % 60},
    }
    return json.dumps(response, indent=2 if i % 3 == 0 else None, ensure_ascii=False)


def tool_result_message(i: int) -> str:
    city, unit = CITIES[i % len(CITIES)]
    degrees = (i * 7) % 35 - 5
    result = {"location": city, "unit": unit, "temperature": degrees, "conditions": "sunny"}
    message = {
        "role": "tool",
        "tool_call_id": f"functions.get_weather:{i % 4}",
        "content": json.dumps(result, ensure_ascii=False),
    }
    return json.dumps(message, ensure_ascii=False)


def kimi_transcript(i: int) -> str:
    """Chat-template text written out as plain characters, so markers appear as ordinary text."""
    city, unit = CITIES[i % len(CITIES)]
    arguments = json.dumps({"location": city, "unit": unit}, ensure_ascii=False)
    return (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
        f"<|im_end|><|im_user|>user<|im_middle|>What's the weather in {city}?<|im_end|>"
        f"<|im_assistant|>assistant<|im_middle|><think>The user wants the weather in {city}; "
        "I should call get_weather.</think><|tool_calls_section_begin|><|tool_call_begin|>"
        f"functions.get_weather:0<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
        "<|tool_calls_section_end|><|im_end|>"
    )


def chinese_sentence(i: int) -> str:
    time_, subject = pick(ZH_TIMES, i, 5), pick(ZH_SUBJECTS, i, 7, 1)
    verb, obj = pick(ZH_VERBS, i, 3, 2), pick(ZH_OBJECTS, i, 11, 3)
    if i % 3 == 0:
        return f"{time_}{subject}{verb}{obj}。"
    if i % 3 == 1:
        return f"{time_}，{subject}{verb}{7 + (i * 37) % 990}个{obj}！"
    return f"{subject}为什么{verb}{obj}？因为{pick(ZH_OBJECTS, i, 5)}{pick(ZH_REASONS, i, 7)}。"


def japanese_sentence(i: int) -> str:
    time_, verb = pick(JA_TIMES, i, 3), pick(JA_VERBS, i, 5, 1)
    noun, noun2 = pick(JA_NOUNS, i, 9, 2), pick(JA_NOUNS, i, 11, 7)
    if i % 2 == 0:
        return f"{time_}、{noun}の{noun2}を{verb}。"
    return f"{noun}が{2 + i % 30}こあるので、{noun2}を{verb}か？"


def handwritten_once(items: Sequence[str], i: int) -> str:
    # Each handwritten CJK sentence is used once in the whole corpus: a long Han or kana run
    # repeated every round would be frequent enough for BPE to memorise it as one token.
    return items[i] if i < len(items) else ""


def cjk_paragraph(i: int) -> str:
    chinese = handwritten_once(CHINESE_SENTENCES, i) + "".join(
        chinese_sentence(i * 5 + k) for k in range(5)
    )
    japanese = handwritten_once(JAPANESE_SENTENCES, i) + "".join(
        japanese_sentence(i * 3 + k) for k in range(3)
    )
    return f"{chinese}\n{japanese}\nNote ({i}): 中文 and English mix, e.g. 版本 v{i % 9}.{i % 13}."


def metrics_block(i: int) -> str:
    lines = []
    for epoch in range(1, 4):
        loss = 2.5 / (epoch + i % 5) + (i % 7) * 0.0123
        acc = 0.5 + 0.4 * epoch / (3 + i % 4)
        tps = 1024 + (i * 313 + epoch * 97) % 50000
        lines.append(
            f"epoch {epoch}/3 - loss {loss:.4f} - acc {acc:.3f} - {tps:,} tok/s - "
            f"step {epoch * (i + 1) * 250} - lr {3e-4 / epoch:.2e}"
        )
    lines.append(f"{pick(EMOJI_LINES, i, 5)}  [{2025}-{1 + i % 12:02d}-{1 + i % 28:02d}]")
    return "\n".join(lines)


def mixed_script_line(i: int) -> str:
    samples = (
        "naïve café, Zürich, São Paulo, Kraków, Ångström",
        "Привет, мир! Это тест токенизатора.",
        "Καλημέρα κόσμε, δοκιμή.",
        "Ünïcödé ÷ × ± ≤ ≥ ≠ ∞ → ← ∑ √",
        "tabs\tand\tcolumns\t1\t22\t333\t4444",
        "trailing spaces   \nand a CRLF line\r\nend",
    )
    return pick(samples, i, 1)


DocumentMaker = Callable[[int], str]
DOCUMENT_MAKERS: tuple[tuple[DocumentMaker, int], ...] = (
    (prose_paragraph, 3),
    (changelog_entry, 1),
    (python_snippet, 1),
    (python_service, 1),
    (js_snippet, 1),
    (cpp_snippet, 1),
    (markdown_doc, 1),
    (tool_schema, 1),
    (tool_call_response, 1),
    (tool_result_message, 1),
    (kimi_transcript, 1),
    (cjk_paragraph, 2),
    (metrics_block, 1),
    (mixed_script_line, 1),
)
CORPUS_ROUNDS = 32


def build_corpus(rounds: int = CORPUS_ROUNDS) -> str:
    """Interleave document kinds round by round so no kind dominates any stretch of the text."""
    documents: list[str] = []
    for r in range(rounds):
        for maker, per_round in DOCUMENT_MAKERS:
            documents.extend(maker(r * per_round + k) for k in range(per_round))
    return "\n\n".join(documents) + "\n"


# --------------------------------------------------------------------------------------------
# Pre-tokenization
# --------------------------------------------------------------------------------------------

# `re` cannot parse `&&`; the `regex` module only treats `&&` as set intersection in VERSION1
# (in VERSION0 it is two literal ampersands and the split silently changes). Its Unicode tables
# are newer than tiktoken's Rust ones, so code points assigned only recently can classify
# differently; hence every run proves the split against tiktoken on the actual corpus.
_KIMI_PAT = regex.compile(KIMI_PAT_STR, regex.VERSION1)

# Characters that exercise every alternative and the Unicode classes the pattern relies on.
SPLIT_PROBE_TEXT = (
    "Hello world's THE DOG'S ǅungla 'S 'Ll don't I'M 中文字符测试 日本語のテキスト カタカナ "
    "ひらがな 🙂🎉👍🏽 12345 1,000.5 \t\t  \n\n  \r\n x\x1c\x1d\x1e\x1f y\x85z\u2028w\u3000v"
    "\u200bu\ufeffq \xa0 é e\u0301 naïve Ⅻ ⅷ ½ ² ١٢٣ x̃ ÀB 'ſ 'K  \n\t\n    def f(x):\n"
    "        return x\n\n\n  "
)


def pretokenize(text: str) -> list[str]:
    pieces = _KIMI_PAT.findall(text)
    if "".join(pieces) != text:
        raise RuntimeError("pre-tokenizer pieces do not cover the text")
    return pieces


def verify_split_matches_tiktoken(text: str, pieces: Sequence[str]) -> None:
    """Prove that tiktoken (Rust fancy-regex) splits `text` into exactly `pieces`.

    tiktoken never exposes its pieces, so we read them off an encoding built for the purpose:
    ranks = all single bytes + every piece P + every adjacent concatenation P_k P_k+1.
    * If the splits agree, each tiktoken piece is some P (a whole-piece rank hit), so the
      output is exactly [rank(P_1), rank(P_2), ...].
    * Conversely, if the output is that list, every tiktoken boundary is one of our
      boundaries (tokens never cross tiktoken pieces), and no tiktoken piece can cover two or
      more of ours: its BPE would have ended on adjacent parts P_k, P_k+1 whose concatenation
      is a rank, and tiktoken's BPE only stops when no adjacent concatenation is a rank.
    """
    encoded = [p.encode("utf-8") for p in pieces]
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for piece in encoded:
        ranks.setdefault(piece, len(ranks))
    for left, right in itertools.pairwise(encoded):
        ranks.setdefault(left + right, len(ranks))
    probe = tiktoken.Encoding(
        "split-probe", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={}
    )
    expected = [ranks[p] for p in encoded]
    got = probe.encode_ordinary(text)
    if got != expected:
        where = next(
            (i for i, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e),
            min(len(got), len(expected)),
        )
        context = pieces[max(0, where - 2) : where + 3]
        raise RuntimeError(f"regex split differs from tiktoken at piece {where}: {context!r}")


# --------------------------------------------------------------------------------------------
# Byte-level BPE training
# --------------------------------------------------------------------------------------------

Pair = tuple[int, int]


@dataclass
class TrainResult:
    tokens: list[bytes]  # index == rank
    merge_steps: int
    reused_merges: int
    last_merge_count: int  # corpus frequency of the final merge; 1 means BPE ran out of signal


class _PairIndex:
    """Pair counts over unique words, updated incrementally as merges rewrite words."""

    def __init__(self, words: list[list[int]], freqs: list[int], tokens: list[bytes]) -> None:
        self.words = words
        self.freqs = freqs
        self.tokens = tokens
        self.counts: dict[Pair, int] = {}
        self.where: dict[Pair, set[int]] = {}
        self.heap: list[tuple[int, bytes, bytes, int, int]] = []
        for w, word in enumerate(words):
            self._add_word(w, word, sign=1, touched=None)
        for pair in sorted(self.counts):
            self._push(pair)

    def _push(self, pair: Pair) -> None:
        a, b = pair
        # Key order is the tie-break: highest count, then smallest (bytes_a, bytes_b). Token
        # bytes are unique, so the key never compares the trailing ids by accident.
        heapq.heappush(self.heap, (-self.counts[pair], self.tokens[a], self.tokens[b], a, b))

    def _add_word(self, w: int, word: list[int], sign: int, touched: set[Pair] | None) -> None:
        freq = self.freqs[w] * sign
        for pair in itertools.pairwise(word):
            count = self.counts.get(pair, 0) + freq
            if count:
                self.counts[pair] = count
            else:
                del self.counts[pair]
            if sign > 0:
                self.where.setdefault(pair, set()).add(w)
            if touched is not None:
                touched.add(pair)

    def best_pair(self) -> Pair | None:
        while self.heap:
            neg_count, _, _, a, b = heapq.heappop(self.heap)
            if self.counts.get((a, b)) == -neg_count:
                return a, b
        return None

    def apply_merge(self, pair: Pair, new_id: int) -> None:
        touched: set[Pair] = set()
        # `where` is never pruned, so some listed words may no longer hold the pair.
        for w in sorted(self.where.pop(pair, ())):
            old = self.words[w]
            new = _merge_word(old, pair, new_id)
            if len(new) == len(old):
                continue
            self._add_word(w, old, sign=-1, touched=touched)
            self._add_word(w, new, sign=1, touched=touched)
            self.words[w] = new
        for changed in sorted(touched):
            if changed in self.counts:
                self._push(changed)


def _merge_word(word: list[int], pair: Pair, new_id: int) -> list[int]:
    a, b = pair
    out: list[int] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def train_bpe(piece_counts: Iterable[tuple[bytes, int]], vocab_size: int) -> TrainResult:
    """Learn merges until `vocab_size` distinct ranks exist; ranks 0-255 are the raw bytes."""
    if vocab_size < 256:
        raise ValueError("vocab_size must be at least 256 (one rank per byte)")
    tokens = [bytes([b]) for b in range(256)]
    rank_of = {tok: i for i, tok in enumerate(tokens)}
    words: list[list[int]] = []
    freqs: list[int] = []
    for piece, count in piece_counts:
        words.append(list(piece))
        freqs.append(count)
    index = _PairIndex(words, freqs, tokens)
    merge_steps = reused = last_count = 0
    while len(tokens) < vocab_size:
        pair = index.best_pair()
        if pair is None:
            raise RuntimeError(f"corpus exhausted after {len(tokens)} ranks; need more text")
        last_count = index.counts[pair]
        merged = tokens[pair[0]] + tokens[pair[1]]
        # A string can be reachable by two different splits (ab+c vs a+bc). tiktoken ranks are
        # keyed by bytes, so the second route must reuse the existing rank, not add a duplicate.
        new_id = rank_of.get(merged)
        if new_id is None:
            new_id = len(tokens)
            tokens.append(merged)
            rank_of[merged] = new_id
        else:
            reused += 1
        index.apply_merge(pair, new_id)
        merge_steps += 1
    return TrainResult(
        tokens=tokens, merge_steps=merge_steps, reused_merges=reused, last_merge_count=last_count
    )


# --------------------------------------------------------------------------------------------
# Output files
# --------------------------------------------------------------------------------------------


def model_file_bytes(tokens: Sequence[bytes]) -> bytes:
    return b"".join(
        base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for rank, tok in enumerate(tokens)
    )


def tokenizer_config(vocab_size: int, model_sha256: str) -> dict[str, object]:
    added = {
        str(token_id): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for token_id, content, special in K25_ADDED_TOKENS
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": list(K25_ADDITIONAL_SPECIAL_TOKENS),
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "tokenizer_class": "TikTokenTokenizer",
        "specregen_note": (
            "specregen mini tokenizer: NOT Kimi's real vocabulary. A "
            f"{vocab_size}-rank byte-level BPE (tiktoken.model sha256 {model_sha256}) trained "
            "deterministically by scripts/train_mini_tokenizer.py on a corpus generated by "
            "that script, pre-tokenized with Kimi K2.5's pat_str. The added-token table above "
            "is K2.5's (ids 163584-163839, SPEC section 1.3), so n_vocab is 163840 like the "
            "real tokenizer; the BPE ids below 163584 do not match Kimi's."
        ),
    }


def readme_text(vocab_size: int, model_sha256: str) -> str:
    return f"""# specregen mini tokenizer

A tiny stand-in for Kimi K2.5's tokenizer, for unit tests and the demo. It is **not** Kimi's
vocabulary: token ids below {FIRST_ADDED_ID} mean nothing outside this project. For real
token ids use the real `tiktoken.model` from `moonshotai/Kimi-K2.5`.

What matches Kimi K2.5 structurally:

* tiktoken format (`tiktoken.model`: `<base64 bytes> <rank>` per line, ranks contiguous);
* byte-level BPE with ranks 0-255 being the 256 single bytes in byte order;
* Kimi's pre-tokenizer regex (`pat_str`, SPEC section 1.2), so merges never cross the same
  piece boundaries;
* the K2.5 added-token table in `tokenizer_config.json` (ids {FIRST_ADDED_ID}-163839,
  e.g. `<|im_end|>`=163586, `<think>`=163606, tool-call markers 163595-163599 with
  `special: false`), so `n_vocab` is 163840 as in the real tokenizer.

What differs: only {vocab_size} base ranks (ids {vocab_size}-163583 are unused gaps), learned
from a small corpus that `scripts/train_mini_tokenizer.py` generates from its own templates
(English prose, Python/JS/C++ code, JSON tool calls, Chinese, Japanese, emoji, markdown).

| file | sha256 / notes |
| --- | --- |
| `tiktoken.model` | `{model_sha256}` ({vocab_size} ranks) |
| `tokenizer_config.json` | K2.5 added tokens + `specregen_note` |

Loading it: read the ranks, use the `pat_str`, and register the added tokens at the ids that
`added_tokens_decoder` gives ({FIRST_ADDED_ID}-163839; ids in that range without an entry are
`<|reserved_token_{{id}}|>`). Do not number them from `len(ranks)` the way Kimi's own
`TikTokenTokenizer` does: with {vocab_size} ranks that would put `[BOS]` at {vocab_size}.
If you use `tiktoken.load.load_tiktoken_bpe`, pass `expected_hash`: tiktoken caches local files
by path, so a regenerated file would otherwise be shadowed by the stale cached copy.

## Regenerate

```bash
python scripts/train_mini_tokenizer.py --out specregen/assets/mini_tokenizer --vocab {vocab_size}
```

Training is deterministic (no network, no randomness; ties go to the highest count, then the
lexicographically smallest byte pair), so the files come out byte-identical every time.
"""


def write_outputs(out_dir: Path, tokens: Sequence[bytes]) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model_file_bytes(tokens)
    sha = hashlib.sha256(model).hexdigest()
    (out_dir / "tiktoken.model").write_bytes(model)
    config = json.dumps(tokenizer_config(len(tokens), sha), indent=2, ensure_ascii=False)
    (out_dir / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")
    (out_dir / "README.md").write_text(readme_text(len(tokens), sha), encoding="utf-8")
    return sha


def check_round_trip(tokens: Sequence[bytes], corpus: str) -> int:
    """Encode the corpus with the trained ranks through tiktoken itself; return the token count."""
    ranks = {tok: rank for rank, tok in enumerate(tokens)}
    enc = tiktoken.Encoding(
        "specregen-mini-check", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={}
    )
    ids = enc.encode_ordinary(corpus)
    if enc.decode(ids) != corpus:
        raise RuntimeError("trained tokenizer does not round-trip the corpus")
    return len(ids)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    default_out = Path(__file__).resolve().parent.parent / "specregen/assets/mini_tokenizer"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=default_out, help="output directory")
    parser.add_argument("--vocab", type=int, default=4096, help="number of base BPE ranks")
    parser.add_argument(
        "--dump-corpus", type=Path, default=None, help="also write the generated corpus here"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    corpus = build_corpus()
    if args.dump_corpus is not None:
        args.dump_corpus.write_text(corpus, encoding="utf-8")
    pieces = pretokenize(corpus)
    verify_split_matches_tiktoken(corpus, pieces)
    verify_split_matches_tiktoken(SPLIT_PROBE_TEXT, pretokenize(SPLIT_PROBE_TEXT))
    piece_counts = Counter(p.encode("utf-8") for p in pieces)
    result = train_bpe(piece_counts.items(), args.vocab)
    n_tokens = check_round_trip(result.tokens, corpus)
    sha = write_outputs(args.out, result.tokens)
    elapsed = time.perf_counter() - started
    corpus_bytes = len(corpus.encode("utf-8"))
    print(
        f"corpus: {corpus_bytes:,} bytes, {len(pieces):,} pre-tokens "
        f"({len(piece_counts):,} unique); split verified identical to tiktoken"
    )
    print(
        f"merges: {len(result.tokens) - 256} new ranks from {result.merge_steps} merge steps "
        f"({result.reused_merges} reused an existing rank); vocab {len(result.tokens)}; "
        f"last merge seen {result.last_merge_count}x"
    )
    print(f"compression: {corpus_bytes / n_tokens:.2f} bytes/token on the training corpus")
    print(f"time: {elapsed:.2f} s")
    print(f"sha256(tiktoken.model): {sha}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
