"""time_rounds: interleaved rounds, and the host time a call takes beside its latency."""

from __future__ import annotations

import logging

from opbench.pipeline.compare import (
    HOST_BOUND_SHARE,
    _say_host_bound,
    call_clocks,
    time_rounds,
)


def test_each_row_gets_its_median_and_the_least_host_time_of_its_rounds():
    """The host time of a row is the least over its rounds (a busy host only adds to it); the latency is the
    median of every sample; ``host`` and then ``device`` (handed that host time) are asked once per row and
    round, after that row's timing; the device time is the median of the answers that are not None."""
    order: list[str] = []
    latency = {"a": [1e-3, 3e-3, 2e-3], "b": [5e-3, 5e-3, 5e-3]}
    host = {"a": iter([4e-4, 1e-4, 2e-4]), "b": iter([9e-4, 9e-4, 8e-4])}
    rows = {name: {"schedule": name} for name in "ab"}
    runs = {name: (lambda n=name: n) for name in "ab"}

    def timer(label, run):
        order.append(f"t{label}")
        return [latency[label].pop(0)]

    def host_time(run):
        order.append(f"h{run()}")
        return next(host[run()])

    device = {"a": iter([7e-4, None, 9e-4]), "b": iter([None, None, None])}
    handed = []

    def device_time(run, host_s):
        order.append(f"d{run()}")
        handed.append(host_s)
        return next(device[run()])

    time_rounds([(rows["a"], runs["a"]), (rows["b"], runs["b"])], timer, host=host_time, device=device_time)
    assert order == [f"{k}{n}" for n in "abbaab" for k in "thd"]
    assert handed == [4e-4, 9e-4, 9e-4, 1e-4, 2e-4, 8e-4]
    assert rows["a"]["latency_ms"] == 2.0 and abs(rows["a"]["host_ms"] - 0.1) < 1e-12
    assert rows["b"]["latency_ms"] == 5.0 and abs(rows["b"]["host_ms"] - 0.8) < 1e-12
    assert abs(rows["a"]["device_ms"] - 0.8) < 1e-12 and "device_ms" not in rows["b"]


def test_without_a_host_clock_rows_get_no_host_time_and_the_cpu_has_none():
    row = {"schedule": "x"}
    time_rounds([(row, lambda: None)], lambda label, run: [1e-3])
    assert row["latency_ms"] == 1.0 and "host_ms" not in row and "device_ms" not in row
    assert call_clocks(False, 20) == (None, None)


def test_a_row_whose_call_is_mostly_host_time_is_said_host_bound(caplog):
    """One INFO line for each row whose host time a call is HOST_BOUND_SHARE of its latency or more."""
    rows = [{"schedule": "torch.compile", "latency_ms": 0.34, "host_ms": 0.34 * HOST_BOUND_SHARE},
            {"schedule": "opara", "latency_ms": 0.33, "host_ms": 0.011},
            {"schedule": "nimble", "latency_ms": None}]
    with caplog.at_level(logging.INFO, logger="opbench.pipeline.compare"):
        _say_host_bound(rows)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["torch.compile: a call takes 0.170 ms of host time, 50 % of its 0.340 ms: a busy host slows it"]


def _rows():
    """A model graph, a torch.compile row timed on a busy host, sequential and a parallel schedule."""
    from opbench.pipeline.compare import _row

    model = _row("model, CUDA Graph", None, latency_ms=0.70, device_ms=0.69, host_ms=0.011, error=0.0)
    compiled = _row("torch.compile", None, latency_ms=0.61, device_ms=0.48, host_ms=0.21, error=0.0)
    plan = type("Plan", (), {"num_streams": 1, "num_events": 0, "partition_label": lambda self: "-"})()
    sequential = _row("sequential", plan, latency_ms=0.53, device_ms=0.525, host_ms=0.012, error=0.0,
                      sched_error=0.0)
    parallel = _row("greedy", plan, latency_ms=0.54, error=0.0, sched_error=0.0)  # no device time: its latency
    return [model, compiled, sequential, parallel]


def test_the_steady_choice_is_recorded_beside_the_choice_made():
    """A torch.compile row slowed by a busy host (0.61 ms back to back, 0.48 ms on the GPU, 0.21 ms on the
    host) loses the choice to sequential (0.53 ms) but wins the steady one; steady_ms is the larger of device and
    host time, never above the latency, and the latency where one is missing."""
    from opbench.pipeline.compare import _decide

    rows = _rows()
    _decide(rows, tolerance=0.01)
    assert [r["schedule"] for r in rows if r["kept"]] == ["sequential"]
    assert [r["schedule"] for r in rows if r["steady_kept"]] == ["torch.compile"]
    assert [r["steady_ms"] for r in rows] == [0.69, 0.48, 0.525, 0.54]


def test_without_device_times_both_choices_agree():
    from opbench.pipeline.compare import _decide

    rows = _rows()
    for row in rows:
        row.pop("device_ms", None)
    _decide(rows, tolerance=0.01)
    assert [r["steady_ms"] for r in rows] == [r["latency_ms"] for r in rows]
    assert [r["kept"] for r in rows] == [r["steady_kept"] for r in rows] == [False, False, True, False]


def test_device_and_host_times_that_do_not_account_for_the_latency_leave_it():
    """Where the larger of device and host time is under STEADY_FLOOR of the latency (the spin held another
    stream than the work's), steady_ms is the latency measured."""
    from opbench.pipeline.compare import STEADY_FLOOR, steady_ms

    row = {"latency_ms": 1.0, "device_ms": 0.9 * STEADY_FLOOR, "host_ms": 0.01}
    assert steady_ms(row) == 1.0
    row["device_ms"] = STEADY_FLOOR
    assert steady_ms(row) == STEADY_FLOOR
    row["device_ms"] = 1.2  # never above the latency measured
    assert steady_ms(row) == 1.0


def test_the_fastest_capture_is_kept_and_one_with_other_outputs_is_dropped(monkeypatch):
    """``fastest_capture`` times every capture through the user's call (inputs passed) by the given timer, in one
    screening round and, for the ``FINALISTS`` fastest there, in ``ROUNDS`` more, and keeps the least; a capture
    whose outputs differ from the first's is left out before any timing."""
    import numpy as np

    from opbench.pipeline import compare

    outputs = iter([[np.ones(2)], [np.ones(2)], [np.zeros(2)], [np.ones(2)]])  # the second new capture is off
    made: list[object] = []

    class Executor:
        def __init__(self, backend, plan):
            made.append(self)

        def run(self, inputs=None):
            assert inputs == ["x"]
            return next(outputs, [np.ones(2)])

    monkeypatch.setattr(compare, "ParallelExecutor", Executor)
    plan = type("Plan", (), {"name": "opara"})()
    first = Executor(None, plan)
    times = {"opara capture 0": 3e-3, "opara capture 1": 2e-3, "opara capture 2": 1e-3}
    labels = []

    def timer(label, run):
        labels.append(label)
        run()
        return [times[label]]

    kept, rows = compare.fastest_capture(None, plan, 4, ["x"], timer, first)
    assert len(made) == 4 and kept is made[3]  # the first, two new ones, the third new one kept
    assert [r["capture"] for r in rows] == [0, 1, 2] and [r["latency_ms"] for r in rows] == [3.0, 2.0, 1.0]
    assert [r["kept"] for r in rows] == [False, False, True]
    assert compare.FINALISTS == 2 and [r["finalist"] for r in rows] == [False, True, True]
    # the slowest capture of the screening is not timed again
    assert sorted(labels) == sorted([*times, *["opara capture 1", "opara capture 2"] * compare.ROUNDS])


def test_a_one_stream_schedule_is_captured_once_and_a_concurrent_one_as_often_as_asked():
    """Captures of a schedule differ in how its concurrent branches run, so only a schedule with two or more
    streams is worth several captures (``captures_of``); one stream is captured once, whatever is asked."""
    from opbench.pipeline.compare import captures_of
    from opbench.schedule import Schedule

    one = Schedule("sequential", [0, 0, 0], [0, 1, 2], [])
    two = Schedule("opara", [0, 1, 0], [0, 1, 2], [(1, 2)])
    assert [captures_of(one, n) for n in (1, 8)] == [1, 1]
    assert [captures_of(two, n) for n in (1, 3, 8)] == [1, 3, 8]
