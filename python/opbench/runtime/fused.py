"""Compiler-fused regions as kernels: a torch model cut into regions, each compiled by PyTorch's
Inductor, launched one region at a time on the streams a schedule gives.

:class:`FusedBackend` traces the model into a ``torch.fx`` graph (``torch.fx`` where it can, else
``torch.export``), cuts it into regions (:mod:`opbench.ir.regions`), splits the graph into one
submodule per region (``torch.fx.passes.split_module``) and compiles each with Inductor ahead of time
(:class:`RegionCompiler`: the region traced to ATen operators with its parameters as inputs, then
``torch._inductor.standalone_compile``; ``torch.compile(region, fullgraph=True)`` where that fails):
Inductor's kernels, without CUDA Graphs of its own, so that the executor captures every region of every
stream in one CUDA Graph. Regions of identical structure compile once, and the compiled code is kept
(``$OPBENCH_CACHE/regions``), so that a second build, in this process or a new one, loads it: no Dynamo,
no compile. With ``merge``, IOS's merge is written into the traced graph before it is
cut (:func:`opbench.ir.torch_graph.merge_into_graph`): sibling convolutions that read one input become
one wider convolution that Inductor compiles into its region, so fewer and larger kernels run. On a GPU, each
convolution -> eval batch norm -> ReLU chain becomes one cuDNN call before the cut
(:func:`opbench.ir.conv_relu.fuse_conv_relu`), which Inductor runs as an external kernel. A region
Inductor cannot compile runs its ATen operators, logged once.
To the schedulers and the executor the regions are ordinary operators: it is a
:class:`~opbench.runtime.backend.TorchBackend` over the split graph.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import OpBenchError, first_line
from ..ir.conv_relu import conv_bias_relu_op, fuse_conv_relu
from ..ir.depthwise import (
    auto_depthwise,
    check_depthwise,
    depthwise_taps,
    grouped_convolutions,
    unfold_depthwise,
)
from ..ir.regions import CUTS, cut_regions, fx_operator_dag, region_of, split_heavy
from ..ir.torch_graph import fx_module, merge_into_graph
from ..utils import written_whole
from .backend import TorchBackend

log = logging.getLogger(__name__)


#: the version of how a region is compiled and stored (a part of each stored region's key)
REGION_FORMAT = 1
#: the fewest structures to compile for which worker processes start. Starting one costs seconds (an import of
#: torch and a CUDA context; on an H100 host, workers took 18 s for three structures), but the build never waits
#: for them (it compiles from the first while they compile from the last), so a few are enough: resnet-50's 13
#: structures, compiled here alone, took 1.43x a cold torch.compile (16.3 vs 11.4 s, H200 host)
WORKERS_FROM = 6
#: how many times the regions handed other strides than their code's are found in one run of the split graph and
#: compiled again together (:func:`_compile_for_handed_strides`), before a last run compiles any left one by one
STRIDE_PASSES = 2
#: whether the workers fed from a queue (:data:`WORKERS_QUEUE`) for the regions' first compiles stay for those
#: compiled again for the strides handed (:attr:`RegionCompiler.keep_workers`), instead of ending before them
KEEP_WORKERS = True
#: structures compiled here first, one at a time, until the last ``PROBES`` of them took over ``COLD_S`` seconds
#: each on average (Inductor's caches cold for them; :func:`_workers_due`), when workers start for the rest; warm, a
#: structure compiles here in 0.1-0.3 s, cold 0.6-1.5 s; workers took 16 s for googlenet's 42 (H100 host)
PROBES, COLD_S = 2, 0.5
#: the artifact key of an index entry that says its region computes nothing (:func:`_no_operators`): a later
#: build runs such a region as it is, without tracing it to ATen to find that out again
NO_OPERATORS = "no_operators"
#: how far (relative norm) a region found through its quick key may be from the region's own outputs: Inductor's
#: rounding differs from eager's by far less; code of another region by far more
CLOSE = 5e-2
#: the fewest traced operators of a region that ``FusedBackend(combo=True)`` compiles a second time with Inductor's
#: horizontal fusion (``combo_kernels``), to be timed against its default code. Combo kernels join kernels that do
#: not depend on each other: a region of the branches cut is a series of operators between forks and joins, so only
#: a long one holds such kernels (densenet121's one region of 431 operators: the copies into its concatenations);
#: a short one would cost a compile and find nothing
COMBO_FROM = 32
#: the layouts a region's convolutions may be compiled in: ``inductor``, Inductor's own choice (its
#: ``layout_optimization``: channels-last around convolutions), or ``pytorch``, the layout the model's tensors have
#: (for most models contiguous). Channels-last, PyTorch sends grouped (depthwise) convolutions to cuDNN, whose plans
#: for them take seconds to make in each new process (the first run of a later build's loaded regions:
#: mobilenet_v3_large and nasnet, 2.3-2.7 s of a 5.3-7.9 s rebuild, H200); in their own layout its own depthwise
#: kernels run them, which need no plan (rebuilds of 2.2-5.0 s), at a cost in speed (2-5 %, same models)
LAYOUTS = ("inductor", "pytorch")
#: the layout regions are compiled in unless asked otherwise (and that of a schedule saved before layouts); keys and
#: cache keys name only another one, so that code stored before layouts is found again
DEFAULT_LAYOUT = LAYOUTS[0]
#: how regions run depthwise convolutions unless asked otherwise: ``auto`` (:data:`opbench.ir.depthwise.AUTO_TAPS`)
DEFAULT_DEPTHWISE = "auto"
#: how the regions of a schedule saved before the choice ran them: PyTorch's convolution
SAVED_DEPTHWISE = "aten"
#: the most a region of a new cut weighs (:func:`_compile_weights`: one per operator, a depthwise convolution
#: unfolded one per tap) when its depthwise convolutions are unfolded (``FusedBackend(depthwise="taps")``): a heavier
#: one is cut into consecutive pieces (:func:`opbench.ir.regions.split_heavy`) that worker processes compile at
#: once. Inductor's compile time grows with the loads of a kernel, and a network without branches is one region of
#: the branches cut, which one process compiled alone: mobilenet_v3_large's 187 operators with 15 unfolded depthwise
#: convolutions (weight 403) took 25.8 s whole and 18.8 s as the eight pieces of this limit, workers compiling four
#: (empty Inductor caches, H200, 16 cores; ``scripts/bench_fused.py --piece-ops``), its schedule as fast (0.345 ms)
PIECE_OPS = 56
#: the longest a build waits for a worker's combo-kernel code (:meth:`RegionCompiler.start`) before it compiles
#: that code itself (a cold compile of densenet121's one region takes 21-23 s)
WAIT_S = 300.0
#: whether a later build (every region's code stored or shared: nothing to compile) loads the regions' code in a
#: thread of its own (:meth:`RegionCompiler._load_ahead`) while this thread makes cuDNN's plans for the convolutions
#: that code calls (:func:`make_plans`, from what the build that stored it saw: :class:`ConvolutionsSeen`) and then
#: runs each loaded region once. A plan takes long to make for a grouped convolution channels-last, seconds in all
#: on nasnet, in C++ without the GIL, while loading is Python (and the first load imports Inductor's runtime): the
#: two overlap. Plans and runs stay on this thread: PyTorch keeps cuDNN's plans per thread, so plans made on another
#: one would be made again here (a later build of nasnet that ran its regions on a thread of their own took 6.5 s
#: against 5.0 s, H200)
LOAD_WHILE_RUNNING = True
#: whether a build whose regions' quick keys find at least :data:`WORKERS_FROM` structures unknown to the store
#: starts its worker processes at once (:meth:`RegionCompiler._spawn_workers`), so that their import of torch and
#: Inductor and their CUDA context overlap this process's tracing of the regions to ATen and its first compiles,
#: which decide whether they are needed (:func:`_workers_due`); those not needed end unused
START_WORKERS_EARLY = True
#: what a region compile worker writes on its standard error when it has imported torch and Inductor and when it
#: has its share (each with the time, epoch seconds), and when it has compiled and stored a structure (with the
#: seconds it took, then the time): :attr:`RegionCompiler.seconds` and :attr:`RegionCompiler.timeline`
WORKER_STARTED, WORKER_READY, WORKER_COMPILED = "started", "ready", "compiled"
#: how the structures are handed to the workers (:meth:`RegionCompiler._start_workers`): False, in shares, all at
#: once; True, from a queue, one at a time to whichever worker is free, this process taking from its front
WORKERS_QUEUE = True
#: whether the workers take the structures from the queue heaviest first (most ATen operators; a long compile
#: started last sets the build's end: shufflenet_v2_x1_0's two longest took 5.6 and 6.4 s in a worker, and this
#: process waited for them), instead of from the last in build order; this process still builds in order, taking
#: what no worker has taken. Off: measured no faster (``scripts/exp_cold_build.py``, shufflenet_v2_x1_0 at batch 8
#: in bfloat16 on an H200, 3 cold builds each: 16.1-18.2 s against 15.5-18.0 s in build order)
WORKERS_HEAVIEST_FIRST = False
#: Inductor's compile threads in each worker started once this process's first compiles turned slow (the pieces of
#: a heavy region, started at once, get their share of the cores instead)
WORKER_THREADS = 1


class RegionCall:
    """A region compiled ahead of time: Inductor's code for the region's ATen operators, called with the
    region's inputs and then its parameters and buffers. They are passed, not baked into the code, so that
    regions of one structure (a network's repeated cells) share one compiled artifact.

    The code was compiled for its example inputs' strides (``inputs``: those of the eager run) and asserts
    them, while a region's producers are compiled regions too, whose outputs Inductor may lay out otherwise
    (padded strides, a contiguous tensor where eager returned a view): an input tensor whose strides differ,
    alone or inside a tuple or list (a ``chunk``'s outputs passed on whole), is copied into the strides the
    code expects; :attr:`copies` counts those copies over every call (a CUDA Graph captures them once).

    Compiled code takes its inputs flat, a tuple's tensors one by one (its ATen graph's placeholders,
    :func:`_aten_graph`), and so does the ATen graph that a region computing nothing runs."""

    def __init__(self, artifact: Any, tensors: Sequence[Any], spec: Any, inputs: Sequence[Any] = ()) -> None:
        import torch

        self.artifact, self.tensors, self.spec = artifact, list(tensors), spec
        leaves = torch.utils._pytree.tree_leaves(list(inputs))
        self.strides = [tuple(x.stride()) if isinstance(x, torch.Tensor) else None for x in leaves]
        # inputs that are all tensors need no flattening on each call
        self.flat = len(leaves) == len(inputs) and all(isinstance(x, torch.Tensor) for x in inputs)
        self.copies = 0

    def __call__(self, *inputs: Any) -> Any:
        import torch

        if self.flat:
            inputs = tuple(self._restrided(x, stride) for x, stride in zip(inputs, self.strides, strict=True))
        else:
            leaves = torch.utils._pytree.tree_leaves(list(inputs))
            inputs = tuple(self._restrided(x, stride) for x, stride in zip(leaves, self.strides, strict=True))
        return torch.utils._pytree.tree_unflatten(list(self.artifact(*inputs, *self.tensors)), self.spec)

    def differs(self, inputs: Sequence[Any]) -> bool:
        """Whether some tensor of ``inputs`` (this region's, as a call passes them) has other strides than the
        code was compiled for."""
        import torch

        leaves = torch.utils._pytree.tree_leaves(list(inputs))
        return len(leaves) == len(self.strides) and not all(
            _strides_match(x, stride) for x, stride in zip(leaves, self.strides, strict=True))

    def _restrided(self, x: Any, stride: tuple[int, ...] | None) -> Any:
        """``x``, or a copy of it in ``stride`` when its own strides differ (a size-1 dimension's stride aside)."""
        import torch

        if _strides_match(x, stride):
            return x
        self.copies += 1
        out = torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device)
        out.copy_(x)
        return out


def _strides_match(x: Any, stride: tuple[int, ...] | None) -> bool:
    """Whether ``x`` is not a tensor, or has ``stride`` (or no expected ``stride``), a size-1 dimension's stride
    aside (Inductor's check skips those)."""
    import torch

    return stride is None or not isinstance(x, torch.Tensor) or all(
        a == b or n == 1 for a, b, n in zip(x.stride(), stride, x.shape, strict=True))


def _state_items(region: Any) -> list[tuple[str, Any]]:
    """``region``'s parameters and buffers by name, in the order a compiled region takes them after its inputs."""
    return list(region.named_parameters()) + list(region.named_buffers())


def _state(region: Any) -> tuple[list[str], list[Any]]:
    """The names of ``region``'s parameters and buffers, and the tensors (detached), in :func:`_state_items`'s
    order."""
    items = _state_items(region)
    return [k for k, _ in items], [v.detach() for _, v in items]


def _aten_graph(region: Any, inputs: Sequence[Any], names: Sequence[str], tensors: Sequence[Any]) -> tuple[Any, Any]:
    """``region`` traced to ATen operators (fake tensors: nothing runs) as a function of its inputs' tensors (a
    tuple's one by one) and then its parameters and buffers (``names``, ``tensors``: :func:`_state`), returning a
    flat tuple; with the outputs' tree structure.

    Every placeholder is one tensor, so that the graph means the same after pickling (a worker's copy): traced with
    a tuple as one input, its code took the tuple apart in a wrapper that pickling drops, and a worker took the
    tuple's first tensor for the tuple (shufflenet_v2_x1_0's regions after its channel split)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, tree = torch.utils._pytree.tree_flatten(list(inputs))
    spec: list[Any] = []

    def flat(*values: Any) -> tuple[Any, ...]:
        args = torch.utils._pytree.tree_unflatten(list(values[:len(leaves)]), tree)
        out = torch.func.functional_call(region, dict(zip(names, values[len(leaves):], strict=True)), tuple(args))
        outs, out_tree = torch.utils._pytree.tree_flatten(out)
        spec[:] = [out_tree]
        return tuple(outs)

    with torch.no_grad():
        graph = make_fx(flat, tracing_mode="fake")(*leaves, *tensors)
    return graph, spec[0]


def _no_operators(graph: Any) -> bool:
    """Whether an ATen graph computes nothing from its inputs: each output is an input, a view of one (an
    identity, a dropout in eval mode, a ``view``), or made from no input at all (BERT's position ids: an
    ``arange`` and views of it). Inductor's graph then has no outputs and its artifact cannot be stored (every
    later build compiled it again), so the graph itself is the region's code."""
    import operator

    import torch

    computes: dict[Any, bool] = {}  # node -> whether it computes from an input through more than views
    reads: dict[Any, bool] = {}  # node -> whether it depends on an input at all
    for node in graph.graph.nodes:
        args = node.all_input_nodes
        if node.op == "placeholder":
            computes[node], reads[node] = False, True
        elif node.op == "call_function" and (node.target is operator.getitem or (
                isinstance(node.target, torch._ops.OpOverload) and node.target.is_view)):
            computes[node], reads[node] = any(computes[a] for a in args), any(reads[a] for a in args)
        elif node.op == "output":
            return not any(computes[a] for a in args)
        else:  # an operator that computes (an input's values, or values of its own)
            reads[node] = any(reads[a] for a in args)
            computes[node] = reads[node] or node.op in ("call_module", "call_method")
    return True


def _has_constants(graph: Any) -> bool:
    """Whether an ATen graph reads tensors of its own (baked into its compiled code, which is then not stored)."""
    return any(n.op == "get_attr" for n in graph.graph.nodes)


def _workers_due(seconds: Sequence[float], left: int, probes: int = PROBES) -> bool:
    """Whether worker processes should compile the ``left`` structures not built yet, after this process compiled
    structures that took ``seconds`` each: the last ``probes`` (:data:`PROBES`) took over :data:`COLD_S` on
    average, and enough are left to be worth the workers' start (``WORKERS_FROM - probes``); with ``probes`` 0, at
    once when :data:`WORKERS_FROM` are left (structures known to compile for seconds: the pieces of a heavy
    region, :data:`PIECE_OPS`).

    A network whose first structures are quick (their code in Inductor's caches, or small) but whose later ones
    are not (nasnet with its depthwise convolutions unfolded: 36 structures compiled here alone in 39 s) still
    gets its workers, once the compiles turn slow."""
    if probes <= 0:
        return left >= WORKERS_FROM
    recent = seconds[-probes:]
    return len(recent) == probes and sum(recent) / probes > COLD_S and left >= WORKERS_FROM - probes


def check_piece_ops(piece_ops: int | None) -> int | None:
    """``piece_ops`` (``FusedBackend(piece_ops=)``) if it is None or a whole number from 0, else an error."""
    if piece_ops is not None and (type(piece_ops) is not int or piece_ops < 0):
        raise OpBenchError(f"piece_ops {piece_ops!r}: the most a region weighs before it is cut into pieces is a "
                           "whole number from 0 (0: no limit), or None for the default")
    return piece_ops


def _compile_weights(gm: Any, ops: Sequence[Any]) -> tuple[list[int], list[bool]]:
    """For each operator of ``gm`` (``ops``, its :func:`~opbench.ir.regions.fx_operator_dag`): its weight in a
    region's compile (one; an unfolded depthwise convolution one per tap of its kernel, each a load of Inductor's
    kernel) and whether a piece of a region may start at it (:func:`~opbench.ir.regions.split_heavy`: a
    convolution or linear module, or a fused convolution chain, whose input is read from memory by a library
    kernel in any case)."""
    import torch

    modules = dict(gm.named_modules())
    chain = conv_bias_relu_op()
    weights, starts = [], []
    for node in ops:
        weight = 1
        if node.op == "call_function" and node.target is depthwise_taps:
            kernel = gm.get_parameter(node.args[1].target).shape
            weight = int(kernel[2] * kernel[3])
        weights.append(weight)
        starts.append((node.op == "call_module" and isinstance(modules.get(node.target),
                                                                 (torch.nn.Conv2d, torch.nn.Linear)))
                      or (node.op == "call_function" and node.target is chain))
    return weights, starts


def check_layout(layout: str) -> str:
    """``layout`` when it is one of :data:`LAYOUTS`, else a one-line error naming those accepted."""
    if layout not in LAYOUTS:
        raise OpBenchError(f"unknown region layout {layout!r} (accepted: {', '.join(LAYOUTS)})")
    return layout


def _variant(combo: bool, layout: str) -> dict[str, Any]:
    """What a key adds for code compiled otherwise than by default: combo kernels, another layout."""
    return ({"combo": True} if combo else {}) | ({"layout": layout} if layout != DEFAULT_LAYOUT else {})


def _region_key(graph: Any, values: Sequence[Any], combo: bool = False, layout: str = DEFAULT_LAYOUT) -> str:
    """The stored artifact's key: the ATen graph's code, its values' metadata (:func:`_meta`), the device's name,
    the torch version and :data:`REGION_FORMAT`, and whether it was compiled with combo kernels or in another
    layout (:data:`LAYOUTS`)."""
    import torch

    from ..utils import digest

    return digest({"code": graph.code, "inputs": [_meta(x) for x in values], "device": _device_name(values),
                   "torch": torch.__version__, "format": REGION_FORMAT} | _variant(combo, layout))


def _meta(x: Any) -> Any:
    """A value as its key sees it: a tensor's shape, strides, offset (Inductor's code may assume aligned
    inputs), dtype and device kind; anything else its ``repr``."""
    import torch

    if not isinstance(x, torch.Tensor):
        return repr(x)
    return [list(x.shape), list(x.stride()), x.storage_offset(), str(x.dtype), str(x.device.type)]


def _device_name(values: Sequence[Any]) -> str:
    import torch

    cuda = next((x.device for x in values if isinstance(x, torch.Tensor) and x.device.type == "cuda"), None)
    return f"{torch.cuda.get_device_name(cuda)} {torch.cuda.get_device_capability(cuda)}" if cuda else "cpu"


#: where a region's ``call_function`` targets may come from for :func:`_quick_key` (a function of the user's could
#: change without its name changing)
_LIBRARY_FUNCTIONS = ("torch", "_operator", "operator", "math", "builtins", "_functools", "functools")
#: where this library's own functions come from, which a quick key names with a digest of their source (a graph
#: pass writes them into the traced graph: :func:`opbench.ir.depthwise.depthwise_taps`)
_OWN_FUNCTIONS = "opbench."


@functools.cache
def _source_digest(function: Any) -> str | None:
    """A digest of ``function``'s source code (None where it has none to read)."""
    import inspect

    from ..utils import digest

    try:
        return digest(inspect.getsource(function))
    except (OSError, TypeError):
        return None


#: plain settings of a module that its key includes besides its ``repr`` (which may leave some out)
_SETTINGS = (bool, int, float, str, tuple, type(None))


def _module_key(module: Any) -> list[Any]:
    """A module as a quick key sees it: for it and each of its submodules (by relative name), its type, mode and
    plain settings (``vars`` of bool, int, float, str, tuple or None; tensors are values of the region), then
    its ``repr``."""
    import torch

    return [[name, f"{type(m).__module__}.{type(m).__qualname__}", m.training,
             sorted((k, repr(v)) for k, v in vars(m).items()
                    if not k.startswith("_") and isinstance(v, (*_SETTINGS, torch.dtype, torch.device)))]
            for name, m in module.named_modules()] + [repr(module)]


def _quick_key(region: Any, values: Sequence[Any], combo: bool = False, layout: str = DEFAULT_LAYOUT) -> str | None:
    """A key of a region as traced by ``torch.fx``, computed without tracing it to ATen: its nodes in order, each
    with its operation, its target (a module by :func:`_module_key`, not by name, so that regions of one structure
    share a key; a function by its qualified name, one of this library's with a digest of its source) and its
    arguments (earlier nodes by position), and the metadata of its inputs, parameters and buffers. None for a
    region that calls a function outside torch, the standard library and this library. A later build finds
    through it the stored artifact of the region's ATen graph (:meth:`RegionCompiler.compile_all`), whose outputs
    are then checked against the region's, once for each key and build. ``combo``, ``layout``: the key of its
    code compiled with combo kernels, in that layout."""
    import torch
    from torch.fx.node import map_arg

    from ..utils import digest

    position = {node: i for i, node in enumerate(region.graph.nodes)}
    # where each parameter and buffer comes among the compiled region's arguments
    state = {id(t): i for i, (_, t) in enumerate(_state_items(region))}
    nodes = []
    for node in region.graph.nodes:
        if node.op == "call_module":
            module = region.get_submodule(node.target)
            if any(m._forward_hooks or m._forward_pre_hooks for m in module.modules()):
                return None  # hooks are code of the user's too
            target: Any = [_module_key(module), [state[id(t)] for t in (*module.parameters(), *module.buffers())]]
        elif node.op == "get_attr":  # a parameter or buffer; another tensor is a constant, whose value no key sees
            value = functools.reduce(getattr, node.target.split("."), region)
            if id(value) not in state:
                return None
            target = state[id(value)]
        elif node.op == "call_function":
            where = str(getattr(node.target, "__module__", None) or "")
            source = _source_digest(node.target) if where.startswith(_OWN_FUNCTIONS) else ""
            if source is None or not (source or where.startswith(_LIBRARY_FUNCTIONS)):
                return None
            target = f"{where}.{getattr(node.target, '__qualname__', getattr(node.target, '__name__', node.target))}"
            target += f"@{source}" if source else ""
        else:  # placeholder (by position), call_method (a method's name), output
            target = node.target if node.op == "call_method" else None
        arguments = map_arg((node.args, node.kwargs), lambda n: f"%{position[n]}")
        nodes.append([node.op, target, repr(arguments)])
    return digest({"nodes": nodes, "values": [_meta(x) for x in values], "device": _device_name(values),
                   "torch": torch.__version__, "format": REGION_FORMAT, "quick": 2} | _variant(combo, layout))


#: a region's parameter and buffer names, those tensors, the values its code is called with and its quick key
_Keyed = tuple[list[str], list[Any], list[Any], "str | None"]


@dataclasses.dataclass
class _Traced:
    """A region ready for its artifact: its ATen graph (None when found through the quick key), the values it is
    called with (inputs, then parameters and buffers), those tensors, its outputs' tree, the artifact's key and
    the quick key (None without)."""

    graph: Any
    values: list[Any]
    tensors: list[Any]
    spec: Any
    key: str
    quick: str | None


def torch_bytecode_found() -> bool:
    """Whether this process finds torch's Inductor modules compiled to bytecode (where ``sys.pycache_prefix``, or
    beside the sources, says): a usual install has it; without it, every new process compiles their sources."""
    import importlib.util
    import os

    import torch

    source = os.path.join(os.path.dirname(torch.__file__), "_inductor", "codecache.py")
    return os.path.exists(importlib.util.cache_from_source(source))


@functools.cache
def _say_no_bytecode() -> bool:
    """Say once per process (INFO) that torch's Inductor modules have no compiled bytecode here and Python may not
    write it (``PYTHONDONTWRITEBYTECODE``): every new process then compiles their sources again before it can
    load stored regions, seconds of a later build (2.3 s of shufflenet_v2_x1_0's on an H200). Returns whether
    it said so."""
    import sys

    if not sys.dont_write_bytecode or torch_bytecode_found():
        return False
    log.info("torch's modules have no compiled bytecode and Python may not write it (PYTHONDONTWRITEBYTECODE), "
             "so each new process compiles their sources before loading stored regions; unset it, or set "
             "PYTHONPYCACHEPREFIX to a folder you can write")
    return True


class RegionCompiler:
    """Compiles regions with Inductor, each structure once, and keeps the compiled code for later builds.

    A region is traced to ATen operators with its parameters as inputs (:func:`_aten_graph`) and compiled
    by ``torch._inductor.standalone_compile`` (no Dynamo: nothing to trace again or guard). The artifact is
    stored under ``folder`` by :func:`_region_key`, so that a later build of a region of the same structure,
    in this process or another, loads it instead of compiling. With ``jobs`` > 1, when many structures are not
    stored yet (:data:`WORKERS_FROM`) and those compiled here turn slow (:func:`_workers_due`: Inductor's caches
    cold), that many worker processes compile the rest from the last while this process compiles from the first
    (:meth:`_start_workers`; each compile is mostly single-threaded Python).
    A region that cannot be traced or compiled this way goes to ``torch.compile(fullgraph=True)``, and one
    Inductor cannot compile at all runs its ATen operators. With ``combo``, every region is compiled with Inductor's
    horizontal fusion (``combo_kernels``; keys of their own), and one that cannot be compiled so is left as it is,
    with the reason (no ``torch.compile`` of it). ``layout`` (:data:`LAYOUTS`): the layout of the regions'
    convolutions (keys of their own too). ``probes``: how many structures this process compiles before workers are
    decided on (:func:`_workers_due`); 0 starts them at once, for structures known to compile for seconds.

    Attributes
    ----------
    counts:
        How each region was built: ``compiled`` (here), ``compiled_by_workers``, ``loaded`` (stored by an
        earlier build), ``shared`` (a region of the same structure earlier in this build), ``no_operators`` (a
        region that computes nothing: :func:`_no_operators`; run as its ATen graph, or, found so by its quick key's
        entry in a later build, as it is), ``torch.compile``, ``aten``.
    seconds:
        Where the time went: ``trace`` (to ATen), ``workers`` (from their start to their end, wall, while this
        process built its regions), ``compile`` and ``load``
        (the artifacts), ``run`` (each region once, but once for each structure and quick key: a region
        sharing what an earlier one ran and checked is not run), ``torch.compile`` (regions that went that way);
        in a later build that loads ahead (:data:`LOAD_WHILE_RUNNING`), ``load`` is the thread of loads' and this
        thread's are ``plans`` (:func:`make_plans`) and ``load_waited`` (for a region's code not loaded yet).
        With workers: ``workers_started`` and ``workers_ready``, from a worker's start until it had imported torch
        and Inductor, and until it had its share (the slowest worker's), and ``workers_compiling``, the seconds
        all of them spent compiling what they stored.
    timeline:
        What happened when: (seconds since this compiler was made, what), in order once the workers ended: the
        workers' start, each structure compiled here or by a worker, each wait for a worker, the workers' end.
    """

    def __init__(self, folder: Any | None, jobs: int = 1, combo: bool = False, layout: str = DEFAULT_LAYOUT,
                 probes: int = PROBES) -> None:
        self.folder, self.jobs, self.combo, self.layout = folder, jobs, combo, check_layout(layout)
        self.probes = probes
        self.counts: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._built: dict[str, Any] = {}
        self._given: set[str] = set()  # structures handed to worker processes
        self._worker_of: dict[str, Any] = {}  # structure -> the worker process that compiles it
        self._pretraced: dict[str, _Traced | None] = {}  # region name -> traced by :meth:`start`
        self._waits = False  # whether this process waits for a worker's structure instead of compiling it too
        self._workers: list[tuple[Any, Any]] = []  # (process, its standard error)
        self._spawned: list[tuple[Any, Any]] = []  # workers started early, waiting for a share
        self._spawned_at: dict[Any, float] = {}  # worker process -> when it started (epoch seconds)
        self._workers_since = 0.0
        self._feeds: list[Any] = []  # the threads that hand the workers their structures
        self._queue: Any = None  # with :data:`WORKERS_QUEUE`: the structures no one has taken yet, in build order
        self._inflight: dict[str, Any] = {}  # structure -> the worker process compiling it from the queue
        self._one_at_a_time_queue = threading.Lock()  # the queue's and the structures in flight
        self._more = threading.Condition(self._one_at_a_time_queue)  # a structure queued, or the workers' end
        self._items: dict[str, bytes] = {}  # structure -> as a worker reads it (:func:`_message`)
        self._ending = False  # whether :meth:`_stop_workers` has begun: the workers take nothing more
        #: whether workers fed from the queue stay after :meth:`compile_all` for later calls of it, which queue
        #: their structures for them, until :meth:`_stop_workers` (the caller's) ends them
        self.keep_workers = False
        self._probed: dict[str, str] = {}
        self._refused: dict[str, Exception] = {}  # structure -> why a probe's compile of it failed
        self._checked: set[tuple[str, str | None]] = set()
        # quick key -> (artifact key, output spec) of its index entry, None without one: read once per build
        self._entries: dict[str, tuple[str, Any] | None] = {}
        self._remembered: set[str] = set()  # quick keys whose entry this build wrote
        self._one_at_a_time = threading.Lock()  # :meth:`_artifact`'s
        self._convolutions: dict[str, list[list[Any]]] = {}  # artifact key -> the convolutions its code calls
        self._born, self._born_epoch = time.perf_counter(), time.time()
        self.timeline: list[tuple[float, str]] = []  # (seconds since this compiler was made, what happened)

    def _count(self, how: str) -> None:
        self.counts[how] = self.counts.get(how, 0) + 1

    def _mark(self, what: str, at: float | None = None) -> None:
        """Note in :attr:`timeline` that ``what`` happened now (or ``at``, epoch seconds)."""
        when = time.perf_counter() - self._born if at is None else at - self._born_epoch
        self.timeline.append((round(when, 3), what))

    def _lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - since
        return now

    def _path(self, key: str) -> Any | None:
        return self.folder / f"{key}.bin" if self.folder is not None else None

    def _worth_a_worker(self, key: str, graph: Any) -> bool:
        """Whether a worker should compile this structure: it can be stored (no constants in its code, not
        found unstorable before) and is not stored yet."""
        path = self._path(key)
        return (path is not None and not path.is_file() and not path.with_suffix(".unstored").exists()
                and not _has_constants(graph) and not _no_operators(graph))

    def _artifact(self, graph: Any, values: list[Any], key: str) -> tuple[Any, str]:
        """The compiled artifact of ``graph`` (ATen, flat outputs) on ``values``, and how it came (a key of
        :attr:`counts`, counted by the caller once the region is built): shared, loaded or compiled. One thread
        at a time (:meth:`_load_ahead`'s, or this one's when a region's code must be found again)."""
        with self._one_at_a_time:
            return self._artifact_here(graph, values, key)

    def _artifact_here(self, graph: Any, values: list[Any], key: str) -> tuple[Any, str]:
        import torch

        if key in self._refused:  # a probe could not compile it: its regions go on without a second try
            raise self._refused[key]
        if key in self._built:  # a probe's (compiled before its region's turn) or one of this build
            nothing = graph is not None and _no_operators(graph)
            return self._built[key], "no_operators" if nothing else self._probed.pop(key, "shared")
        if graph is not None and _no_operators(graph):  # nothing to compile, load or store
            self._built[key] = graph
            return graph, "no_operators"
        path = self._path(key)
        # a graph of None was found stored: it has no constants
        constants = graph is not None and _has_constants(graph)
        artifact, how, clock = None, "compiled", time.perf_counter()
        queued = self._queue is not None  # from the queue: take it, or wait for the worker that has it
        worker = self._from_queue(key) if queued else self._worker_of.get(key) if self._waits else None
        waited = worker is not None
        while worker is not None and worker.poll() is None and not path.is_file() \
                and time.perf_counter() - clock < WAIT_S:  # a worker is compiling it (or will)
            time.sleep(0.05)
            worker = self._from_queue(key) if queued else worker
        if waited:
            self._mark(f"waited {time.perf_counter() - clock:.2f} s for {key[:8]}")
            clock = self._lap("waited", clock)
        if path is not None and not constants and path.is_file():
            try:
                artifact = torch._inductor.CompiledArtifact.load(path=str(path), format="binary")
                how = "compiled_by_workers" if key in self._given else "loaded"
                _say_no_bytecode()
            except Exception as err:  # another torch, a torn file: compile it again
                log.info("stored region %s not loaded (%s); compiling it", path.name, first_line(err))
            clock = self._lap("load", clock)
        if artifact is None:
            if graph is None:
                raise OpBenchError("its stored code could not be loaded")
            artifact = _standalone_compile(graph, values, self.combo, self.layout)
            how = "compiled"
            if path is not None and not constants:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # compiled code: ours alone
                    artifact.save(path=str(path), format="binary")  # written whole (write_atomic)
                except Exception as err:  # used, not kept; later builds compile it here, not in a worker
                    log.info("region not stored (%s)", first_line(err))
                    with contextlib.suppress(OSError):
                        path.with_suffix(".unstored").touch()
            self._mark(f"compiled {key[:8]} here in {time.perf_counter() - clock:.2f} s")
            self._lap("compile", clock)
        self._built[key] = artifact
        return artifact, how

    def start(self, regions: Sequence[tuple[str, Any, Sequence[Any], Any]]) -> None:
        """Trace ``regions`` (as :meth:`compile_all` takes them) and hand those not stored yet to worker processes
        now (``jobs`` > 1), each with a share of the cores for Inductor's compile threads, while this process
        builds other regions; a later :meth:`compile_all` of them waits for the workers' code instead of
        compiling it again (a second code of a long region: one structure, whose compile takes as long as the
        first's)."""
        import os

        self._pretraced = {name: self._trace(name, region, inputs) for name, region, inputs, _ in regions}
        todo = {t.key: (t.graph, t.values) for t in self._pretraced.values()
                if t is not None and t.graph is not None and self._worth_a_worker(t.key, t.graph)}
        if self.jobs > 1 and todo:
            self._waits = True
            workers = min(self.jobs, len(todo))
            self._start_workers(todo, threads=max(1, (os.cpu_count() or 2) // 2 // workers))

    def _spawn_workers(self, count: int, device: Any = None) -> None:
        """Start ``count`` worker processes now, before their shares are known: each imports torch and Inductor
        and makes its CUDA context on ``device`` meanwhile, then waits for its share (:meth:`_start_workers`),
        or ends with none (:meth:`_stop_workers`)."""
        import os
        import subprocess
        import sys
        import tempfile

        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds opbench
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        if not self._spawned and not self._workers:
            self._workers_since = time.perf_counter()
        for _ in range(count):
            errors = tempfile.TemporaryFile()
            proc = subprocess.Popen([sys.executable, "-c", "from opbench.runtime.fused import _worker; _worker()",
                                     str(device or "")], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE if WORKERS_QUEUE else subprocess.DEVNULL,
                                    stderr=errors, env=env)
            self._spawned.append((proc, errors))
            self._spawned_at[proc] = time.time()
        self._mark(f"{count} workers started")

    def _start_workers(self, todo: dict[str, tuple[Any, list[Any]]], threads: int = 1) -> None:
        """Hand ``jobs`` worker processes (those :meth:`_spawn_workers` started earlier, else new ones) the
        structures of ``todo`` (key -> ATen graph, values, in the order this process builds them) to compile and
        store, from its end, while this process builds its regions in order from the first, loading a structure
        a worker has stored by then: they meet in the middle. :meth:`_stop_workers` ends them once every region is
        built. ``threads``: each worker's Inductor compile threads.

        Two ways to hand them out (:data:`WORKERS_QUEUE`): in shares, each worker every ``jobs``-th structure
        counted from the last, all at once, and this process compiles what no worker has stored by the time it gets
        there (it never waits for a worker, whose start takes seconds); or from a queue, each ready worker the last
        structure nobody has taken, one at a time, and this process takes from the front what no worker has
        taken, and waits for what a worker is compiling.

        The workers are new interpreters (``python -c``) that read their graphs from a pipe: nothing of the
        caller's script runs again in them."""
        import collections

        items = self._pickled(todo)
        count = min(self.jobs, len(todo))
        if WORKERS_QUEUE:
            self._queue = collections.deque(_worker_order([key for key in todo if key in items], todo))
            self._ending = False
            shares: list[list[str]] = [[] for _ in range(count)]
        else:
            backwards = list(reversed(todo))
            shares = [backwards[i::self.jobs] for i in range(count)]
        device = next((v.device for _, values in todo.values() for v in values if hasattr(v, "device")), None)
        header = _message((self.combo, self.layout, threads))
        for share in shares:
            if any(key not in items for key in share):  # a share with a graph that cannot travel: all here
                continue
            # from the queue, each structure when a worker takes it
            payload = b"" if WORKERS_QUEUE else header + b"".join(items[key] for key in share) + _message(None)
            if not self._spawned:
                self._spawn_workers(1, device)
            proc, errors = self._spawned.pop(0)
            self._workers.append((proc, errors))
            self._given.update(share)
            self._worker_of.update((key, proc) for key in share)
            feed = functools.partial(self._dispatch, proc, header) if WORKERS_QUEUE else \
                functools.partial(_write_all, proc, payload)
            self._feeds.append(threading.Thread(target=feed, name="region-workers-feed", daemon=True))
        # those started early and not needed: their standard input closed, they end
        for proc, _ in self._spawned:
            self._feeds.append(threading.Thread(target=_write_all, args=(proc, b""), daemon=True))
        self._workers += self._spawned
        self._spawned = []
        for thread in self._feeds:
            thread.start()
        self._mark(f"{len(items)} structures handed to {count} workers")

    def _pickled(self, todo: dict[str, tuple[Any, list[Any]]]) -> dict[str, bytes]:
        """Each structure of ``todo`` as a worker reads it, kept in ``_items``; those that cannot travel are left
        out (compiled here)."""
        items: dict[str, bytes] = {}
        for key, (graph, values) in todo.items():
            try:
                items[key] = _message((key, graph, _specs(values), str(self._path(key))))
            except Exception as err:  # graphs that cannot travel are compiled here
                log.info("regions compiled here: %s", first_line(err))
        self._items.update(items)
        return items

    def _enqueue(self, todo: dict[str, tuple[Any, list[Any]]]) -> None:
        """Queue the structures of ``todo`` for the workers kept from an earlier :meth:`compile_all`
        (:attr:`keep_workers`), in build order: they take from the end, this process from the front."""
        items = self._pickled(todo)
        with self._more:
            self._queue.extend(_worker_order([k for k in todo if k in items and k not in self._queue], todo))
            self._more.notify_all()
        self._mark(f"{len(items)} structures queued for the workers kept")

    def _from_queue(self, key: str) -> Any:
        """The worker compiling ``key`` from the queue (:data:`WORKERS_QUEUE`), or, where this process waits for
        workers (:meth:`start`) and ``key`` is still queued, any worker alive (one will take it); else None, with
        ``key`` taken out of the queue for this process to compile."""
        with self._one_at_a_time_queue:
            if key in self._inflight:
                return self._inflight[key]
            if self._waits and key in self._queue:
                alive = self._alive_worker()
                if alive is not None:
                    return alive
            with contextlib.suppress(ValueError):
                self._queue.remove(key)
            return None

    def _alive_worker(self) -> Any | None:
        """A worker process still running, or None."""
        return next((proc for proc, _ in self._workers if proc.poll() is None), None)

    def _dispatch(self, proc: Any, header: bytes) -> None:
        """Feed worker ``proc`` from the queue (:data:`WORKERS_QUEUE`): its settings, and once it is ready, the
        last structure nobody has taken, then the next when it is done with that, until the queue is empty (with
        :attr:`keep_workers`, until :meth:`_stop_workers`: it waits for more) or the worker ends."""
        def said(word: str) -> bool:  # whether the worker said it (False: it ended first)
            while line := proc.stdout.readline():  # other lines: what a library printed
                if line.strip() == word.encode():
                    return True
            return False

        try:
            proc.stdin.write(header)
            proc.stdin.flush()
            if not said(WORKER_READY):
                return
            while True:
                with self._more:
                    while self.keep_workers and not self._queue and not self._ending:
                        self._more.wait()
                    key = self._queue.pop() if self._queue and not self._ending else None
                    if key is None:
                        break
                    self._inflight[key] = proc
                self._given.add(key)
                self._worker_of[key] = proc
                try:
                    proc.stdin.write(self._items[key])
                    proc.stdin.flush()
                    done = said(key)
                finally:
                    with self._one_at_a_time_queue:
                        self._inflight.pop(key, None)
                if not done:  # it ended
                    return
            proc.stdin.write(_message(None))
        except (OSError, ValueError):  # it ended, or was ended
            pass
        finally:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()

    def _stop_workers(self) -> None:
        """End the workers (what they have not stored by now was compiled here), and those started early that got
        no share, and remove what a worker ended in the middle of a write left behind."""
        with self._more:  # those waiting for more (:attr:`keep_workers`): none comes
            self._ending = True
            self._more.notify_all()
        unused, self._spawned = self._spawned, []
        for proc, errors in unused:
            proc.kill()
            proc.wait()
            errors.close()
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError, AttributeError):
                    pipe.close()
        if unused and not self._workers:
            log.info("%d region compile workers started early were not needed (the structures compiled quickly "
                     "here)", len(unused))
        if not self._workers:
            return
        for proc, _ in self._workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for thread in self._feeds:  # their writes to the ended workers fail at once
            thread.join()
        self._feeds, self._inflight, self._items = [], {}, {}  # a later start hands its structures anew
        for proc, _ in self._workers:
            if proc.stdout is not None:
                proc.stdout.close()
        since: dict[str, list[float]] = {WORKER_STARTED: [], WORKER_READY: []}
        busy = 0.0
        for proc, errors in self._workers:
            errors.seek(0)
            text = errors.read().decode(errors="replace")
            said = [t for t in text.splitlines() if t.startswith("region ")]
            compiles: list[tuple[float, float]] = []  # each structure it stored: its seconds, when it was done
            report = _worker_report(text, compiles)
            busy += report.get(WORKER_COMPILED, 0.0)
            for seconds_taken, done in compiles:
                self._mark(f"worker {proc.pid} compiled in {seconds_taken:.2f} s", done)
            for word, seconds in since.items():
                if word in report and proc in self._spawned_at:
                    seconds.append(report[word] - self._spawned_at[proc])
            if said:
                log.info("a region compile worker could not compile a structure (%s); it was compiled here",
                         said[-1][:300])
            errors.close()
            for torn in self.folder.glob(f".{proc.pid}.*.tmp"):  # Inductor's write_atomic, stopped mid-way
                with contextlib.suppress(OSError):
                    torn.unlink()
        self._lap("workers", self._workers_since)
        self._mark("workers ended")
        self.timeline.sort()
        # the slowest worker's start (to torch imported, and to its share in hand), the seconds all compiled
        for word, seconds in since.items():
            if seconds:
                self.seconds[f"workers_{word}"] = self.seconds.get(f"workers_{word}", 0.0) + max(seconds)
        self.seconds["workers_compiling"] = self.seconds.get("workers_compiling", 0.0) + busy
        log.info("%d region structures compiled by %d workers, %d here, in %.1f s", self.counts.get(
            "compiled_by_workers", 0), len(set(self._worker_of.values())), self.counts.get("compiled", 0),
            self.seconds["workers"])
        self._workers = []

    def _index(self, quick: str | None) -> Any | None:
        return self.folder / "index" / f"{quick}.json" if quick is not None and self.folder is not None else None

    def _entry(self, name: str, quick: str | None) -> tuple[str, Any] | None:
        """The stored artifact's key and output spec that ``quick``'s index entry points at (None without a
        usable entry); regions of one structure share it, so it is read once per build."""
        import torch

        index = self._index(quick)
        if index is None:
            return None
        if quick not in self._entries:
            self._entries[quick] = None
            try:
                if index.is_file():
                    found = json.loads(index.read_text())
                    if found["key"] == NO_OPERATORS:
                        self._entries[quick] = (NO_OPERATORS, None)
                    elif self._path(found["key"]).is_file():
                        self._entries[quick] = (found["key"], torch.utils._pytree.treespec_loads(found["spec"]))
                        if isinstance(found.get("convolutions"), list):
                            self._convolutions.setdefault(found["key"], found["convolutions"])
            except (OSError, ValueError, KeyError, TypeError) as err:  # a torn or foreign entry: trace again
                log.info("region %s: index entry not used (%s)", name, first_line(err))
        return self._entries[quick]

    def _keyed(self, name: str, region: Any, inputs: Sequence[Any]) -> _Keyed:
        """The region's parameter and buffer names, those tensors, the values its code is called with (inputs, then
        parameters and buffers) and its quick key (None without a store, or when it has none)."""
        import torch

        clock = time.perf_counter()
        names, tensors = _state(region)
        # flat: a tuple's tensors one by one, as the compiled code takes them (keys see their metadata, never a
        # tuple's repr, which would hold the tensors' values)
        values = [*torch.utils._pytree.tree_leaves(list(inputs)), *tensors]
        try:
            quick = _quick_key(region, values, self.combo, self.layout) if self.folder is not None else None
        except Exception as err:  # a module whose repr fails, say: no quick key
            quick = None
            log.debug("region %s: no quick key (%s)", name, first_line(err))
        self._lap("trace", clock)
        return names, tensors, values, quick

    def _trace(self, name: str, region: Any, inputs: Sequence[Any],
               keyed: _Keyed | None = None) -> _Traced | None:
        """The region ready for its artifact: found through its quick key when a build stored it, else traced
        to ATen; None when it cannot be traced (then Dynamo's way). ``keyed``: :meth:`_keyed`'s, when computed
        already."""
        names, tensors, values, quick = keyed or self._keyed(name, region, inputs)
        found = self._entry(name, quick)
        if found is not None:
            return _Traced(None, values, tensors, found[1], found[0], quick)
        clock = time.perf_counter()
        try:
            graph, spec = _aten_graph(region, inputs, names, tensors)
            return _Traced(graph, values, tensors, spec, _region_key(graph, values, self.combo, self.layout), quick)
        except Exception as err:  # not traceable to ATen: Dynamo's way
            log.debug("region %s: not traced to ATen (%s); using torch.compile", name, first_line(err))
            return None
        finally:
            self._lap("trace", clock)

    def compile_all(self, regions: Sequence[tuple[str, Any, Sequence[Any], Any]]) -> dict[str, tuple[Any, str | None]]:
        """Each ``(name, region, inputs, outputs)`` (``outputs``: the region's own on ``inputs``) compiled, the code
        of each structure (and quick key) run once on its region's inputs: name -> (callable, None), or (the
        region itself, why) when Inductor cannot compile it (see the class docstring)."""
        import os

        keyed = {name: self._keyed(name, region, inputs) for name, region, inputs, _ in regions
                 if name not in self._pretraced}
        # the structures no index entry knows, as far as quick keys tell (a region without one counts alone)
        unknown = {k[3] or name for name, k in keyed.items() if self._entry(name, k[3]) is None}
        if START_WORKERS_EARLY and self.jobs > 1 and self.folder is not None and len(unknown) >= WORKERS_FROM \
                and not self._workers and not self._spawned:
            self._spawn_workers(min(self.jobs, len(unknown)), _device_of(regions))
        self._mark(f"{len(regions)} regions keyed, {len(unknown)} structures not stored")
        traced = {name: self._pretraced[name] if name in self._pretraced else self._trace(name, region, inputs,
                                                                                          keyed[name])
                  for name, region, inputs, _ in regions}
        self._mark("traced")
        todo = {t.key: (t.graph, t.values) for t in traced.values()
                if t is not None and t.graph is not None and self._worth_a_worker(t.key, t.graph)}
        if todo and self._kept():  # workers kept from an earlier call: they take from the queue
            self._enqueue(todo)
        elif self.jobs > 1 and len(todo) >= WORKERS_FROM and not self._workers:
            # here first, one at a time: with Inductor's caches warm a structure compiles here in a fraction of a
            # second, less than a worker takes to start; once they take seconds, workers compile the rest
            seconds: list[float] = []
            for key in list(todo):
                if _workers_due(seconds, len(todo), self.probes):
                    # structures known to be heavy: each worker as many compile threads as its share of the cores
                    self._start_workers(todo, WORKER_THREADS if self.probes else max(1, (os.cpu_count() or 2) // min(
                        self.jobs, len(todo))))
                    break
                clock = time.perf_counter()
                graph, values = todo.pop(key)
                try:
                    self._probed[key] = self._artifact(graph, values, key)[1]
                except Exception as err:  # raised again, not compiled again, where the region is built
                    self._refused[key] = err
                seconds.append(time.perf_counter() - clock)
        pool = None
        try:
            ahead: dict[str, Any] = {}
            if LOAD_WHILE_RUNNING and regions and all(self._ready(t) for t in traced.values()):
                pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="opbench-region-loads")
                ahead = self._load_ahead(regions, traced, pool)
                clock = time.perf_counter()
                calls = {json.dumps(c): c for t in traced.values() for c in self._convolutions.get(t.key, ())}
                make_plans(list(calls.values()), _device_of(regions))  # each once: a plan is made once
                self._lap("plans", clock)
                if ahead:  # the first load imports what loading needs: nothing here meanwhile
                    next(iter(ahead.values())).exception()
            return {name: self._one(name, region, inputs, outputs, traced[name], ahead.get(name))
                    for name, region, inputs, outputs in regions}
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if not self._kept():
                self._stop_workers()

    def _kept(self) -> bool:
        """Whether workers fed from the queue are kept (:attr:`keep_workers`) and alive to take more structures."""
        return self.keep_workers and self._queue is not None and not self._ending and self._alive_worker() is not None

    def _ready(self, traced: _Traced | None) -> bool:
        """Whether the region's code is there without compiling: stored, built earlier in this build, or none
        needed (it computes nothing)."""
        if traced is None:  # torch.compile's way
            return False
        if traced.key == NO_OPERATORS or traced.graph is None or traced.key in self._built:
            return True
        path = self._path(traced.key)
        return _no_operators(traced.graph) or (path is not None and path.is_file() and not _has_constants(
            traced.graph))

    def _load_ahead(self, regions: Sequence[tuple[str, Any, Sequence[Any], Any]], traced: dict[str, _Traced | None],
                    pool: Any) -> dict[str, Any]:
        """Every region's code handed to ``pool``'s one thread to load, in order: name -> the future of
        :meth:`_artifact`'s (artifact, how). The first load imports what loading needs; the caller imports nothing
        until it is done (two threads importing one module can deadlock)."""
        return {name: pool.submit(self._artifact, traced[name].graph, traced[name].values, traced[name].key)
                for name, _, _, _ in regions if traced[name] is not None and traced[name].key != NO_OPERATORS}

    @staticmethod
    def _check(call: RegionCall, inputs: Sequence[Any], outputs: Any, compare: bool) -> None:
        """Run ``call`` once on ``inputs`` and, with ``compare``, raise when its outputs are not close to
        ``outputs``."""
        import torch

        with torch.no_grad():
            got = call(*inputs)
        if compare and not _close(got, outputs):  # found by a quick key that misled
            raise ValueError("its outputs differ from the region's")

    def _one(self, name: str, region: Any, inputs: Sequence[Any], outputs: Any,
             traced: _Traced | None, ahead: Any = None) -> tuple[Any, str | None]:
        if traced is not None and traced.key == NO_OPERATORS:  # its entry says it computes nothing
            self._count("no_operators")
            return region, None
        if traced is not None:
            try:
                if ahead is not None:  # being loaded by :meth:`_load_ahead`
                    clock = time.perf_counter()
                    artifact, how = ahead.result()
                    self._lap("load_waited", clock)
                else:
                    artifact, how = self._artifact(traced.graph, traced.values, traced.key)
                call = RegionCall(artifact, traced.tensors, traced.spec, inputs)
                # what an earlier region of this build ran and checked needs no run: the same code on values
                # of the same metadata (a quick key's link to its artifact is checked once for each quick key)
                checked = (traced.key, traced.quick if traced.graph is None else None)
                if checked not in self._checked:
                    clock = time.perf_counter()
                    # the convolutions its code calls, once, for later builds to make their plans ahead
                    seen = ConvolutionsSeen() if traced.key not in self._convolutions else None
                    with seen or contextlib.nullcontext():
                        self._check(call, inputs, outputs, traced.graph is None)
                    if seen is not None:
                        self._convolutions[traced.key] = seen.calls
                        if traced.graph is None and seen.calls:  # an entry written before they were noted
                            self._note_convolutions(traced)
                    self._lap("run", clock)
                    self._checked.add(checked)
                self._count(how)
                self._remember(traced)
                return call, None
            except Exception as err:
                if traced.graph is None:  # found through the quick key: trace it to ATen after all
                    log.info("region %s: its stored code is not used (%s); tracing it", name, first_line(err))
                    if traced.quick not in self._remembered:  # not yet written right by a region before
                        with contextlib.suppress(OSError):
                            self._index(traced.quick).unlink()
                    self._entries[traced.quick] = None
                    self._built.pop(traced.key, None)
                    return self._one(name, region, inputs, outputs, self._trace(name, region, inputs))
                if self.combo:
                    return region, f"not compiled with combo kernels: {first_line(err)[:200]}"
                log.debug("region %s: ahead-of-time compile failed (%s); using torch.compile", name, first_line(err))
        if self.combo:
            return region, "not traced to ATen"
        clock = time.perf_counter()
        compiled, why = compile_region(region, inputs, name, self.layout)
        self._count("aten" if why else "torch.compile")
        self._lap("torch.compile", clock)
        return compiled, why

    def _note_convolutions(self, traced: _Traced) -> None:
        """Add the convolutions its code calls to the index entry that found a region (one written before entries
        noted them), for later builds to make their plans ahead."""
        index = self._index(traced.quick)
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):  # left as it is
            entry = json.loads(index.read_text())
            if entry.get("key") == traced.key and "convolutions" not in entry:
                _write_entry(index, entry | {"convolutions": self._convolutions[traced.key]})

    def _remember(self, traced: _Traced) -> None:
        """Point the region's quick key at its stored artifact, or say that the region computes nothing, for
        later builds."""
        import torch

        index = self._index(traced.quick)
        nothing = traced.graph is not None and _no_operators(traced.graph)
        if traced.graph is None or index is None or traced.quick in self._remembered \
                or not (nothing or self._path(traced.key).is_file()):
            return  # found through its entry, no quick key, written already by this build, or not stored
        self._remembered.add(traced.quick)
        with contextlib.suppress(OSError, TypeError, ValueError):  # an output tree without JSON form: no entry
            entry = {"key": NO_OPERATORS} if nothing else \
                {"key": traced.key, "spec": torch.utils._pytree.treespec_dumps(traced.spec)} | (
                    {"convolutions": self._convolutions[traced.key]} if self._convolutions.get(traced.key) else {})
            _write_entry(index, entry)


def _write_entry(index: Path, entry: dict[str, Any]) -> None:
    """Write a region's index entry whole (a build stopped mid-way leaves the one before or none)."""
    index.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with written_whole(index) as part:
        part.write_text(json.dumps(entry))


class ConvolutionsSeen:
    """A context that notes each convolution (``aten.convolution``) run inside it, as JSON-ready lists that
    :func:`make_plans` takes: input and weight (shape, strides, the data pointer's offset from a 256-byte boundary),
    dtype, bias or not, then stride, padding, dilation, transposed, output padding and groups. cuDNN keys its plans
    by these (PyTorch's plan cache: sizes, strides, alignment, dtype and the convolution's parameters)."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def __enter__(self) -> ConvolutionsSeen:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if func is torch.ops.aten.convolution.default and not kwargs:
                    with contextlib.suppress(Exception):  # a call it cannot note is run all the same
                        seen._note(*args)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def _note(self, x: Any, w: Any, bias: Any, *params: Any) -> None:
        def tensor(t: Any) -> list[Any]:
            return [list(t.shape), list(t.stride()), t.data_ptr() % 256]

        call = [tensor(x), tensor(w), str(x.dtype).removeprefix("torch."), bias is not None,
                *[list(p) if isinstance(p, list | tuple) else p for p in params]]
        if call not in self.calls:
            self.calls.append(call)


def make_plans(calls: Sequence[Sequence[Any]], device: Any) -> int:
    """Run each convolution of ``calls`` (as :class:`ConvolutionsSeen` notes them) once on ``device``, on tensors of
    its shapes, strides, alignment and dtype (their values unset), so that cuDNN makes its plans for them on this
    thread; returns how many ran. Only on a CUDA device (elsewhere there is nothing to plan); a call that fails is
    left to the region's own run."""
    if device is None or device.type != "cuda":
        return 0
    return _run_convolutions(calls, device)


def _run_convolutions(calls: Sequence[Sequence[Any]], device: Any) -> int:
    """:func:`make_plans` on any device."""
    import torch

    made = 0
    with torch.no_grad():
        for call in calls:
            try:
                (xs, xt, xo), (ws, wt, wo), dtype, has_bias, *params = call
                dtype = getattr(torch, dtype)
                x, w = (_strided(shape, stride, offset, dtype, device) for shape, stride, offset in
                        ((xs, xt, xo), (ws, wt, wo)))
                bias = torch.zeros(ws[1] * params[-1] if params[3] else ws[0], dtype=dtype, device=device) \
                    if has_bias else None
                torch.convolution(x, w, bias, *params)
                made += 1
            except Exception as err:
                log.debug("a convolution's plan not made ahead (%s)", first_line(err))
    return made


def _strided(shape: Sequence[int], stride: Sequence[int], offset: int, dtype: Any, device: Any) -> Any:
    """An uninitialised tensor of ``shape`` and ``stride`` whose data starts ``offset`` bytes past a 256-byte
    boundary."""
    import torch

    size = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
    item = torch.empty((), dtype=dtype).element_size()
    base = torch.empty(size + 256 // item, dtype=dtype, device=device)
    return base.as_strided(shape, stride, storage_offset=(offset - base.data_ptr() % 256) % 256 // item)


def _device_of(regions: Sequence[tuple[str, Any, Sequence[Any], Any]]) -> Any:
    """The device of the first tensor among the regions' inputs (None without one)."""
    import torch

    return next((x.device for _, _, inputs, _ in regions for x in torch.utils._pytree.tree_leaves(list(inputs))
                 if isinstance(x, torch.Tensor)), None)


def hash_sources_meanwhile() -> Any | None:
    """Start computing, in a thread of its own, the digests of torch's and Triton's sources that Inductor keys its
    stored code by (``torch_key``, ``triton_key``: every file of both read and hashed once per process, 0.6 s of a
    7 s rebuild on an H200 host, most of it file reads and hashing, which run without the GIL), so that it overlaps
    this thread's preparing of the model; returns the thread (None where this torch lacks either function). Both
    functions keep their result: a caller that gets there first computes it too, to the same value."""
    import threading

    try:  # imported here, not in the thread: two threads importing one module can deadlock
        from torch._inductor.codecache import torch_key
        from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key
    except ImportError:
        return None

    def digests() -> None:
        with contextlib.suppress(Exception):  # a failure shows where Inductor computes the digest itself
            torch_key()
            if HAS_TRITON:
                triton_key()

    thread = threading.Thread(target=digests, name="opbench-source-digests", daemon=True)
    thread.start()
    return thread


def _close(got: Any, want: Any) -> bool:
    """Whether ``got`` has ``want``'s structure and each tensor is within :data:`CLOSE` of it (relative norm)."""
    import torch

    a, tree_a = torch.utils._pytree.tree_flatten(got)
    b, tree_b = torch.utils._pytree.tree_flatten(want)
    if _structure(tree_a) != _structure(tree_b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                return False
            scale = float(y.double().norm()) or 1.0
            if float((x.double() - y.double()).norm()) > CLOSE * scale:
                return False
        elif x != y:
            return False
    return True


def _structure(spec: Any) -> Any:
    """An output tree's structure, a ``torch.Size`` as the tuple it is (traced to ATen, a region's ``x.size()``
    comes out as a tuple, while the eager region gives a ``torch.Size``)."""
    import torch

    kind = tuple if spec.type is torch.Size else spec.type
    children = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs  # older torch
    return kind, spec.context, [_structure(child) for child in children]


def _specs(values: Sequence[Any]) -> list[Any]:
    """Tensors as (shape, stride, dtype, device) for a worker, which makes empty ones of each; other values as
    they are."""
    import torch

    return [("tensor", tuple(v.shape), tuple(v.stride()), v.dtype, str(v.device)) if isinstance(v, torch.Tensor)
            else ("value", v) for v in values]


def _message(value: Any) -> bytes:
    """``value`` pickled, framed as a worker reads it (:func:`_read_message`); None frames the end."""
    import pickle
    import struct

    data = b"" if value is None else pickle.dumps(value)
    return struct.pack(">I", len(data)) + data


def _read_message(stream: Any) -> Any:
    """The next value :func:`_message` framed on ``stream``; None at the end or when the stream ends."""
    import pickle
    import struct

    head = stream.read(4)
    if len(head) < 4 or not (size := struct.unpack(">I", head)[0]):
        return None
    return pickle.loads(stream.read(size))  # noqa: S301 (a pipe from our parent, never a file)


def _worker() -> None:
    """A region compile worker (:meth:`RegionCompiler._start_workers`): imports torch and Inductor and makes its
    CUDA context on the device its command line names (if any); then reads from standard input its settings (none:
    it ends) and the structures to compile, one after another, until their end; compiles and stores each that is
    not stored yet (the building process may have compiled it meanwhile), saying on standard error why one failed.
    On standard output it says when it is ready and when it is done with each structure (:data:`WORKERS_QUEUE`)."""
    import os
    import sys

    import torch
    import torch._inductor.compile_fx  # noqa: F401  (what the graphs' unpickling refers to)
    import torch.fx.experimental.proxy_tensor  # noqa: F401

    device = sys.argv[1] if len(sys.argv) > 1 else ""
    if device.startswith("cuda") and torch.cuda.is_available():
        with contextlib.suppress(Exception):  # made where the first graph needs it otherwise
            torch.zeros(1, device=device)
    conv_bias_relu_op()  # graphs may call it
    print(f"{WORKER_STARTED} {time.time():.3f}", file=sys.stderr, flush=True)
    settings = _read_message(sys.stdin.buffer)
    if settings is None:  # not needed
        return
    combo, layout, threads = settings
    torch._inductor.config.compile_threads = threads
    print(f"{WORKER_READY} {time.time():.3f}", file=sys.stderr, flush=True)
    print(WORKER_READY, flush=True)
    while (item := _read_message(sys.stdin.buffer)) is not None:
        key, graph, specs, path = item
        clock = time.perf_counter()
        try:
            if not os.path.exists(path):
                values = [torch.empty_strided(s[1], s[2], dtype=s[3], device=s[4]) if s[0] == "tensor" else s[1]
                          for s in specs]
                artifact = _standalone_compile(graph, values, combo, layout)
                artifact.save(path=path, format="binary")
                print(f"{WORKER_COMPILED} {time.perf_counter() - clock:.3f} {time.time():.3f}", file=sys.stderr,
                      flush=True)
        except Exception as err:
            print(f"region {key}: {type(err).__name__}: {first_line(err)[:200]}", file=sys.stderr, flush=True)
        print(key, flush=True)  # done with it, stored or not


def _worker_order(keys: list[str], todo: dict[str, tuple[Any, list[Any]]]) -> list[str]:
    """``keys`` (structures of ``todo``, key -> (ATen graph, values), in build order) in the queue's order: the
    workers take from its end, so the last of the build first, or with :data:`WORKERS_HEAVIEST_FIRST` the one with
    the most ATen operators first (ties: the later in the build first)."""
    if not WORKERS_HEAVIEST_FIRST:
        return keys
    return sorted(keys, key=lambda k: sum(n.op == "call_function" for n in todo[k][0].graph.nodes))


def _write_all(proc: Any, payload: bytes) -> None:
    """Write ``payload`` to worker ``proc`` and close its standard input (a worker that ended: nothing)."""
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.write(payload)
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()


def _worker_report(text: str, compiles: list[tuple[float, float]] | None = None) -> dict[str, float]:
    """What a worker's standard error (:func:`_worker`) says of its time: when it had imported torch and Inductor
    (:data:`WORKER_STARTED`) and when it had its share (:data:`WORKER_READY`), epoch seconds, and the seconds it
    spent compiling what it stored (:data:`WORKER_COMPILED`, summed); a line cut short is left out. ``compiles``
    gets each compile's (seconds, when it ended, epoch seconds), of the lines that say when."""
    said: dict[str, float] = {}
    for line in text.splitlines():
        word, _, value = line.partition(" ")
        if word in (WORKER_STARTED, WORKER_READY, WORKER_COMPILED):
            first, _, when = value.partition(" ")  # compiled: its seconds, then when
            with contextlib.suppress(ValueError):
                said[word] = float(first) + (said.get(word, 0.0) if word == WORKER_COMPILED else 0.0)
                if word == WORKER_COMPILED and compiles is not None and when:
                    compiles.append((float(first), float(when)))
    return said


def _region_index(name: str) -> int:
    """The index into the cut of the region that ``split_module`` named ``name`` (``submod_3`` -> 3)."""
    return int(name.rsplit("_", 1)[1])


def _inductor_options(combo: bool = False, layout: str = DEFAULT_LAYOUT) -> dict[str, Any]:
    """Inductor's settings for code with combo kernels (``combo``) and in ``layout`` (:data:`LAYOUTS`)."""
    return ({"combo_kernels": True} if combo else {}) | ({"layout_optimization": False} if layout == "pytorch" else {})


def _standalone_compile(graph: Any, values: Sequence[Any], combo: bool, layout: str = DEFAULT_LAYOUT) -> Any:
    """``graph`` (ATen) compiled by Inductor for ``values``, with combo kernels when ``combo``, in ``layout``."""
    import torch

    with torch.no_grad(), torch._inductor.config.patch(_inductor_options(combo, layout)):
        return torch._inductor.standalone_compile(graph, list(values), dynamic_shapes="from_example_inputs")


def compile_region(region: Any, inputs: Sequence[Any], name: str,
                   layout: str = DEFAULT_LAYOUT) -> tuple[Any, str | None]:
    """``region`` compiled by ``torch.compile`` (Dynamo, then Inductor; convolutions in ``layout``) and run once on
    ``inputs`` (compiling it), or the region itself with the reason when Inductor cannot compile it."""
    import torch

    compiled = torch.compile(region, dynamic=False, fullgraph=True, options=_inductor_options(layout=layout) or None)
    try:
        with torch.no_grad():
            compiled(*inputs)
        return compiled, None
    except Exception as err:  # a region Inductor cannot take runs its ATen operators
        first = first_line(err)
        return region, f"{type(err).__name__}: {first[:200]}"


def compile_jobs(jobs: int | None) -> int:
    """Worker processes for compiling regions: ``jobs``, or ``$OPBENCH_COMPILE_JOBS``, or one per two cores up to 8
    on a machine of at least 8 cores (1, compiling in this process, on smaller ones)."""
    import os

    from ..utils import worker_count

    def default() -> int:
        cores = os.cpu_count() or 1
        return min(8, cores // 2) if cores >= 8 else 1

    return worker_count(jobs, "OPBENCH_COMPILE_JOBS", default)


def _compile_for_handed_strides(split: Any, inputs: Sequence[Any], built: dict[str, tuple[Any, str | None]],
                                compiler: Callable[[str], RegionCompiler], produced: dict[str, Any]) -> list[str]:
    """Run the split graph once with its compiled regions, in order, and compile again, for the strides it is
    handed, each region whose code was compiled for other ones (the eager run's: a compiled producer may pad
    strides or return a contiguous tensor where eager returned a view), so that no call copies its inputs into
    the strides its code expects (:class:`RegionCall`). ``built`` (name -> (callable, why)) is updated in place,
    each region compiled again by ``compiler(name)``;
    returns the names of the regions compiled again. A later build finds their code through their quick keys,
    which hold the strides handed.

    Up to :data:`STRIDE_PASSES` times, one run finds every region handed other strides (each still runs its
    code, which copies its inputs) and they compile together (:meth:`RegionCompiler.compile_all`: workers still
    there take their share); a region compiled again may hand others strides of its own, so a last run compiles
    again, one at a time, each region that still differs when its turn comes."""
    again: list[str] = []
    for _ in range(STRIDE_PASSES):
        handed = _handed_strides(split, inputs, built)
        if not handed:
            return again
        groups: dict[RegionCompiler, list[str]] = {}  # each compiler's regions, in build order
        for name in handed:
            groups.setdefault(compiler(name), []).append(name)
        for each, names in groups.items():
            built.update(each.compile_all([(name, split.get_submodule(name), handed[name], produced[name])
                                           for name in names]))
        again += [name for name in handed if name not in again]
    again += [name for name in _handed_strides(split, inputs, built, compiler, produced) if name not in again]
    if again:
        log.info("%d regions compiled again for the strides their compiled producers hand them: %s", len(again),
                 ", ".join(again))
    return again


def _handed_strides(split: Any, inputs: Sequence[Any], built: dict[str, tuple[Any, str | None]],
                    compiler: Callable[[str], RegionCompiler] | None = None,
                    produced: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """Run the split graph once with its compiled regions (``built``), in order: region name -> the inputs it was
    handed, for each region whose code was compiled for other strides. With ``compiler``, each such region is
    compiled again (``compiler(name)``, on ``produced[name]`` as its outputs) before it runs, ``built`` updated."""
    import torch
    from torch.fx.interpreter import Interpreter

    handed: dict[str, list[Any]] = {}

    class Compiled(Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            call = built[target][0] if target in built else self.fetch_attr(target)
            if isinstance(call, RegionCall) and not kwargs and call.differs(args):
                handed[target] = list(args)
                if compiler is not None:
                    region = split.get_submodule(target)
                    built[target] = compiler(target).compile_all([(target, region, list(args),
                                                                   produced[target])])[target]
                    call = built[target][0]
            return call(*args, **kwargs)

    with torch.no_grad():
        Compiled(split).run(*inputs)
    return handed


class FusedBackend(TorchBackend):
    """A torch model's regions, each compiled by Inductor (see the module docstring).

    Parameters
    ----------
    cut:
        How to cut (:data:`opbench.ir.regions.CUTS`); ``blocks`` weighs ``costs``, each traced
        operator's seconds (:func:`opbench.pipeline.compile.torch_backend` times them alone), or a
        callable that gives them for the traced (and merged) ``GraphModule``.
    regions:
        A cut made earlier, as lists of traced node names (a saved schedule's ``meta["regions"]``):
        no cut is computed.
    trace:
        ``auto`` (``torch.fx``, else ``torch.export``), ``fx`` or ``export``.
    merge:
        IOS's merge before the cut: ``True`` merges every group of sibling convolutions, a list of groups
        (node names of the traced graph) those groups; a saved schedule's ``meta["merged"]`` again.
    store:
        Where compiled regions are kept for later builds (:class:`RegionCompiler`): ``"default"`` is
        ``$OPBENCH_CACHE/regions``, None keeps nothing.
    jobs:
        Worker processes that compile the regions not stored yet (:func:`compile_jobs`; None: automatic).
    combo:
        Inductor's horizontal fusion inside regions: ``True`` compiles each region of at least :data:`COMBO_FROM`
        operators a second time with ``combo_kernels`` (:attr:`combo_offered`; the caller times both and picks
        with :meth:`use_combo`); a list of region indices (a saved schedule's ``meta["combo"]``) compiles those
        regions only so; ``False``: none.
    layout:
        The layout of the regions' convolutions (:data:`LAYOUTS`): ``inductor`` (Inductor's choice, channels-last)
        or ``pytorch`` (the model's own; later builds of models with grouped convolutions start seconds sooner,
        their code runs a few percent slower); a saved schedule's ``meta["layout"]``.
    conv_relu:
        Run each convolution -> eval batch norm -> ReLU chain as one cuDNN call, the batch norm folded into the
        weights (:func:`opbench.ir.conv_relu.fuse_conv_relu`), written into the traced graph before the cut.
        ``None`` (default): in Inductor's layout, on CUDA inputs, for a model without grouped convolutions (their
        weights stay in the model's layout: :func:`weights_channels_last`). googlenet's replay ran 105 kernels
        instead of 162, its greedy schedule 0.277 ms instead of 0.325 (H200, float32, batch 1;
        ``scripts/exp_layout.py``). ``True`` or ``False``: so; a saved schedule's ``meta["conv_relu"]``.
    depthwise:
        How the regions run depthwise convolutions (:data:`opbench.ir.depthwise.DEPTHWISE`): ``aten``, PyTorch's
        convolution (cuDNN, in Inductor's layout), or ``taps``, unfolded into sums of shifted products
        before the cut (:func:`opbench.ir.depthwise.unfold_depthwise`), which Inductor compiles into the regions' own
        kernels. A model left without grouped convolutions then gets the ``conv_relu`` default and channels-last
        weights of one that never had any, and its chains are fused only where cuDNN fuses their shape, their
        inputs made channels-last in the graph (:func:`opbench.ir.conv_relu.fuse_conv_relu` given the inputs;
        shufflenet_v2_x1_0's sequential schedule ran 0.248 ms instead of 0.366 with the inputs as they came, and
        0.349 with ``aten``: H200, batch 1, bfloat16). A trade, measured on an H200
        (``scripts/exp_layout.py``, ``scripts/bench_fused.py --depthwise taps``): randwire's kept schedule ran
        0.201 ms instead of 0.244 (batch 1, float32) and 0.276 instead of 0.398 ms (batch 8, bfloat16),
        mobilenet_v3_large within 1 % at batch 1, and nasnet's and
        mobilenet_v3_large's 6-8 % slower at batch 8 in float32; a later build makes no cuDNN plans for them
        (nasnet's 4.2-5.0 s instead of 8.5 at batch 1), but a cold build compiles longer, shared out by workers:
        nasnet's 27 s against a cold ``torch.compile``'s 38 s, mobilenet_v3_large's one region in eight pieces
        (``piece_ops``) 18.8 s against 23.7 s (25.8 s whole). ``auto`` (default): ``taps`` for a network whose
        depthwise convolutions are all small (:func:`opbench.ir.depthwise.auto_depthwise`: at most 3x3, as
        randwire's and shufflenet_v2_x1_0's), else ``aten``, and ``aten`` on the CPU (there shufflenet_v2_x1_0's
        sequential schedule took 1.7x as long unfolded: 28.9 against 17.3 ms, 2 cores, float32, batch 1);
        :attr:`depthwise` says which. A saved schedule's ``meta["depthwise"]`` (``aten`` or ``taps``).
    piece_ops:
        The most a region of a new cut weighs (:func:`_compile_weights`) before it is cut into consecutive pieces
        that worker processes compile at once (:func:`opbench.ir.regions.split_heavy`): ``None`` (default),
        :data:`PIECE_OPS` when depthwise convolutions are unfolded and no limit otherwise; 0, no limit. A saved cut
        (``regions``) is used as it is.

    Attributes
    ----------
    regions:
        The cut: the traced node names of each region, in launch order.
    compile_s:
        Seconds spent compiling the regions (or loading them).
    built:
        How many regions were compiled, loaded, shared within this build, compiled by ``torch.compile``,
        or left to their ATen operators (:attr:`RegionCompiler.counts`).
    compile_seconds:
        Where :attr:`compile_s` went (:attr:`RegionCompiler.seconds`).
    fallbacks:
        Region name -> why it runs its ATen operators.
    merged_groups:
        The groups of sibling convolutions merged, by node name (empty without ``merge``).
    conv_relu_chains:
        How many convolution -> batch norm -> ReLU chains run as one cuDNN call (0 without ``conv_relu``).
    depthwise:
        How the regions run depthwise convolutions: ``aten`` or ``taps`` (what ``auto`` chose).
    depthwise_unfolded:
        How many depthwise convolutions were unfolded (0 unless :attr:`depthwise` is ``taps``).
    recompiled:
        The regions compiled again for the strides their compiled producers hand them
        (:func:`_compile_for_handed_strides`).
    restrided:
        The regions whose calls copied inputs into their code's strides, and how many (:class:`RegionCall`; none
        after :attr:`recompiled`, unless strides change later).
    combo_offered:
        The regions (submodule names) that have both codes, default and combo kernels (``combo=True``).
    combo_regions:
        The indices (into :attr:`regions`) of the regions that run their combo-kernel code.
    combo_times:
        Region -> (default, combo) seconds, as the caller timed them to choose (empty until then).
    """

    name = "fused"

    def __init__(self, model: Any, inputs: Sequence[Any], cut: str = "branches",
                 regions: Sequence[Sequence[str]] | None = None, trace: str = "auto",
                 costs: Sequence[float] | Callable[[Any], Sequence[float]] | None = None, min_gain_s: float = 5e-6,
                 merge: bool | Sequence[Sequence[str]] = False, store: str | Path | None = "default",
                 jobs: int | None = None, combo: bool | Sequence[int] = False, layout: str = DEFAULT_LAYOUT,
                 conv_relu: bool | None = None, depthwise: str = DEFAULT_DEPTHWISE,
                 piece_ops: int | None = None) -> None:
        import torch
        from torch.fx.interpreter import Interpreter
        from torch.fx.passes.split_module import split_module

        if store == "default":
            from ..utils import cache_root

            store = cache_root() / "regions"
        if cut not in CUTS:
            raise OpBenchError(f"unknown region cut '{cut}' (accepted: {', '.join(CUTS)})")
        self.layout = check_layout(layout)
        self.depthwise = check_depthwise(depthwise)
        limit = check_piece_ops(piece_ops)
        in_pieces = False  # heavy regions of this cut were cut into pieces
        if store is not None:  # Inductor needs them to load or store a region's code
            hash_sources_meanwhile()
        gm, self.source_trace = fx_module(model, inputs, trace)
        self._merged = merge_into_graph(gm, inputs, None if merge is True else merge) if merge else []
        conv_bias_relu_op()  # registered before a region that calls it is compiled or loaded
        if self.depthwise == "auto":  # unfolded only on a GPU: on the CPU Inductor's sums ran slower
            self.depthwise = auto_depthwise(gm) if _on_cuda(inputs) else "aten"
            log.info("depthwise='auto': %s for this network", self.depthwise)
        self.depthwise_unfolded = unfold_depthwise(gm) if self.depthwise == "taps" else 0
        if conv_relu is None:
            conv_relu = self.layout == "inductor" and _on_cuda(inputs) and not grouped_convolutions(gm)
        # with depthwise convolutions unfolded, chains of shapes cuDNN does not fuse are left to Inductor, and the
        # inputs of the others made channels-last in the graph (cuDNN's layout for them; in a network with grouped
        # convolutions or a channel shuffle many come in PyTorch's)
        unfolded = bool(self.depthwise_unfolded)
        self.conv_relu_chains = (fuse_conv_relu(gm, inputs if unfolded else None, channels_last_inputs=unfolded)
                                 if conv_relu else 0)
        if self.layout == "inductor":
            gm = weights_channels_last(gm)
        ops, preds = fx_operator_dag(gm.graph)
        if callable(costs):
            costs = costs(gm)
        if regions is not None:
            index = {n.name: i for i, n in enumerate(ops)}
            missing = [name for region in regions for name in region if name not in index]
            if missing or sorted(i for r in regions for i in (index[n] for n in r)) != list(range(len(ops))):
                raise OpBenchError("the saved region cut does not match this model's traced graph "
                                   f"({len(missing)} unknown operators): make the schedule again")
            cut_ops = [sorted(index[name] for name in region) for region in regions]
        else:
            cut_ops = cut_regions(preds, cut, costs, min_gain_s)
            if limit is None:
                limit = PIECE_OPS if self.depthwise_unfolded else 0
            if limit:
                whole = len(cut_ops)
                cut_ops = split_heavy(cut_ops, preds, *_compile_weights(gm, ops), limit)
                in_pieces = len(cut_ops) > whole
                if in_pieces:
                    log.info("regions heavier than %d cut into pieces: %d regions instead of %d", limit,
                             len(cut_ops), whole)
        self.cut = cut if regions is None else "saved"
        self.regions = [[ops[i].name for i in region] for region in cut_ops]
        split = split_module(gm, gm, region_of(ops, cut_ops))
        # each region's inputs, from one eager run of the split graph (the compiler's example inputs)
        seen: dict[str, list[Any]] = {}
        produced: dict[str, Any] = {}

        class Recorder(Interpreter):
            def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
                seen[target] = list(args)
                produced[target] = super().call_module(target, args, kwargs)
                return produced[target]

        with torch.no_grad():
            Recorder(split).run(*inputs)
        start = time.perf_counter()
        compiled: dict[str, Any] = {}
        self.fallbacks: dict[str, str] = {}
        folder, jobs = None if store is None else Path(store), compile_jobs(jobs)
        # the pieces of heavy regions compile for seconds each: workers start at once, without probes here first
        compiler = RegionCompiler(folder, jobs, layout=layout, probes=0 if in_pieces else PROBES)
        combo_compiler = RegionCompiler(folder, jobs, combo=True, layout=layout)
        children = [(name, region, seen[name], produced[name]) for name, region in split.named_children()
                    if name in seen]
        saved_combo = set() if isinstance(combo, bool) else {f"submod_{int(r)}" for r in combo}
        long = [c for c in children if len(cut_ops[_region_index(c[0])]) >= COMBO_FROM] if combo is True else []
        # the workers of the first compiles stay for the regions compiled again for the strides handed
        compiler.keep_workers = KEEP_WORKERS
        try:
            built = self._compile(children, long, saved_combo, compiler, combo_compiler, split, inputs, produced)
        finally:
            compiler._stop_workers()
            combo_compiler._stop_workers()
        self._calls = {name: call for name, (call, _) in built.items() if isinstance(call, RegionCall)}
        for name, (compiled[name], why) in built.items():
            if why is not None:
                self.fallbacks[name] = why
                log.warning("region %s runs its ATen operators: Inductor cannot compile it (%s)", name, why)
        self.compile_s = time.perf_counter() - start
        self.built = compiler.counts | {f"combo_{k}": v for k, v in combo_compiler.counts.items()}
        self.compile_seconds = compiler.seconds | {f"combo_{k}": v for k, v in combo_compiler.seconds.items()}
        compiler._mark("regions built")
        #: what happened while the regions compiled, in order: (seconds since they began, what), the workers' too
        self.compile_timeline = compiler.timeline
        log.info("regions: %s in %.1f s", ", ".join(f"{v} {k}" for k, v in sorted(self.built.items())), self.compile_s)
        super().__init__(split, inputs, trace="graph")
        flops = self._region_flops(gm, inputs, cut_ops)
        for node in list(self.traced.modules):
            if node.target in compiled:
                self.traced.modules[node] = compiled[node.target]
        for op in self.graph:  # regions: their operators' FLOPs (the split graph knows only the regions)
            if op.var_name in flops:
                op.flops = flops[op.var_name]
                op.kind = "region"

    @property
    def merged_groups(self) -> list[list[str]]:
        """The groups of sibling convolutions merged before the cut, by node name of the traced graph."""
        return self._merged

    @property
    def restrided(self) -> dict[str, int]:
        """Region (submodule) name -> how many inputs its calls so far copied into the strides its code was
        compiled for (:class:`RegionCall`), for the regions that copied any."""
        return {name: call.copies for name, call in self._calls.items() if call.copies}

    def _compile(self, children: list[tuple[str, Any, list[Any], Any]], long: list[tuple[str, Any, list[Any], Any]],
                 saved_combo: set[str], compiler: RegionCompiler, combo_compiler: RegionCompiler, split: Any,
                 inputs: Sequence[Any], produced: dict[str, Any]) -> dict[str, tuple[Any, str | None]]:
        """Every region's code (name -> (callable, why)): the default code, or the combo-kernel code of the regions
        in ``saved_combo`` (a saved choice); with ``long``, the combo-kernel code of those regions too, compiled by
        workers while this process compiles the default code (:meth:`RegionCompiler.start`), kept as
        :attr:`combo_offered` for the caller to time."""
        combo_compiler.start(long)
        built = compiler.compile_all([c for c in children if c[0] not in saved_combo])
        if saved_combo:  # a saved choice: those regions' combo-kernel code only (a region that has none: default)
            built |= combo_compiler.compile_all([c for c in children if c[0] in saved_combo])
            again = [c for c in children if c[0] in saved_combo and built[c[0]][1] is not None]
            built |= compiler.compile_all(again)
            saved_combo -= {c[0] for c in again}
        self.combo_regions = sorted(_region_index(name) for name in saved_combo)
        compiler._mark("compiling again for the strides handed")
        self.recompiled = _compile_for_handed_strides(
            split, inputs, built, lambda name: combo_compiler if name in saved_combo else compiler, produced)
        # (default code, combo-kernel code) of each long region, for the caller to time (combo=True)
        self._variants: dict[str, tuple[Any, Any]] = {}
        self.combo_times: dict[str, tuple[float, float]] = {}  # the caller's timing of both codes
        long = [c for c in long if isinstance(built[c[0]][0], RegionCall)]
        for name, (call, why) in combo_compiler.compile_all(long).items():
            if why is None and isinstance(call, RegionCall):
                self._variants[name] = (built[name][0], call)
            else:
                log.info("region %s: no combo-kernel code (%s)", name, why)
        return built

    @property
    def combo_offered(self) -> list[str]:
        return list(self._variants)

    def region_op(self, name: str) -> int:
        """The index (into :attr:`graph`) of the operator that calls region ``name`` (a submodule's name)."""
        return next(i for i, node in enumerate(self.traced.ops) if node.op == "call_module" and node.target == name)

    def use_combo(self, names: Sequence[str]) -> None:
        """Run the combo-kernel code of the offered regions ``names`` (:attr:`combo_offered`) and the default code of
        the other offered ones; a later capture or launch takes it."""
        unknown = set(names) - set(self._variants)
        if unknown:
            raise OpBenchError(f"regions without combo-kernel code: {', '.join(sorted(unknown))}")
        for name, (default, combo) in self._variants.items():
            call = combo if name in names else default
            self.traced.modules[self.traced.ops[self.region_op(name)]] = call
            self._calls[name] = call
        kept = {_region_index(name) for name in names}
        offered = {_region_index(name) for name in self._variants}
        self.combo_regions = sorted((set(self.combo_regions) - offered) | kept)

    def schedule_meta(self) -> dict[str, Any]:
        return {"kernels": self.name, "cut": self.cut, "regions": self.regions, "merged": self.merged_groups,
                "combo": self.combo_regions, "layout": self.layout, "conv_relu": bool(self.conv_relu_chains),
                "depthwise": self.depthwise}

    def _region_flops(self, gm: Any, inputs: Sequence[Any], cut_ops: list[list[int]]) -> dict[str, float]:
        """FLOPs of each region's call in the split graph, summed over its traced operators."""
        from ..ir.torch_graph import TorchGraph

        traced = TorchGraph(gm, inputs, trace="graph").graph
        calls = [n for n in self.traced.ops if n.op == "call_module" and str(n.target).startswith("submod_")]
        by_region = {_region_index(str(n.target)): n.name for n in calls}
        return {by_region[r]: sum(traced[i].flops for i in ops) for r, ops in enumerate(cut_ops) if r in by_region}


def weights_channels_last(module: Any) -> Any:
    """``module``, or a copy of it whose 4-D parameters and buffers (convolution weights) are channels-last.

    A region takes its parameters as inputs, and Inductor's channels-last convolutions (``layout="inductor"``)
    want their weights channels-last: a weight in PyTorch's layout is copied into it by a kernel of its own on every
    call. Stored channels-last once, it is not: googlenet's replay ran 162 kernels instead of 209, inception_v3's
    230 instead of 323 (H200, float32, batch 1; ``scripts/exp_layout.py``). The traced graph shares its modules
    with the caller's model, which is left as it was: the copy holds its own parameters and buffers (as much device
    memory again as the model's). A module with nothing to convert, one with grouped convolutions (depthwise
    networks: Inductor leaves those in PyTorch's layout where channels-last would slow cuDNN down, and they were
    not measured so) and one that cannot be copied come back as they are."""
    import copy

    import torch

    def converted(t: Any) -> bool:
        return t.dim() != 4 or t.is_contiguous(memory_format=torch.channels_last)

    if all(converted(t) for t in (*module.parameters(), *module.buffers())) or grouped_convolutions(module):
        return module
    try:
        module = copy.deepcopy(module)
    except Exception as err:  # a module that cannot be copied keeps its layout (its copies run on every call)
        log.info("weights left in their layout: the traced model cannot be copied (%s)", first_line(err))
        return module
    return module.to(memory_format=torch.channels_last)


def _on_cuda(inputs: Sequence[Any]) -> bool:
    """Whether the first tensor of ``inputs`` is on a CUDA device."""
    return next((bool(x.is_cuda) for x in inputs if hasattr(x, "is_cuda")), False)


# fx_module: opbench.ir.torch_graph's
__all__ = ["DEFAULT_DEPTHWISE", "DEFAULT_LAYOUT", "LAYOUTS", "PIECE_OPS", "SAVED_DEPTHWISE", "FusedBackend",
           "RegionCall", "RegionCompiler", "check_layout", "check_piece_ops", "compile_region", "fx_module",
           "weights_channels_last"]
