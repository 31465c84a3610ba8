"""The Opara-style facade: one call takes a PyTorch model to its fastest captured form.

:func:`capturer` traces the model's operators (``torch.fx`` where it can, else ``torch.export``),
schedules them on CUDA streams, measures the candidates beside the model's own CUDA Graph
(:func:`opbench.pipeline.compare.evaluate`), and returns the fastest, captured: a
:class:`CapturedSchedule`, or the model captured as it is when no schedule beats it.
:func:`optimize` returns the chosen schedule itself (JSON, reusable with ``schedule=``).

The jobs behind it live in :mod:`opbench.pipeline` (``compile``: the kernel backends and IOS's
merge; ``compare``: measuring schedules and keeping the fastest).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import OpBenchError, first_line
from .ir.depthwise import check_depthwise
from .pipeline.compare import (
    EvaluateOptions,
    captures_of,
    check_captures,
    check_sm_partition,
    evaluate,
    fastest_capture,
    host_arrays,
    relative_error,
    rounds_timer,
    table_rows,
    trace_rows,
)
from .pipeline.compile import check_kernels, combo_in_regions, merge_mode, saved_cut, torch_backend
from .pipeline.spec import overridden
from .profile.schedule import Timer
from .runtime.backend import KernelBackend
from .runtime.executor import ParallelExecutor
from .runtime.fused import DEFAULT_DEPTHWISE, DEFAULT_LAYOUT, check_layout, check_piece_ops
from .runtime.graphs import (
    COMBO_ROW,
    COMPILE_ROW,
    MODEL_ROW,
    MODEL_ROW_EAGER,
    CapturedModel,
    compile_variants,
    compiled_baselines,
)
from .schedule import Schedule
from .utils import check_output_path

__all__ = ["CaptureOptions", "CapturedSchedule", "capturer", "optimize"]
log = logging.getLogger(__name__)

#: captures of the kept schedule, the fastest returned (``capturer(captures=...)``): two instantiations of one CUDA
#: Graph run its concurrent kernels a few per cent apart, steadily (docs/parallel.md)
CAPTURES = 8


def _load_schedule(schedule: Schedule | str | Path | None) -> Schedule | None:
    if schedule is None or isinstance(schedule, Schedule):
        return schedule
    return Schedule.load(schedule)


def _in_dtype(model: Any, inputs: list[Any], dtype: str | None) -> tuple[Any, list[Any]]:
    """``model`` (a copy) and the floating-point ``inputs`` cast to ``dtype``; as they are for None."""
    if dtype is None:
        return model, inputs
    import copy

    import torch

    from .models import check_dtype

    target = getattr(torch, check_dtype(dtype))
    model = copy.deepcopy(model).to(target)
    return model, [x.to(target) if hasattr(x, "is_floating_point") and x.is_floating_point() else x for x in inputs]


#: the default ``rtol`` of :func:`capturer` by the inputs' precision: a candidate this far from the model's
#: own outputs (relative norm) is wrong, not rounded differently. Inductor's kernels were seen 3.7e-2 from
#: eager on inception_v3 in float32 (H100): cuDNN's TF32, on by default, rounds eager and compiled
#: convolutions each its own way (``scripts/exp_inductor_error.py``: with TF32 off both are within 3e-5
#: of a float64 result). ``tf32``: float32 on a GPU with TF32 on (PyTorch's default for cuDNN's convolutions),
#: whose 10-bit mantissa is float16's: two TF32 runs that round differently (batch norms folded into the weights,
#: ``opbench.ir.conv_relu``) were 4.0e-2 apart on inception_v3 (H200)
RTOL = {"float32": 5e-2, "float64": 5e-2, "float16": 1e-1, "bfloat16": 2e-1, "tf32": 1e-1}
#: the version of what a search measures, a part of every ``capturer(cache=...)`` key: raised when the candidates
#: change, so that a choice kept before is searched again rather than rebuilt (2: combo kernels inside regions;
#: 3: convolution -> batch norm -> ReLU chains as one cuDNN call; 4: ``depthwise="auto"`` the default, and the chains
#: of a network with its depthwise convolutions unfolded given channels-last inputs)
SEARCH_VERSION = 4


def default_rtol(inputs: Sequence[Any]) -> float:
    """:data:`RTOL` for the precision of the first floating-point input (float32's without one); for float32 on
    a GPU with TF32 on (cuDNN's or matrix products'), TF32's."""
    for x in inputs:
        if hasattr(x, "is_floating_point") and x.is_floating_point():
            dtype = str(x.dtype).removeprefix("torch.")
            if dtype == "float32" and x.is_cuda and _tf32_on():
                return RTOL["tf32"]
            return RTOL.get(dtype, RTOL["float32"])
    return RTOL["float32"]


def _tf32_on() -> bool:
    """Whether float32 convolutions or matrix products on a GPU may round to TF32 (PyTorch's settings)."""
    import torch

    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


@dataclasses.dataclass(frozen=True)
class CaptureOptions:
    """How :func:`capturer` and :func:`optimize` search, as one object: each field is the keyword of the same
    name (see :func:`capturer`). ``capturer(inputs, model, options, **overrides)``: keywords given beside
    ``options`` replace its fields, so ``capturer(inputs, model, repeat=3)`` works as it always did."""

    schedulers: Sequence[Any] | None = None
    mode: str = "fast"
    schedule: Schedule | str | Path | None = None
    tolerance: float = 0.02
    repeat: int = 7
    number: int = 10
    timer: Timer | None = None
    merge: bool | str = False
    kernels: str = "aten"
    compiled: bool | Sequence[str] | None = None
    cut: str = "auto"
    layout: str = DEFAULT_LAYOUT
    depthwise: str = DEFAULT_DEPTHWISE
    piece_ops: int | None = None
    sm_partition: str = "off"
    dtype: str | None = None
    trace: str | Path | None = None
    rtol: float | None = None
    cache: bool | str = False
    captures: int = CAPTURES

    def __post_init__(self) -> None:
        check_captures(self.captures)
        # True keeps the choice too (a later build builds only what was kept); "schedule" the cut and the schedule
        if not isinstance(self.cache, bool) and self.cache != "schedule":
            raise OpBenchError(f"unknown capturer cache {self.cache!r} (accepted: False, True, 'schedule')")
        check_layout(self.layout)
        if check_depthwise(self.depthwise) == "taps" and self.kernels != "fused":
            raise OpBenchError(f"depthwise={self.depthwise!r} unfolds the depthwise convolutions of fused regions "
                               f"(accepted with kernels='fused'; kernels={self.kernels!r} takes depthwise='aten' or "
                               "'auto', which run PyTorch's convolution)")
        if check_piece_ops(self.piece_ops) is not None and self.kernels != "fused":
            raise OpBenchError(f"piece_ops={self.piece_ops!r} limits the regions of fused kernels (accepted with "
                               f"kernels='fused'; kernels={self.kernels!r} takes piece_ops=None)")


def _check_order(inputs: Any, model: Any, caller: str) -> list[Any]:
    if callable(inputs) and not callable(model):
        raise OpBenchError(f"{caller} takes (inputs, model): the first argument is a {type(inputs).__name__}, "
                           f"the second a {type(model).__name__}")
    if hasattr(inputs, "shape"):  # one tensor
        return [inputs]
    return list(inputs)


@dataclasses.dataclass
class _Selected:
    """What :func:`_select` built and measured, and the seconds each phase took."""

    backend: KernelBackend
    baselines: list[Any]
    plan: Schedule
    rows: list[dict[str, Any]]
    structure: Any  # the outputs' pytree structure
    phases: dict[str, float]
    executor: ParallelExecutor | None = None  # the kept schedule's capture (None where a baseline was kept)


def _prepared(inputs: Any, model: Any, caller: str, o: CaptureOptions) -> tuple[Any, list[Any]]:
    """``model`` and its inputs as the search takes them: in the right order, cast to ``o.dtype``."""
    return _in_dtype(model, _check_order(inputs, model, caller), o.dtype)


def _backend(model: Any, inputs: Sequence[Any], o: CaptureOptions, saved: Schedule | None) -> KernelBackend:
    """The kernels of ``o.kernels`` (traced as ``compare --backend torch`` traces); fused regions take the cut of
    ``saved``, an earlier build's schedule, when there is one, and otherwise offer combo kernels inside long regions
    when the ``torch.compile`` rows include combo kernels (:func:`~opbench.pipeline.compile.choose_combo`)."""
    saved_fields = saved_cut(saved.meta) if saved is not None and o.kernels == "fused" else {}
    return torch_backend(model, inputs, merge=merge_mode(o.merge), repeat=o.repeat, number=o.number,
                         kernels=o.kernels, cut=o.cut, combo=combo_in_regions(o.compiled, o.kernels),
                         **({"layout": o.layout, "depthwise": o.depthwise, "piece_ops": o.piece_ops} | saved_fields))


def _select(model: Any, inputs: list[Any], o: CaptureOptions) -> _Selected:
    """Build and measure every candidate of ``model`` on ``inputs`` (both :func:`_prepared`) and keep the fastest."""
    import torch

    phases: dict[str, float] = {}
    given = _load_schedule(o.schedule)
    cached = _cache_file(model, inputs, o) if o.cache and given is None else None
    if cached is not None and cached.is_file():
        try:
            given = Schedule.load(cached)
            phases["cache"] = 1.0  # the cut and the schedule of an earlier build: no search
        except (OpBenchError, OSError, ValueError) as err:
            log.info("capturer cache %s not used: %s", cached, first_line(err))
    check_kernels(o.kernels)
    check_sm_partition(o.sm_partition)
    clock = time.perf_counter()
    baselines: list[Any] = [CapturedModel(model, inputs)]
    with torch.no_grad():
        reference = model(*inputs)
    phases["model_graph_s"] = time.perf_counter() - clock
    leaves, structure = torch.utils._pytree.tree_flatten(reference)
    if not any(isinstance(v, torch.Tensor) for v in leaves):
        raise OpBenchError(f"{type(model).__name__} returns no tensor ({type(reference).__name__}): nothing to "
                           "schedule")
    variants = compile_variants(o.compiled, o.kernels)
    compiled = compiled_baselines(model, inputs, variants)
    phases.update({"torch_compile_s" if v == "default" else f"torch_compile_{v}_s": c.compile_s
                   for v, c in zip(variants, compiled, strict=True)})
    baselines += compiled
    clock = time.perf_counter()
    backend = _backend(model, inputs, o, given)
    phases["trace_s" if o.kernels == "aten" else "build_s"] = time.perf_counter() - clock
    if o.kernels == "fused":
        phases.update(regions_compile_s=backend.compile_s, **region_phases(backend))
    if phases.get("cache") and given is not None and given.meta.get("graph") != backend.graph.fingerprint():
        log.info("capturer cache: the saved schedule is of another graph; searching again")
        given, phases["cache"] = None, 0.0
    found = evaluate(backend, o.schedulers, None, host_arrays(leaves), baselines, o.timer,
                     EvaluateOptions(o.repeat, o.number, o.tolerance, o.mode, given, sm_partition=o.sm_partition,
                                     rtol=default_rtol(inputs) if o.rtol is None else o.rtol,
                                     captures=o.captures))
    phases.update(found.phases)
    if cached is not None and not phases.get("cache"):
        kept = next(r for r in found.rows if r["kept"])
        found.plan.meta.update(choice="schedule" if kept["plan"] is not None else kept["schedule"],
                               table=table_rows(found.rows))
        _cache_put(cached, found.plan)
    return _Selected(backend, baselines, found.plan, found.rows, structure, phases, found.executor)


def region_phases(backend: Any) -> dict[str, float]:
    """A fused backend's regions by how they were built (``regions_loaded``, ...) and where their compile seconds
    went (``regions_time_trace_s``, ...), for a capturer's ``phases``."""
    counts = {f"regions_{k.replace('.', '_')}": float(v) for k, v in backend.built.items()}
    return counts | {f"regions_time_{k.replace('.', '_')}_s": v for k, v in backend.compile_seconds.items()}


def _cache_file(model: Any, inputs: Sequence[Any], o: CaptureOptions) -> Path:
    """:func:`_cache_path` for the options that shape the search."""
    return _cache_path(model, inputs, {"kernels": o.kernels, "cut": o.cut, "merge": o.merge, "mode": o.mode,
                                       "schedulers": [str(s) for s in o.schedulers or []], "sm": o.sm_partition,
                                       "compiled": o.compiled}
                       | ({"layout": o.layout} if o.layout != DEFAULT_LAYOUT else {})
                       | ({"depthwise": o.depthwise} if o.kernels == "fused" and o.depthwise != DEFAULT_DEPTHWISE
                          else {})
                       | ({"piece_ops": o.piece_ops} if o.piece_ops is not None else {}))


def _rebuild(model: Any, inputs: list[Any], o: CaptureOptions) -> Any | None:
    """``capturer(cache=True)`` when an earlier build of the same model (same key as :func:`_cache_path`) kept its
    choice: only the kept candidate is built (the schedule with its saved cut, or the one baseline), nothing is
    searched and no other candidate measured (a schedule's captures are: :func:`_kept_capture`), and its outputs
    are checked against the model's own (``rtol``). ``model`` and
    ``inputs`` as :func:`_prepared` gives them. None on a miss, on a cache file without a choice, or when the
    rebuilt candidate is off (then the caller searches again)."""
    if o.cache is not True or o.schedule is not None or o.trace is not None:
        return None
    import torch

    path = _cache_file(model, inputs, o)
    if not path.is_file():
        return None
    try:
        plan = Schedule.load(path)
    except (OpBenchError, OSError, ValueError) as err:
        log.info("capturer cache %s not used: %s", path, first_line(err))
        return None
    choice, table = plan.meta.get("choice"), plan.meta.get("table")
    if not isinstance(table, list) or choice not in ("schedule", MODEL_ROW, MODEL_ROW_EAGER, COMPILE_ROW, COMBO_ROW):
        return None  # written before choices were kept: the cut and the schedule are still taken (_select)
    check_kernels(o.kernels)
    phases: dict[str, float] = {"cache": 1.0, "cache_choice": 1.0}
    with torch.no_grad():
        reference = model(*inputs)
    leaves, structure = torch.utils._pytree.tree_flatten(reference)
    backend: KernelBackend | None = None
    result: Any
    clock = time.perf_counter()
    if choice == "schedule":
        backend = _backend(model, inputs, o, plan)
        if o.kernels == "fused":
            phases.update(regions_compile_s=backend.compile_s, **region_phases(backend))
        if plan.meta.get("graph") != backend.graph.fingerprint():
            log.info("capturer cache: the saved schedule is of another graph; searching again")
            return None
        result = CapturedSchedule(backend, plan, table, structure, _kept_capture(backend, plan, inputs, o, phases))
    elif choice in (COMPILE_ROW, COMBO_ROW):
        result = compiled_baselines(model, inputs, ["combo" if choice == COMBO_ROW else "default"])[0]
        phases["torch_compile_s" if choice == COMPILE_ROW else "torch_compile_combo_s"] = result.compile_s
    else:
        result = CapturedModel(model, inputs)
    phases["build_s"] = time.perf_counter() - clock
    with torch.no_grad():
        outputs = result(*inputs)
    error = relative_error(host_arrays(torch.utils._pytree.tree_leaves(outputs)), host_arrays(leaves))
    rtol = default_rtol(inputs) if o.rtol is None else o.rtol
    if not error <= rtol:
        log.info("capturer cache: the rebuilt %s is %.3g from the model's outputs (rtol %.3g); searching again",
                 choice, error, rtol)
        return None
    if choice != "schedule":
        result.schedule = None
    result.table = [dict(row, cached=True) for row in table]
    result.backend, result.baselines = backend, [result] if choice != "schedule" else []
    result.trace = backend.trace if backend is not None else None
    result.phases = phases
    log.info("capturer cache: rebuilt the %s kept by an earlier build (%s)", choice, path)
    return result


def _kept_capture(backend: KernelBackend, plan: Schedule, inputs: Sequence[Any], o: CaptureOptions,
                  phases: dict[str, float]) -> ParallelExecutor | None:
    """For a rebuild from the cache, which measures no candidate: the fastest of ``o.captures`` captures of the
    kept ``plan`` (:func:`~opbench.pipeline.compare.fastest_capture`, timed through the user's call), or None
    (one capture asked, a one-stream ``plan`` (:func:`~opbench.pipeline.compare.captures_of`), or the CPU:
    :class:`CapturedSchedule` captures it). Seconds in ``phases["captures_s"]``."""
    if captures_of(plan, o.captures) == 1 or not backend.is_cuda:
        return None
    clock = time.perf_counter()
    timer = o.timer or rounds_timer(True, o.repeat, o.number)
    executor, rows = fastest_capture(backend, plan, o.captures, [x.detach().clone() for x in inputs], timer)
    phases["captures_s"] = time.perf_counter() - clock
    log.info("capturer cache: kept capture %d of %d (%s ms)", next(r["capture"] for r in rows if r["kept"]),
             len(rows), ", ".join(f"{r['latency_ms']:.4f}" for r in rows))
    return executor


def _cache_path(model: Any, inputs: Sequence[Any], options: dict[str, Any]) -> Path:
    """Where ``capturer(cache=...)`` keeps a model's cut, schedule and choice: ``$OPBENCH_CACHE/capturer/KEY.json``,
    the key a digest of the model's class and parameters' shapes and dtypes, the inputs' shapes, dtypes
    and device, the options that shape the search, the device's name, the library versions and
    :data:`SEARCH_VERSION`."""
    import torch

    from ._version import __version__
    from .utils import cache_root, digest

    device = inputs[0].device if inputs and hasattr(inputs[0], "device") else None
    name = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else "cpu"
    key = digest({"model": f"{type(model).__module__}.{type(model).__qualname__}",
                  "params": [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()],
                  "inputs": [[list(x.shape), str(x.dtype), str(x.device.type)] for x in inputs if hasattr(x, "shape")],
                  "options": options, "device": name, "torch": torch.__version__, "opbench": __version__,
                  "search": SEARCH_VERSION})
    return cache_root() / "capturer" / f"{key}.json"


def _cache_put(path: Path, plan: Schedule) -> None:
    """Keep ``plan`` (with its cut) for the next build; a cache that cannot be written is skipped."""
    from .utils import written_whole

    try:
        with written_whole(path) as part:
            plan.save(part)
    except OSError as err:
        log.info("capturer cache not written (%s)", err)


def optimize(inputs: Any, model: Any, options: CaptureOptions | None = None, /, **overrides: Any) -> Schedule:
    """The fastest measured schedule of a torch model (the same search, the same options as :func:`capturer`).

    ``schedule.meta["table"]`` has every row, the model's own CUDA Graph included;
    ``schedule.meta["beats_model"]`` says whether the schedule beat every baseline (else
    :func:`capturer` would return the fastest baseline). For ``kernels="fused"`` the schedule records
    the region cut (``meta["regions"]``), so that passing it back skips the cut and the search; a
    partitioned schedule (``sm_partition="auto"``) carries its SM groups (``sm_groups``). It returns no
    capture, so ``captures`` is not used (one capture of each schedule is measured).
    """
    options = overridden(options or CaptureOptions(), overrides, "optimize")
    if options.trace is not None:
        raise TypeError("optimize() takes no trace (capturer(..., trace=PATH) writes one)")
    selected = _select(*_prepared(inputs, model, "optimize", options), dataclasses.replace(options, captures=1))
    plan, rows = selected.plan, selected.rows
    plan.meta["table"] = table_rows(rows)
    plan.meta["beats_model"] = any(r["kept"] and r["plan"] is plan for r in rows)
    return plan


class CapturedSchedule:
    """A model captured with its chosen schedule: ``captured(*inputs)`` replays it.

    Outputs are the graph's static output tensors, overwritten by the next call.
    """

    def __init__(self, backend: KernelBackend, schedule: Schedule, table: list[dict[str, Any]], structure: Any,
                 executor: ParallelExecutor | None = None):
        """``executor``: the schedule already captured (the capture the search timed and kept); else it is
        captured here."""
        self.backend, self.schedule, self.table, self._structure = backend, schedule, table, structure
        self.executor = executor if executor is not None else ParallelExecutor(backend, schedule)
        self.executor.run()

    def __str__(self) -> str:
        """The schedule in a line: operators per stream, and its time against the model's own row."""
        from collections import Counter

        per_stream = Counter(self.schedule.stream_of)
        kept = next((r for r in self.table if r.get("kept")), None)
        model = self.table[0] if self.table else None
        text = (f"CapturedSchedule '{self.schedule.name}': {len(self.schedule.stream_of)} operators on "
                f"{len(per_stream)} stream{'s' * (len(per_stream) != 1)} ("
                + ", ".join(f"{n} on stream {s}" for s, n in sorted(per_stream.items())) + ")")
        if kept and model and kept.get("latency_ms") and model.get("latency_ms"):
            text += (f"; {kept['latency_ms']:.4f} ms against {model['latency_ms']:.4f} ms for {model['schedule']} "
                     f"({model['latency_ms'] / kept['latency_ms']:.2f}x)")
        combo = getattr(self.backend, "combo_regions", None)
        if combo:
            text += f"; {len(combo)} region{'s' * (len(combo) != 1)} with combo kernels"
        if getattr(self.backend, "layout", DEFAULT_LAYOUT) != DEFAULT_LAYOUT:
            text += f"; regions in {self.backend.layout}'s layout"
        chains = getattr(self.backend, "conv_relu_chains", 0)
        if chains:
            text += f"; {chains} convolution -> batch norm -> ReLU chain{'s' * (chains != 1)} as one cuDNN call each"
        unfolded = getattr(self.backend, "depthwise_unfolded", 0)
        if unfolded:
            text += f"; {unfolded} depthwise convolution{'s' * (unfolded != 1)} compiled into the regions' kernels"
        return text

    def dump(self, path: str | Path) -> Path:
        """Write the schedule's CUDA Graph to ``path`` in Graphviz DOT (``torch.cuda.CUDAGraph.debug_dump``: every
        kernel node, the edges between them, and which stream's work each came from): the schedule's operators
        are captured once more with the graph's template kept, for the dump only (later calls still replay the
        capture kept, whose outputs they return). ``dot -Tsvg`` draws it. Returns ``path``."""
        if not self.backend.is_cuda:
            raise OpBenchError("dump writes the schedule's CUDA Graph: a schedule on the CPU runs its streams as "
                               "threads and has none")
        check_output_path(path, "path")
        ParallelExecutor(self.backend, self.schedule).capture(keep=True).cuda_graph.dump(path)
        return Path(path)

    def __call__(self, *inputs: Any) -> Any:
        import torch

        outputs = self.executor.run(inputs)
        if self._structure.num_leaves == len(outputs):  # the model's own nesting (tuple, dict, ...)
            return torch.utils._pytree.tree_unflatten(list(outputs), self._structure)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def capturer(inputs: Any, model: Any, options: CaptureOptions | None = None, /, **overrides: Any) -> Any:
    """Opara-style one call: trace ``model``, pick the fastest variant by measurement, capture it.

    Every keyword below is a field of :class:`CaptureOptions`; pass them one by one, or an ``options`` object
    (positional, third) and override some of its fields with keywords.

    The variants are the baselines, the model itself captured as it is in one CUDA Graph and (with
    ``compiled``; by default with ``kernels="fused"``) ``torch.compile(model, mode="reduce-overhead")``
    and the same with Inductor's horizontal fusion (``combo_kernels``; ``compiled=("default",)`` leaves
    it out),
    and the schedules of the model's operators (see :func:`opbench.pipeline.compare.evaluate` for
    ``schedulers``, ``mode``, ``schedule``, ``tolerance`` and ``timer``). The operators are
    ``kernels="aten"``: PyTorch's own kernels, one per traced call; or ``kernels="fused"``: regions of
    the traced graph, each compiled by Inductor (:class:`opbench.runtime.fused.FusedBackend`; ``cut``:
    ``auto``, the branches cut, or one of :data:`opbench.ir.regions.CUTS`; with the combo row, each long region
    is also compiled with combo kernels and keeps the faster of its two codes,
    :func:`opbench.pipeline.compile.choose_combo`; ``layout``: the layout of the regions' convolutions,
    :data:`opbench.runtime.fused.LAYOUTS`: ``"pytorch"`` keeps the model's own, so that a later build of a model
    with grouped convolutions need not wait seconds for cuDNN's channels-last plans, at a few percent of speed;
    ``depthwise="taps"``: depthwise convolutions unfolded into sums of shifted products that Inductor compiles into
    the regions' own kernels, :func:`opbench.ir.depthwise.unfold_depthwise`, for fused kernels, ``"auto"`` so where
    every depthwise convolution is at most 3x3 on a GPU (:func:`opbench.ir.depthwise.auto_depthwise`; the default),
    ``"aten"`` PyTorch's convolution; ``piece_ops``: the most a fused region of a new cut weighs before it is cut
    into consecutive pieces that worker processes compile at once, :class:`~opbench.runtime.fused.FusedBackend`'s;
    by default a limit only where depthwise convolutions are unfolded).
    The result is a
    :class:`CapturedSchedule` when a schedule beats every baseline by more than ``tolerance``, else the
    fastest baseline (:class:`~opbench.runtime.graphs.CapturedModel` or
    :class:`~opbench.runtime.graphs.CompiledModel`), with the reason logged at INFO: never slower than
    a baseline it measured. Each takes the model's inputs and carries ``table`` (every row),
    ``build_s`` (seconds this call took), ``phases`` (where they went: ``torch_compile_s``,
    ``regions_compile_s``, ...) and ``trace``. ``merge`` applies IOS's merge first (ATen kernels, or the traced
    graph before fused regions are cut): ``True`` or ``"all"`` merges every group of sibling convolutions,
    ``"ios"`` the groups where IOS's dynamic programme finds merging faster
    (:func:`opbench.pipeline.compile.ios_merges`).
    ``sm_partition="auto"`` also measures the best parallel schedule with SM partitions (CUDA green
    contexts: the critical path's stream keeps most SMs, the other branches share the rest; off with
    one INFO line where green contexts are missing). ``dtype`` (``float16``, ``bfloat16``, ``float32``)
    runs a copy of the model with its weights and floating-point inputs cast to it (every operator in that
    precision; the result casts the inputs it is given); for a model whose softmax or normalisations must
    stay in float32, pass a model that runs under ``torch.autocast`` instead. Every
    measured row is ``repeat`` samples of ``number`` runs (the median is compared). ``backend`` and
    ``baselines`` are what was measured (the regions of ``kernels="fused"`` are ``backend.regions``).

    ``rtol``: a candidate whose outputs differ from the model's own by more than this relative norm (its
    row's ``error``) is not kept, and its row's ``refused`` says so; default :data:`RTOL` for the inputs'
    precision (5e-2 in float32, 1e-1 in float16, 2e-1 in bfloat16).

    ``cache=True``: keep what this build found (``$OPBENCH_CACHE/capturer``, by default
    ``~/.cache/opbench``), keyed by the model's structure, the inputs, the options, the device and the
    library versions: the cut, the schedule, the table and the choice. A later build of the same model builds
    only the candidate kept (the schedule with its cut, or the one ``torch.compile`` row or the model's graph)
    and measures no other candidate (only a schedule's own captures, ``captures`` below), as an autotuner
    reuses its best configuration; it checks that candidate's outputs against the model's (``rtol``) and
    searches again if they are off. Its table is the first build's, each
    row marked ``cached``; ``run.phases["cache_choice"]`` is 1. ``cache="schedule"`` keeps only the cut and
    the schedule: a later build skips the cut and the search but measures that schedule beside sequential
    and the baselines again, and keeps the fastest. ``run.phases["cache"]`` is 1 for a build that took
    either.

    ``captures``: on a GPU, a kept schedule is captured this many times and the fastest capture, timed through the
    call a user makes, is returned (:data:`CAPTURES` by default; 1 returns the capture measured beside the
    baselines). Two instantiations of one CUDA Graph run its concurrent kernels a few per cent apart, steadily
    (:func:`opbench.pipeline.compare.fastest_capture`; a one-stream schedule, whose captures run alike, is captured
    once); the kept row's ``latency_ms`` is then the kept capture's, ``captures_ms`` every capture's (timed in
    full for the ``finalists`` of a screening round, the others once), and ``compared_ms`` what the comparison
    measured. A rebuild from ``cache`` does the same.

    ``trace`` (a path): also replay sequential and the fastest schedule (kept or not) with a timing mark
    around each operator and write them there as a Chrome trace, one lane per stream
    (:mod:`opbench.runtime.trace`; ``opbench compare --trace`` writes the same).

    A model that cannot be traced, or that returns no tensor, is run unscheduled (``model`` itself)
    with a warning.
    """
    options = overridden(options or CaptureOptions(), overrides, "capturer")
    trace = options.trace
    if trace is not None:
        check_output_path(trace, "trace")
    start = time.perf_counter()
    prepared = _prepared(inputs, model, "capturer", options)  # the model cast once, for the rebuild and the search
    rebuilt = _rebuild(*prepared, options)
    if rebuilt is not None:
        rebuilt.build_s = time.perf_counter() - start
        return rebuilt
    try:
        selected = _select(*prepared, options)
    except OpBenchError as err:
        if str(err).startswith("torch.export failed"):
            log.warning("%s (and torch.fx could not trace it either); running the model unscheduled", err)
            return model
        if "returns no tensor" in str(err):
            log.warning("%s; running the model unscheduled", err)
            return model
        raise
    backend, baselines, plan, rows, phases = (selected.backend, selected.baselines, selected.plan, selected.rows,
                                              selected.phases)
    table = table_rows(rows)
    if trace is not None:
        trace_rows(backend, rows, plan, trace, meta={"model": type(model).__name__, "kernels": options.kernels})
    result: Any
    kept = next(r for r in rows if r["kept"])
    if kept["plan"] is None:
        result = kept["baseline"]
        result.schedule = None
    else:
        result = CapturedSchedule(backend, plan, table, selected.structure, selected.executor)
    result.table = table
    result.backend, result.baselines = backend, baselines
    result.trace = backend.trace
    result.phases = phases
    result.build_s = time.perf_counter() - start
    return result
