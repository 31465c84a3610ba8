"""Host-clock sampling: the number of calls and the seconds per call."""

from __future__ import annotations

import time

from opbench.profile.timer import wall_samples


def test_wall_samples_counts_calls_and_divides_by_number():
    calls = []

    def fn() -> None:
        calls.append(1)
        time.sleep(0.002)

    samples = wall_samples(fn, repeat=3, number=2, warmup=1)
    assert len(calls) == 1 + 3 * 2 and len(samples) == 3
    assert all(0.002 <= s < 0.02 for s in samples)  # per call, not per sample of two calls
