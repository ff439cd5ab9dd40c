"""specregen on a cluster: a real PostgreSQL, a Prefect server on it, two process workers with
nothing shared on local disk (S3 on a moto server, a PREFECT_HOME each), the deployments made by
infra/deploy.sh, and the emulator behind a provider-style rate limit.

1. Two datasets on two workers share one rate limit: together they never exceed it (no 429
   at all) and keep it busy while they have work.
2. A worker is SIGKILLed (with every process it started: its machine is lost) in the middle of
   `pipeline/nightly`: Prefect's zombie automation marks its runs Crashed, the rerun automation
   runs them again on the other worker, the parent waits through it, and every dataset is
   published once, byte-identical to a run on one worker, paying again only for what was in
   flight.
3. `reconstruct_spread`: a dataset's reconstruction chunk groups run as deployment runs, one of
   them in a flow process of the worker that does not run the dataset.

Light on purpose (small datasets, a 30 s heartbeat, a 5 s rate window): about 5 minutes,
most of it the 60 s zombie window and the dead run's 60 s lease.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from bench.scale import DATASETS, Cluster, serve_limited, write_config
from specregen.emulator.config import EmulatorConfig
from specregen.store.fs import Store
from tests.support import get_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RATE, PERIOD, WINDOW = 16, 5.0, 8  # requests per PERIOD s; requests in flight
ROWS = 24  # per dataset


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import tempfile

    # Not under pytest's 0700 tmp folder: PostgreSQL runs as its own user below this one.
    base = Path(tempfile.mkdtemp(prefix="specregen-cluster-"))
    emu, limited = serve_limited(
        EmulatorConfig(seed=11, latency="fixed", latency_mean=0.05, literal_marker_rate=0.0),
        get_tokenizer("mini"), RATE, PERIOD)
    cluster = Cluster(base, heartbeat_s=30, zombie_after_s=60, worker_limit=2)
    try:
        cluster.start()
        sources = {}
        for name in DATASETS:
            rows = [{"id": f"{name}-{i}", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Say {i} things about {name}."}]}
                for i in range(ROWS)]
            sources[name] = base / f"{name}.jsonl"
            sources[name].write_text("".join(json.dumps(r) + "\n" for r in rows))

        def config(label: str, **extra) -> Path:
            return write_config(
                base / f"{label}.yaml", base_url=emu.openrouter_url,
                storage=f"s3://{cluster.bucket}/{label}", sources=sources,
                shared_limit={"requests_per_minute": RATE, "period_s": PERIOD,
                              "in_flight": WINDOW, "batch": 2},
                concurrency=16, chunk_size=10,
                # Chunk groups as deployment runs; with every worker slot taken they are done
                # by the dataset's own worker (flows/chunks.py): the output must not change.
                **{"reconstruct_spread": 2, **extra})

        cluster.config = config
        cluster.emu, cluster.limited = emu, limited
        cluster.deploy(config("deployed"))
        cluster.start_worker()
        cluster.start_worker()
        yield cluster
    finally:
        cluster.stop()
        emu.stop()
        shutil.rmtree(base, ignore_errors=True)


def store_of(cluster: Cluster, label: str) -> Store:
    import os

    os.environ.update(cluster.s3_env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    return Store(f"s3://{cluster.bucket}/{label}")


def published(store: Store, dataset: str) -> dict[str, bytes]:
    latest = store.read_json(dataset, "published", "LATEST.json")["fingerprint"]
    folder = (dataset, "published", latest, "data")
    return {name: store.read_bytes(*folder, name) for name in store.list(*folder)}


def test_two_datasets_on_two_workers_share_one_rate_limit(cluster):
    cluster.limited.reset()
    run = cluster.run_nightly(cluster.config("rate"), list(DATASETS[:2]), timeout=300)
    assert run.state.is_completed(), run.state
    times = sorted(cluster.limited.arrivals)
    assert len(times) == 2 * ROWS
    # Within the limit, together: the emulator refused nothing.
    assert cluster.limited.refused == 0
    assert cluster.limited.most_in_any_window() <= RATE
    # Never idle while the limit had room: request k may go once request k - RATE is a PERIOD
    # old, and most go right then. The lag: the 0.2 s safety margin, the 0.25 s poll, server
    # calls, a batch's spread -- and the moments nobody had work (one dataset done or not yet
    # started), hence the median. At 60 s windows the loss is ~2 % (bench/scale.py measures the
    # rate held; here the bound only has to catch a limiter that waits whole periods: on a
    # loaded 2-core box the median lag was seen at 0.4 s and, once, 3.2 s).
    lags = sorted(max(0.0, times[k] - times[k - RATE] - PERIOD) for k in range(RATE, len(times)))
    assert lags[len(lags) // 2] <= PERIOD, [round(x, 2) for x in lags]


def test_a_chunk_group_runs_on_another_worker(cluster):
    """`reconstruct_spread: 3` on one dataset: its 3 chunks become 3 groups, 2 of them
    deployment runs of reconstruct-chunks/spread. Nightly and the dataset take 2 of the 4
    worker slots, so both groups find a slot, and they wait for it (`reconstruct_spread_wait_s`;
    tiny chunks would otherwise be taken back at once): a group runs in a flow process of the
    worker that does not run the dataset, and the dataset is published from its shards."""
    name = DATASETS[2]
    where: dict = {}  # flow run id -> (run name, worker name), seen while the process lived

    async def watch(client):
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType

        for run in await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(
                    any_=[StateType.PENDING, StateType.RUNNING])))):
            if run.id in where or not run.name.startswith(name) or not run.infrastructure_pid:
                continue
            worker = cluster.worker_of(int(run.infrastructure_pid.rsplit(":", 1)[-1]))
            if worker is not None:
                where[run.id] = (run.name, worker.name)

    config = cluster.config("spread", reconstruct_spread=3, reconstruct_spread_wait_s=120)
    run = cluster.run_nightly(config, [name], timeout=300, on_poll=watch)
    assert run.state.is_completed(), run.state
    dataset_workers = {w for n, w in where.values() if n == name}
    assert len(dataset_workers) == 1, where
    chunk_runs = asyncio.run(read_runs(cluster, f"{name}-chunks-"))
    assert len(chunk_runs) == 2, [(r.name, r.state.name) for r in chunk_runs]
    # Both groups ran as their own flow runs (not taken back: that would be Cancelled) ...
    assert all(r.state.is_completed() for r in chunk_runs), [r.state.name for r in chunk_runs]
    # ... and at least one in a process of the other worker.
    elsewhere = [where[r.id] for r in chunk_runs
                 if r.id in where and where[r.id][1] not in dataset_workers]
    assert elsewhere, (where, dataset_workers)
    store = store_of(cluster, "spread")
    assert published(store, name), "the dataset was not published"


def test_a_lost_worker_is_rerun_elsewhere_and_publishes_what_one_worker_does(cluster):
    cluster.emu.reset()
    cluster.limited.reset()
    killed = {}

    async def kill_midway(client):
        if killed or cluster.emu.stats()["completed"] < 20:
            return
        from prefect.client.schemas.filters import (
            FlowFilter,
            FlowFilterName,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType

        def worker_of(run):
            return run.infrastructure_pid and cluster.worker_of(
                int(run.infrastructure_pid.rsplit(":", 1)[-1]))

        def running(flow):
            return client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))

        owners = {run.id: worker_of(run) for run in await running("dataset")}
        # The parent's own worker is spared: this test is about a lost dataset run (the parent
        # would be rerun by the same automation, but its crash ends the wait below).
        parents = {w.name for w in map(worker_of, await running("pipeline")) if w}
        # The pool spreads the datasets: nightly and 3 datasets need both workers' 2 slots.
        spread = {w.name for w in owners.values() if w}
        for run_id, worker in owners.items():
            if worker and worker.name not in parents:
                cluster.kill_worker(worker)
                killed.update(worker=worker.name, run=run_id, spread=spread,
                              answered=cluster.emu.stats()["completed"])
                return

    run = cluster.run_nightly(cluster.config("kill"), timeout=600, on_poll=kill_midway)
    assert killed, "no dataset run was seen running to kill"
    assert 0 < killed["answered"] < 3 * ROWS, "the kill did not land mid-run"
    assert killed["spread"] == {"worker-1", "worker-2"}, killed["spread"]
    assert run.state.is_completed(), run.state
    # The killed run was marked Crashed (zombie automation), then ran again (rerun automation)
    # and completed: the same flow run, a higher run count.
    rerun = asyncio.run(read_run(cluster, killed["run"]))
    assert rerun.state.is_completed() and rerun.run_count >= 2, (rerun.state, rerun.run_count)
    # Paid again only for what was in flight (at most the shared window) and for the answers
    # the killed worker had received but not yet committed: on an object store a chunk's raw
    # log puts a part once its window of answers waits (store/rawlog.py commit_rolls; here
    # 8, or after 2.5 s at 16 per 5 s), so each of the 2 chunks in flight holds fewer than
    # WINDOW uncommitted (a fixed 10 s commit allowed RATE * 10 / PERIOD = 32).
    stats = cluster.emu.stats()
    assert stats["distinct_requests"] == 3 * ROWS
    uncommitted = 2 * WINDOW
    assert stats["chat_requests"] - stats["distinct_requests"] <= WINDOW + uncommitted, stats
    assert cluster.limited.refused == 0

    # The same config on one worker (the survivor) into another prefix: the same bytes.
    reference = cluster.run_nightly(cluster.config("single"), timeout=600)
    assert reference.state.is_completed(), reference.state
    kill_store, single_store = store_of(cluster, "kill"), store_of(cluster, "single")
    for name in DATASETS:
        fingerprints = [p for p in kill_store.list(name, "published") if p != "LATEST.json"]
        assert len(fingerprints) == 1, (name, fingerprints)  # published once
        assert published(kill_store, name) == published(single_store, name), name


async def read_run(cluster: Cluster, run_id):
    from prefect.client.orchestration import get_client

    from flows.server import using_api

    with using_api(cluster.api_url):
        async with get_client() as client:
            return await client.read_flow_run(run_id)


async def read_runs(cluster: Cluster, prefix: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.server import using_api

    with using_api(cluster.api_url):
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(like_=prefix)))
    return [r for r in runs if r.name.startswith(prefix)]
