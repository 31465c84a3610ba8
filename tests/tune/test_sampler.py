"""Hardware-free sampling: deterministic for a seed, de-duplicated, rejections counted (never built)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("tvm")


@functools.cache
def _task(n: int = 64):
    """The one task of ``simple`` matmul:n=N (a dense layer), extracted once per session."""
    import tvm

    from opbench.models import load_workload
    from opbench.pipeline.tune import extracted_tasks

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    (task,) = extracted_tasks(load_workload("simple", f"matmul:n={n}", 1), target)
    return task.dispatched[0]


def _cuda():
    import tvm

    from opbench.runtime.target import tuning_target

    return tuning_target(tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))


def test_same_seed_same_candidates_and_a_prefix_extends():
    from opbench.tune.sampler import SampleStats, sample_task

    stats = SampleStats()
    first = list(sample_task(_task(), _cuda(), 6, seed=3, init_valid=2, stats=stats))
    again = list(sample_task(_task(), _cuda(), 6, seed=3, init_valid=2))
    shorter = list(sample_task(_task(), _cuda(), 3, seed=3, init_valid=2))
    assert [c.shash for c in first] == [c.shash for c in again] and len(first) == 6
    assert [c.shash for c in shorter] == [c.shash for c in first[:3]]  # a larger --per-task extends a sample
    assert [c.index for c in first] == list(range(6))
    assert len({c.shash for c in first}) == 6  # de-duplicated
    assert {c.origin.split(":")[0] for c in first} == {"random", "mutate"}
    other = [c.shash for c in sample_task(_task(), _cuda(), 6, seed=4, init_valid=2)]
    assert other != [c.shash for c in first]


def test_rejected_candidates_are_counted_not_kept():
    from opbench.tune.sampler import SampleStats, sample_task

    stats = SampleStats()
    kept = list(sample_task(_task(), _cuda(), 4, seed=0, init_valid=2, stats=stats))
    # every attempt is kept or rejected for a named reason; VerifyGPUCode refuses random tilings of a CUDA dense
    assert stats.kept == len(kept) == 4
    assert stats.attempts == stats.kept + sum(stats.rejected.values())
    assert stats.rejected["VerifyGPUCode"] > 0 and not stats.exhausted
    assert stats.to_json()["rejected"]["VerifyGPUCode"] == stats.rejected["VerifyGPUCode"]


def test_a_small_space_is_exhausted_early():
    import tvm
    from tvm import te, tirx

    from opbench.runtime.target import tuning_target
    from opbench.tune.sampler import SampleStats, sample_task

    a = te.placeholder((8,), name="a")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="b")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", "main")})
    stats = SampleStats()
    got = list(sample_task(mod, tuning_target(tvm.target.Target("llvm")), 50, seed=0, patience=30, stats=stats))
    assert 1 <= len(got) < 50 and stats.exhausted and stats.attempts < 200
    del tirx


def test_the_memo_keeps_the_same_candidates_and_counts_with_fewer_postprocessings(monkeypatch):
    """A trace whose decisions repeat a known one is not post-processed again (nor replayed, for a
    mutation), and the sampler keeps what it keeps without the memo, in the same order, with the same counts."""
    import tvm
    from tvm import s_tir, te

    import opbench.tune.sampler as sampler
    from opbench.tune.sampler import SampleStats, sample_task

    a = te.placeholder((64, 64), name="a")

    def module(out):
        return tvm.IRModule({"main": te.create_prim_func([a, out]).with_attr("global_symbol", "main")})

    small = module(te.compute((64, 64), lambda i, j: a[i, j] * 2.0))  # one decision: the unroll
    single = module(te.compute((1,), lambda i: a[0, 0] * 2.0))  # a sketch that draws nothing: one program
    postprocessed, replayed = [], []
    enter, replay = s_tir.Schedule.enter_postproc, sampler._replay
    monkeypatch.setattr(s_tir.Schedule, "enter_postproc", lambda sch: postprocessed.append(1) or enter(sch))
    monkeypatch.setattr(sampler, "_replay", lambda *args: replayed.append(1) or replay(*args))
    # a dense layer (mutations, VerifyGPUCode), and small spaces sampled at random only (their draws repeat)
    for mod, count, init_valid in ((_task(), 8, 2), (small, 40, 40), (single, 16, 16)):
        runs = {}
        for memo in (False, True):
            postprocessed.clear()
            replayed.clear()
            stats = SampleStats()
            kept = [(c.index, c.origin, c.sketch, c.trace, c.mod, c.shash)
                    for c in sample_task(mod, _cuda(), count, 1, init_valid=init_valid, patience=60, stats=stats,
                                         memo=memo)]
            runs[memo] = (kept, stats.attempts, dict(stats.rejected), stats.exhausted, len(postprocessed),
                          len(replayed))
        assert runs[True][:4] == runs[False][:4] and runs[True][0]
        assert runs[False][4] == runs[False][1] - runs[False][2].get("mutator_declined", 0) \
            - runs[False][2].get("replay_error", 0)  # without the memo every replayed attempt is post-processed
        assert runs[True][4] <= runs[False][4]
        if mod is small:
            assert runs[True][2].get("duplicate", 0) > 0 and runs[True][4] < runs[False][4] / 2
    assert runs[True][1] > 50 and runs[True][5] == runs[True][4] == 1  # the single program: replayed once


def test_a_long_compiler_error_keeps_its_errors_not_its_warnings():
    from opbench.tune.measure import error_text

    warning = 'k.cu(451): warning #177-D: variable "cse_v16" was declared but never referenced\n    int x = 1;\n' \
              '        ^\n\n'
    message = ("RuntimeError: NVRTC compilation failed:\n" + warning * 200
               + 'k.cu(12): error: identifier "half4" is undefined\n    half4 v;\n    ^\n\n'
               + "1 error detected in the compilation of \"k.cu\".")
    text = error_text(message)
    assert 'identifier "half4" is undefined' in text and "warning #" not in text
    assert text.startswith("RuntimeError: NVRTC compilation failed:") and len(text) <= 4000
    assert error_text("short: warning #1 stays") == "short: warning #1 stays"  # short messages are kept whole
