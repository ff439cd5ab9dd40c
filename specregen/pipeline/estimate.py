"""What a pipeline run will cost, realtime and batch (`specregen estimate --config FILE`).

Per dataset: the prompts are prepared exactly as the run prepares them (the prompts stage; the
run reuses them), counted, and their prompt tokens counted exactly with the config's tokenizer
and the K2.5 template (tools declared when sent as `tools`; thinking as configured). Completion
lengths cannot be counted before asking, so a small paid pilot (`--pilot`, default 50 requests
per dataset, realtime) asks the first prompts; the answers go into the dataset's raw logs like
any other attempt, so the real run finds them final and does not pay for them again. The
projection: prompt tokens x prompt price + prompts x mean pilot completion x completion price,
in both modes (batch = x (1 - batch_discount)); without configured prices the pilot's reported
`usage.cost` per request is scaled instead. The spread (median, 10th and 90th percentile of the
pilot's completion lengths) says how far to trust it.

A dataset of whole conversations (`turns: all`) is paid per conversation, and how many requests
a conversation takes depends on the model's answers: its prompt tokens are the first requests'
(exact; the later ones hold answers not yet written), the pilot is `--pilot` CONVERSATIONS in
all (each run to its stop), and the pilot's numbers are per conversation: completion tokens and
cost summed over its requests, the projection = conversations x the pilot's mean conversation
(prompt and completion tokens x prices, or its reported cost).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

DEFAULT_PILOT = 50


@dataclass
class DatasetEstimate:
    dataset: str
    prompts: int
    prompt_tokens: int
    pilot: int  # answers the projection rests on
    pilot_cost_usd: float
    completion_mean: float
    completion_p10: float
    completion_p50: float
    completion_p90: float
    realtime_usd: float | None
    batch_usd: float | None
    # Whole conversations (`turns: all`): `pilot` counts conversations, the completion figures
    # are per conversation (all its requests), `prompt_tokens` are the first requests'.
    conversations: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def estimate_config(
    config_path: str, pilot: int, only: list[str] | None = None
) -> list[DatasetEstimate]:
    from specregen.config import load_config
    from specregen.pipeline.apikey import resolve_api_key
    from specregen.pipeline.layout import DatasetRun

    config = load_config(config_path)
    names = only or [d.name for d in config.datasets]
    key = resolve_api_key(config)
    out = []
    for name in names:
        run = DatasetRun(config, config.dataset(name))
        out.append(await estimate_dataset(run, pilot, key))
    return out


async def estimate_dataset(run: Any, pilot: int, key: Any) -> DatasetEstimate:
    from specregen.client.cost import DEFAULT_BATCH_DISCOUNT, usage_cost
    from specregen.client.engine import run_inference
    from specregen.client.request import build_request
    from specregen.pipeline.prompts import prepare_prompts, read_chunk
    from specregen.pipeline.reconstruction import run_format
    from specregen.pipeline.run import dataset_lease
    from specregen.store.rawlog import FINAL_ANSWER, RawLog
    from specregen.wire.request import request_fingerprint

    cfg = run.config.endpoint.model_copy(update={"mode": "realtime"})
    fmt = run_format(run)
    thinking = cfg.thinking if cfg.thinking is not None else True
    whole = run.dataset.turns == "all"
    lease = await asyncio.to_thread(dataset_lease, run, wait=0.0)
    with lease:
        manifest = await asyncio.to_thread(prepare_prompts, run)
        chunks = int(manifest.counts.get("chunks", 0))
        prompts = 0
        prompt_tokens = 0
        lengths: list[int] = []
        pilot_cost = 0.0
        costs: list[float] = []
        # Per pilot conversation: (prompt tokens, completion tokens, cost or None) of its
        # requests, summed.
        sums: list[tuple[int, int, float | None]] = []
        asked = 0  # conversations asked so far: the pilot's cap across chunks
        for chunk in range(chunks):
            items = await asyncio.to_thread(read_chunk, run, chunk)
            prompts += len(items)
            for prompt in items:
                tools = prompt.tools if prompt.tool_mode == "tools" else None
                # A conversation's first request is the one whose size is known now.
                messages = (build_request(prompt, cfg)["messages"] if prompt.turns == "all"
                            else prompt.messages)
                prompt_tokens += len(fmt.encode_prompt(messages, tools, thinking=thinking))
            taken = asked if whole else len(lengths)
            wanted = items[: max(0, pilot - taken)]
            if not wanted:
                continue
            asked += len(wanted)
            async with RawLog(run.rawlog_url(chunk)) as log:
                if pilot:
                    summary = await run_inference(wanted, cfg, log, api_key=key)
                    pilot_cost += summary.cost_usd
                if whole:
                    sums += _conversation_sums(log.iter_records(), wanted, cfg)
                    continue
                keys = {(p.sample_id, request_fingerprint(build_request(p, cfg))) for p in wanted}
                # The pilot's answers, and answers of earlier runs or pilots: all paid already.
                for record in log.iter_records():
                    if (record.get("final") and record.get("status") in FINAL_ANSWER
                            and (record["sample_id"], record["fingerprint"]) in keys):
                        usage = record.get("usage") or {}
                        lengths.append(int(usage.get("completion_tokens") or 0))
                        cost = usage_cost(record.get("response") or {"usage": usage},
                                          cfg.prices)
                        if cost is not None:
                            costs.append(cost)
    prices = cfg.prices
    realtime = batch = None
    if whole:
        lengths = [completion for _, completion, _ in sums]
        mean = statistics.fmean(lengths) if lengths else 0.0
        if prices is not None and sums:
            mean_prompt = statistics.fmean(p for p, _, _ in sums)
            realtime = prompts * (mean_prompt * prices.prompt_per_million
                                  + mean * prices.completion_per_million) / 1e6
            batch = realtime * prices.factor("batch")
        elif sums and all(c is not None for _, _, c in sums):
            realtime = statistics.fmean(c for _, _, c in sums if c is not None) * prompts
            batch = realtime * (1 - DEFAULT_BATCH_DISCOUNT)
    else:
        mean = statistics.fmean(lengths) if lengths else 0.0
        if prices is not None and lengths:
            realtime = (prompt_tokens * prices.prompt_per_million
                        + prompts * mean * prices.completion_per_million) / 1e6
            batch = realtime * prices.factor("batch")
        elif costs:
            realtime = statistics.fmean(costs) * prompts
            batch = realtime * (1 - DEFAULT_BATCH_DISCOUNT)
    q = _quantiles(lengths)
    return DatasetEstimate(
        dataset=run.name, prompts=prompts, prompt_tokens=prompt_tokens, pilot=len(lengths),
        pilot_cost_usd=round(pilot_cost, 6), completion_mean=round(mean, 1),
        completion_p10=q[0], completion_p50=q[1], completion_p90=q[2],
        realtime_usd=None if realtime is None else round(realtime, 4),
        batch_usd=None if batch is None else round(batch, 4), conversations=whole,
    )


def _conversation_sums(records: Any, wanted: list[Any],
                       cfg: Any) -> list[tuple[int, int, float | None]]:
    """Per wanted conversation with at least one answer: its requests' prompt and completion
    tokens and cost, summed (None when a request's cost is unknown). A record counts when it
    answers a request of the conversation as today's endpoint sends it (its own messages
    rebuilt into a body with today's settings give its fingerprint)."""
    from specregen.client.cost import usage_cost
    from specregen.client.request import build_request
    from specregen.records import Prompt
    from specregen.store.rawlog import FINAL_ANSWER
    from specregen.wire.request import request_fingerprint

    plans = {p.sample_id: p for p in wanted}
    final: dict[str, dict[str, Any]] = {}  # request id -> its answer (the last one)
    for record in records:
        where = record.get("conversation")
        request = record.get("request")
        if (not record.get("final") or record.get("status") not in FINAL_ANSWER
                or not isinstance(where, dict) or where.get("id") not in plans
                or not isinstance(request, dict)
                or not isinstance(request.get("messages"), list)):
            continue
        prompt = plans[where["id"]]
        body = build_request(Prompt(record["sample_id"], request["messages"], prompt.tools,
                                    prompt.tool_mode), cfg)
        if request_fingerprint(body) == record.get("fingerprint"):
            final[record["sample_id"]] = record
    out: dict[str, list[Any]] = {}
    for record in final.values():
        usage = record.get("usage") or {}
        cost = usage_cost(record.get("response") or {"usage": usage}, cfg.prices)
        entry = out.setdefault(record["conversation"]["id"], [0, 0, 0.0])
        entry[0] += int(usage.get("prompt_tokens") or 0)
        entry[1] += int(usage.get("completion_tokens") or 0)
        entry[2] = None if cost is None or entry[2] is None else entry[2] + cost
    return [(p, c, cost) for p, c, cost in out.values()]


def _quantiles(values: list[int]) -> tuple[float, float, float]:
    if not values:
        return (0.0, 0.0, 0.0)
    if len(values) == 1:
        return (float(values[0]),) * 3
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return (round(deciles[0], 1), round(statistics.median(values), 1), round(deciles[8], 1))
