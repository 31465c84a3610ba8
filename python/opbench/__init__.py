"""OpBench: per-operator and co-run profiling of DNN models on Apache TVM, and inter-operator parallel
execution of PyTorch models.

The packages follow the data flow of the tool (docs/architecture.md gives their layers):

* :mod:`opbench.models`   model sources -> :class:`~opbench.models.Workload`
* :mod:`opbench.ir`       the ``ExtractOperators`` Relax pass, the :class:`~opbench.ir.OpGraph`, a PyTorch
  model's graph (:mod:`opbench.ir.torch_graph`)
* :mod:`opbench.dataset`  the SQLite record store; :func:`opbench.load` reads a table as a DataFrame
* :mod:`opbench.schedule` the ``Schedule`` and one scheduler per policy (sequential, greedy, nimble, opara, ios)
* :mod:`opbench.runtime`  targets, builds, per-operator kernels, kernel backends, the parallel executor,
  CUDA Graph capture
* :mod:`opbench.profile`  timing (CPU, CUDA events, co-runs, remote devices) and environment tags
* :mod:`opbench.tune`     MetaSchedule tuners, the trial recorder, knobs, design spaces, the tuning database
* :mod:`opbench.predict`  XGBoost predictors of latency, co-run interference and tuning trials
* :mod:`opbench.report`   the HTML report and its figures
* :mod:`opbench.pipeline` the jobs: compile, collect, compare, tune and measure, train
* :mod:`opbench.parallel` the Opara-style facade: :func:`capturer`, :func:`optimize`
* the jobs as plain data, each runnable from Python: :func:`opbench.collect` runs a
  :class:`~opbench.pipeline.collect.CollectJob` (what ``opbench collect`` runs), :func:`opbench.sweep` a
  :class:`~opbench.pipeline.sweep.SweepJob`, :func:`opbench.compare` a
  :class:`~opbench.pipeline.compare_job.CompareJob` (of a :class:`~opbench.pipeline.spec.ModelSpec` and a
  :class:`~opbench.pipeline.compile.BackendSpec`), :func:`opbench.sample` a
  :class:`~opbench.pipeline.sample.SampleJob` (tensor programs sampled and measured: ``opbench sample``)
* :mod:`opbench.cli`      the ``opbench`` command
"""

from ._version import __version__
from .errors import OpBenchError

__all__ = ["BackendSpec", "CaptureOptions", "CollectJob", "CompareJob", "CompareOptions", "MeasureSpec", "ModelSpec",
           "OpBenchError", "SampleJob", "SweepJob", "__version__", "capturer", "collect", "compare", "load", "optimize",
           "sample", "sweep"]

#: public name -> (module, attribute), imported on first use
_LAZY = {
    "CaptureOptions": ("parallel", "CaptureOptions"), "capturer": ("parallel", "capturer"),
    "optimize": ("parallel", "optimize"), "collect": ("cli.collect_job", "run_collect"),
    "CollectJob": ("pipeline.collect", "CollectJob"), "compare": ("pipeline.compare_job", "run_compare"),
    "CompareJob": ("pipeline.compare_job", "CompareJob"), "CompareOptions": ("pipeline.compare", "CompareOptions"),
    "sweep": ("pipeline.sweep", "sweep"), "SweepJob": ("pipeline.sweep", "SweepJob"),
    "sample": ("pipeline.sample", "sample"), "SampleJob": ("pipeline.sample", "SampleJob"),
    "ModelSpec": ("pipeline.spec", "ModelSpec"), "MeasureSpec": ("pipeline.spec", "MeasureSpec"),
    "BackendSpec": ("pipeline.compile", "BackendSpec"), "load": ("dataset", "load"),
}


def __getattr__(name: str):  # lazy: importing opbench does not import TVM or torch
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attribute)
    raise AttributeError(f"module 'opbench' has no attribute '{name}'")
