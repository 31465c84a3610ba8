"""capturer and optimize on the CPU: the baseline decision with a fake timer, the returned callables,
the fast mode, schedule reuse and refusal, and the argument order."""

from __future__ import annotations

import logging

import pytest

from opbench import OpBenchError
from opbench.parallel import CapturedSchedule, capturer, optimize
from opbench.pipeline.compare import FAST_SCHEDULERS
from opbench.runtime.graphs import CapturedModel
from opbench.schedule import Schedule

torch = pytest.importorskip("torch")


class Inception(torch.nn.Module):
    """Four independent branches on one input (IOS's and Opara's favourite shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 1)
        self.b = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.c = torch.nn.Conv2d(3, 4, 5, padding=2)
        self.d = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x)), torch.relu(self.c(x)),
                          torch.sigmoid(self.d(x))], dim=1)


class Block(torch.nn.Module):
    """IOS's sample block: three 3x3 convolutions read the input (one feeds a fourth), beside a 1x1."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(4))
        self.e = torch.nn.Conv2d(8, 8, 1)  # another kernel size: not merged with them

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x), self.d(self.c(x)), self.e(x)], dim=1)


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    return Inception().eval(), torch.randn(1, 3, 10, 10)


def fake_timer(times_ms: dict[str, float], default_ms: float):
    """A timer that calls the run once (so outputs exist) and reports a fixed time per row label."""
    def timer(label, run):
        run()
        return [times_ms.get(label, default_ms) / 1e3] * 3
    return timer


def fake_compiled_model(built: list[bool]):
    """A stand-in for ``graphs.CompiledModel``: the model as it is in torch.compile's rows (no compile on the
    CPU); each build appends whether it was the combo variant to ``built``."""
    from opbench.runtime import graphs

    class Compiled(graphs.CapturedModel):
        label = graphs.COMPILE_ROW

        def __init__(self, model, inputs, mode="reduce-overhead", warmup=3, combo=False):
            super().__init__(model, inputs)
            self.label, self.compile_s = graphs.COMBO_ROW if combo else graphs.COMPILE_ROW, 0.0
            built.append(combo)
    return Compiled


def test_baseline_wins_returns_the_model_as_is(model_and_input, caplog):
    model, x = model_and_input
    with caplog.at_level(logging.INFO, logger="opbench"):
        run = capturer([x], model, timer=fake_timer({"model, eager": 1.0}, 0.99))  # 1% better: not enough
    assert isinstance(run, CapturedModel) and run.schedule is None
    assert run.table[0]["schedule"] == "model, eager" and run.table[0]["kept"]
    assert sum(r["kept"] for r in run.table) == 1
    assert "keeping the model as it is" in caplog.text
    other = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(run(other), model(other), rtol=0, atol=0)


def test_schedule_that_wins_is_captured(model_and_input):
    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "greedy": 0.9, "nimble": 0.5, "opara": 0.7}
    run = capturer([x], model, mode="exhaustive", timer=fake_timer(times, 1.0))
    assert isinstance(run, CapturedSchedule) and run.schedule.name == "nimble"
    kept = [r for r in run.table if r["kept"]]
    assert [r["schedule"] for r in kept] == ["nimble"] and kept[0]["vs_model"] == pytest.approx(2.0)
    other = torch.randn_like(x)
    with torch.no_grad():
        expected = model(other)
    out = run(other)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not out.requires_grad  # the exported weights are plain tensors, nothing is recorded for autograd
    text = str(run)
    streams = len(set(run.schedule.stream_of))
    assert text.startswith(f"CapturedSchedule 'nimble': {len(run.schedule.stream_of)} operators on {streams} streams")
    assert text.endswith("0.5000 ms against 1.0000 ms for model, eager (2.00x)")
    with pytest.raises(OpBenchError, match="has none"):  # on the CPU there is no CUDA Graph to dump
        run.dump("graph.dot")


def test_the_callable_returned_is_the_capture_that_was_timed(model_and_input, monkeypatch):
    """Two captures of one schedule run a few per cent apart: the kept schedule is not captured once more after
    the comparison (a new draw), the executor its row timed is the one returned."""
    from opbench.runtime.executor import ParallelExecutor

    model, x = model_and_input
    made, init = [], ParallelExecutor.__init__

    def spy(self, backend, schedule, priorities=None):
        init(self, backend, schedule, priorities)
        made.append(self)

    monkeypatch.setattr(ParallelExecutor, "__init__", spy)
    times = {"model, eager": 1.0, "sequential": 1.0, "nimble": 0.5}
    run = capturer([x], model, schedulers=["sequential", "nimble"], timer=fake_timer(times, 1.0))
    assert isinstance(run, CapturedSchedule) and run.schedule.name == "nimble"
    assert len(made) == 2 and run.executor is made[1]
    with torch.no_grad():
        torch.testing.assert_close(run(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("captures", [0, -2, 1.5, True, "8"])
def test_captures_must_be_a_whole_number_of_one_or_more(model_and_input, captures):
    model, x = model_and_input
    with pytest.raises(OpBenchError, match=r"captures must be a whole number, 1 or more \(got "):
        capturer([x], model, captures=captures)


def test_capturer_writes_a_trace_of_sequential_and_the_kept_schedule(model_and_input, tmp_path):
    import json

    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "nimble": 0.5}
    path = tmp_path / "run.trace.json"
    run = capturer([x], model, schedulers=["sequential", "nimble"], timer=fake_timer(times, 1.0), trace=path)
    assert run.schedule.name == "nimble"
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[1].startswith("sequential (") and names[2].startswith("nimble (") and len(names) == 2
    assert names[1].endswith(", 1.000 ms unmarked)") and names[2].endswith(", 0.500 ms unmarked)")
    n = len(run.backend.graph)
    for pid in (1, 2):  # every operator once per schedule, one lane (thread) per stream
        ops = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        assert sorted(e["args"]["op_index"] for e in ops) == list(range(n))
        lanes = {e["tid"] for e in events if e["name"] == "thread_name" and e["pid"] == pid}
        assert lanes == {e["tid"] for e in ops}
    assert len(lanes) == len(set(run.schedule.stream_of)) > 1
    with pytest.raises(OpBenchError, match="trace .* folder"):
        capturer([x], model, trace=tmp_path)


def test_every_candidate_is_timed_through_its_users_call_in_interleaved_rounds(model_and_input, monkeypatch):
    """The model's own row and each schedule are timed through the call a user makes (inputs passed in, so
    copied), in interleaved rounds whose first candidate rotates: a slower machine at one moment reaches
    every candidate alike (the round-5 review found torch.compile timed through another path than the
    schedules, 3-13 % slower than an independent harness timed it)."""
    from opbench.pipeline.compare import ROUNDS
    from opbench.runtime.executor import ParallelExecutor

    model, x = model_and_input
    calls, seen = [], []
    run_schedule, call_model = ParallelExecutor.run, CapturedModel.__call__

    def spy_run(self, inputs=None, around=None):
        calls.append(("schedule", inputs is not None))
        return run_schedule(self, inputs, around)

    def spy_call(self, *inputs):
        calls.append(("model", len(inputs) == 1))
        return call_model(self, *inputs)

    monkeypatch.setattr(ParallelExecutor, "run", spy_run)
    monkeypatch.setattr(CapturedModel, "__call__", spy_call)

    def timer(label, run):
        calls.clear()
        run()
        seen.append((label, list(calls)))
        return [1e-3]

    capturer([x], model, schedulers=["sequential", "nimble"], timer=timer)
    labels = [label for label, _ in seen]
    first = ["model, eager", "sequential", "nimble"]
    assert ROUNDS == 3 and labels == [*first, *first[1:], first[0], first[2], *first[:2]]
    assert all(c == [("model", True)] for label, c in seen if label == "model, eager")
    assert all(c == [("schedule", True)] for label, c in seen if label != "model, eager")


def test_a_candidate_whose_outputs_are_off_is_refused(model_and_input, monkeypatch):
    """rtol: a faster candidate whose outputs differ from the model's own beyond it is not kept; its row says
    why. The default follows the inputs' precision."""
    from opbench.parallel import RTOL, default_rtol
    from opbench.pipeline import compare

    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "nimble": 0.5}
    exact, calls = compare.relative_error, []

    def relative_error(out, ref):  # the model's row, then sequential's and nimble's error and sched_error
        calls.append(1)
        return 0.3 if len(calls) == 4 else exact(out, ref)  # nimble's outputs are off the model's by 0.3

    monkeypatch.setattr(compare, "relative_error", relative_error)
    run = capturer([x], model, schedulers=["sequential", "nimble"], timer=fake_timer(times, 1.0), rtol=0.1)
    rows = {r["schedule"]: r for r in run.table}
    assert isinstance(run, CapturedModel) and rows["model, eager"]["kept"]  # nimble was fastest, but off
    assert rows["nimble"]["error"] == 0.3 and rows["nimble"]["refused"] == "error 3.0e-01 > rtol 1e-01"
    assert rows["sequential"]["refused"] is None and rows["model, eager"]["refused"] is None
    assert rows["nimble"]["sched_error"] == 0.0  # the same as sequential: refused for rtol alone
    calls.clear()
    run = capturer([x], model, schedulers=["sequential", "nimble"], timer=fake_timer(times, 1.0), rtol=0.5)
    assert isinstance(run, CapturedSchedule) and run.schedule.name == "nimble"  # within a looser rtol: kept
    assert default_rtol([x]) == RTOL["float32"] and default_rtol([x.half()]) == RTOL["float16"] > RTOL["float32"]
    assert default_rtol([x.bfloat16()]) == RTOL["bfloat16"]

    class OnGpu:  # a float32 input on a GPU, as default_rtol reads it
        dtype, is_cuda = torch.float32, True

        def is_floating_point(self):
            return True

    settings = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        for cudnn, matmul, expected in ((True, False, "tf32"), (False, True, "tf32"), (False, False, "float32")):
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul
            assert default_rtol([OnGpu()]) == RTOL[expected] and default_rtol([x]) == RTOL["float32"]
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = settings
    assert RTOL["tf32"] == RTOL["float16"]


def test_the_combo_kernels_row_is_offered_and_can_win(model_and_input, monkeypatch):
    """torch.compile with Inductor's horizontal fusion is a candidate beside plain torch.compile (both built
    by default with fused kernels, or when compiled=True), and the fastest row is kept whichever it is."""
    from opbench.runtime import graphs

    built: list[bool] = []
    monkeypatch.setattr(graphs, "CompiledModel", fake_compiled_model(built))
    model, x = model_and_input
    times = {"model, eager": 1.0, "torch.compile": 0.9, "torch.compile + combo kernels": 0.6, "nimble": 0.8}
    run = capturer([x], model, schedulers=["sequential", "nimble"], compiled=True, timer=fake_timer(times, 1.0))
    assert built == [False, True] and run.label == graphs.COMBO_ROW and run.schedule is None
    assert [r["schedule"] for r in run.table if r["kept"]] == ["torch.compile + combo kernels"]
    assert set(run.phases) >= {"torch_compile_s", "torch_compile_combo_s"}
    built.clear()
    run = capturer([x], model, schedulers=["sequential", "nimble"], compiled=("default",),
                   timer=fake_timer({**times, "nimble": 0.95}, 1.0))
    assert built == [False] and run.label == graphs.COMPILE_ROW
    with pytest.raises(OpBenchError, match="unknown torch.compile variant 'turbo'"):
        capturer([x], model, compiled=("turbo",))


def counting_timer(times_ms: dict[str, float], default_ms: float, calls: list[str]):
    """:func:`fake_timer` that also notes every label it times in ``calls``."""
    timer = fake_timer(times_ms, default_ms)

    def counted(label, run):
        calls.append(label)
        return timer(label, run)
    return counted


def test_a_second_build_with_the_cache_rebuilds_only_the_kept_schedule(model_and_input, tmp_path, monkeypatch):
    """capturer(cache=True): the first build searches and keeps its choice in $OPBENCH_CACHE; a second build of the
    same model builds only the kept schedule and times nothing (its table is the first's, marked cached), with
    outputs equal to the model's; a model of other shapes misses; cache="schedule" reuses the schedule but
    measures it beside the baselines again; a bad cache value is one line."""
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))
    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "nimble": 0.5, "opara": 0.6, "greedy": 0.7}
    calls: list[str] = []
    first = capturer([x], model, cache=True, timer=counting_timer(times, 1.0, calls))
    assert "cache" not in first.phases and first.schedule.name == "nimble" and calls
    assert len(list((tmp_path / "cache" / "capturer").glob("*.json"))) == 1
    calls.clear()
    again = capturer([x], model, cache=True, timer=counting_timer(times, 1.0, calls))
    assert calls == []  # nothing searched, nothing measured
    assert isinstance(again, CapturedSchedule) and again.schedule.name == "nimble"
    assert again.phases["cache"] == 1.0 and again.phases["cache_choice"] == 1.0
    assert [r["schedule"] for r in again.table] == [r["schedule"] for r in first.table]
    assert all(r["cached"] for r in again.table)
    assert [r["kept"] for r in again.table] == [r["kept"] for r in first.table]
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=1e-5, atol=1e-6)
    measured = capturer([x], model, cache="schedule", timer=counting_timer(times, 1.0, calls))
    assert measured.phases["cache"] == 1.0 and "cache_choice" not in measured.phases
    assert [r["schedule"] for r in measured.table] == ["model, eager", "sequential", "nimble"]  # no search
    assert sorted(calls) == sorted(["model, eager", "sequential", "nimble"] * 3)  # measured again, 3 rounds
    other = capturer([torch.randn(1, 3, 12, 12)], model, cache=True, timer=fake_timer(times, 1.0))
    assert "cache" not in other.phases and len(list((tmp_path / "cache" / "capturer").glob("*.json"))) == 2
    import opbench.parallel

    monkeypatch.setattr(opbench.parallel, "SEARCH_VERSION", opbench.parallel.SEARCH_VERSION + 1)
    newer = capturer([x], model, cache=True, timer=fake_timer(times, 1.0))  # other candidates: searched again
    assert "cache" not in newer.phases and len(list((tmp_path / "cache" / "capturer").glob("*.json"))) == 3
    plain = capturer([x], model, timer=fake_timer(times, 1.0))  # the default: no cache
    assert "cache" not in plain.phases and len(plain.table) == 1 + len(FAST_SCHEDULERS)
    with pytest.raises(OpBenchError, match="unknown capturer cache 'yes'.*accepted: False, True, 'schedule'"):
        capturer([x], model, cache="yes")


def test_a_cached_baseline_choice_builds_that_baseline_alone(model_and_input, tmp_path, monkeypatch):
    """When a baseline won (here the combo row), the cached rebuild builds that one torch.compile variant and no
    other candidate; a cached candidate whose outputs are off is not returned: the build searches again."""
    from opbench import parallel
    from opbench.runtime import graphs

    built: list[bool] = []
    monkeypatch.setattr(graphs, "CompiledModel", fake_compiled_model(built))
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))
    model, x = model_and_input
    times = {"model, eager": 1.0, "torch.compile": 0.9, "torch.compile + combo kernels": 0.6, "nimble": 0.8}
    first = capturer([x], model, schedulers=["sequential", "nimble"], compiled=True, cache=True,
                     timer=fake_timer(times, 1.0))
    assert first.label == graphs.COMBO_ROW and built == [False, True]
    built.clear()
    calls: list[str] = []
    again = capturer([x], model, schedulers=["sequential", "nimble"], compiled=True, cache=True,
                     timer=counting_timer(times, 1.0, calls))
    assert built == [True] and calls == [] and again.label == graphs.COMBO_ROW and again.schedule is None
    assert again.phases["cache_choice"] == 1.0 and "torch_compile_combo_s" in again.phases
    monkeypatch.setattr(parallel, "relative_error", lambda actual, expected: 1.0)  # the rebuilt outputs are off
    built.clear()
    searched = capturer([x], model, schedulers=["sequential", "nimble"], compiled=True, cache=True,
                        timer=counting_timer(times, 1.0, calls))
    assert "cache_choice" not in searched.phases and built[:1] == [True] and calls  # measured again


def test_fast_mode_measures_only_the_best_predicted(model_and_input):
    model, x = model_and_input
    run = capturer([x], model, timer=fake_timer({}, 1.0))
    names = [r["schedule"] for r in run.table]
    assert names == ["model, eager", *FAST_SCHEDULERS]  # every fast scheduler is scheduled and predicted
    measured = [r["schedule"] for r in run.table if r["measured"]]
    assert measured[:2] == ["model, eager", "sequential"] and 3 <= len(measured) <= 4
    assert all(r["predicted_ms"] > 0 for r in run.table[1:])
    predicted = {r["schedule"]: r["predicted_ms"] for r in run.table[2:]}
    skipped = [r["schedule"] for r in run.table[2:] if not r["measured"]]
    assert all(predicted[s] >= max(predicted[m] for m in measured[2:]) for s in skipped)
    # named schedulers are all measured
    run = capturer([x], model, schedulers=["sequential", "ios"], timer=fake_timer({}, 1.0))
    assert [r["schedule"] for r in run.table if r["measured"]] == ["model, eager", "sequential", "ios"]


def test_schedule_reuse_and_refusal(model_and_input, tmp_path):
    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "opara": 0.5}
    plan = optimize([x], model, schedulers=["sequential", "opara"], timer=fake_timer(times, 1.0))
    assert plan.name == "opara" and plan.meta["beats_model"] and len(plan.meta["graph"]) == 32
    assert plan.meta["device"] == "cpu"  # the device it was measured on, which a later build checks
    path = tmp_path / "kept.json"
    plan.save(path)
    run = capturer([x], model, schedule=str(path), timer=fake_timer(times, 1.0))
    assert [r["schedule"] for r in run.table] == ["model, eager", "sequential", "opara"]
    assert run.table[1]["scheduling_ms"] == 0.0 and run.schedule.stream_of == plan.stream_of

    class Other(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    with pytest.raises(OpBenchError, match="was made for another graph"):
        capturer([x], Other(), schedule=path)
    bare = Schedule.from_dict({k: v for k, v in plan.to_dict().items() if k != "meta"})
    with pytest.raises(OpBenchError, match="carries no graph fingerprint"):
        optimize([x], model, schedule=bare)


def test_a_schedule_made_under_other_versions_is_warned_about(model_and_input, tmp_path, caplog):
    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "opara": 0.5}
    plan = optimize([x], model, schedulers=["sequential", "opara"], timer=fake_timer(times, 1.0))
    assert plan.meta["versions"]["torch"] == torch.__version__ and plan.meta["versions"]["opbench"]
    plan.save(tmp_path / "same.json")
    with caplog.at_level(logging.WARNING, logger="opbench"):
        capturer([x], model, schedule=tmp_path / "same.json", timer=fake_timer(times, 1.0))
    assert "other versions" not in caplog.text
    plan.meta["versions"]["torch"] = "1.0.0"
    plan.save(tmp_path / "old.json")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="opbench"):
        run = capturer([x], model, schedule=tmp_path / "old.json", timer=fake_timer(times, 1.0))
    lines = [r.message for r in caplog.records if "other versions" in r.message]
    assert len(lines) == 1 and f"torch 1.0.0 -> {torch.__version__}" in lines[0]
    assert run.schedule.name == "opara"  # warned, still used


def test_inputs_come_first(model_and_input):
    model, x = model_and_input
    with pytest.raises(OpBenchError, match=r"optimize takes \(inputs, model\)"):
        optimize(model, [x])
    with pytest.raises(OpBenchError, match=r"capturer takes \(inputs, model\)"):
        capturer(model, x)
    with pytest.raises(OpBenchError, match="unknown mode 'quick'"):
        capturer(x, model, mode="quick")  # one tensor is accepted as the inputs


def test_torch_backend_traces_with_fx_or_export(model_and_input):
    from opbench.runtime.backend import TorchBackend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import get_scheduler

    model, x = model_and_input
    fx = TorchBackend(model, [x], trace="auto")
    exported = TorchBackend(model, [x], trace="export")
    assert fx.trace == "fx" and exported.trace == "export"
    kinds = sorted(n.kind for n in fx.graph)
    assert kinds.count("conv2d") == 4 and "cat" in kinds  # module calls as the user wrote them
    convs = [n for n in fx.graph if n.kind == "conv2d"]
    assert {n.flops for n in convs} >= {2.0 * 4 * 10 * 10 * 3 * 3 * 3}  # the 3x3 convolution
    for backend in (fx, exported):
        out = ParallelExecutor(backend, get_scheduler("greedy").schedule(backend.graph)).run([x])[0]
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    # fx cannot trace a TransformerEncoder: auto falls back to torch.export
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    seq = torch.randn(1, 5, 16)
    backend = TorchBackend(encoder, [seq], trace="auto")
    assert backend.trace == "export"
    with pytest.raises(OpBenchError, match="torch.fx could not trace TransformerEncoder"):
        TorchBackend(encoder, [seq], trace="fx")
    with pytest.raises(OpBenchError, match="unknown trace 'jit'"):
        TorchBackend(encoder, [seq], trace="jit")


@pytest.mark.parametrize("trace", ["fx", "export"])
def test_merge_known_answer_on_the_ios_block(trace):
    """IOS's sample block: three 3x3 convolutions read the input (one feeds a fourth), then a concat.
    Merged, the three become one convolution whose output is split; every schedule's output equals
    the model's."""
    from opbench.runtime.backend import TorchBackend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import SCHEDULERS, get_scheduler

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 8, 10, 10)
    plain = TorchBackend(model, [x], trace=trace)
    merged = TorchBackend(model, [x], trace=trace, merge=True)
    assert len(merged.graph) == len(plain.graph) - 2
    node = next(n for n in merged.graph if n.attrs.get("merged"))
    assert node.attrs == {"merged": 3, "out_channels": [8, 8, 8]} and len(node.output_shapes) == 3
    assert node.flops == pytest.approx(sum(n.flops for n in plain.graph if n.kind == "conv2d") -
                                       2 * 8 * 10 * 10 * 8 * 3 * 3 - 2 * 8 * 10 * 10 * 8)  # all but d and e
    consumers = [n for n in merged.graph if node.index in merged.graph.preds(n.index)]
    assert {a.item for n in consumers for a in n.args if a.index == node.index} == {0, 1, 2}
    with torch.no_grad():
        expected = model(x)
    for name in SCHEDULERS:
        out = ParallelExecutor(merged, get_scheduler(name).schedule(merged.graph)).run([x])[0]
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_merge_chosen_groups_and_ios_choice():
    """Merging only the siblings named (two of the three), and IOS's dynamic programme choosing
    the merge by cost: with operators that take a second each, the merged convolution (timed,
    milliseconds) wins; with operators of a nanosecond, it loses. Outputs equal the model's."""
    from opbench.pipeline.compile import ios_merges, torch_backend
    from opbench.profile.schedule import merge_cost, stage_table
    from opbench.runtime.backend import TorchBackend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import get_scheduler

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 8, 10, 10)
    with torch.no_grad():
        expected = model(x)
    plain = TorchBackend(model, [x])
    convs = [n.var_name for n in plain.graph if n.kind == "conv2d"]
    assert plain.merge_groups() == [[0, 1, 2]] and plain.merged_groups == []
    two = TorchBackend(model, [x], merge=[convs[1:3]])  # b and c; a stays alone
    assert two.merged_groups == [convs[1:3]] and len(two.graph) == len(plain.graph) - 1
    node = next(n for n in two.graph if n.attrs.get("merged"))
    assert node.attrs == {"merged": 2, "out_channels": [8, 8]}
    out = ParallelExecutor(two, get_scheduler("nimble").schedule(two.graph)).run([x])[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    stages = stage_table(two, get_scheduler("sequential").schedule(two.graph), repeat=2)
    assert [r["strategy"] for r in stages] == ["merge" if r["groups"] == [[node.index]] else "sequential"
                                               for r in stages] and "merge" in {r["strategy"] for r in stages}
    for bad in ([convs[0]], [convs[0], convs[3]], [convs[0], "nowhere"]):  # one; a 1x1 among 3x3; unknown
        with pytest.raises(OpBenchError, match="cannot merge"):
            TorchBackend(model, [x], merge=[bad])
    cost = merge_cost(plain, repeat=3)
    assert cost((0, 1)) > 0 and cost((0, 3)) is None and cost((0,)) is None
    assert ios_merges(plain, latencies=[1.0] * len(plain.graph)) == [convs[:3]]
    assert ios_merges(plain, latencies=[1e-9] * len(plain.graph)) == []
    chosen = torch_backend(model, [x], merge="ios", trace="export", repeat=3, number=10)
    out = ParallelExecutor(chosen, get_scheduler("ios").schedule(chosen.graph)).run([x])[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(OpBenchError, match="unknown merge 'some'"):
        torch_backend(model, [x], merge="some")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_capturer_in_half_precision_equals_the_model_in_that_precision(model_and_input, dtype):
    import copy

    model, x = model_and_input
    times = {"model, eager": 1.0, "sequential": 1.0, "greedy": 0.9, "nimble": 0.5, "opara": 0.7}
    run = capturer(x, model, dtype=dtype, mode="exhaustive", timer=fake_timer(times, 1.0))
    assert isinstance(run, CapturedSchedule) and run.schedule.name == "nimble"
    want = copy.deepcopy(model).to(getattr(torch, dtype))(x.to(getattr(torch, dtype)))
    got = run(x)  # float32 inputs are cast to the model's dtype
    assert got.dtype == getattr(torch, dtype)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert next(model.parameters()).dtype == torch.float32  # the caller's model is not changed
    with pytest.raises(OpBenchError, match="unknown dtype 'int8'"):
        capturer(x, model, dtype="int8")


def test_options_as_one_object_and_keywords_beside_it(model_and_input):
    """``capturer(inputs, model, CaptureOptions(...), **overrides)`` searches as the same keywords one by one;
    an unknown keyword is a TypeError naming it; optimize takes no trace."""
    from opbench.parallel import CaptureOptions
    from opbench.pipeline.spec import overridden

    model, x = model_and_input
    timer = fake_timer({"greedy": 0.5, "sequential": 2.0}, 5.0)
    options = CaptureOptions(schedulers=["sequential", "greedy"], mode="exhaustive", repeat=2, number=1)
    plan = optimize(x, model, options, timer=timer)
    same = optimize(x, model, schedulers=["sequential", "greedy"], mode="exhaustive", repeat=2, number=1,
                    timer=timer)
    assert plan.name == same.name == "greedy" and plan.stream_of == same.stream_of
    assert [r["schedule"] for r in plan.meta["table"]] == [r["schedule"] for r in same.meta["table"]]
    assert overridden(options, {"repeat": 3}, "capturer").repeat == 3 and options.repeat == 2  # a copy
    with pytest.raises(TypeError, match="unexpected keyword argument 'repeats'"):
        capturer(x, model, repeats=3)
    with pytest.raises(TypeError, match="optimize\\(\\) takes no trace"):
        optimize(x, model, trace="t.json")


def test_a_dump_that_wrote_nothing_is_an_error(tmp_path):
    """torch 2.11's ``debug_dump`` writes nothing for a graph whose template was not kept, silently:
    ``CapturedGraph.dump`` says so instead of returning as if it had written the file."""
    from opbench.errors import OpBenchError
    from opbench.runtime.graphs import CapturedGraph

    class Silent:  # a graph without raw_cuda_graph, whose debug_dump writes nothing
        def debug_dump(self, path: str) -> None:
            self.path = path

    with pytest.raises(OpBenchError, match="CUDA wrote no graph"):
        CapturedGraph(Silent()).dump(tmp_path / "graph.dot")
    assert not (tmp_path / "graph.dot").exists()


def test_calls_after_a_dump_return_the_kept_captures_outputs(tmp_path, monkeypatch):
    """A capture binds the operators' outputs to its own memory, and the backend's values are the last
    capture's. ``dump`` captures the schedule once more for the file; later calls still replay the capture that
    was kept (the fastest) and return its outputs, not the dumped capture's (once seen on an H100: every output
    stale after a dump)."""
    from pathlib import Path
    from types import SimpleNamespace

    import opbench.parallel as parallel
    import opbench.runtime.executor as executor
    from opbench.parallel import CapturedSchedule

    class Graph:  # a capture: the backend's outputs now live in this graph's memory, which replay fills
        def __init__(self, backend):
            self.memory = torch.zeros(1)
            backend.out = [self.memory]

        def replay(self):
            self.memory += 1

        def dump(self, path):
            Path(path).write_text("digraph {}")

    backend = SimpleNamespace(is_cuda=True, out=None)
    backend.outputs = lambda: backend.out
    monkeypatch.setattr(executor, "capture_graph", lambda launch, keep=False: Graph(backend))

    class Bare(executor.ParallelExecutor):  # an executor of the fake backend, no schedule to validate
        def __init__(self, backend, schedule=None):
            self.backend, self.cuda_graph, self._captured = backend, None, None

    monkeypatch.setattr(parallel, "ParallelExecutor", Bare)
    run = object.__new__(CapturedSchedule)
    run.backend, run.schedule, run.executor = backend, None, Bare(backend).capture()
    kept = run.executor.cuda_graph.memory
    assert run.dump(tmp_path / "graph.dot").read_text().startswith("digraph")
    assert backend.out[0] is not kept  # the dump's capture left the backend's values in its own memory
    out = run.executor.run()
    assert out[0] is kept and float(kept) == 1.0
