"""compare --trace on the CPU: a Chrome trace with one lane per stream (threads) and every operator once
per schedule; --nvtx is refused off the GPU."""

from __future__ import annotations

import json

from helpers import run


def test_compare_trace_on_the_cpu(tmp_path):
    path = tmp_path / "t.json"
    proc = run("compare", "--modelsource", "simple", "--modelname", "ios_block", "--schedulers", "sequential,greedy",
               "--compare-repeat", "2", "--compare-number", "1", "--trace", str(path),
               "--json", str(tmp_path / "c.json"), script=False)
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
    n = len(table["operator_times"])
    for pid, events in by_pid.items():
        assert sorted(e["args"]["op_index"] for e in events) == list(range(n))  # every operator once
        streams = {e["tid"] for e in events}
        assert {(pid, f"thread {s}") for s in streams} <= lanes  # one lane per stream
        assert all(e["dur"] > 0 and e["ts"] >= 0 and e["args"]["kind"] and e["args"]["outputs"] for e in events)
    if kept["schedule"] != "sequential":
        assert len({e["tid"] for e in by_pid[2]}) == kept["streams"]
    assert "timing mark" in trace["otherData"]["note"] and table["trace"] == str(path)


def test_nvtx_needs_a_gpu(tmp_path):
    proc = run("compare", "--modelsource", "simple", "--modelname", "ios_block", "--nvtx", script=False)
    assert proc.returncode == 2 and "--nvtx marks operators for Nsight Systems on a GPU" in proc.stderr
