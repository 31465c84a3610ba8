"""Compiler-fused regions on the CPU (Inductor compiles for the CPU too): outputs equal the model's,
a region Inductor cannot compile falls back to its ATen operators, a saved cut is reused, bad
choices are one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opbench import OpBenchError

torch = pytest.importorskip("torch")


class Block(torch.nn.Module):
    """An inception-style block: three branches of one input (one of them two convolutions), concatenated."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(c, c, 1)
        self.b = torch.nn.Conv2d(c, c, 3, padding=1)
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.c2 = torch.nn.Conv2d(c, c, 1)

    def forward(self, x):
        x = torch.relu(x)
        return torch.cat([torch.relu(self.a(x)), torch.sigmoid(self.b(x)), self.c2(torch.relu(self.c1(x)))], 1)


@torch.fx.wrap
def _host_side(x):
    # a value read back to the host: neither traceable to ATen nor compiled by torch.compile(fullgraph=True)
    return x * 2 if x.sum().item() > -1e9 else x


class WithGraphBreak(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return _host_side(self.block(x))


def _greedy(backend):
    """``backend``'s outputs, run under the greedy scheduler's schedule."""
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import get_scheduler

    return ParallelExecutor(backend, get_scheduler("greedy").schedule(backend.graph)).run()


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(1, 8, 10, 10)


def test_fused_regions_equal_the_model_under_every_schedule(block):
    from opbench.runtime.backend import KernelBackend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import SCHEDULERS, get_scheduler

    model, x = block
    backend = KernelBackend.create("fused", model, [x])
    assert backend.name == "fused" and not backend.fallbacks and backend.compile_s > 0
    region_ops = [r for r in backend.regions]
    assert len(region_ops) == 1 + 3 + 1  # the stem, one region per branch, the concatenation
    assert sum(n.kind == "region" for n in backend.graph) == len(region_ops)
    with torch.no_grad():
        expected = model(x)
    for name in SCHEDULERS:
        schedule = get_scheduler(name).schedule(backend.graph)
        torch.testing.assert_close(ParallelExecutor(backend, schedule).run()[0], expected, rtol=1e-4, atol=1e-5)


def test_workers_start_once_the_compiles_here_turn_slow(monkeypatch):
    """Workers start when the last structures compiled here were slow on average, not only when the first were:
    a network whose first structures compile quickly and whose later ones do not still gets its workers, and
    too few left are not worth their start."""
    from opbench.runtime import fused

    monkeypatch.setattr(fused, "PROBES", 2)
    monkeypatch.setattr(fused, "COLD_S", 0.5)
    monkeypatch.setattr(fused, "WORKERS_FROM", 6)
    assert not fused._workers_due([], 30) and not fused._workers_due([2.0], 30)  # fewer than PROBES so far
    assert not fused._workers_due([0.1, 0.2], 30)  # quick: Inductor's caches warm
    assert fused._workers_due([0.9, 0.8], 30)
    assert fused._workers_due([0.1, 0.1, 0.1, 0.2, 1.5], 30)  # quick at first, then slow
    assert not fused._workers_due([0.1, 0.1, 0.8, 0.1], 30)  # the last two: 0.45 s each on average
    assert fused._workers_due([0.9, 0.8], 4) and not fused._workers_due([0.9, 0.8], 3)  # too few left
    # the pieces of a heavy region: no probes, workers at once where enough are left
    assert fused._workers_due([], 6, probes=0) and not fused._workers_due([], 5, probes=0)


def test_a_region_inductor_cannot_compile_runs_its_aten_operators(caplog):
    from opbench.runtime.backend import KernelBackend

    torch.manual_seed(0)
    model, x = WithGraphBreak().eval(), torch.randn(1, 8, 6, 6)
    with caplog.at_level("WARNING", logger="opbench"):
        backend = KernelBackend.create("fused", model, [x])
    assert len(backend.fallbacks) == 1
    assert sum("runs its ATen operators" in r.message for r in caplog.records) == 1  # logged once
    out = _greedy(backend)
    with torch.no_grad():
        torch.testing.assert_close(out[0], model(x), rtol=1e-4, atol=1e-5)


class TwoBlocks(torch.nn.Module):
    """Two blocks of one structure and different weights, one after the other, each behind a convolution (whose
    output is channels-last in Inductor's layout, where the regions take channels-last weights: both blocks then
    take their input in one layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Block(), Block()
        self.stem = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.squeeze = torch.nn.Conv2d(24, 8, 1)

    def forward(self, x):
        return self.second(self.squeeze(self.first(self.stem(torch.cat([x, x, x], 1)[:, :8]))))


def _after_the_workers(artifact_here):
    """``RegionCompiler._artifact`` in a process slower than its workers: it waits for a structure handed to them
    (in shares, or still in the queue while a worker lives to take it; up to two minutes) and then loads their
    code."""
    def after_the_workers(self, graph, values, key):
        for _ in range(1200):
            queued = self._queue is not None and key in self._queue and self._alive_worker() is not None
            if not queued and (key not in self._given or self._path(key).is_file()):
                break
            time.sleep(0.1)
        return artifact_here(self, graph, values, key)

    return after_the_workers


def test_regions_of_one_structure_compile_once_and_a_second_build_loads_them(tmp_path, monkeypatch):
    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(1, 8, 10, 10)
    with torch.no_grad():
        expected = model(x)

    def built(store, jobs=1):
        backend = FusedBackend(model, [x], store=store, jobs=jobs)
        out = _greedy(backend)[0]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        return backend

    first = built(tmp_path)
    n = len(first.regions)
    assert not first.fallbacks and sum(first.built.values()) == n
    # every region compiled ahead of time; the two blocks' 1x1 branches are of one structure: compiled once
    assert set(first.built) == {"compiled", "shared"} and first.built["shared"] >= 1
    stored = sorted(tmp_path.glob("*.bin"))
    assert len(stored) == first.built["compiled"]
    # while checking, each structure ran once: a region sharing code that an earlier region ran is not run (the
    # pass after the checks, which runs the graph once to see the strides each region is handed, aside)
    ran = []
    with monkeypatch.context() as patched:
        call = fused.RegionCall.__call__
        patched.setattr(fused.RegionCall, "__call__", lambda self, *a: ran.append(self.artifact) or call(self, *a))
        strides_pass = fused._compile_for_handed_strides

        def unseen(*args):
            before = len(ran)
            again = strides_pass(*args)
            del ran[before:]
            return again

        patched.setattr(fused, "_compile_for_handed_strides", unseen)
        assert FusedBackend(model, [x], store=None).built == first.built
    assert len(ran) == len({id(a) for a in ran}) == first.built["compiled"] < n
    second = built(tmp_path)  # a new build: every structure loaded from the folder, nothing compiled
    assert second.built == {"loaded": first.built["compiled"], "shared": first.built["shared"]}
    # ... and found through each region's quick key: nothing traced to ATen
    with monkeypatch.context() as patched:
        patched.setattr(fused, "_aten_graph", lambda *a: pytest.fail("traced to ATen"))
        assert built(tmp_path).built == second.built
    # an index entry that points at another structure's code is caught by the outputs' check, and traced again
    entries = sorted((tmp_path / "index").glob("*.json"))
    assert len(entries) == first.built["compiled"]  # regions of one structure share their quick key
    right = {e: json.loads(e.read_text())["key"] for e in entries}
    for entry, key in right.items():
        entry.write_text(json.dumps(dict(json.loads(entry.read_text()),
                                         key=next(k for k in sorted(set(right.values())) if k != key))))
    misled = built(tmp_path).built  # outputs equal the model's (checked in built)
    # nothing compiled; a structure loaded for a region it misled may serve the region whose code it is (shared)
    assert set(misled) == {"loaded", "shared"} and sum(misled.values()) == n
    assert {e: json.loads(e.read_text())["key"] for e in entries} == right  # each entry written again, right
    stored[0].write_bytes(b"torn")  # a stored region that cannot be loaded is compiled again
    third = built(tmp_path)
    assert third.built.get("compiled") == 1 and third.built["loaded"] == len(stored) - 1
    assert built(None).built["compiled"] == first.built["compiled"] and not list(tmp_path.glob("*.tmp*"))
    # two worker processes compile what is not stored yet; this process loads it
    monkeypatch.setattr(fused, "WORKERS_FROM", 3)
    monkeypatch.setattr(fused, "COLD_S", 1e3)  # the first two compiled here were quick: no workers
    assert built(tmp_path / "warm", jobs=2).built == first.built
    monkeypatch.setattr(fused, "COLD_S", 0.0)  # they were slow: workers compile the rest, from the last
    with monkeypatch.context() as patched:
        patched.setattr(fused.RegionCompiler, "_artifact", _after_the_workers(fused.RegionCompiler._artifact))
        workers = built(tmp_path / "workers", jobs=2)
    assert workers.built == {"compiled": fused.PROBES, "compiled_by_workers": first.built["compiled"] - fused.PROBES,
                             "shared": first.built["shared"]}
    # workers that store nothing (they hang) are not waited for: this process compiles every structure itself,
    # then ends them and removes what they left half written
    folder = tmp_path / "hung"
    hang = tmp_path / "hang.sh"
    hang.write_text(f"#!/bin/sh\nmkdir -p {folder}\ntouch {folder}/.$$.1.tmp\nexec sleep 600\n")
    hang.chmod(0o755)
    started = []
    popen = subprocess.Popen

    def seen(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    with monkeypatch.context() as patched:
        patched.setattr(sys, "executable", str(hang))
        patched.setattr(subprocess, "Popen", seen)
        assert built(folder, jobs=2).built == first.built
    procs = [proc for proc in started if "_worker()" in " ".join(map(str, proc.args))]  # not Inductor's own
    assert len(procs) == 2 and all(proc.returncode == -signal.SIGKILL for proc in procs)
    assert not list(folder.glob(".*.tmp"))
    # a structure that cannot be stored is marked, and later builds compile it here instead of in a worker
    artifact = next(m for m in first.traced.modules.values() if isinstance(m, fused.RegionCall)).artifact

    def refuse(self, **kwargs):
        raise RuntimeError("nothing to serialize")

    monkeypatch.setattr(type(artifact), "save", refuse)
    assert built(tmp_path / "unstored").built["compiled"] == first.built["compiled"]
    assert len(list((tmp_path / "unstored").glob("*.unstored"))) == first.built["compiled"]
    assert built(tmp_path / "unstored", jobs=2).built["compiled"] == first.built["compiled"]  # no worker given any


@pytest.mark.parametrize("due", [True, False])
def test_workers_start_before_the_first_compile_and_end_unused_when_the_compiles_are_quick(due, tmp_path,
                                                                                           monkeypatch):
    """With enough structures unknown to the store, the workers start before this process traces or compiles
    any region (``START_WORKERS_EARLY``); once the first compiles here turn slow, those same processes get the
    shares, and when they stay quick, they end unused and everything is compiled here."""
    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(1, 8, 10, 10)
    with torch.no_grad():
        expected = model(x)
    monkeypatch.setattr(fused, "WORKERS_FROM", 3)
    monkeypatch.setattr(fused, "COLD_S", 0.0 if due else 1e3)
    started, at_first_compile = [], []
    popen, compile_here, trace = subprocess.Popen, fused._standalone_compile, fused._aten_graph

    def spawned(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    def ours():
        return [p for p in started if "_worker()" in " ".join(map(str, p.args))]  # not Inductor's own

    def noted(fn):
        def wrapper(*args, **kwargs):
            at_first_compile.append(len(ours()))
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(subprocess, "Popen", spawned)
    monkeypatch.setattr(fused, "_standalone_compile", noted(compile_here))
    monkeypatch.setattr(fused, "_aten_graph", noted(trace))
    monkeypatch.setattr(fused.RegionCompiler, "_artifact", _after_the_workers(fused.RegionCompiler._artifact))
    backend = FusedBackend(model, [x], store=tmp_path, jobs=2)
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    procs = ours()
    assert len(procs) == 2 and at_first_compile[0] == 2  # both started before the first trace to ATen
    assert all(p.args[-1] == "cpu" for p in procs)  # the device they make ready
    assert all(p.poll() is not None for p in procs)
    if due:
        assert backend.built["compiled"] == fused.PROBES and backend.built["compiled_by_workers"] >= 1
        # what the workers said of their time: imported torch, then had a share, then compiled for a while
        seconds = backend.compile_seconds
        assert 0 < seconds["workers_started"] <= seconds["workers_ready"] < seconds["workers"]
        assert 0 < seconds["workers_compiling"]
    else:
        assert "compiled_by_workers" not in backend.built and all(p.returncode == -signal.SIGKILL for p in procs)
    # a later build knows every structure: no worker starts
    del started[:]
    assert set(FusedBackend(model, [x], store=tmp_path, jobs=2).built) == {"loaded", "shared"} and not ours()


def test_workers_from_a_queue_build_each_structure_once_and_hung_ones_are_not_waited_for(tmp_path, monkeypatch):
    """``WORKERS_QUEUE``: each ready worker takes the last structure no one has taken, this process takes from the
    front and waits for what a worker is compiling: every structure is compiled once, here or by a worker, and the
    outputs equal the model's. Workers that never get ready take nothing, and nothing waits for them."""
    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(1, 8, 10, 10)
    with torch.no_grad():
        expected = model(x)
    structures = FusedBackend(model, [x], store=tmp_path / "one").built["compiled"]
    monkeypatch.setattr(fused, "WORKERS_QUEUE", True)
    monkeypatch.setattr(fused, "WORKERS_FROM", 3)
    monkeypatch.setattr(fused, "COLD_S", 0.0)  # the first compiles were slow: the workers take the rest
    artifact = fused.RegionCompiler._artifact

    def once_a_worker_took_one(self, graph, values, key):  # this process slower than the workers' start
        for _ in range(1200):
            if self._queue is None or self._given or not self._queue:
                break
            time.sleep(0.1)
        return artifact(self, graph, values, key)

    with monkeypatch.context() as patched:
        patched.setattr(fused.RegionCompiler, "_artifact", once_a_worker_took_one)
        backend = FusedBackend(model, [x], store=tmp_path / "queue", jobs=2)
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    built = backend.built
    assert built["compiled"] >= fused.PROBES and built["compiled_by_workers"] >= 1, built
    assert built["compiled"] + built["compiled_by_workers"] == structures  # each once
    assert len(list((tmp_path / "queue").glob("*.bin"))) == structures
    assert backend.compile_seconds["workers_compiling"] > 0
    # workers that never say they are ready (they hang) take nothing: this process compiles every structure
    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    hung = FusedBackend(model, [x], store=tmp_path / "hung", jobs=2)
    assert hung.built["compiled"] == structures and "waited" not in hung.compile_seconds
    torch.testing.assert_close(_greedy(hung)[0], expected, rtol=1e-4, atol=1e-5)


def test_workers_kept_from_one_compile_all_take_the_structures_of_the_next_and_end_when_stopped(tmp_path,
                                                                                                monkeypatch):
    """``keep_workers`` (with ``WORKERS_QUEUE``): the workers of a first ``compile_all`` outlive it, a second one
    queues its structures for them (no new worker starts), and ``_stop_workers`` ends them; every region's code
    equals its module's, each structure compiled once. Without it, the first ``compile_all`` ends its workers."""
    from opbench.runtime import fused

    monkeypatch.setattr(fused, "WORKERS_QUEUE", True)
    monkeypatch.setattr(fused, "WORKERS_FROM", 3)
    monkeypatch.setattr(fused, "COLD_S", 0.0)  # the first compiles were slow: the workers take the rest
    monkeypatch.setattr(fused.RegionCompiler, "_artifact", _after_the_workers(fused.RegionCompiler._artifact))
    started = []
    popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1])

    def regions(channels):
        out = []
        for c in channels:  # a structure per channel count
            torch.manual_seed(c)
            module, x = torch.nn.Sequential(torch.nn.Conv2d(c, 4, 1), torch.nn.ReLU()).eval(), torch.randn(1, c, 5, 5)
            with torch.no_grad():
                out.append((f"submod_{c}", module, [x], module(x)))
        return out

    def equal(built, given):
        for name, _, inputs, want in given:
            call, why = built[name]
            assert why is None and isinstance(call, fused.RegionCall), why
            with torch.no_grad():
                torch.testing.assert_close(call(*inputs), want, rtol=1e-4, atol=1e-5)

    compiler = fused.RegionCompiler(tmp_path / "kept", jobs=2)
    compiler.keep_workers = True
    first, second = regions([3, 5, 6, 7]), regions([9, 10, 11])
    equal(compiler.compile_all(first), first)
    alive = [p for p in started if p.poll() is None]
    assert alive and compiler.counts["compiled"] == fused.PROBES
    workers = len(started)
    equal(compiler.compile_all(second), second)
    assert len(started) == workers  # no new worker
    assert any(what.endswith("structures queued for the workers kept") for _, what in compiler.timeline)
    compiler._stop_workers()
    assert all(p.poll() is not None for p in started)
    counts = compiler.counts
    assert counts["compiled"] + counts["compiled_by_workers"] == 7 and counts["compiled_by_workers"] >= 3, counts
    assert len(list((tmp_path / "kept").glob("*.bin"))) == 7
    # not kept: the first compile_all ends them
    once = fused.RegionCompiler(tmp_path / "once", jobs=2)
    del started[:]
    equal(once.compile_all(first), first)
    assert started and all(p.poll() is not None for p in started)


def test_the_workers_take_the_last_structure_first_or_the_heaviest(monkeypatch):
    """The queue's order (the workers take from its end): the build's order, or with ``WORKERS_HEAVIEST_FIRST``
    the structure of the most ATen operators at the end, ties in the build's order."""
    from opbench.runtime import fused

    def graph(ops):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        for _ in range(ops):
            x = g.call_function(torch.ops.aten.relu.default, (x,))
        g.output(x)
        return torch.fx.GraphModule(torch.nn.Module(), g)

    todo = {key: (graph(ops), []) for key, ops in (("a", 3), ("b", 9), ("c", 1), ("d", 3))}
    assert fused._worker_order(list(todo), todo) == ["a", "b", "c", "d"]
    monkeypatch.setattr(fused, "WORKERS_HEAVIEST_FIRST", True)
    assert fused._worker_order(list(todo), todo) == ["c", "a", "d", "b"]


def test_a_workers_report_of_its_time_leaves_out_other_lines_and_lines_cut_short():
    from opbench.runtime.fused import _worker_report

    text = "started 100.5\nsome warning\nready 102.0\ncompiled 1.5\nregion k: Error: x\ncompiled 2.25\ncompiled 3."
    assert _worker_report(text) == {"started": 100.5, "ready": 102.0, "compiled": 6.75}
    assert _worker_report("compiled\nready x\n") == {}
    # with the time each compile ended: those that say it, in order; a blank line is no line
    compiles = []
    text = "started 100.5\n\ncompiled 1.5 103.5\ncompiled 2.25\ncompiled 0.5 104.25\ncompiled 1 x"
    assert _worker_report(text, compiles) == {"started": 100.5, "compiled": 5.25}
    assert compiles == [(1.5, 103.5), (0.5, 104.25)]


@pytest.mark.parametrize("ahead", [True, False])
def test_a_later_build_loads_regions_in_a_thread_while_it_runs_each_structure_once_here(ahead, tmp_path,
                                                                                         monkeypatch):
    """A later build (nothing to compile) loads the regions' code in a thread of its own (``LOAD_WHILE_RUNNING``)
    while this thread makes the plans of the convolutions the first build saw and runs each structure once (cuDNN
    keeps its plans per thread); it loads and runs what the build without it does, and a cold build (something to
    compile) compiles here."""
    import threading

    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(1, 8, 10, 10)
    with torch.no_grad():
        expected = model(x)
    monkeypatch.setattr(fused, "LOAD_WHILE_RUNNING", ahead)
    here = threading.current_thread().name
    runs: list[tuple[int, str]] = []
    loads: list[str] = []
    check, artifact = fused.RegionCompiler._check, fused.RegionCompiler._artifact_here

    def run_seen(call, *args):
        runs.append((id(call.artifact), threading.current_thread().name))
        return check(call, *args)

    def load_seen(self, *args):
        loads.append(threading.current_thread().name)
        return artifact(self, *args)

    plans: list[tuple[list, str]] = []
    monkeypatch.setattr(fused.RegionCompiler, "_check", staticmethod(run_seen))
    monkeypatch.setattr(fused.RegionCompiler, "_artifact_here", load_seen)
    monkeypatch.setattr(fused, "make_plans", lambda calls, device: plans.append((calls, device.type)))
    cold = FusedBackend(model, [x], store=tmp_path)
    assert set(loads) == {name for _, name in runs} == {here} and not plans
    # the index entries keep the convolutions each structure's code called: the stem's and the squeeze's, and the
    # 1x1 and 3x3 ones of the blocks (the two blocks' of one structure noted once)
    entries = [json.loads(e.read_text()) for e in sorted((tmp_path / "index").glob("*.json"))]
    seen = [c for e in entries for c in e.get("convolutions", [])]
    assert all(c[0][0][2:] == [10, 10] and c[1][0][0] == 8 and c[2] == "float32" for c in seen)
    assert sorted(tuple(c[1][0][1:]) for c in seen) == [(8, 1, 1), (8, 1, 1), (8, 3, 3), (8, 3, 3), (8, 3, 3),
                                                        (24, 1, 1)]
    runs.clear()
    loads.clear()
    later = FusedBackend(model, [x], store=tmp_path)
    torch.testing.assert_close(_greedy(later)[0], expected, rtol=1e-4, atol=1e-5)
    assert later.built == {"loaded": cold.built["compiled"], "shared": cold.built["shared"]}
    # each structure ran once, here; every region's code was loaded in the thread of loads, and the plans of the
    # convolutions the entries name were made here first, each structure's once
    assert len(runs) == len({a for a, _ in runs}) == cold.built["compiled"] and {name for _, name in runs} == {here}
    assert len(loads) == len(later.regions)
    assert set(loads) == ({"opbench-region-loads_0"} if ahead else {here})
    unique = sorted({json.dumps(c) for c in seen})
    assert [(sorted(json.dumps(c) for c in calls), device) for calls, device in plans] == (
        [(unique, "cpu")] if ahead else [])
    assert later.compile_seconds["load"] > 0 and ("load_waited" in later.compile_seconds) == ahead
    # entries written before they noted convolutions get them from the next build's runs, and the one after makes
    # their plans
    for e in (tmp_path / "index").glob("*.json"):
        e.write_text(json.dumps({k: v for k, v in json.loads(e.read_text()).items() if k != "convolutions"}))
    plans.clear()
    assert FusedBackend(model, [x], store=tmp_path).built == later.built and plans == ([([], "cpu")] if ahead else [])
    again = [c for e in sorted((tmp_path / "index").glob("*.json"))
             for c in json.loads(e.read_text()).get("convolutions", [])]

    def placed_anywhere(calls):  # where a CPU tensor's data starts past a 256-byte boundary varies from run to run
        return sorted(json.dumps([c[0][:2], c[1][:2], *c[2:]]) for c in calls)

    assert placed_anywhere(again) == placed_anywhere(seen)
    unique = sorted({json.dumps(c) for c in again})
    plans.clear()
    FusedBackend(model, [x], store=tmp_path)
    assert [sorted(json.dumps(c) for c in calls) for calls, _ in plans] == ([unique] if ahead else [])


def test_the_plans_made_ahead_run_each_convolution_seen_on_tensors_of_its_shape_strides_and_alignment(monkeypatch):
    """``make_plans`` calls each convolution ``ConvolutionsSeen`` noted with tensors of the same shapes, strides,
    offsets from a 256-byte boundary and dtype (what cuDNN keys its plans by), on a GPU (on the CPU there is nothing
    to plan: it runs nothing)."""
    from opbench.runtime import fused

    # channels-last, one element past the start of its storage (which starts on a 64-byte boundary at least)
    x = torch.randn(2 * 8 * 8 * 16 + 1)[1:].view(2, 8, 8, 16).permute(0, 3, 1, 2)
    w = torch.randn(16, 1, 3, 3, dtype=torch.float32)
    with fused.ConvolutionsSeen() as seen:
        expected = torch.convolution(x, w, torch.zeros(16), [1, 1], [1, 1], [1, 1], False, [0, 0], 16)
        torch.nn.functional.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(4, 3, 2, 2), stride=2)
    assert len(seen.calls) == 2 and json.loads(json.dumps(seen.calls)) == seen.calls
    (xs, xt, xo), (ws, wt, wo), dtype, bias, *params = seen.calls[0]
    assert (xs, xt, xo) == (list(x.shape), list(x.stride()), x.data_ptr() % 256) and xo != 0
    assert (ws, wt, dtype, bias, params) == ([16, 1, 3, 3], list(w.stride()), "float32", True,
                                             [[1, 1], [1, 1], [1, 1], False, [0, 0], 16])
    assert seen.calls[1][-3] is True  # transposed
    assert expected.shape == (2, 16, 8, 8)
    assert fused.make_plans(seen.calls, torch.device("cpu")) == 0
    made = []
    convolution = torch.convolution

    def called(x, w, bias, *params):
        made.append(([list(x.shape), list(x.stride()), x.data_ptr() % 256], [list(w.shape), list(w.stride())],
                     None if bias is None else list(bias.shape), list(params)))
        return convolution(x, w, bias, *params)

    monkeypatch.setattr(torch, "convolution", called)
    assert fused._run_convolutions(seen.calls, torch.device("cpu")) == 2  # as on a GPU
    assert made[0][0] == [xs, xt, xo] and made[0][1] == [ws, wt] and made[0][2] == [16]
    assert made[1][2] is None and made[1][3][3] is True


def test_a_structure_a_probe_could_not_compile_is_not_compiled_again(tmp_path, monkeypatch):
    """The structures compiled here before the workers are decided on: one Inductor refuses is tried once, and
    each of its regions then goes on without its compiled code (here: runs as it is)."""
    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(1, 8, 10, 10)
    tried: list[int] = []

    def refuse(graph, *args, **kwargs):
        tried.append(id(graph))
        raise RuntimeError("Inductor refuses")

    monkeypatch.setattr(fused, "WORKERS_FROM", 1)
    monkeypatch.setattr(fused, "COLD_S", 1e3)  # quick: every structure probed here, no workers
    monkeypatch.setattr(fused, "_standalone_compile", refuse)
    monkeypatch.setattr(fused, "compile_region", lambda region, inputs, name, layout: (region, "refused"))
    backend = FusedBackend(model, [x], store=tmp_path, jobs=2)
    assert tried and len(tried) == len(set(tried))  # each structure tried once
    assert backend.built == {"aten": len(backend.regions)}
    with torch.no_grad():
        torch.testing.assert_close(_greedy(backend)[0], model(x), rtol=1e-4, atol=1e-5)


def test_a_build_that_loads_stored_regions_says_once_when_torch_has_no_bytecode(block, tmp_path, monkeypatch, caplog):
    import importlib.util
    import logging
    import sys

    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    model, x = block
    FusedBackend(model, [x], store=tmp_path)  # compiles and stores: nothing loaded, nothing said
    pyc = tmp_path / "codecache.pyc"
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(importlib.util, "cache_from_source", lambda source: str(pyc))
    fused._say_no_bytecode.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="opbench.runtime.fused"):
            assert FusedBackend(model, [x], store=tmp_path).built.get("loaded")
            FusedBackend(model, [x], store=tmp_path)
        assert sum("no compiled bytecode" in r.getMessage() for r in caplog.records) == 1  # once a process
        fused._say_no_bytecode.cache_clear()
        pyc.touch()  # bytecode found: nothing to say
        assert not fused._say_no_bytecode()
        fused._say_no_bytecode.cache_clear()
        pyc.unlink()
        monkeypatch.setattr(sys, "dont_write_bytecode", False)  # Python writes it as it imports
        assert not fused._say_no_bytecode()
    finally:
        fused._say_no_bytecode.cache_clear()


def test_regions_of_one_structure_write_and_read_their_shared_index_entry_once_per_build(tmp_path, monkeypatch):
    """The two blocks' 1x1 branches share a quick key: a cold build writes its entry once, a later one reads it
    once, and both builds give the model's outputs."""
    import pathlib

    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, x = TwoBlocks().eval(), torch.randn(1, 8, 10, 10)
    writes, reads = [], []
    written_whole = fused.written_whole
    monkeypatch.setattr(fused, "written_whole", lambda path: writes.append(path) or written_whole(path))
    cold = FusedBackend(model, [x], store=tmp_path)
    entries = sorted((tmp_path / "index").glob("*.json"))
    assert cold.built["shared"] >= 1 and sorted(w for w in writes if w.parent.name == "index") == entries
    read_text = pathlib.Path.read_text
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: reads.append(self) or read_text(self, *a, **k))
    warm = FusedBackend(model, [x], store=tmp_path)
    assert warm.built == {"loaded": cold.built["compiled"], "shared": cold.built["shared"]}
    assert sorted(r for r in reads if r.parent.name == "index") == entries  # each entry read once


class WithDropout(torch.nn.Module):
    """Two convolution branches and a dropout (an identity in eval mode), concatenated."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(c, c, 1)
        self.b = torch.nn.Conv2d(c, c, 3, padding=1)
        self.d = torch.nn.Dropout(0.2)

    def forward(self, x):
        x = torch.relu(x)
        return torch.cat([torch.relu(self.a(x)), torch.sigmoid(self.b(x)), self.d(x)], 1)


def test_a_region_that_computes_nothing_runs_its_graph_and_is_neither_compiled_nor_marked(tmp_path, monkeypatch):
    """The dropout's region has no operator: Inductor would give an artifact it cannot store (so every later
    build compiled it again); it runs its ATen graph instead, and the outputs equal the model's. Its quick key's
    entry says so, so that a later build runs it as it is, tracing no region to ATen."""
    from opbench.runtime import fused
    from opbench.runtime.fused import FusedBackend

    traced = []
    trace = fused._aten_graph
    monkeypatch.setattr(fused, "_aten_graph", lambda *a: traced.append(a[0]) or trace(*a))
    torch.manual_seed(0)
    model, x = WithDropout().eval(), torch.randn(1, 8, 10, 10)
    with torch.no_grad():
        expected = model(x)
    for build in ("cold", "warm"):
        traced.clear()
        backend = FusedBackend(model, [x], store=tmp_path)
        assert backend.built.get("no_operators") == 1 and not backend.fallbacks, build
        assert backend.built.get("compiled" if build == "cold" else "loaded") == len(backend.regions) - 1
        assert len(traced) == (len(backend.regions) if build == "cold" else 0), build
        out = _greedy(backend)[0]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert not list(tmp_path.glob("*.unstored")) and len(list(tmp_path.glob("*.bin"))) == len(backend.regions) - 1


class Pair(torch.nn.Module):
    """Two 1x1 convolutions in a row, named ``names`` (one convolution twice when the names are equal)."""

    def __init__(self, names: tuple[str, str] = ("a", "b")) -> None:
        super().__init__()
        self.names = names
        for name in names:
            setattr(self, name, torch.nn.Conv2d(4, 4, 1))

    def forward(self, x):
        first, second = (getattr(self, n) for n in self.names)
        return second(torch.relu(first(x)))


def test_a_quick_key_sees_a_region_s_structure_and_not_its_names():
    from opbench.runtime.fused import _quick_key, _state

    def key(module, x=None):
        graph = torch.fx.symbolic_trace(module)
        return _quick_key(graph, [torch.randn(1, 4, 5, 5) if x is None else x, *_state(graph)[1]])

    assert key(Pair()) == key(Pair(("p", "q")))  # other weights, other names: one structure, one key
    assert key(Pair(("a", "a"))) != key(Pair())  # one convolution twice
    assert key(Pair(), torch.randn(2, 4, 5, 5)) != key(Pair())  # another input shape
    pair = Pair()
    pair.b.weight.data = pair.b.weight.data.half()
    assert key(pair) != key(Pair())  # another dtype of a parameter
    pair = Pair()
    pair.b.extra = 3  # a setting its repr does not show
    assert key(pair) != key(Pair())
    pair.b.register_forward_hook(lambda *a: None)
    assert key(pair) is None  # hooks are code that no key sees: the region is traced to ATen


@pytest.mark.slow
def test_capturer_fused_keeps_the_fastest_and_a_saved_cut_is_reused(block, tmp_path, monkeypatch):
    from opbench import capturer, optimize
    from opbench.schedule import Schedule

    model, x = block
    plan = optimize(x, model, kernels="fused", repeat=2, number=2, schedulers=["sequential", "greedy"])
    assert plan.meta["kernels"] == "fused" and plan.meta["regions"]
    rows = {r["schedule"] for r in plan.meta["table"]}
    assert {"torch.compile", "torch.compile + combo kernels", "sequential", "greedy"} <= rows  # measured rows
    plan.save(tmp_path / "s.json")
    again = capturer(x, model, kernels="fused", schedule=tmp_path / "s.json", repeat=2, number=2)
    assert again.backend.cut == "saved" and again.backend.regions == Schedule.load(tmp_path / "s.json").meta["regions"]
    kept = next(r for r in again.table if r["kept"])
    baselines = [r["latency_ms"] for r in again.table if r["schedule"] in ("model, eager", "torch.compile",
                                                                            "torch.compile + combo kernels")]
    assert len(baselines) == 3 and kept["latency_ms"] <= min(baselines)  # never slower than a baseline
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=1e-4, atol=1e-5)
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path / "cache"))  # the second build takes the cut (and the choice)
    first = capturer(x, model, kernels="fused", repeat=2, number=2, cache=True)
    second = capturer(x, model, kernels="fused", repeat=2, number=2, cache="schedule")
    assert "cache" not in first.phases and second.phases["cache"] == 1.0 and second.backend.cut == "saved"
    assert second.backend.regions == first.backend.regions
    third = capturer(x, model, kernels="fused", repeat=2, number=2, cache=True)  # only the kept candidate built
    assert third.phases["cache_choice"] == 1.0 and all(r["cached"] for r in third.table)
    assert [r["schedule"] for r in third.table if r["kept"]] == [r["schedule"] for r in first.table if r["kept"]]
    assert third.backend is None or (third.backend.cut == "saved" and third.backend.regions == first.backend.regions)
    with torch.no_grad():
        torch.testing.assert_close(third(x), model(x), rtol=1e-4, atol=1e-5)
    other = Block(4).eval()
    with pytest.raises(OpBenchError, match="another graph|does not match"):
        capturer(torch.randn(1, 4, 10, 10), other, kernels="fused", schedule=tmp_path / "s.json")


@pytest.mark.parametrize("combo_faster", [True, False])
def test_combo_kernels_inside_long_regions_are_timed_through_one_path_and_kept_where_faster(
        block, tmp_path, monkeypatch, combo_faster):
    from opbench.pipeline import compile as compile_module
    from opbench.pipeline.compile import choose_combo, saved_cut, torch_backend
    from opbench.runtime import fused

    model, x = block
    with torch.no_grad():
        expected = model(x)
    monkeypatch.setattr(fused, "COMBO_FROM", 3)  # the three-operator branch is long enough
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path))
    backend = fused.FusedBackend(model, [x], store=tmp_path / "regions", combo=True)
    long = [i for i, region in enumerate(backend.regions) if len(region) >= 3]
    assert len(long) == 1 and backend.combo_offered == [f"submod_{long[0]}"]
    assert backend.built["combo_compiled"] == 1 and backend.combo_regions == []
    for names in (backend.combo_offered, []):  # either code gives the model's outputs
        backend.use_combo(names)
        torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(OpBenchError, match="without combo-kernel code: submod_0"):
        backend.use_combo(["submod_0"])
    calls, time_ops = [], compile_module.time_ops

    def timed(backend_, ops, repeat, number):  # one path for both codes: only which code is in place differs
        calls.append((tuple(ops), repeat, number, bool(backend_.combo_regions)))
        time_ops(backend_, ops, 1, 1)  # launched for real, on the values the operators before it give
        return [1.0 if bool(backend_.combo_regions) == combo_faster else 2.0] * repeat

    monkeypatch.setattr(compile_module, "time_ops", timed)
    backend = fused.FusedBackend(model, [x], store=tmp_path / "regions", combo=True)  # nothing run yet
    times = choose_combo(backend, repeat=2, number=3, rounds=2)
    op = backend.region_op(f"submod_{long[0]}")
    assert calls == [((op,), 2, 3, False), ((op,), 2, 3, True)] * 2  # alternating rounds
    assert times == {f"submod_{long[0]}": (2.0, 1.0) if combo_faster else (1.0, 2.0)}
    assert backend.combo_regions == (long if combo_faster else [])
    # at a tie (faster by less than COMBO_MARGIN) the default code stays
    assert choose_combo(backend, repeat=2, number=3, rounds=1, margin=0.6) == times and backend.combo_regions == []
    choose_combo(backend, repeat=2, number=3, rounds=1)
    assert backend.combo_regions == (long if combo_faster else [])
    meta = backend.schedule_meta()
    assert meta["combo"] == backend.combo_regions
    from opbench.parallel import CapturedSchedule
    from opbench.schedule import get_scheduler

    text = str(CapturedSchedule(backend, get_scheduler("sequential").schedule(backend.graph), [], None))
    assert ("; 1 region with combo kernels" in text) == combo_faster
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    # a second build from the saved cut builds each region in the code kept, loaded, and times nothing
    monkeypatch.setattr(compile_module, "time_ops", lambda *a: pytest.fail("timed again"))
    again = torch_backend(model, [x], kernels="fused", combo=True, **saved_cut(meta))
    assert again.combo_regions == backend.combo_regions and again.combo_offered == []
    assert again.built.get("combo_loaded", 0) == len(backend.combo_regions) and "compiled" not in again.built
    assert "combo_compiled" not in again.built
    torch.testing.assert_close(_greedy(again)[0], expected, rtol=1e-4, atol=1e-5)
    if combo_faster:  # with workers, one compiles the combo-kernel code meanwhile, and this process waits for it
        workers = fused.FusedBackend(model, [x], store=tmp_path / "workers", combo=True, jobs=2)
        assert workers.built["combo_compiled_by_workers"] == 1 and workers.built["compiled"] >= 1
        assert workers.compile_seconds["combo_waited"] >= 0 and "combo_compiled" not in workers.built
        workers.use_combo(workers.combo_offered)
        torch.testing.assert_close(_greedy(workers)[0], expected, rtol=1e-4, atol=1e-5)
        # a worker that stores nothing (it hangs) is waited for WAIT_S at most; then this process compiles the code
        hang = tmp_path / "hang.sh"
        hang.write_text("#!/bin/sh\nexec sleep 600\n")
        hang.chmod(0o755)
        monkeypatch.setattr(sys, "executable", str(hang))
        monkeypatch.setattr(fused, "WAIT_S", 0.5)
        hung = fused.FusedBackend(model, [x], store=tmp_path / "hung", combo=True, jobs=2)
        assert hung.built["combo_compiled"] == 1 and 0.5 <= hung.compile_seconds["combo_waited"] < 60
        assert hung.combo_offered == backend.combo_offered


def test_the_pytorch_layout_compiles_without_layout_optimization_under_keys_of_its_own(block, tmp_path,
                                                                                     monkeypatch):
    """``layout="pytorch"``: every region compiled with Inductor's layout optimization off, stored apart from the
    default layout's code, saved in the schedule's meta and built so again from it."""
    from opbench.pipeline.compile import saved_cut, torch_backend
    from opbench.runtime import fused

    model, x = block
    with torch.no_grad():
        expected = model(x)
    seen, standalone = [], torch._inductor.standalone_compile

    def recording(*args, **kwargs):
        seen.append(torch._inductor.config.layout_optimization)
        return standalone(*args, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", recording)
    monkeypatch.setenv("OPBENCH_CACHE", str(tmp_path))  # torch_backend below builds from the default store: this one
    store = tmp_path / "regions"
    plain = fused.FusedBackend(model, [x], store=store, layout="pytorch")
    n = plain.built["compiled"]
    assert n >= 1 and seen == [False] * n and plain.schedule_meta()["layout"] == "pytorch", (plain.built, seen)
    torch.testing.assert_close(_greedy(plain)[0], expected, rtol=1e-4, atol=1e-5)
    default = fused.FusedBackend(model, [x], store=store)  # the default layout's code: not the one stored
    assert default.built["compiled"] == n and seen[n:] == [True] * n, (default.built, seen)
    assert default.schedule_meta()["layout"] == "inductor"
    again = torch_backend(model, [x], kernels="fused", **saved_cut(plain.schedule_meta()))
    assert again.layout == "pytorch" and again.built == {"loaded": n} and len(seen) == 2 * n, (again.built, seen)
    torch.testing.assert_close(_greedy(again)[0], expected, rtol=1e-4, atol=1e-5)
    assert saved_cut({"regions": [["x"]]})["layout"] == "inductor"  # a schedule saved before layouts
    from opbench.parallel import CapturedSchedule
    from opbench.schedule import get_scheduler

    text = str(CapturedSchedule(again, get_scheduler("sequential").schedule(again.graph), [], None))
    assert text.endswith("; regions in pytorch's layout"), text


@pytest.mark.parametrize("layout", ["inductor", "pytorch"])
def test_regions_take_channels_last_weights_in_inductor_s_layout_and_the_model_keeps_its_own(block, tmp_path,
                                                                                          monkeypatch, layout):
    """In Inductor's layout every region is compiled for (and called with) its 3x3 convolutions' weights stored
    channels-last, so that no call copies them into that layout; in PyTorch's, as the model has them. Either way the
    caller's model keeps its own weights, untouched, and the regions' outputs equal the model's."""
    from opbench.runtime import fused

    model, x = block
    with torch.no_grad():
        expected = model(x)
    before = {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    seen, standalone = [], torch._inductor.standalone_compile

    def recording(graph, values, *args, **kwargs):
        seen.extend(v.is_contiguous(memory_format=torch.channels_last) for v in values
                    if isinstance(v, torch.Tensor) and tuple(v.shape) == (8, 8, 3, 3))
        return standalone(graph, values, *args, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", recording)
    backend = fused.FusedBackend(model, [x], store=tmp_path / "regions", layout=layout)
    assert len(seen) == 2 and seen == [layout == "inductor"] * 2, seen  # the two 3x3 convolutions' weights
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    assert {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()} == before


def test_weights_channels_last_copies_only_what_it_converts():
    from opbench.runtime.fused import weights_channels_last

    linear = torch.nn.Linear(4, 4)
    assert weights_channels_last(linear) is linear  # nothing 4-D
    conv = torch.nn.Conv2d(2, 3, 3)
    converted = weights_channels_last(conv)
    assert converted is not conv and converted.weight.is_contiguous(memory_format=torch.channels_last)
    assert conv.weight.is_contiguous() and not conv.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(converted.weight, conv.weight)
    assert weights_channels_last(converted) is converted  # already channels-last
    depthwise = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3), torch.nn.Conv2d(4, 4, 3, groups=4))
    assert weights_channels_last(depthwise) is depthwise  # grouped convolutions: left in the model's layout

    class Functional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 1, 3, 3))

        def forward(self, x):
            return torch.nn.functional.conv2d(x, self.w, None, 1, 0, 1, 4)

    traced = torch.fx.symbolic_trace(Functional())
    assert weights_channels_last(traced) is traced  # a grouped convolution called in the traced graph


def test_the_capturer_builds_a_saved_cut_in_its_saved_layout_and_otherwise_in_the_one_asked(monkeypatch):
    from opbench import parallel
    from opbench.schedule import Schedule

    asked: list[dict] = []
    monkeypatch.setattr(parallel, "torch_backend", lambda model, inputs, **kw: asked.append(kw))
    options = parallel.CaptureOptions(kernels="fused", layout="pytorch")
    saved = Schedule("opara", [0], [0], [], meta={"kernels": "fused", "regions": [["x"]], "layout": "inductor"})
    parallel._backend(None, [], options, None)
    parallel._backend(None, [], options, saved)
    assert [kw["layout"] for kw in asked] == ["pytorch", "inductor"] and asked[1]["regions"] == [["x"]]
    # depthwise convolutions too: as asked, or as the saved cut ran them (as PyTorch's convolution, saved before)
    parallel._backend(None, [], parallel.CaptureOptions(kernels="fused", depthwise="taps"), None)
    parallel._backend(None, [], parallel.CaptureOptions(kernels="fused", depthwise="taps"), saved)
    assert [kw["depthwise"] for kw in asked[2:]] == ["taps", "aten"]
    with pytest.raises(OpBenchError, match="depthwise='taps' unfolds the depthwise convolutions of fused regions"):
        parallel.CaptureOptions(depthwise="taps")  # with PyTorch's kernels
    with pytest.raises(OpBenchError,
                       match=r"unknown depthwise convolution mode 'cudnn' \(accepted: aten, taps, auto\)"):
        parallel.CaptureOptions(kernels="fused", depthwise="cudnn")


def test_bad_kernels_and_cuts_are_one_line(block):
    from opbench import capturer
    from opbench.pipeline.compile import torch_backend

    model, x = block
    with pytest.raises(OpBenchError, match=r"unknown kernels 'bogus' \(accepted: aten, fused\)"):
        capturer(x, model, kernels="bogus")
    with pytest.raises(OpBenchError, match="unknown region cut 'thin'"):
        torch_backend(model, [x], kernels="fused", cut="thin")
    with pytest.raises(OpBenchError, match=r"unknown merge 'some' \(accepted: none, all, ios"):
        torch_backend(model, [x], merge="some", kernels="fused")
    with pytest.raises(OpBenchError, match=r"unknown region layout 'nchw' \(accepted: inductor, pytorch\)"):
        capturer(x, model, kernels="fused", layout="nchw")
    with pytest.raises(OpBenchError, match=r"layout 'nchw' \(accepted: inductor, pytorch\)"):
        torch_backend(model, [x], kernels="fused", layout="nchw")


@pytest.mark.parametrize("trace", ["fx", "export"])
def test_sibling_convolutions_merge_before_the_cut_and_outputs_equal_the_model(block, trace):
    """IOS's merge in fused regions: the block's two 3x3 convolutions of one input become one convolution in
    the traced graph before it is cut (one conv2d fewer; each reads its channels of the merged output), the
    outputs equal the model's under every schedule, and a saved cut of the merged graph is taken again."""
    from opbench.ir.regions import fx_operator_dag
    from opbench.ir.torch_graph import fx_module, merge_into_graph
    from opbench.pipeline.compile import torch_backend
    from opbench.runtime.executor import ParallelExecutor
    from opbench.schedule import SCHEDULERS, get_scheduler

    def convolutions(gm):
        return sum(isinstance(gm.get_submodule(n.target), torch.nn.Conv2d) if n.op == "call_module"
                   else "conv" in str(n.target) for n in fx_operator_dag(gm.graph)[0])

    model, x = block
    gm = fx_module(model, [x], trace)[0]
    before = convolutions(gm)
    merged = merge_into_graph(gm, [x])
    assert len(merged) == 1 and len(merged[0]) == 2 and before == 4
    assert convolutions(gm) == before - 1
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(gm(x), expected, rtol=1e-4, atol=1e-5)
    backend = torch_backend(model, [x], kernels="fused", merge="all", trace=trace)
    assert backend.merged_groups == merged and backend.schedule_meta()["merged"] == merged
    for name in SCHEDULERS:
        schedule = get_scheduler(name).schedule(backend.graph)
        torch.testing.assert_close(ParallelExecutor(backend, schedule).run()[0], expected, rtol=1e-4, atol=1e-5)
    again = torch_backend(model, [x], kernels="fused", trace=trace, regions=backend.regions, merged=merged)
    assert again.cut == "saved" and again.regions == backend.regions and again.merged_groups == merged


def test_the_blocks_cut_times_the_operators_and_merges_what_is_not_worth_splitting(block):
    """``cut="blocks"`` times each traced operator alone; with a gain threshold no block can reach,
    every branch joins one region, and the outputs still equal the model's."""
    from opbench.ir.regions import fx_operator_dag
    from opbench.pipeline.compile import torch_backend
    from opbench.runtime.backend import KernelBackend

    model, x = block
    backend = torch_backend(model, [x], kernels="fused", cut="blocks")
    assert backend.cut == "blocks" and 1 <= len(backend.regions) <= 5
    ops, _ = fx_operator_dag(torch.fx.symbolic_trace(model).graph)
    merged = KernelBackend.create("fused", model, [x], cut="blocks", costs=[1e-6] * len(ops), min_gain_s=1.0)
    assert len(merged.regions) == 1
    with torch.no_grad():
        expected = model(x)
    for b in (backend, merged):
        out = _greedy(b)[0]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_capturer_merges_sibling_convolutions_in_fused_regions_and_takes_its_saved_schedule(block, tmp_path):
    from opbench import capturer, optimize

    model, x = block
    plan = optimize(x, model, kernels="fused", merge="all", repeat=2, number=2, schedulers=["sequential", "greedy"])
    assert plan.meta["merged"] and len(plan.meta["merged"][0]) == 2
    plan.save(tmp_path / "s.json")
    again = capturer(x, model, kernels="fused", merge="all", schedule=tmp_path / "s.json", repeat=2, number=2)
    assert again.backend.cut == "saved" and again.backend.merged_groups == plan.meta["merged"]
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_region_takes_inputs_whose_strides_differ_from_its_compiled_ones():
    """A region's code asserts its eager example inputs' strides; its producer, compiled too, may return a
    contiguous tensor where eager returned a view (shufflenet's channel split at batch 8) or padded strides,
    alone or inside the tuple of a ``chunk`` that crosses the region's border."""
    from opbench.runtime.fused import RegionCall, _aten_graph

    class Half(torch.nn.Module):
        def forward(self, x, pair):
            return torch.relu(x) * 2 + pair[1]

    whole = torch.randn(4, 16, 5, 5)
    view = whole[:, :8]  # a channel split: strides of the 16-channel tensor
    pair = whole.chunk(2, dim=1)
    graph, spec = _aten_graph(Half(), [view, pair], [], [])
    artifact = torch._inductor.standalone_compile(graph, [view, *pair], dynamic_shapes="from_example_inputs")
    contiguous = view.contiguous()
    with pytest.raises(AssertionError, match="stride"):  # the compiled code alone refuses other strides
        artifact(contiguous, *pair)
    call = RegionCall(artifact, [], spec, [view, pair])
    padded = torch.empty_strided(view.shape, (8 * 25 + 4, 25, 5, 1))
    padded.copy_(view)
    want = Half()(view, pair)
    for x in (view, contiguous, padded):
        for p in (pair, tuple(t.contiguous() for t in pair), [padded, padded]):
            torch.testing.assert_close(call(x, p), want if p[1] is not padded else torch.relu(x) * 2 + padded)
    assert call.copies == 2 * 3 + 3 * 2 + 3 * 2  # x twice of three, then each pair's two tensors twice of three


class ChannelSplit(torch.nn.Module):
    """shufflenet's pattern: one convolution's output split in two by ``chunk``, each half a branch of its own."""

    def __init__(self, c: int = 58) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(8, 2 * c, 1)
        self.b = torch.nn.Conv2d(c, c, 3, padding=1)
        self.c = torch.nn.Conv2d(c, c, 1)

    def forward(self, x):
        p, q = torch.relu(self.a(x)).chunk(2, dim=1)
        return torch.cat([torch.relu(self.b(p)), torch.sigmoid(self.c(q))], 1)


@pytest.mark.parametrize("compile_again", [True, False])
def test_regions_handed_padded_strides_by_their_producer_compile_for_them_or_copy(monkeypatch, compile_again):
    """With Inductor's padding on (as on a GPU; here forced on the CPU), the producer's chunk halves come out with
    padded strides, not the eager run's its consumers were compiled for: the consumers are compiled again for
    the strides they are handed (no copy), or, without that pass, copy their inputs; outputs equal the model's."""
    from opbench.runtime import fused

    if not compile_again:
        monkeypatch.setattr(fused, "_compile_for_handed_strides", lambda *args: [])
    calls, compile_all = [], fused.RegionCompiler.compile_all
    monkeypatch.setattr(fused.RegionCompiler, "compile_all",
                        lambda self, regions: calls.append(sorted(r[0] for r in regions)) or compile_all(self, regions))
    torch.manual_seed(0)
    model, x = ChannelSplit().eval(), torch.randn(4, 8, 7, 7)
    with torch._inductor.config.patch(disable_padding_cpu=False):  # contiguous in eager, padded by Inductor
        backend = fused.FusedBackend(model, [x], store=None, layout="pytorch")
        out = _greedy(backend)[0]
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    if compile_again:
        assert backend.recompiled and not backend.restrided
        # both halves' consumers, found in one run of the graph, compiled again together
        assert len(backend.recompiled) == 2 and sorted(backend.recompiled) in calls[1:], calls
    else:
        assert not backend.recompiled and backend.restrided


def test_a_region_that_takes_a_chunk_s_tuple_is_loaded_by_a_later_build(tmp_path):
    """The chunk's tuple crosses the border of the regions that read its halves: their stored code takes the
    tuple's tensors one by one, and a later build loads and runs it (it used to fall back to torch.compile)."""
    from opbench.runtime import fused

    torch.manual_seed(0)
    model, x = ChannelSplit().eval(), torch.randn(4, 8, 7, 7)
    with torch.no_grad():
        expected = model(x)
    for build in ("cold", "warm"):
        backend = fused.FusedBackend(model, [x], store=tmp_path)
        calls = [c for c in backend.traced.modules.values() if isinstance(c, fused.RegionCall)]
        assert any(not c.flat for c in calls), "no region takes a tuple: this test no longer tests that"
        assert backend.built == {"compiled" if build == "cold" else "loaded": len(backend.regions)}, build
        out = _greedy(backend)[0]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


class Positions(torch.nn.Module):
    """BERT's position ids: an ``arange`` made from no input, read by two embeddings (so a region of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.emb = torch.nn.Embedding(16, 8)
        self.emb2 = torch.nn.Embedding(16, 8)

    def forward(self, x):
        pos = torch.arange(x.shape[-1]).unsqueeze(0)
        return torch.relu(self.a(x)) + self.emb(pos).transpose(1, 2) * self.emb2(pos).transpose(1, 2)


def test_a_region_made_from_no_input_computes_nothing_and_is_not_compiled(tmp_path):
    """The positions' region reads no input: it runs its ATen graph, is neither compiled nor stored (Inductor's
    graph of such a region has no outputs, and BERT's could not be stored, so every later build compiled them
    again), and a later build runs it as it is; the outputs equal the model's."""
    from opbench.runtime import fused

    torch.manual_seed(0)
    model, x = Positions().eval(), torch.randn(1, 8, 16)
    with torch.no_grad():
        expected = model(x)
    for build in ("cold", "warm"):
        backend = fused.FusedBackend(model, [x], store=tmp_path)
        assert ["getattr_1", "getitem", "arange", "unsqueeze"] in backend.regions
        assert backend.built.get("no_operators") == 1, build
        assert backend.built.get("compiled" if build == "cold" else "loaded") == len(backend.regions) - 2, build
        out = _greedy(backend)[0]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_a_region_s_check_takes_a_size_traced_as_a_tuple_for_the_size():
    """Traced to ATen, a region's ``x.size()`` output comes out as a tuple, the eager region's as a torch.Size:
    the check of stored code against the region's outputs takes them as one structure (shufflenet's
    channel-shuffle regions failed it, and every later build traced them again); other values still differ."""
    from opbench.runtime.fused import _close

    x = torch.randn(2, 3)
    assert _close((x, (2, 3)), (x, torch.Size([2, 3])))
    assert not _close((x, (2, 4)), (x, torch.Size([2, 3])))
    assert not _close((x, (2, 3)), (x, [2, 3])) and not _close((x + 1, (2, 3)), (x, torch.Size([2, 3])))


class BasicConv(torch.nn.Module):
    """torchvision's ``BasicConv2d``: convolution, batch norm, functional in-place ReLU."""

    def __init__(self, cin: int, cout: int, k: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
        self.bn = torch.nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return torch.nn.functional.relu(self.bn(self.conv(x)), inplace=True)


class Chains(torch.nn.Module):
    """An inception block of ``BasicConv`` branches behind a ``BasicConv`` stem: five chains."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = BasicConv(3, 8, 3)
        self.a, self.b1, self.b2 = BasicConv(8, 4, 1), BasicConv(8, 4, 1), BasicConv(4, 4, 3)
        self.c = BasicConv(8, 4, 3)

    def forward(self, x):
        x = self.stem(x)
        return torch.cat([self.a(x), self.b2(self.b1(x)), self.c(x)], 1)


@pytest.mark.slow
def test_chains_run_as_one_call_through_workers_a_saved_cut_and_a_later_process(tmp_path, monkeypatch):
    """``conv_relu=True``: every chain is one call, in regions that worker processes compile and a later process
    loads; outputs equal the model's; the saved cut builds the same regions again. On the CPU the default leaves
    the graph as it is."""
    from opbench.pipeline.compile import saved_cut, torch_backend
    from opbench.runtime import fused

    torch.manual_seed(0)
    model = Chains().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        expected = model(x)
    unfused = fused.FusedBackend(model, [x], store=None)
    assert unfused.conv_relu_chains == 0  # the default, on the CPU
    monkeypatch.setattr(fused, "WORKERS_FROM", 1)
    monkeypatch.setattr(fused, "COLD_S", 0.0)
    with monkeypatch.context() as patched:
        patched.setattr(fused.RegionCompiler, "_artifact", _after_the_workers(fused.RegionCompiler._artifact))
        backend = fused.FusedBackend(model, [x], store=tmp_path, jobs=2, conv_relu=True)
    assert backend.conv_relu_chains == 5 and not backend.fallbacks
    flops = [sum(op.flops for op in b.graph) for b in (backend, unfused)]  # the convolutions' FLOPs are counted
    assert 0.95 * flops[1] <= flops[0] <= flops[1], flops
    from opbench.parallel import CapturedSchedule
    from opbench.schedule import get_scheduler

    text = str(CapturedSchedule(backend, get_scheduler("sequential").schedule(backend.graph), [], None))
    assert "; 5 convolution -> batch norm -> ReLU chains as one cuDNN call each" in text
    assert backend.built.get("compiled_by_workers", 0) >= 1, backend.built
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    meta = backend.schedule_meta()
    assert meta["conv_relu"] is True and saved_cut(meta)["conv_relu"] is True
    assert saved_cut({"regions": [["x"]]})["conv_relu"] is False  # a schedule saved before chains were fused
    again = torch_backend(model, [x], kernels="fused", **saved_cut(meta))
    assert again.regions == backend.regions and again.conv_relu_chains == 5
    torch.save(model.state_dict(), tmp_path / "state.pt")
    torch.save(x, tmp_path / "x.pt")
    here = str(Path(__file__).parent)
    later = subprocess.run([sys.executable, "-c", f"""
import sys, torch
sys.path.insert(0, {here!r})
from test_fused import Chains, _greedy
from opbench.runtime.fused import FusedBackend
model = Chains().eval()
model.load_state_dict(torch.load({str(tmp_path / "state.pt")!r}))
x = torch.load({str(tmp_path / "x.pt")!r})
backend = FusedBackend(model, [x], store={str(tmp_path)!r}, jobs=1, conv_relu=True)
with torch.no_grad():
    print(sorted(backend.built), torch.allclose(_greedy(backend)[0], model(x), rtol=1e-4, atol=1e-5))
"""], capture_output=True, text=True, timeout=300, check=False)
    assert later.returncode == 0, later.stderr[-2000:]
    built, equal = later.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert "compiled" not in built and "loaded" in built and equal == "True", later.stdout


class DepthwiseChains(torch.nn.Module):
    """A ``BasicConv`` stem, a depthwise 3x3 convolution and two ``BasicConv`` branches after it: three chains."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.dw = BasicConv(3, 8, 3), torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.a, self.b = BasicConv(8, 4, 1), BasicConv(8, 4, 3)

    def forward(self, x):
        x = self.dw(self.stem(x))
        return torch.cat([self.a(x), self.b(x)], 1)


def test_chains_given_channels_last_inputs_compile_in_the_regions_and_equal_the_model(tmp_path):
    """Where depthwise convolutions are unfolded, ``FusedBackend`` gives the chains channels-last inputs
    (``fuse_conv_relu(channels_last_inputs=True)``): the layout changes it adds before each chain are traced, cut and
    compiled by Inductor with the rest; outputs equal the model's."""
    from opbench.runtime import fused

    torch.manual_seed(0)
    model = DepthwiseChains().eval()
    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        expected = model(x)
    backend = fused.FusedBackend(model, [x], store=tmp_path, jobs=1, conv_relu=True, depthwise="taps")
    assert (backend.conv_relu_chains, backend.depthwise_unfolded) == (3, 1) and not backend.fallbacks
    assert backend.built.get("compiled", 0) > 0
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)


class PairInput(torch.nn.Module):
    """A region that takes a tuple whole (``torch.chunk``'s outputs passed on, as after shufflenet's channel split)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)

    def forward(self, pair):
        return self.conv(pair[1]) + pair[0]


def test_a_region_traced_with_a_tuple_input_means_the_same_after_pickling():
    """``_aten_graph`` traces a region that takes a tuple with one placeholder per tensor, so that a worker's
    pickled copy of the graph takes the same flat inputs and computes the same; both equal the region. Traced
    with the tuple as one input, the copy took the tuple's first tensor for the tuple (an ``IndexError`` in
    shufflenet_v2_x1_0's workers, whose structures the building process then compiled itself)."""
    import pickle

    from opbench.runtime import fused

    torch.manual_seed(0)
    region = PairInput().eval()
    pair = (torch.randn(1, 4, 5, 5), torch.randn(1, 4, 5, 5))
    names, tensors = fused._state(region)
    graph, spec = fused._aten_graph(region, [pair], names, tensors)
    assert sum(n.op == "placeholder" for n in graph.graph.nodes) == 2 + len(tensors)
    with torch.no_grad():
        expected = region(pair)
        for g in (graph, pickle.loads(pickle.dumps(graph))):  # noqa: S301 (our own graph)
            got = torch.utils._pytree.tree_unflatten(list(g(*pair, *tensors)), spec)
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("depthwise, unfolded", [("taps", True), ("aten", False)])
def test_chains_take_channels_last_inputs_where_the_depthwise_convolutions_are_unfolded(depthwise, unfolded,
                                                                                       monkeypatch):
    """With its depthwise convolutions unfolded, a network's chains take their inputs channels-last (one copy for
    the two branches that share one: the graph's ``contiguous`` calls); with PyTorch's convolution they take them
    as they come. Outputs equal the model's either way (the regions run as they are here)."""
    from opbench.runtime import fused

    monkeypatch.setattr(fused.RegionCompiler, "compile_all",
                        lambda self, regions: {name: (region, None) for name, region, *_ in regions})
    seen = []

    def spy(gm, inputs=None, channels_last_inputs=False):
        chains = fused_conv_relu(gm, inputs, channels_last_inputs)
        seen.append((channels_last_inputs, sum(n.target == "contiguous" for n in gm.graph.nodes)))
        return chains

    fused_conv_relu = fused.fuse_conv_relu
    monkeypatch.setattr(fused, "fuse_conv_relu", spy)
    torch.manual_seed(0)
    model, x = DepthwiseChains().eval(), torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        expected = model(x)
    backend = fused.FusedBackend(model, [x], store=None, conv_relu=True, depthwise=depthwise)
    assert (backend.conv_relu_chains, bool(backend.depthwise_unfolded)) == (3, unfolded)
    assert seen == [(unfolded, 2 if unfolded else 0)]  # the stem's input and the depthwise output, once each
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)


def test_the_source_digests_a_build_computes_in_a_thread_are_those_inductor_computes_itself(monkeypatch):
    """``hash_sources_meanwhile`` computes Inductor's digests of torch's and Triton's sources in a thread of its
    own, where Inductor keeps them; computed again in this thread, torch's is the same."""
    import threading

    from torch._inductor import codecache
    from torch._inductor.runtime import triton_compat

    from opbench.runtime.fused import hash_sources_meanwhile

    codecache.torch_key.clear()
    thread = hash_sources_meanwhile()
    assert thread is not None and thread.name == "opbench-source-digests"
    thread.join(120)
    assert not thread.is_alive()
    kept = codecache.torch_key()  # the thread's, kept by Inductor's own cache
    codecache.torch_key.clear()
    assert codecache.torch_key() == kept and len(kept) == 32  # a sha256, computed again here
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(codecache, "torch_key", lambda: calls.append(("torch", threading.current_thread().name)))
    monkeypatch.setattr(triton_compat, "triton_key", lambda: calls.append(("triton", threading.current_thread().name)))
    monkeypatch.setattr(triton_compat, "HAS_TRITON", True)
    hash_sources_meanwhile().join(10)
    assert calls == [("torch", "opbench-source-digests"), ("triton", "opbench-source-digests")]


class Separable(torch.nn.Module):
    """Two branches of depthwise (one with two filters per channel) then pointwise convolutions, as in NASNet's
    separable convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw_a, self.bn_a = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), torch.nn.BatchNorm2d(8)
        self.pw_a = torch.nn.Conv2d(8, 8, 1)
        self.dw_b, self.pw_b = torch.nn.Conv2d(8, 16, 5, stride=2, padding=2, groups=8), torch.nn.Conv2d(16, 8, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        a = self.pw_a(torch.relu(self.bn_a(self.dw_a(x))))
        b = self.pw_b(self.dw_b(torch.relu(x)))
        return a.mean((2, 3)) + b.mean((2, 3))


def test_depthwise_taps_run_in_the_regions_and_a_later_build_finds_them_by_their_quick_keys(tmp_path, monkeypatch):
    """``depthwise="taps"``: the depthwise convolutions are unfolded into the regions' code, the outputs equal the
    model's, the schedule says so; a later build finds every region through its quick key (the key names this
    library's function with a digest of its source), nothing traced to ATen."""
    from opbench.runtime import fused

    torch.manual_seed(0)
    model = Separable().eval()
    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        expected = model(x)
    first = fused.FusedBackend(model, [x], store=tmp_path, jobs=1, depthwise="taps")
    assert first.depthwise_unfolded == 2 and first.schedule_meta()["depthwise"] == "taps"
    from opbench.parallel import CapturedSchedule
    from opbench.schedule import get_scheduler

    text = str(CapturedSchedule(first, get_scheduler("sequential").schedule(first.graph), [], None))
    assert "; 2 depthwise convolutions compiled into the regions' kernels" in text
    from opbench.pipeline.compile import saved_cut

    assert saved_cut(first.schedule_meta())["depthwise"] == "taps"  # a saved schedule builds its regions so again
    assert saved_cut({"regions": [["x"]]})["depthwise"] == "aten"  # one saved before depthwise could be unfolded
    assert not first.fallbacks and first.built.get("compiled")
    torch.testing.assert_close(_greedy(first)[0], expected, rtol=1e-4, atol=1e-5)
    with monkeypatch.context() as patched:
        patched.setattr(fused, "_aten_graph", lambda *a: pytest.fail("traced to ATen"))
        again = fused.FusedBackend(model, [x], store=tmp_path, jobs=1, depthwise="taps")
    assert again.built == {"loaded": first.built["compiled"]} | ({"shared": first.built["shared"]}
                                                                  if "shared" in first.built else {})
    torch.testing.assert_close(_greedy(again)[0], expected, rtol=1e-4, atol=1e-5)
    assert fused.FusedBackend(model, [x], store=None).schedule_meta()["depthwise"] == "aten"  # the default
    with pytest.raises(OpBenchError, match="unknown depthwise convolution mode"):
        fused.FusedBackend(model, [x], store=None, depthwise="cudnn")


class ThreeByThree(torch.nn.Module):
    """Two depthwise 3x3 convolutions, each between pointwise ones, on two branches."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 1)
        self.dw_a, self.pw_a = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Conv2d(8, 8, 1)
        self.dw_b, self.pw_b = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.pw_a(torch.relu(self.dw_a(x))).mean((2, 3)) + self.pw_b(torch.relu(self.dw_b(x))).mean((2, 3))


@pytest.mark.parametrize("on_gpu", [True, False])
def test_depthwise_auto_unfolds_a_network_of_3x3_ones_and_leaves_larger_ones_to_pytorch(on_gpu, monkeypatch):
    """``depthwise="auto"`` (the default): on a GPU (here the inputs taken for a GPU's), a network whose depthwise
    convolutions are all 3x3 runs them unfolded, and its schedule says ``taps``; one with a 5x5
    (:class:`Separable`) keeps PyTorch's convolution and says ``aten``. On the CPU both keep it. The regions run as
    they are here (what is chosen, not Inductor's compile, is under test)."""
    from opbench.runtime import fused

    monkeypatch.setattr(fused.RegionCompiler, "compile_all",
                        lambda self, regions: {name: (region, None) for name, region, *_ in regions})
    monkeypatch.setattr(fused, "_on_cuda", lambda inputs: on_gpu)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 12, 12)
    for model, chosen, unfolded in ((ThreeByThree().eval(), "taps" if on_gpu else "aten", 2 if on_gpu else 0),
                                    (Separable().eval(), "aten", 0)):
        with torch.no_grad():
            expected = model(x)
        backend = fused.FusedBackend(model, [x], store=None)
        assert (backend.depthwise, backend.depthwise_unfolded) == (chosen, unfolded)
        assert backend.schedule_meta()["depthwise"] == chosen  # a later build from the schedule takes the choice
        torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)


class InvertedResiduals(torch.nn.Module):
    """A stem and three inverted-residual blocks in a chain (expand, depthwise 3x3, project, the shortcut added):
    one region of the branches cut; the last two blocks alike."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1)

        def block(k: int) -> torch.nn.ModuleList:
            return torch.nn.ModuleList([torch.nn.Conv2d(c, 2 * c, 1), torch.nn.Conv2d(2 * c, 2 * c, k, padding=k // 2,
                                                                                      groups=2 * c),
                                        torch.nn.Conv2d(2 * c, c, 1)])

        self.blocks = torch.nn.ModuleList([block(5), block(3), block(3)])

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for expand, depthwise, project in self.blocks:
            x = x + project(torch.relu(depthwise(torch.relu(expand(x)))))
        return x


def test_a_heavy_region_compiles_as_pieces_that_start_at_a_convolution_and_alike_pieces_compile_once(tmp_path,
                                                                                                   monkeypatch):
    """``piece_ops``: the chain's one region (weight 2 + 3 * 5 + 25 + 2 * 9 = 60 with its depthwise convolutions
    unfolded; at most 16: four pieces) is cut into pieces at block boundaries, each piece after the first starting
    at a convolution; the two alike blocks compile once; the outputs equal the model's. A bad limit is refused
    before any work."""
    from opbench.parallel import CaptureOptions
    from opbench.pipeline.compile import BackendSpec
    from opbench.pipeline.spec import SpecError
    from opbench.runtime import fused

    torch.manual_seed(0)
    model = InvertedResiduals().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    probes = []
    init = fused.RegionCompiler.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        probes.append(self.probes)

    monkeypatch.setattr(fused.RegionCompiler, "__init__", recorded)
    backend = fused.FusedBackend(model, [x], store=tmp_path, jobs=1, depthwise="taps", piece_ops=16)
    assert probes[0] == 0  # pieces compile for seconds each: workers (given jobs) would start without probes
    assert backend.depthwise_unfolded == 3
    assert [r[0] for r in backend.regions] == ["stem", "blocks_0_0", "blocks_1_0", "blocks_2_0"]
    assert backend.built["shared"] == 1  # the last two blocks: one structure
    assert not backend.fallbacks
    torch.testing.assert_close(_greedy(backend)[0], expected, rtol=1e-4, atol=1e-5)
    for bad in (-1, 2.5, "8"):
        with pytest.raises(OpBenchError, match="is a whole number from 0"):
            fused.FusedBackend(None, [x], store=None, piece_ops=bad)
        with pytest.raises(SpecError, match="accepted: a whole number from 0"):
            BackendSpec(kind="fused", kernels="fused", piece_ops=bad).validate()
    with pytest.raises(OpBenchError, match="piece_ops=8 limits the regions of fused kernels"):
        CaptureOptions(piece_ops=8)  # with PyTorch's kernels
