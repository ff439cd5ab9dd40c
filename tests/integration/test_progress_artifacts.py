"""Live progress of inference and reconstruction chunks in the Prefect UI (issue 13).

A dataset runs under the real Prefect test server against the emulator (slow enough that a
chunk lasts a few seconds); a watcher polls the server's artifacts while it runs, as the UI
does. Each inference chunk and the reconstruction have a progress artifact whose description
carries the live numbers (done / in flight / failed, rates, spend, projection, time left) and
ends at 100 % with the chunk's own summary numbers.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest
import yaml

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.store.fs import Store
from tests.support import REPO, get_tokenizer

pytestmark = pytest.mark.integration

KEYS = ("b1-glaive-infer-chunk-0", "b1-glaive-infer-chunk-1", "b1-glaive-reconstruct-chunks-0-1")


def _config(tmp_path: Path, base_url: str) -> Path:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config.update(storage=str(tmp_path / "store"), chunk_size=12, chunks_in_flight=1,
                  probe="off")
    config["endpoint"].update(base_url=base_url, concurrency=3)
    config["datasets"] = [d for d in config["datasets"] if d["name"] == "B1_glaive"]
    path = tmp_path / "progress.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Watcher(threading.Thread):
    """Reads the artifacts every 0.2 s, as the UI would, and keeps every description seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[str, list[tuple[float, str]]] = {key: [] for key in KEYS}
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        with get_client(sync_client=True) as client:
            def read() -> list:
                return client.read_artifacts(artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=list(KEYS))))

            # The session's server holds other tests' artifacts under the same keys (the demo
            # config's dataset): only the ones this run creates count.
            earlier = {artifact.id for artifact in read()}
            self.ready.set()
            while not self.stop.is_set():
                for artifact in read():
                    if artifact.id in earlier:
                        continue
                    entry = (float(artifact.data), artifact.description or "")
                    seen = self.seen[artifact.key]
                    if not seen or seen[-1] != entry:
                        seen.append(entry)
                self.stop.wait(0.2)


def test_chunks_show_live_progress_artifacts(prefect_server, tmp_path, monkeypatch):
    from flows.dataset import dataset_flow

    monkeypatch.setenv("SPECREGEN_DEMO_KEY", "sk-demo-local")
    emulator = EmulatorConfig(seed=7, latency="fixed", latency_mean=0.8,
                              literal_marker_rate=0.0)
    with serve_in_thread(emulator, get_tokenizer("mini")) as emu:
        path = _config(tmp_path, emu.openrouter_url)
        watcher = Watcher()
        watcher.start()
        assert watcher.ready.wait(30), "the watcher could not read the artifacts"
        try:
            result = asyncio.run(dataset_flow(str(path), "B1_glaive"))
            time.sleep(0.5)  # one more look after the last write
        finally:
            watcher.stop.set()
            watcher.join(10)
    assert result["outcome"] == "published", result

    store = Store(str(tmp_path / "store"))
    summaries = [store.read_json(*parts) for parts in _infer_summaries(store)]
    assert [s["chunk"] for s in summaries] == [0, 1]
    for summary in summaries:
        seen = watcher.seen[f"b1-glaive-infer-chunk-{summary['chunk']}"]
        assert seen, "no progress artifact for the chunk"
        percent, final = seen[-1]
        assert percent == 100.0
        assert final.startswith(f"Inference of B1_glaive, chunk {summary['chunk']}: ")
        # The last word equals the chunk's own summary: 12 of 12, nothing failed, its spend.
        assert "12/12 (100.0%), 12 done, 0 failed, 0 in flight" in final, final
        assert f"${summary['cost_usd']:,.4f} spent" in final, (final, summary["cost_usd"])
        assert re.search(r"[\d,]+ tok/min", final) and "took " in final, final
        # While it ran: part done, requests in flight, rates, a projected total, time left.
        live = [text for p, text in seen if p < 100.0]
        assert any(re.search(r"\b[1-3] in flight", t) and re.search(r"[1-9][\d,]*/min", t)
                   and "projected" in t and re.search(r"\d+s left", t) for t in live), seen

    rebuilt = watcher.seen["b1-glaive-reconstruct-chunks-0-1"]
    assert rebuilt and rebuilt[-1][0] == 100.0, rebuilt
    assert "24/24 (100.0%)" in rebuilt[-1][1] and "rebuilt" in rebuilt[-1][1], rebuilt


def _infer_summaries(store: Store) -> list[tuple[str, ...]]:
    (folder,) = store.list("B1_glaive", "infer")
    return [("B1_glaive", "infer", folder, name)
            for name in sorted(store.list("B1_glaive", "infer", folder))
            if name.endswith(".json")]
