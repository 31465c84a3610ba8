"""CUDA Graph capture: the one helper behind the executor, the co-run profiler and the timers.

Every capture in OpBench goes through :func:`capture_graph`:

1. warm-up: ``launch`` runs once (or ``warmup`` times) on a side stream that waits on the current
   one, outside any capture (lazy kernel loading, cuDNN heuristics, allocator growth);
2. capture: ``launch`` runs again inside ``torch.cuda.graph``; it receives the capture stream and
   launches on it, or forks onto worker streams with :func:`fork_join`;
3. a capture that recorded no work (every launch was a view or an alias) is known as such:
   PyTorch's "The CUDA Graph is empty" warning is caught here, the graph is dropped, and replaying
   the result does nothing.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import OpBenchError, first_line

log = logging.getLogger(__name__)
EMPTY_GRAPH_WARNING = "The CUDA Graph is empty"
#: the name of the baseline row: the user's module captured as it is
MODEL_ROW = "model, CUDA Graph"
MODEL_ROW_EAGER = "model, eager"
#: the name of the torch.compile baseline row
COMPILE_ROW = "torch.compile"
#: the name of the torch.compile row with Inductor's horizontal fusion (``combo_kernels``)
COMBO_ROW = "torch.compile + combo kernels"
#: the torch.compile variants a comparison may hold: Inductor's defaults, and with combo kernels
COMPILE_VARIANTS = ("default", "combo")


class CapturedGraph:
    """A captured CUDA Graph (or nothing, when the capture recorded no work).

    Attributes
    ----------
    graph:
        The ``torch.cuda.CUDAGraph``; ``None`` when the capture was empty.
    result:
        What ``launch`` returned during the capture (e.g. the static outputs of a module).
    """

    def __init__(self, graph: Any, result: Any = None) -> None:
        self.graph = graph
        self.result = result

    @property
    def empty(self) -> bool:
        """True when the capture recorded no kernel, copy or memset."""
        return self.graph is None

    def replay(self) -> None:
        """Launch the captured work (nothing for an empty capture)."""
        if self.graph is not None:
            self.graph.replay()

    def dump(self, path: str | Path) -> None:
        """Write the graph's nodes and edges to ``path`` in Graphviz DOT (CUDA's ``cudaGraphDebugDotPrint`` on
        the kept template, through ``cuda-bindings`` when installed so that its error is seen; else
        ``torch.cuda.CUDAGraph.debug_dump``); the graph must have been captured with ``keep=True``
        (:func:`capture_graph`). An :class:`OpBenchError` when no file was written."""
        if self.graph is None:
            raise OpBenchError("the capture recorded no kernel: there is no CUDA Graph to dump")
        target = str(path)
        try:
            from cuda.bindings import runtime
        except ImportError:
            runtime = None
        raw = getattr(self.graph, "raw_cuda_graph", None)
        if runtime is not None and raw is not None:
            flags = runtime.cudaGraphDebugDotFlags.cudaGraphDebugDotFlagsVerbose
            result = runtime.cudaGraphDebugDotPrint(raw(), target.encode(), flags)
            err = result[0] if isinstance(result, tuple) else result
            if err != runtime.cudaError_t.cudaSuccess:
                raise OpBenchError(f"cudaGraphDebugDotPrint({target!r}) failed: {getattr(err, 'name', err)}")
        else:
            self.graph.debug_dump(target)
        if not Path(target).is_file():
            raise OpBenchError(f"CUDA wrote no graph to {target!r} (torch {_torch_version()}: its debug_dump keeps "
                               "the graph only with keep_graph=True; install cuda-bindings for CUDA's own error)")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def like(inputs: Sequence[Any], static: Sequence[Any]) -> list[Any]:
    """``inputs`` with each floating-point tensor cast to the dtype of its static input (a model captured
    in float16 takes float32 inputs too)."""
    return [x.to(s.dtype) if hasattr(x, "is_floating_point") and x.is_floating_point() and x.dtype != s.dtype
            else x for x, s in zip(inputs, static, strict=True)]


def clear_cublas_workspaces() -> None:
    """Free cuBLAS's per-stream workspaces (the next matmul on a stream allocates a new one)."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def capture_graph(launch: Callable[[Any], Any], warmup: int = 1, pool: Any = None,
                  keep: bool = False) -> CapturedGraph:
    """Warm ``launch`` up on a side stream, then capture it in a CUDA Graph.

    Parameters
    ----------
    launch:
        Called with the stream to launch on (a ``torch.cuda.Stream``); its return value is kept
        from the capture as :attr:`CapturedGraph.result`.
    warmup:
        Untimed runs on a side stream before capture (at least one).
    pool:
        A memory pool handle (``torch.cuda.graph_pool_handle()``) to share with other graphs.
    keep:
        Keep the graph's template after instantiation, so that :meth:`CapturedGraph.dump` can write it.
    """
    import torch

    origin = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(origin)
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            launch(side)
    origin.wait_stream(side)
    torch.cuda.synchronize()
    # keep_graph=True retains the template for debug_dump (torch 2.11's enable_debug_mode alone does not);
    # torch before keep_graph has only enable_debug_mode
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
    except TypeError:
        graph = torch.cuda.CUDAGraph()
        graph.enable_debug_mode()
    # cuBLAS keeps one workspace per stream. One allocated by the warm-up lives in the ordinary pool:
    # captured, the graph would keep using it after anyone frees it (torch.compile's CUDA Graphs
    # clear every workspace), and a replay would then write into another tensor's memory. Cleared
    # here, the capture allocates its own in the graph's private pool; cleared after, later eager
    # matmuls do not share the graph's (what PyTorch's own CUDA Graph trees do).
    clear_cublas_workspaces()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph, pool=pool):
            result = launch(torch.cuda.current_stream())
    clear_cublas_workspaces()
    empty = False
    for w in caught:
        if EMPTY_GRAPH_WARNING in str(w.message):
            empty = True
        else:  # not ours to hide
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if keep and not empty and hasattr(graph, "instantiate"):  # a kept template is instantiated on request
        graph.instantiate()
    torch.cuda.synchronize()
    return CapturedGraph(None if empty else graph, result)


def fork_join(origin: Any, streams: Sequence[Any], body: Callable[[], None]) -> None:
    """Run ``body`` with ``streams`` forked from ``origin`` and joined back into it.

    ``origin`` records an event that every stream waits on before ``body`` launches anything, and
    waits on an event recorded on every stream afterwards, so that inside a capture all work on
    ``streams`` belongs to the graph, and outside one ``origin`` is ordered after it.
    """
    import torch

    fork = torch.cuda.Event()
    fork.record(origin)
    for stream in streams:
        stream.wait_event(fork)
    body()
    for stream in streams:
        join = torch.cuda.Event()
        join.record(stream)
        origin.wait_event(join)


class CapturedModel:
    """The user's module run as it is: captured in one CUDA Graph, or eager where capture fails.

    ``captured(*inputs)`` copies ``inputs`` into static inputs, replays, and returns the static
    outputs (overwritten by the next call), like ``opbench.parallel.CapturedSchedule``. On the CPU it calls
    the module.
    """

    def __init__(self, model: Any, inputs: Sequence[Any]) -> None:
        import torch

        self.model = model
        self.static_inputs = [x.detach().clone() for x in inputs]
        self.graph: Any = None
        self.reason = ""
        self.outputs: Any = None
        self.is_cuda = bool(self.static_inputs) and self.static_inputs[0].device.type == "cuda"
        if self.is_cuda:
            def launch(stream: Any) -> Any:
                with torch.no_grad():
                    return model(*self.static_inputs)

            try:
                captured = capture_graph(launch, warmup=3)
                self.graph, self.outputs = captured, captured.result
            except Exception as err:  # data-dependent code, host syncs: run it eagerly
                first = first_line(err)
                self.reason = f"cannot be captured in a CUDA Graph ({first})"
                log.info("the model %s; its baseline runs eagerly", self.reason)

    @property
    def label(self) -> str:
        return MODEL_ROW if self.graph is not None else MODEL_ROW_EAGER

    def run_once(self) -> Any:
        """One run on the static inputs (a replay, or an eager call)."""
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        import torch

        with torch.no_grad():
            return self.model(*self.static_inputs)

    def __call__(self, *inputs: Any) -> Any:
        if self.graph is None:
            import torch

            with torch.no_grad():
                return self.model(*like(inputs, self.static_inputs))
        for dst, src in zip(self.static_inputs, inputs, strict=True):
            dst.copy_(src)
        return self.run_once()


def compile_variants(compiled: bool | Sequence[str] | None, kernels: str) -> tuple[str, ...]:
    """The torch.compile rows of a comparison: ``compiled`` None means both variants with fused kernels and none
    with ATen kernels, True both, False none, or the named :data:`COMPILE_VARIANTS`."""
    from ..errors import OpBenchError

    if compiled is None:
        compiled = kernels == "fused"
    if isinstance(compiled, bool):
        return COMPILE_VARIANTS if compiled else ()
    variants = tuple(compiled)
    unknown = [v for v in variants if v not in COMPILE_VARIANTS]
    if unknown:
        raise OpBenchError(f"unknown torch.compile variant {unknown[0]!r} (accepted: {', '.join(COMPILE_VARIANTS)}, "
                           "or True/False)")
    return variants


def compiled_baselines(model: Any, inputs: Sequence[Any], variants: Sequence[str]) -> list[CompiledModel]:
    """One :class:`CompiledModel` per variant (:func:`compile_variants`), each built and warmed up (its
    ``compile_s`` says how long that took)."""
    out = []
    for variant in variants:
        log.info("compiling the model with torch.compile%s (the %s row)", " and combo kernels" * (variant == "combo"),
                 COMBO_ROW if variant == "combo" else COMPILE_ROW)
        out.append(CompiledModel(model, inputs, combo=variant == "combo"))
    return out


class CompiledModel:
    """The user's module compiled by ``torch.compile`` (``mode="reduce-overhead"``: Inductor's fused
    kernels in its own CUDA Graphs), a baseline beside the model's own graph.

    Built and warmed up at once (``compile_s`` says how long that took); ``run_once()`` runs it on the
    static inputs, ``compiled(*inputs)`` on new ones. Its outputs are PyTorch's (overwritten by a
    later run, as with its CUDA Graphs).
    """

    def __init__(self, model: Any, inputs: Sequence[Any], mode: str = "reduce-overhead", warmup: int = 3,
                 combo: bool = False) -> None:
        import time

        import torch

        self.model = model
        self.label = COMBO_ROW if combo else COMPILE_ROW
        self.static_inputs = [x.detach().clone() for x in inputs]
        self.is_cuda = bool(self.static_inputs) and self.static_inputs[0].device.type == "cuda"
        start = time.perf_counter()
        if combo:  # the mode's own options (CUDA Graphs for reduce-overhead) and horizontal fusion
            from torch._inductor import list_mode_options

            self.compiled = torch.compile(model, options={**list_mode_options(mode), "combo_kernels": True})
        else:
            self.compiled = torch.compile(model, mode=mode)
        with torch.no_grad():
            for _ in range(max(1, warmup)):
                self.outputs = self.compiled(*self.static_inputs)
        if self.is_cuda:
            torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - start

    def run_once(self) -> Any:
        import torch

        with torch.no_grad():
            return self.compiled(*self.static_inputs)

    def __call__(self, *inputs: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.compiled(*like(inputs, self.static_inputs))
