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
* :func:`opbench.collect` runs a :class:`~opbench.pipeline.collect.CollectJob` (what ``opbench collect`` runs)
* :mod:`opbench.cli`      the ``opbench`` command
"""

from ._version import __version__
from .errors import OpBenchError

__all__ = ["CaptureOptions", "CollectJob", "OpBenchError", "__version__", "capturer", "collect", "load",
           "optimize"]


def __getattr__(name: str):  # lazy: importing opbench does not import TVM or torch
    if name in ("CaptureOptions", "capturer", "optimize"):
        from . import parallel

        return getattr(parallel, name)
    if name == "collect":
        from .cli.collect_job import run_collect

        return run_collect
    if name == "CollectJob":
        from .pipeline.collect import CollectJob

        return CollectJob
    if name == "load":
        from .dataset import load

        return load
    raise AttributeError(f"module 'opbench' has no attribute '{name}'")
