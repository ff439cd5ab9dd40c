"""Duplicate detection in bounded memory (issue 12 item 5): past `memory_ids` the ids move to
sorted runs on disk behind a fixed-size Bloom filter; memory no longer grows with the rows."""

from __future__ import annotations

import tracemalloc

from specregen.sources._io import SeenIds


def test_repeats_are_found_in_the_runs_on_disk_too():
    # A tiny filter (every lookup goes to disk) and a tiny table (a run per 1,000 ids).
    seen = SeenIds(capacity=16, memory_ids=1_000, bloom_bytes=64)
    ids = [f"B1_glaive-{i}" for i in range(20_000)]
    assert all(seen.add(i) for i in ids)
    assert len(seen._runs) == 20
    assert not any(seen.add(i) for i in ids[::7])  # in runs and in the table
    assert not seen.add(ids[-1]) and not seen.add(ids[0])
    assert seen.add("B1_glaive-20000") and len(seen) == 20_001
    seen.close()


def test_memory_stops_growing_past_the_limit():
    tracemalloc.start()
    seen = SeenIds(memory_ids=5_000, bloom_bytes=128 << 10)
    for i in range(20_000):
        seen.add(f"row-{i}")
    at_20k = seen.nbytes()
    for i in range(20_000, 60_000):
        seen.add(f"row-{i}")
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The table (8,192 slots of 8 B for 5,000 ids) + the 128 kB filter, whatever the count:
    # the same at 20k and 60k ids. A table of all 60k ids alone would be 1 MB.
    assert max(seen.nbytes(), at_20k) <= 8_192 * 8 + (128 << 10)
    assert current <= 384 << 10, current
    assert peak <= 768 << 10, peak  # spilling sorts a copy of one table's keys, nothing more
    assert not seen.add("row-123") and not seen.add("row-59999") and len(seen) == 60_000
    seen.close()
