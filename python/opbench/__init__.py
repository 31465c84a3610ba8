"""OpBench: per-operator and co-run profiling of DNN models on Apache TVM.

The packages follow the data flow of the tool:

* :mod:`opbench.models`   model sources -> :class:`~opbench.models.Workload`
* :mod:`opbench.ir`       the ``ExtractOperators`` Relax pass and the :class:`~opbench.ir.OpGraph`
* :mod:`opbench.runtime`  compiled per-operator kernels and the Relax VM
* :mod:`opbench.profile`  timing (CPU, CUDA events, co-runs) and environment tags
* :mod:`opbench.pipeline` the jobs (collection)
* :mod:`opbench.dataset`  the SQLite record store; :func:`opbench.load` reads a table as a DataFrame
* :mod:`opbench.cli`      the ``opbench`` command
"""

__version__ = "0.1.0"

from .errors import OpBenchError  # noqa: E402

__all__ = ["OpBenchError", "__version__", "capturer", "load", "optimize"]


def __getattr__(name: str):  # lazy: importing opbench does not import TVM or torch
    if name in ("capturer", "optimize"):
        from . import parallel

        return getattr(parallel, name)
    if name == "load":
        from .dataset import load

        return load
    raise AttributeError(f"module 'opbench' has no attribute '{name}'")
