"""From a model to kernels that run: the one extract -> apply tuning database -> build path, and
the kernel backends built on it.

:func:`compile_workload` lowers a workload with the ``ExtractOperators`` pass once, picks the best
record of each of its tasks from a tuning database folder (when one is given), and compiles the
Relax VM and every per-operator kernel in one build. The collection job, the compare job, the
``capturer`` facade and the scripts all go through it.

:func:`tvm_backend` and :func:`torch_backend` make the kernel backends the schedulers and the
executor run (:mod:`opbench.runtime.backend`), with IOS's merge applied as asked: ``all`` sibling
convolutions, or the groups IOS's dynamic programme finds faster merged (:func:`ios_merges`,
:func:`tvm_ios_merges`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import signals
from ..errors import OpBenchError
from ..ir import OpGraph, extract_operators
from ..ir.merge import conv_bindings, merge_sibling_convs, sibling_groups
from ..ir.regions import KERNELS
from ..models import Workload
from ..profile.schedule import median, merge_cost, time_ops
from ..runtime import BuiltModule, OperatorKernels, build_module
from ..runtime.backend import KernelBackend, TorchBackend, TVMBackend
from ..runtime.fused import DEFAULT_DEPTHWISE, DEFAULT_LAYOUT, SAVED_DEPTHWISE
from ..runtime.target import tuning_target
from .spec import Spec, SpecError, check_positive, overridden

log = logging.getLogger(__name__)
#: IOS's merge: none, every group of sibling convolutions (all), or the groups IOS's DP merges (ios)
MERGE_MODES = ("none", "all", "ios")


@dataclasses.dataclass
class CompiledWorkload:
    """A workload lowered and compiled once: its operator graph, the build, the tuning records applied."""

    workload: Workload
    target: Any
    lowered: Any  # the module ExtractOperators produced (unscheduled)
    graph: OpGraph
    built: BuiltModule
    applied: Any = None  # opbench.tune.database.Applied: the tuning records in the build, if any

    @property
    def config(self) -> str:
        """The rows' kernel configuration: ``default`` or ``db:<digest>`` of the applied records."""
        return self.applied.config if self.applied is not None else "default"

    @functools.cached_property
    def kernels(self) -> OperatorKernels:
        """Every operator's compiled kernel (on this machine's device)."""
        return OperatorKernels(self.graph, self.built)

    def backend(self, inputs: Sequence[Any] | None = None, resources: bool = True) -> TVMBackend:
        """The kernels as a backend over static buffers holding ``inputs`` (default: the workload's
        example inputs); on a GPU with each kernel's resources (grid, threads, registers, shared memory)."""
        inputs = inputs if inputs is not None else self.workload.example_inputs()
        res = None
        if resources and self.kernels.device.dlpack_device_type() == 2:
            from ..profile.cuda import CudaProfiler

            res = CudaProfiler().resources(self.kernels)
        return TVMBackend(self.kernels, inputs, res)


def compile_workload(workload: Workload, target: Any, database: str | Path | None = None,
                     exclude: set[str] | None = None, device: Any = None, mod: Any = None) -> CompiledWorkload:
    """Extract ``workload``'s operators, apply the best record of each task from the tuning database
    folder ``database`` (except the tasks in ``exclude``), and build.

    ``device`` is the measuring device when it is not this machine (its limits shape the tuning
    tasks, which must match the records'); ``mod`` replaces the workload's module (a rewritten one,
    e.g. merged convolutions). A database without a record for any task leaves the default
    schedules, with a warning. A Ctrl-C or SIGTERM during extraction takes effect when it returns.
    """
    with signals.deferred():  # a signal inside TVM's passes is raised once they return, never mid-pass
        lowered, graph = extract_operators(workload.mod if mod is None else mod, target)
    applied = None
    if database is not None:
        from tvm.s_tir import meta_schedule as ms

        from ..tune.database import applied_database

        tasks = list(ms.relax_integration.extract_tasks(lowered, tuning_target(target, device)))
        applied = applied_database(database, tasks, target, exclude)
        if applied is None:
            log.warning("tuning database %s has no record for this model's tasks; default kernels", database)
    built = build_module(lowered, target, applied.database if applied else None)
    return CompiledWorkload(workload, target, lowered, graph, built, applied)


def merge_mode(merge: bool | str | None) -> str:
    """``merge`` as one of :data:`MERGE_MODES` (True is ``all``, False or None ``none``)."""
    if merge is True:
        return "all"
    if merge is False or merge is None:
        return "none"
    if merge in MERGE_MODES:
        return str(merge)
    raise OpBenchError(f"unknown merge '{merge}' (accepted: {', '.join(MERGE_MODES)}, True, False)")


def tvm_backend(workload: Workload, target: Any, inputs: Sequence[Any] | None = None, resources: bool = True,
                database: str | Path | None = None, merge: bool | str = False, repeat: int = 10,
                number: int = 20) -> TVMBackend:
    """A workload's TVM kernels as a backend (tuned ones where the database folder ``database`` has
    records). ``merge`` (:data:`MERGE_MODES`) applies IOS's merge to the Relax module first
    (:mod:`opbench.ir.merge`): ``True`` or ``"all"`` every group of sibling convolutions, ``"ios"`` the
    groups :func:`tvm_ios_merges` picks (two more builds: every group merged, to time the merged
    kernels, then the chosen ones)."""
    from ..ir.extract import entry_function

    mode = merge_mode(merge)
    inputs = inputs if inputs is not None else workload.example_inputs()

    def build(mod: Any = None) -> TVMBackend:
        return compile_workload(workload, target, database, mod=mod).backend(inputs, resources)

    if mode == "none":
        return build()
    mod = workload.mod
    entry = entry_function(mod)
    groups = len(sibling_groups(mod[entry]))
    merged_mod, _ = merge_sibling_convs(mod, entry)
    if mode == "all" or not groups:
        log.info("merge: %d group(s) of sibling convolutions merged", groups)
        return build(merged_mod)
    plain, merged = build(), build(merged_mod)
    chosen = tvm_ios_merges(mod, entry, plain, merged, repeat=repeat, number=number)
    log.info("merge: IOS merges %d of %d group(s) of sibling convolutions: %s", len(chosen), groups,
             ", ".join(str(i) for i in chosen) or "none")
    if not chosen:
        return plain
    if len(chosen) == groups:
        return merged
    return build(merge_sibling_convs(mod, entry, chosen)[0])


def check_kernels(kernels: str) -> str:
    """``kernels`` if it is one of :data:`KERNELS`, else a one-line error naming them."""
    if kernels not in KERNELS:
        raise OpBenchError(f"unknown kernels '{kernels}' (accepted: {', '.join(KERNELS)})")
    return kernels


#: how every torch model is traced into operators, by ``capturer``/``optimize`` and by ``compare --backend torch``
#: alike: torch.fx first (the calls the user wrote, traced in a fraction of export's time), torch.export when fx
#: cannot trace the model (data-dependent Python control flow); :mod:`opbench.ir.torch_graph`
TORCH_TRACE = "auto"


@dataclasses.dataclass(frozen=True)
class BackendSpec(Spec):
    """Which kernels run a model's operators, for the compare job and the facade.

    Attributes
    ----------
    kind:
        ``tvm`` (TVM's kernels), ``torch`` (the model's PyTorch kernels) or ``fused`` (``torch`` with
        ``kernels="fused"``).
    kernels:
        For ``torch``: ``aten``, ATen's kernel per traced call, or ``fused``, regions of the traced graph each
        compiled by Inductor.
    merge:
        IOS's merge of sibling convolutions (:data:`MERGE_MODES`: ``none``, ``all``, ``ios``).
    cut:
        How fused regions are cut (``auto``: the branches; :data:`opbench.ir.regions.CUTS`).
    regions:
        A saved cut's regions (node names), used instead of cutting again.
    merged:
        A saved fused schedule's merged groups of sibling convolutions (node names, its
        ``meta["merged"]``), merged again instead of choosing (the saved ``regions`` name their nodes).
    compiled:
        ``torch.compile`` baselines beside a torch model's own CUDA Graph (``None``: with fused kernels).
    combo:
        For fused kernels: compile each long region also with Inductor's combo kernels and keep, region by region,
        the code that runs faster (:func:`choose_combo`); :func:`model_backend` and the capturer do so whenever
        their ``torch.compile`` rows include combo kernels.
    combo_regions:
        A saved fused schedule's regions that ran their combo-kernel code (its ``meta["combo"]``), built so again
        instead of choosing.
    layout:
        For fused kernels, the layout of the regions' convolutions (:data:`opbench.runtime.fused.LAYOUTS`):
        ``inductor`` (Inductor's choice) or ``pytorch`` (the model's own: later builds start sooner where the model
        has grouped convolutions); a saved fused schedule's ``meta["layout"]``.
    conv_relu:
        For fused kernels, whether each convolution -> eval batch norm -> ReLU chain runs as one cuDNN call
        (``FusedBackend(conv_relu=)``): ``None`` decides (on a GPU, in Inductor's layout, without grouped
        convolutions); a saved fused schedule's ``meta["conv_relu"]``.
    depthwise:
        For fused kernels, how depthwise convolutions run (:data:`opbench.ir.depthwise.DEPTHWISE`:
        ``FusedBackend(depthwise=)``; ``aten``, PyTorch's convolution; ``auto``, the default, chooses for the
        network); a saved fused schedule's ``meta["depthwise"]`` (what was chosen).
    piece_ops:
        For fused kernels, the most a region of a new cut weighs before it is cut into pieces that worker processes
        compile at once (``FusedBackend(piece_ops=)``; ``None``: its default, a limit only where depthwise
        convolutions are unfolded; 0: no limit).
    trace:
        How a torch model is traced (:data:`TORCH_TRACE`, shared by every caller).
    repeat, number:
        Timing of the measurements a backend's construction makes (IOS's merge, the ``blocks`` cut).
    """

    kind: str = "tvm"
    kernels: str = "aten"
    merge: str = "none"
    cut: str = "auto"
    regions: tuple[tuple[str, ...], ...] | None = None
    merged: tuple[tuple[str, ...], ...] | None = None
    compiled: bool | None = None
    combo: bool = False
    combo_regions: tuple[int, ...] | None = None
    layout: str = DEFAULT_LAYOUT
    conv_relu: bool | None = None
    depthwise: str = DEFAULT_DEPTHWISE
    piece_ops: int | None = None
    trace: str = TORCH_TRACE
    repeat: int = 10
    number: int = 20

    def validate(self) -> None:
        """Check every field (see :class:`~opbench.pipeline.spec.Spec`)."""
        from ..ir.depthwise import DEPTHWISE
        from ..ir.regions import CUTS
        from ..ir.torch_graph import TRACERS as TRACES
        from ..runtime.backend import BACKEND_KINDS
        from ..runtime.fused import LAYOUTS

        for name, value, accepted in (("kind", self.kind, BACKEND_KINDS.kinds()), ("kernels", self.kernels, KERNELS),
                                      ("merge", self.merge, MERGE_MODES), ("cut", self.cut, ("auto", *CUTS)),
                                      ("trace", self.trace, TRACES), ("layout", self.layout, LAYOUTS),
                                      ("depthwise", self.depthwise, DEPTHWISE)):
            if value not in accepted:
                raise SpecError(name, f"unknown {name} {value!r} (accepted: {', '.join(accepted)})")
        if self.combo_regions is not None and not all(type(r) is int and r >= 0 for r in self.combo_regions):
            raise SpecError("combo_regions", f"combo_regions {list(self.combo_regions)!r}: region indices are whole "
                                             "numbers from 0 (a saved schedule's meta['combo'])")
        if self.piece_ops is not None and (type(self.piece_ops) is not int or self.piece_ops < 0):
            raise SpecError("piece_ops", f"piece_ops {self.piece_ops!r} (accepted: a whole number from 0, 0 for no "
                                         "limit, or null for the default)")
        if not (self.conv_relu is None or isinstance(self.conv_relu, bool)):
            raise SpecError("conv_relu", f"conv_relu {self.conv_relu!r} (accepted: true, false, or null to decide)")
        check_positive(self, ("repeat", "number"))


def torch_backend(model: Any, inputs: Sequence[Any], spec: BackendSpec | None = None, /,
                  **overrides: Any) -> KernelBackend:
    """A torch model's kernels as a backend, as ``spec`` (a :class:`BackendSpec`; keywords of its fields'
    names override them) says: ``kernels="aten"``, a :class:`TorchBackend` (PyTorch's kernels, one per traced
    call) with IOS's merge applied as ``merge`` says (:data:`MERGE_MODES`: ``all`` merges every group of
    sibling convolutions, ``ios`` the groups :func:`ios_merges` picks, logged; ``backend.merged_groups``
    lists what was merged); ``kernels="fused"``, a :class:`~opbench.runtime.fused.FusedBackend` (regions
    compiled by Inductor; ``cut`` or a saved cut's ``regions``; ``auto`` is the branches cut), with IOS's merge
    written into the traced graph before the cut (``all``, or ``ios``: the groups :func:`ios_merges` picks on
    the ATen kernels of the same trace; a saved schedule's ``merged`` groups again)."""
    o = overridden(spec or BackendSpec(), overrides, "torch_backend")
    mode = merge_mode(o.merge)
    repeat, number, trace, regions = o.repeat, o.number, o.trace, o.regions
    if check_kernels(o.kernels) == "fused":
        from ..ir.torch_graph import fx_module
        from ..profile.schedule import alone_times

        merge: bool | Sequence[Sequence[str]] = mode == "all"
        if o.merged is not None:
            merge = [list(g) for g in o.merged]
        elif mode == "ios":
            merge = ios_merges(TorchBackend(fx_module(model, inputs, trace)[0], inputs, trace="graph"),
                               repeat=repeat, number=number)
            log.info("merge: IOS merges %d group(s) of sibling convolutions before the cut: %s", len(merge),
                     "; ".join("+".join(g) for g in merge) or "none")
        costs = None
        if o.cut == "blocks" and regions is None:  # each traced (and merged) operator alone, PyTorch's kernel
            def costs(gm: Any) -> list[float]:
                return alone_times(TorchBackend(gm, inputs, trace="graph"), repeat=min(repeat, 3),
                                   number=min(number, 5))
        fused = KernelBackend.create("fused", model, inputs, cut="branches" if o.cut == "auto" else o.cut,
                                     regions=regions, trace=trace, costs=costs, merge=merge or False,
                                     combo=list(o.combo_regions) if o.combo_regions is not None else o.combo,
                                     layout=o.layout, conv_relu=o.conv_relu, depthwise=o.depthwise,
                                     piece_ops=o.piece_ops)
        choose_combo(fused, repeat, number)
        return fused
    backend = TorchBackend(model, inputs, trace=trace, merge=mode == "all")
    if mode == "ios":
        chosen = ios_merges(backend, repeat=repeat, number=number)
        log.info("merge: IOS merges %d of %d group(s) of sibling convolutions: %s", len(chosen),
                 len(backend.merge_groups()), "; ".join("+".join(g) for g in chosen) or "none")
        if chosen:
            backend = TorchBackend(model, inputs, trace=backend.trace, merge=chosen)
    return backend


def combo_in_regions(compiled: bool | Sequence[str] | None, kernels: str) -> bool:
    """Whether fused regions are offered combo kernels (:func:`choose_combo`) beside the ``torch.compile`` rows that
    ``compiled`` asks for (:func:`~opbench.runtime.graphs.compile_variants`): with fused kernels, whenever those rows
    include combo kernels."""
    from ..runtime.graphs import compile_variants

    return kernels == "fused" and "combo" in compile_variants(compiled, kernels)


def saved_cut(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The :class:`BackendSpec` fields that build a saved fused schedule's regions again, from its ``meta``: the cut
    (``regions``), the merged groups it names (``merged``), the regions that ran combo-kernel code
    (``combo_regions``; none for a schedule saved before they could), the layout of their convolutions
    (``layout``; Inductor's for one saved before it could be chosen) and whether convolution -> batch norm -> ReLU
    chains ran as one call (``conv_relu``; not for one saved before they could) and how depthwise convolutions ran
    (``depthwise``; PyTorch's convolution for one saved before they could run otherwise); ``{}`` for a schedule
    without a cut."""
    regions = (meta or {}).get("regions")
    if not regions:
        return {}
    return {"regions": regions, "merged": meta.get("merged") or None, "combo_regions": tuple(meta.get("combo") or ()),
            "layout": meta.get("layout") or DEFAULT_LAYOUT, "conv_relu": bool(meta.get("conv_relu", False)),
            "depthwise": meta.get("depthwise") or SAVED_DEPTHWISE}


#: how much faster (relative median) a region's combo-kernel code must run to be kept over its default code: at a
#: tie the default stays, whose stored code a later build loads sooner (mobilenet_v3_large's one region, H200: 0.2 %
#: faster with combo kernels, loaded in 2.1 s against 1.5 s)
COMBO_MARGIN = 0.01


def choose_combo(backend: Any, repeat: int = 10, number: int = 20, rounds: int = 3,
                 margin: float = COMBO_MARGIN) -> dict[str, tuple[float, float]]:
    """Time each region that a fused backend offers in two codes (``FusedBackend(combo=True)``: Inductor's default
    and its combo kernels), each alone in its own CUDA Graph (:func:`time_ops`, the path the schedulers' costs take),
    in ``rounds`` alternating rounds, and keep the combo-kernel code of each region whose median is lower than the
    default's by more than ``margin`` (``backend.use_combo``). Returns region -> (default, combo) median seconds,
    also kept as ``backend.combo_times``."""
    offered = list(getattr(backend, "combo_offered", []))
    if not offered:
        return {}
    for index in range(len(backend.graph)):  # every operator once: the values each region reads
        backend.launch(index)
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in offered}
    for _ in range(rounds):
        for with_combo in (False, True):
            backend.use_combo(offered if with_combo else [])
            for name in offered:
                samples[name][with_combo].extend(time_ops(backend, [backend.region_op(name)], repeat, number))
    times = {name: (median(default), median(combo)) for name, (default, combo) in samples.items()}
    kept = [name for name, (default, combo) in times.items() if combo < default * (1 - margin)]
    backend.use_combo(kept)
    backend.combo_times = times
    log.info("combo kernels inside regions: %s", "; ".join(
        f"{name} {d * 1e3:.3f} -> {c * 1e3:.3f} ms ({'kept' if name in kept else 'not kept'})"
        for name, (d, c) in times.items()))
    return times


def ios_merges(backend: TorchBackend, latencies: Sequence[float] | None = None, repeat: int = 10,
               number: int = 20, time_limit_s: float = 60.0) -> list[list[str]]:
    """The groups of sibling convolutions that IOS's dynamic programme runs merged, by node name.

    The DP (:class:`opbench.schedule.ios.IOS` with a merge cost) weighs, for every candidate
    stage of two or more sibling convolutions, running them concurrently (the scheduling cost, on
    ``latencies`` or the operators timed alone) against running them as one merged convolution
    (timed alone, :func:`opbench.profile.schedule.merge_cost`), and merges where that is faster.
    """
    if not backend.merge_groups():
        return []
    merged = _ios_merged_stages(backend, merge_cost(backend, max(3, repeat // 2), number), latencies, repeat,
                                number, time_limit_s)
    return [[backend.graph[i].var_name for i in ops] for ops in merged]


def _ios_merged_stages(backend: KernelBackend, merge: Any, latencies: Sequence[float] | None, repeat: int,
                       number: int, time_limit_s: float) -> list[list[int]]:
    """The stages IOS's dynamic programme runs merged on ``backend``'s operators, with merge cost
    ``merge`` and the scheduling cost on ``latencies`` (timed alone when not given)."""
    from ..schedule.ios import IOS
    from .costs import operator_latencies, scheduling_cost

    if latencies is None:
        latencies = operator_latencies(backend, repeat, number)
    plan = IOS(time_limit_s=time_limit_s, merge=merge).schedule(backend.graph, scheduling_cost(backend, latencies))
    return plan.meta["merged"]


def _conv_operators(bindings: Sequence[Any], graph: Any, check: bool = True) -> list[int]:
    """For each ``conv2d`` binding of ``bindings`` (in program order), the index of the extracted
    operator of ``graph`` that computes it (``check``: its weight's shape agrees)."""
    ops = [n.index for n in graph if "nn.conv2d" in n.ops]
    agree = len(ops) == len(bindings) and (not check or all(
        tuple(b.value.args[1].value.shape) in [tuple(x) for x in graph[op].input_shapes]
        for b, op in zip(bindings, ops, strict=True)))
    if not agree:
        raise OpBenchError("--merge ios: the model's convolutions do not map one to one onto its lowered "
                           "convolution kernels (use --merge all)")
    return ops


def tvm_ios_merges(mod: Any, func_name: str, plain: TVMBackend, merged: TVMBackend,
                   latencies: Sequence[float] | None = None, repeat: int = 10, number: int = 20,
                   time_limit_s: float = 60.0) -> list[int]:
    """The sibling groups (positions in :func:`opbench.ir.merge.sibling_groups`) that IOS's dynamic
    programme merges, for TVM kernels.

    ``plain`` and ``merged`` are ``mod``'s kernels without and with every group merged. Each
    group's merged kernel is timed alone in ``merged``; the DP runs on ``plain``'s operators
    (``latencies``, or timed alone) and may run a stage of exactly one whole group as that kernel.
    """
    func = mod[func_name]
    groups = sibling_groups(func)
    if not groups:
        return []
    convs = conv_bindings(func)
    later = [b for g in groups for b in g[1:]]
    kept = [b for b in convs if not any(b.var.same_as(s.var) for s in later)]  # the merged module's convolutions

    def position(b: Any, among: list[Any]) -> int:
        return next(k for k, c in enumerate(among) if c.var.same_as(b.var))

    plain_ops = _conv_operators(convs, plain.graph)
    merged_ops = _conv_operators(kept, merged.graph, check=False)  # a group's kernel holds all its weights
    members = {tuple(sorted(plain_ops[position(b, convs)] for b in g)): i for i, g in enumerate(groups)}
    kernel = {i: merged_ops[position(g[0], kept)] for i, g in enumerate(groups)}
    timed: dict[int, float] = {}

    def cost(ops: Sequence[int]) -> float | None:
        i = members.get(tuple(sorted(ops)))
        if i is None:
            return None
        if i not in timed:
            timed[i] = median(time_ops(merged, [kernel[i]], max(3, repeat // 2), number))
        return timed[i]

    chosen = _ios_merged_stages(plain, cost, latencies, repeat, number, time_limit_s)
    return sorted(members[tuple(sorted(ops))] for ops in chosen)


def model_backend(workload: Any, target: Any, spec: BackendSpec | None = None, database: Any = None,
                  seed: int = 0) -> tuple[KernelBackend, list[Any] | None]:
    """``workload``'s kernels as ``spec`` says (a :class:`BackendSpec`) for the compare job, and the baselines
    where the backend runs the model's PyTorch kernels: the model's own CUDA Graph and (``compiled``; by
    default with fused kernels) ``torch.compile(model, mode="reduce-overhead")``.

    ``tvm``: TVM's kernels (tuned ones from the tuning database folder ``database``); ``torch``: the
    model's PyTorch kernels (sources with a PyTorch model: local, transformers), ATen's one per traced
    call (``kernels="aten"``) or regions compiled by Inductor (``kernels="fused"``, cut as ``cut``
    says or as a saved schedule's ``regions`` were; ``fused`` as ``kind`` is the same). ``merge`` applies IOS's
    merge (:data:`opbench.pipeline.compile.MERGE_MODES`). ``seed`` makes the inputs.
    """
    from ..runtime.device import gpu_index
    from ..runtime.graphs import CapturedModel, compile_variants, compiled_baselines
    from ..runtime.target import is_gpu

    spec = spec or BackendSpec()
    KernelBackend.check_kind(spec.kind)
    if spec.kind == "fused":
        spec = dataclasses.replace(spec, kind="torch", kernels="fused")
    merge, kernels = merge_mode(spec.merge), check_kernels(spec.kernels)
    if kernels == "fused" and spec.kind == "tvm":
        raise OpBenchError("fused kernels are regions of a PyTorch model compiled by Inductor: use them with "
                           "--backend torch (TVM's kernels are fused by TVM already)")
    if spec.kind == "tvm":
        log.info("extracting and compiling %s for %s", workload.name, target.kind.name)
        return tvm_backend(workload, target, workload.example_inputs(seed), database=database, merge=merge,
                           repeat=spec.repeat, number=spec.number), None
    if workload.torch_module is None:
        raise OpBenchError(f"--backend {spec.kind} needs a torch model; source '{workload.source}' has none "
                           "(accepted sources: local, transformers)")

    device = f"cuda:{gpu_index()}" if is_gpu(target) else "cpu"
    module = workload.torch_module.to(device).eval()
    inputs = workload.torch_inputs(seed, device)
    baselines: list[Any] = [CapturedModel(module, inputs)]
    baselines += compiled_baselines(module, inputs, compile_variants(spec.compiled, kernels))
    if kernels == "fused":
        log.info("cutting %s into regions and compiling each with Inductor", workload.name)
    backend = torch_backend(module, inputs, spec, regions=spec.regions if kernels == "fused" else None,
                            combo=spec.combo or combo_in_regions(spec.compiled, kernels))
    return backend, baselines


__all__ = ["KERNELS", "MERGE_MODES", "TORCH_TRACE", "BackendSpec", "CompiledWorkload", "check_kernels",
           "choose_combo", "combo_in_regions", "compile_workload", "ios_merges", "merge_mode", "model_backend",
           "saved_cut", "torch_backend", "tvm_backend", "tvm_ios_merges"]
