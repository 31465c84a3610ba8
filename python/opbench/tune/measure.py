"""Builders and the trial recorder that MetaSchedule's tuning loop calls.

* :class:`InProcessBuilder`: builds candidates in this process. MetaSchedule's ``LocalBuilder``
  starts fresh worker processes for every batch, and each imports TVM and its tensor intrinsics
  (half a minute on a small machine), so on CPU targets building in-process is several times faster.
* :class:`PoolBuilder`: worker processes that start once per tuning run and build a batch in
  parallel (GPU targets, where each candidate's CUDA compilation takes about a second).
* :class:`CheckedRunner`: MetaSchedule's runner, measuring one candidate at a time where it
  measures synchronously (its ``LocalRunner``), so that Ctrl-C stops a batch between two candidates.
* :class:`TrialRecorder`: a ``PyMeasureCallback`` that hands every measured candidate (trace,
  decoded knobs, build and run status with the error text, run times, best so far) to a sink,
  the dataset's ``trials`` table; MetaSchedule itself keeps only ``1e10`` for a failure.
* :class:`CheckedCostModel` and :class:`SignalCheck`: a cost model and a last measure callback
  that stop the loop on a signal during the search and after a batch is written.

Every one of them calls :func:`opbench.signals.check` at points from which an exception unwinds
through MetaSchedule's C++ loop cleanly (see :mod:`opbench.signals`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.cost_model import PyCostModel
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import PyRunner

from .. import signals
from .knobs import decode_knobs, dumps

#: CUDA's kernel compilers for candidates: ``nvrtc-pch`` (NVRTC in this process, the headers every TVM
#: kernel includes parsed once per process: see :func:`use_cuda_compiler`), ``nvrtc``, ``nvcc``
CUDA_COMPILERS = ("nvrtc-pch", "nvrtc", "nvcc")

#: the headers of TVM's CUDA kernels (its NVRTC preamble and codegen): included first, in one precompiled header
_PRELUDE = """#pragma once
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
"""
_PCH: dict[str, Any] = {}


def use_cuda_compiler(compiler: str | None) -> None:
    """Make ``compiler`` (:data:`CUDA_COMPILERS`; None: TVM's default) compile this process's CUDA kernels.

    ``nvrtc-pch``: NVRTC with automatic precompiled headers. Most of a candidate's compilation is the
    parse of the same headers (libcu++, ``cuda_fp16.h``, ``mma.h``: about 0.6 s of the 0.7 s a typical
    candidate takes); here they are pre-included and precompiled once per process, then reused, and
    every kernel is the same (its PTX equals plain NVRTC's but for unused header constants). A compile
    that fails with the precompiled header is done again without it; where that succeeds, the process
    stops using the header (a kernel that fails both ways is the candidate's build error). Once the
    header has compiled a kernel in this process, a failure is the kernel's own and is not compiled
    again. A source that :func:`known_compile_error` finds wrong fails at once, without NVRTC.
    """
    if compiler is None:
        return
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc" if compiler == "nvcc" else "nvrtc"
    if compiler != "nvrtc-pch":
        return
    import tvm_ffi
    from tvm.support.nvcc import compile_cuda

    def compile_with_pch(code: str) -> Any:
        known = known_compile_error(code)
        if known is not None:
            raise RuntimeError(f"NVRTC compilation failed (found before compiling): {known}")
        if _PCH.get("failed"):
            return compile_cuda(code, target_format="cubin", compiler="nvrtc")
        try:
            if "options" not in _PCH:  # the header is written at the first CUDA compile (none on a CPU target)
                _PCH["options"] = ["-pch", f"--pre-include={_prelude_file()}"]
            result = compile_cuda(code, target_format="cubin", compiler="nvrtc", options=_PCH["options"])
            _PCH["worked"] = True
            return result
        except Exception as err:
            if _PCH.get("worked"):  # the header is fine: the kernel's own error (compiling again costs as much)
                raise
            result = compile_cuda(code, target_format="cubin", compiler="nvrtc")  # a kernel's own error raises here
            # only the header failed (an NVRTC without automatic PCH, say): plain NVRTC from now on
            _PCH["failed"] = f"{type(err).__name__}: {str(err).strip()[:200]}"
            return result

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_with_pch, override=True)


#: CUDA's vector constructors (``make_int4``, ``make_longlong4``, ...): one argument per lane
_MAKE_VECTOR = re.compile(r"\bmake_(char|uchar|short|ushort|int|uint|long|ulong|longlong|ulonglong|float|double)"
                          r"([1-4])\(")


def known_compile_error(code: str) -> str | None:
    """Why NVRTC would reject the CUDA source ``code``, where that is certain without compiling it; else None.

    TVM 0.27's codegen writes an int64 vector of 8 lanes as ``make_longlong4`` with 8 arguments, which no
    CUDA compiler accepts (``too many arguments in function call``): at bfloat16 it was 14 % of the
    builders' time in a sampling run, at about 1.8 s per candidate. Any vector constructor called with
    another number of arguments than its lanes is found here.
    """
    for match in _MAKE_VECTOR.finditer(code):
        depth, args, i = 0, 1, match.end()
        while i < len(code):
            c = code[i]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                args += 1
            i += 1
        lanes = int(match.group(2))
        if args != lanes:
            problem = "too many" if args > lanes else "too few"
            return f"{match.group(0)[:-1]} called with {args} arguments for {lanes} lanes: {problem} arguments"
    return None


def _prelude_file() -> str:
    """The header :func:`use_cuda_compiler` pre-includes: one file per content in ``$OPBENCH_CACHE/nvrtc``
    (written once, through a partial file; a temporary folder where the cache cannot be written)."""
    from pathlib import Path

    from ..utils import cache_root, digest, written_whole

    name = f"opbench_prelude_{digest(_PRELUDE)}.h"
    for folder in (cache_root() / "nvrtc", None):
        try:
            path = (folder if folder is not None else Path(tempfile.mkdtemp(prefix="opbench-nvrtc-"))) / name
            if not path.is_file():
                with written_whole(path) as part:
                    part.write_text(_PRELUDE)
            return str(path)
        except OSError:
            continue
    raise OSError("no folder for NVRTC's pre-included header")


def build_candidate(mod: Any, target: Any) -> Any:
    """What MetaSchedule's default build does, without importing every tensor intrinsic."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from ..runtime.build import build_context

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    with build_context(mod):
        return tvm.tirx.build(mod, target=target)


def build_to_file(mod: Any, target: Any, path: str, fcompile: Any = None) -> str | None:
    """Build a candidate (:func:`build_candidate`) and export it to ``path`` (``fcompile``: how; default a
    linked shared library); the error text where it does not build (recorded, the search goes on)."""
    try:
        lib = build_candidate(mod, target)
        lib.export_library(path, **({"fcompile": fcompile} if fcompile is not None else {}))
    except Exception as err:
        return exception_text(err)
    return None


def _build_one(item: Any, root: str | None) -> Any:
    """Build ``item`` into a folder of its own under ``root`` (the runner removes that folder once it has
    measured the candidate); a candidate that does not build leaves no folder."""
    from tvm.support.tar import tar

    folder = tempfile.mkdtemp(prefix="candidate-", dir=root)
    path = os.path.join(folder, "mod." + tar.output_format)
    error = build_to_file(item.mod, item.target, path, fcompile=tar)
    if error:
        shutil.rmtree(folder, ignore_errors=True)
    return BuilderResult(None if error else path, error)


class _BuildFolder:
    """The one temporary folder (``opbench-build-*``) that holds a builder's candidates, made at its
    first build and removed by :meth:`close` with whatever is left in it: candidates built but never
    measured, because the run was interrupted or reached its time limit."""

    _root: str | None = None

    def root(self) -> str:
        if self._root is None:
            self._root = tempfile.mkdtemp(prefix="opbench-build-")
        return self._root

    def remove_folder(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


@derived_object
class InProcessBuilder(PyBuilder, _BuildFolder):
    """Build candidates one after another in this process (see the module docstring)."""

    def build(self, build_inputs: list[Any]) -> list[Any]:
        results = []
        for item in build_inputs:
            signals.check()
            results.append(_build_one(item, self.root()))
        return results

    def close(self) -> None:
        """Remove the candidates' folder."""
        self.remove_folder()


def _build_saved(mod_json: str, target_json: str, root: str) -> tuple[str | None, str | None]:
    """Worker side of :class:`PoolBuilder`: build one candidate saved as JSON into ``root``."""
    import tvm

    class Item:  # what _build_one reads of a BuilderInput
        mod = tvm.ir.load_json(mod_json)
        target = tvm.target.Target(json.loads(target_json))

    result = _build_one(Item, root)
    return result.artifact_path, result.error_msg


def _worker_ready() -> None:
    import tvm  # noqa: F401  (imported once per worker, not once per candidate)

    # CUDA kernels with their headers precompiled once per worker, unless a compiler was chosen
    use_cuda_compiler(os.environ.get("OPBENCH_CUDA_COMPILER")
                      or (None if os.environ.get("TVM_CUDA_COMPILE_MODE") else "nvrtc-pch"))


@derived_object
class PoolBuilder(PyBuilder, _BuildFolder):
    """Build candidates in ``max_workers`` worker processes that live as long as the builder.

    TVM's CUDA compilation holds Python's lock, so threads build one candidate at a time; worker
    processes build ``max_workers`` at once. Unlike MetaSchedule's ``LocalBuilder`` (new workers for
    every batch, each importing TVM and its tensor intrinsics), the workers start once. They are
    started with ``spawn``: a forked child cannot use the CUDA driver that its parent initialised.
    """

    def __init__(self, max_workers: int = 4, timeout_s: float = 120.0) -> None:
        super().__init__()
        self.max_workers = max(1, int(max_workers))
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None

    def build(self, build_inputs: list[Any]) -> list[Any]:
        signals.check()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.max_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_ready)
        futures = [self._pool.submit(_build_saved, tvm.ir.save_json(item.mod), str(item.target), self.root())
                   for item in build_inputs]
        results = []
        for future in futures:
            try:
                path, error = _result(future, self.timeout_s)
            except FutureTimeout:
                path, error = None, f"build timeout: killed after {self.timeout_s:g} s"
            except Exception as err:  # a worker that died: the candidate is a failed build
                path, error = None, exception_text(err)
            results.append(BuilderResult(path, error))
        signals.check()
        return results

    def close(self) -> None:
        """Stop the worker processes and remove the candidates' folder."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self.remove_folder()


def _result(future: Any, timeout_s: float, poll_s: float = 0.2) -> Any:
    """``future.result(timeout_s)``, checking for a signal every ``poll_s`` seconds while it waits."""
    deadline = time.monotonic() + timeout_s
    while True:
        signals.check()
        try:
            return future.result(timeout=max(0.0, min(poll_s, deadline - time.monotonic())))
        except FutureTimeout:
            if time.monotonic() >= deadline:
                raise


@derived_object
class CheckedRunner(PyRunner):
    """``runner`` (a MetaSchedule runner), with a signal check between two candidates.

    MetaSchedule's ``LocalRunner`` measures a whole batch inside one ``run`` call; here it gets one
    candidate per call. A runner that measures asynchronously (``RPCRunner``, several remote devices
    at once) gets the batch in one call, with a check before and after.
    """

    def __init__(self, runner: Any) -> None:
        super().__init__()
        self.runner = runner
        from tvm.s_tir.meta_schedule.runner import LocalRunner

        self.one_by_one = isinstance(runner, LocalRunner)  # it measures inside run(), on one worker

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        signals.check()
        if not self.one_by_one:
            return list(self.runner.run(runner_inputs))
        futures = []
        for item in runner_inputs:
            signals.check()
            futures.extend(self.runner.run([item]))
        return futures

    def close(self) -> None:
        """Stop the runner's worker process (it would otherwise be stopped while Python exits)."""
        pool = getattr(self.runner, "pool", None)
        if pool is not None:
            pool.shutdown(wait=False)


def exception_text(err: BaseException) -> str:
    """An exception as the dataset's error text: its type and message (:func:`error_text`)."""
    return error_text(f"{type(err).__name__}: {err}")


_WARNING = re.compile(r"^\S+\(\d+\): warning #")


def error_text(message: Any, limit: int = 4000) -> str:
    """An error message for the dataset: its start and, where the cause is (the end of a traceback), its end.
    A long message loses a CUDA compiler's warnings first (each a line ``file(line): warning #...`` and the
    lines up to the next blank one), so that the compiler's errors are what is kept."""
    text = str(message).strip()
    if len(text) > limit:
        kept, skipping = [], False
        for line in text.splitlines():
            if _WARNING.match(line):
                skipping = True
            elif skipping and not line.strip():
                skipping = False
            elif not skipping:
                kept.append(line)
        text = "\n".join(kept).strip()
    if len(text) <= limit:
        return text
    return text[: limit // 4] + "\n[...]\n" + text[-(limit - limit // 4):]


def _status(build: Any, run: Any) -> tuple[str, str | None, list[float] | None]:
    if build.error_msg:
        timeout = "timeout" in build.error_msg.lower()
        return ("build_timeout" if timeout else "build_error"), error_text(build.error_msg), None
    if run.error_msg:
        timeout = "timeout" in str(run.error_msg).lower()
        return ("run_timeout" if timeout else "run_error"), error_text(run.error_msg), None
    secs = [float(s) for s in run.run_secs or []]
    if not secs or max(secs) >= 1e9:
        return "run_error", "no valid run time", None
    return "ok", None, secs


@derived_object
class TrialRecorder(PyMeasureCallback):
    """Hands one row per measured candidate to ``sink`` and reports progress (see the module docstring)."""

    def __init__(self, sink: Callable[[dict[str, Any]], None], best_s: float | None = None,
                 on_batch: Callable[[TrialRecorder], None] | None = None) -> None:
        super().__init__()
        self.sink = sink
        self.best_s = best_s
        self.valid = 0
        self.measured = 0
        self.on_batch = on_batch
        self.batch = 0  # candidates in the batch being recorded
        self.failure: Exception | None = None  # what stopped the recorder, as raised
        self.started = time.perf_counter()

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: list[Any], builder_results: list[Any],
              runner_results: list[Any]) -> None:
        self.batch = len(measure_candidates)
        try:
            self._record(measure_candidates, builder_results, runner_results)
            if self.on_batch is not None:
                self.on_batch(self)
        except Exception as err:  # MetaSchedule's C++ loop hands it on as a RuntimeError: keep the original
            self.failure = err
            raise

    def _record(self, measure_candidates: list[Any], builder_results: list[Any], runner_results: list[Any]) -> None:
        for candidate, build, run in zip(measure_candidates, builder_results, runner_results, strict=True):
            status, error, secs = _status(build, run)
            median = statistics.median(secs) if secs else None
            if median is not None:
                self.valid += 1
                if self.best_s is None or median < self.best_s:
                    self.best_s = median
            trace = candidate.sch.trace
            try:
                knobs = decode_knobs(trace)
            except Exception as err:  # knobs are extra columns: never lose the trial for them
                knobs = {"decode_error": f"{type(err).__name__}: {err}"}
            self.sink({"trace": dumps(trace), "knobs": knobs, "build_status": status,
                       "error": error, "run_secs": secs, "latency_median_s": median,
                       "best_so_far_s": self.best_s})
            self.measured += 1


@derived_object
class SignalCheck(PyMeasureCallback):
    """The last measure callback: a signal that arrived while the batch ran stops tuning here, once
    the batch's trial rows and database records are written."""

    def apply(self, *_args: Any) -> None:
        signals.check()


@derived_object
class CheckedCostModel(PyCostModel):
    """``model`` (a MetaSchedule cost model), with a signal check before each prediction: the search
    asks for predictions between its parallel loops, so a signal during the search stops it there."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def load(self, path: str) -> None:
        self.model.load(path)

    def save(self, path: str) -> None:
        self.model.save(path)

    def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
        self.model.update(context, candidates, results)

    def predict(self, context: Any, candidates: list[Any]) -> Any:
        signals.check()
        return self.model.predict(context, candidates)
