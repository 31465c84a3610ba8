"""compare --trace: a Chrome trace with one lane per stream (threads on the CPU, CUDA streams on the GPU)
and every operator once per schedule; --nvtx names the operators in torch.profiler's trace on the GPU and
is refused off it."""

from __future__ import annotations

import json

import pytest

from helpers import run


def check_trace(tmp_path, target: str, lane: str, *extra: str) -> dict:
    """Run compare --trace and check the file: every operator once per schedule, one lane per stream,
    spans of one lane in order; returns the trace."""
    path = tmp_path / "t.json"
    proc = run("compare", "--modelsource", "simple", "--modelname", "ios_block", "--schedulers", "sequential,greedy",
               "--target", target, "--compare-repeat", "2", "--compare-number", "1", "--trace", str(path),
               "--json", str(tmp_path / "c.json"), *extra, script=False)
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(path.read_text())
    table = json.loads((tmp_path / "c.json").read_text())
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    lanes = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    kept = next(r for r in table["schedules"] if r.get("kept"))
    by_pid = {}
    for e in ops:
        by_pid.setdefault(e["pid"], []).append(e)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names[1].startswith("sequential") and len(by_pid) == (1 if kept["schedule"] == "sequential" else 2)
    assert all(" ms traced, " in name and name.endswith(" ms unmarked)") for name in names.values())
    n = len(table["operator_times"])
    for pid, events in by_pid.items():
        assert sorted(e["args"]["op_index"] for e in events) == list(range(n))  # every operator once
        streams = {e["tid"] for e in events}
        assert {(pid, f"{lane} {s}") for s in streams} <= lanes  # one lane per stream
        assert all(e["dur"] > 0 and e["ts"] >= 0 and e["args"]["kind"] and e["args"]["outputs"] for e in events)
        for s in streams:  # a stream runs its operators one after another
            spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == s)
            assert all(end <= nxt + 1e-3 for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    if kept["schedule"] != "sequential":
        assert len({e["tid"] for e in by_pid[2]}) == kept["streams"]
    assert "timing mark" in trace["otherData"]["note"] and table["trace"] == str(path)
    return trace


@pytest.mark.slow
def test_compare_trace_on_the_cpu(tmp_path):
    check_trace(tmp_path, "llvm", "thread")


@pytest.mark.gpu
def test_compare_trace_and_nvtx_on_the_gpu(tmp_path):
    trace = check_trace(tmp_path, "cuda", "stream", "--nvtx")
    assert trace["otherData"]["device"] != "cpu"
    profile = json.loads((tmp_path / "t.torch.json").read_text())  # the NVTX run's torch.profiler trace
    ranges = {e["name"] for e in profile["traceEvents"] if str(e.get("name", "")).startswith("#")}
    assert {r.split()[0] for r in ranges} >= {"#0", "#1"}


def test_nvtx_needs_a_gpu(tmp_path):
    proc = run("compare", "--modelsource", "simple", "--modelname", "ios_block", "--nvtx", script=False)
    assert proc.returncode == 2 and "--nvtx marks operators for Nsight Systems on a GPU" in proc.stderr
