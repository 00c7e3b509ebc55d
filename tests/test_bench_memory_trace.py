"""bench/memory_trace.py's replay of a memory trace to its peak."""

from __future__ import annotations

from bench.memory_trace import alive_at_peak


def test_the_allocations_alive_at_the_largest_total() -> None:
    events = [
        {"action": "alloc", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 2, "size": 50},
        {"action": "free_requested", "addr": 1, "size": 100},  # not freed until completed
        {"action": "alloc", "addr": 3, "size": 30},  # peak: 1, 2 and 3 alive (180)
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 4, "size": 120},  # 200 with 2, 3 and 4: the new peak
        {"action": "free_completed", "addr": 4, "size": 120},
        {"action": "free_completed", "addr": 9, "size": 7},  # made before the trace: ignored
    ]
    best, alive = alive_at_peak(events)
    assert best == 200 and sorted(alive) == [2, 3, 4]
