"""Compile a lowered module once: the Relax VM and every per-operator kernel share the result."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import tvm
from tvm import relax

from .target import device_for, is_gpu

log = logging.getLogger(__name__)


def schedule_passes(target: Any) -> list[Any]:
    """Default schedules applied to the fused PrimFuncs: dlight on GPUs, none on CPUs."""
    if not is_gpu(target):
        return []
    from tvm.s_tir import dlight as dl

    rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    return [dl.ApplyDefaultSchedule(*(_guarded(rule) for rule in rules))]


def _guarded(rule: Any) -> Any:
    """``rule`` as a dlight rule that declines (returns None) where it would raise, so that the next
    rule schedules the function: TVM 0.27's GEMV rule asserts on some sampled reductions (e.g. a
    mean over a 1x1 feature map), which would otherwise stop the whole model's build."""
    from tvm.s_tir import dlight as dl

    class Guarded(dl.ScheduleRule):
        def apply(self, func: Any, target: Any, tunable: bool) -> Any:
            try:
                return rule.apply(func, target, tunable)
            except Exception as err:  # a rule's bug: leave the function to the next rule
                log.debug("dlight %s declined a function (%s: %s)", type(rule).__name__, type(err).__name__, err)
                return None

    return Guarded()


def uses_wmma(mod: tvm.IRModule) -> bool:
    """Whether a PrimFunc of ``mod`` keeps a tensor-core (WMMA) accumulator fragment."""
    from tvm import tirx

    from .resources import _walk

    found: list[Any] = []

    def visit(node: Any) -> bool:
        found.extend(b for b in getattr(node, "alloc_buffers", None) or [] if str(b.scope()) == "wmma.accumulator")
        return not found

    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            _walk(func.body, visit)
            if found:
                return True
    return False


def build_context(mod: tvm.IRModule) -> tvm.transform.PassContext:
    """The pass context to compile ``mod`` in.

    TVM 0.27's storage rewrite lets a float32 WMMA accumulator tile share its buffer with the float16
    operand tiles, after which the float32 store of ``wmma_store_16x16x16_f32_*`` fails to lower
    ("tvm_access_ptr element type must match the source buffer"): every MetaSchedule tensor-core
    schedule that accumulates in float32 (``wmma_sync_16x16x16_f16f16f32``) would fail to build. A
    module with a WMMA accumulator is therefore built with storage rewrite off (its tiles keep their
    own buffers); every other module gets the ordinary context.
    """
    current = tvm.transform.PassContext.current()
    if not uses_wmma(mod):
        return current
    config = dict(current.config.items()) if current.config else {}
    config["tirx.disable_storage_rewrite"] = True
    return tvm.transform.PassContext(opt_level=current.opt_level, config=config,
                                     required_pass=list(current.required_pass),
                                     disabled_pass=list(current.disabled_pass))


def _finalize_pipeline(target: Any) -> Any:
    backend = relax.backend.cuda.pipeline if is_gpu(target) else relax.backend.cpu_generic.pipeline

    @tvm.transform.module_pass(opt_level=0, name="opbench.Finalize")
    def finalize(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        with target:
            passes = backend.dataflow_lower_passes(target) + backend.finalize_passes(target)
            return tvm.transform.Sequential(passes)(mod)

    return finalize


@dataclasses.dataclass
class BuiltModule:
    """A compiled model: the VM executable and the library holding every fused kernel."""

    executable: Any
    target: Any
    device: Any
    compile_seconds: float
    scheduled: Any = None

    def device_source(self) -> str:
        """The generated CUDA C source of every kernel (empty on CPU targets)."""
        host = self.library
        return host.imports[0].inspect_source("cuda") if host.imports else ""

    @property
    def library(self) -> Any:
        """The module whose functions are the fused kernels (by PrimFunc name)."""
        return self.executable.mod.imports[0]

    def kernel(self, name: str) -> Any:
        """The compiled kernel of PrimFunc ``name`` (destination-passing style)."""
        return self.executable.mod.get_function(name, query_imports=True)

    def vm(self) -> Any:
        """A Relax VM over the executable."""
        return relax.VirtualMachine(self.executable, self.device)


def apply_database(lowered: tvm.IRModule, target: Any, database: Any) -> tvm.IRModule:
    """Replace every fused PrimFunc that ``database`` (a MetaSchedule database) has a record for
    with its tuned schedule; the others stay as they are for the default schedules."""
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(lowered)


def build_module(lowered: tvm.IRModule, target: Any, database: Any = None) -> BuiltModule:
    """Schedule and compile a module lowered by ``ExtractOperators``.

    Kernels with a record in ``database`` get their tuned schedule; every other kernel gets the
    default one (dlight on GPUs, none on CPUs). Works on a copy: ``lowered`` stays unscheduled, so
    tuning tasks can still be extracted from it.
    """
    start = time.perf_counter()
    lowered = tvm.IRModule(dict(lowered.functions_items()), attrs=lowered.attrs, global_infos=lowered.global_infos)
    if database is not None:
        lowered = apply_database(lowered, target, database)
    passes = schedule_passes(target)
    if passes:
        with target:
            lowered = tvm.transform.Sequential(passes)(lowered)
    if target.kind.name == "cuda":  # the kernels' resources are then read from this build's binary
        from .resources import remember_cuda_binaries

        remember_cuda_binaries()
    with build_context(lowered):
        executable = tvm.compile(lowered, target=target, relax_pipeline=_finalize_pipeline(target))
    return BuiltModule(executable, target, device_for(target), time.perf_counter() - start, lowered)


def launch_dims(lowered: tvm.IRModule, target: Any) -> dict[str, dict[str, Any]]:
    """Each fused PrimFunc's kernel launches under the default GPU schedules, without compiling:
    ``{name: {"grid": [[x, y, z], ...], "block": [[x, y, z], ...], "threads": n}}`` (one entry per
    kernel; ``threads`` of the first). Empty on CPU targets."""
    from tvm import tirx

    passes = schedule_passes(target)
    if not passes:
        return {}
    with target:
        scheduled = tvm.transform.Sequential(passes)(lowered)
    axes = {"x": 0, "y": 1, "z": 2}
    out: dict[str, dict[str, Any]] = {}
    for gv, func in scheduled.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        kernels: list[tuple[list[int], list[int]]] = []

        def visit(stmt: Any, inside: bool, kernels: list = kernels) -> None:
            if isinstance(stmt, tirx.For) and stmt.thread_binding is not None:
                tag = str(stmt.thread_binding.thread_tag)
                if not inside:
                    kernels.append(([1, 1, 1], [1, 1, 1]))
                kind, _, axis = tag.partition(".")
                try:
                    extent = int(stmt.extent)
                except (TypeError, ValueError):
                    extent = 1
                dims = kernels[-1][0] if kind == "blockIdx" else kernels[-1][1] if kind == "threadIdx" else None
                if dims is not None and axis in axes:
                    dims[axes[axis]] = max(dims[axes[axis]], extent)
                visit(stmt.body, True)
                return
            if isinstance(stmt, tirx.SeqStmt):
                for s in stmt.seq:
                    visit(s, inside)
                return
            for attr in ("block", "body", "then_case", "else_case"):
                child = getattr(stmt, attr, None)
                if child is not None and child is not stmt:
                    visit(child, inside)

        visit(func.body, False)
        if kernels:
            out[gv.name_hint] = {"grid": [k[0] for k in kernels], "block": [k[1] for k in kernels],
                                 "threads": int(kernels[0][1][0] * kernels[0][1][1] * kernels[0][1][2])}
    return out
