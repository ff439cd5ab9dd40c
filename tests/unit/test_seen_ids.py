"""Duplicate detection over a whole source: exact on ids, and a bounded cost per id."""

from __future__ import annotations

import tracemalloc

from specregen.sources._io import SeenIds


def test_every_repeat_is_found_and_no_new_id_is_taken_for_one():
    seen = SeenIds(capacity=16)  # grows many times on the way
    ids = [f"B1_glaive-{i}" for i in range(50_000)]
    assert all(seen.add(i) for i in ids)
    assert not any(seen.add(i) for i in ids[::7])
    assert seen.add("B1_glaive-50000") and len(seen) == 50_001


def test_memory_per_id_is_a_small_constant_not_a_python_object_per_id():
    tracemalloc.start()
    seen = SeenIds()
    n = 200_000
    for i in range(n):
        seen.add(f"row-{i}")
    current, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # 8-byte slots, at most 5/8 full (<= 26 B per id) ; a set of 12-byte digests is ~75 B.
    assert seen.nbytes() / n <= 26
    assert current / n <= 30, current / n
