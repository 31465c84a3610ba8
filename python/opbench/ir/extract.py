"""``ExtractOperators``: a Relax module pass that lowers to fused operators and builds an OpGraph.

Use it in any pipeline::

    extract = ExtractOperators()
    lowered = tvm.transform.Sequential([extract, my_other_pass])(mod)
    graph = extract.graph          # the OpGraph of the last module it saw

The lowering is TVM's default legalize-and-fuse recipe, preceded by
``DecomposeOpsForInference`` + ``CanonicalizeBindings`` so that conv + batch-norm + relu fuse into
one kernel (docs/architecture.md, "TVM facts"). Afterwards every binding of ``main`` is a ``call_tir`` of a
fused PrimFunc. Before legalization the pass records each Relax operator with its attributes, and
follows it through legalization (binding variables survive ``LegalizeOps``) and fusion (the fused
Relax function lists the legalized PrimFuncs it calls), so each node knows the operators it fuses.
A module that is already lowered is walked as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tvm
import tvm_ffi
from tvm import ir, relax

from ..errors import OpBenchError
from .features import attrs_to_dict, classify, estimate_flops, main_op, tensor_bytes
from .graph import ArgRef, OpGraph, OpNode

_CALL_TIR = ir.Op.get("relax.call_tir")
_CALL_PURE_PACKED = ir.Op.get("relax.call_pure_packed")
_RESHAPE = ir.Op.get("relax.reshape")

OpInfo = tuple[str, dict[str, Any]]


def lowering_passes() -> tuple[list[Any], list[Any], list[Any]]:
    """The three pass groups of the lowering: before legalization, legalize+fuse, fuse TIR.

    The first group also holds TVM's library dispatch (sort, scan, sampling), which turns ops such
    as ``cumsum`` into TIR before legalization, as TVM's default pipelines do.
    """
    t = relax.transform
    return (
        [relax.backend.DispatchSampling(), relax.backend.DispatchSortScan(),
         t.DecomposeOpsForInference(), t.CanonicalizeBindings()],
        [t.LegalizeOps(), t.AnnotateTIROpPattern(), t.FoldConstant(), t.FuseOps()],
        [t.FuseTIR(), t.DeadCodeElimination()],
    )


def _bindings(func: relax.Function) -> list[Any]:
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for block in body.blocks for b in block.bindings]


def entry_function(mod: tvm.IRModule, name: str | None = None) -> str:
    """The Relax function to extract: ``name`` if given, else ``main``, else the module's only Relax
    function (fused and primitive functions do not count)."""
    funcs = [gv.name_hint for gv, f in mod.functions.items()
             if isinstance(f, relax.Function) and not (f.attrs and "Primitive" in f.attrs)]
    if name is not None:
        if name not in funcs:
            raise OpBenchError(f"the module has no Relax function '{name}' (it has: {', '.join(funcs) or 'none'})")
        return name
    if "main" in funcs:
        return "main"
    if len(funcs) == 1:
        return funcs[0]
    if not funcs:
        raise OpBenchError("the module has no Relax function to extract operators from")
    raise OpBenchError(f"the module has no 'main' function and several Relax functions ({', '.join(funcs)}): "
                       "name one with func_name")


def _record_ops(mod: tvm.IRModule, entry: str) -> dict[Any, OpInfo]:
    """Relax operator (name, attrs) bound to each variable of the entry function."""
    out: dict[Any, OpInfo] = {}
    for binding in _bindings(mod[entry]):
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, ir.Op) and value.op != _CALL_TIR:
            name = value.op.name.removeprefix("relax.")
            out[binding.var] = (name, attrs_to_dict(value.attrs))
    return out


def _legalized_ops(mod: tvm.IRModule, recorded: dict[Any, OpInfo], entry: str) -> dict[str, OpInfo]:
    """Legalized PrimFunc name -> the Relax operator it implements."""
    out: dict[str, OpInfo] = {}
    for binding in _bindings(mod[entry]):
        value = binding.value
        if isinstance(value, relax.Call) and value.op == _CALL_TIR and binding.var in recorded:
            out.setdefault(value.args[0].name_hint, recorded[binding.var])
    return out


def _fused_ops(mod: tvm.IRModule, legal: dict[str, OpInfo]) -> dict[str, list[OpInfo]]:
    """Fused function name -> the operators it contains, in order."""
    out: dict[str, list[OpInfo]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs and "Primitive" in func.attrs:
            ops = []
            for binding in _bindings(func):
                value = binding.value
                if isinstance(value, relax.Call) and value.op == _CALL_TIR:
                    name = value.args[0].name_hint
                    ops.append(legal.get(name, (name.rstrip("0123456789"), {})))
            out[gv.name_hint] = ops
    for name, info in legal.items():
        out.setdefault(name, [info])
    return out


def _is_lowered(mod: tvm.IRModule, entry: str) -> bool:
    for binding in _bindings(mod[entry]):
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, ir.Op) and value.op != _CALL_TIR:
            return False
    return True


def _shape(ty: Any) -> tuple[int, ...]:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise OpBenchError(f"operator graph needs static tensor shapes, got {ty}")
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError:
        raise OpBenchError(f"operator graph needs static tensor shapes, got {ty}") from None


def _tensor_types(ty: Any) -> list[Any]:
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def _is_reshape(value: Any) -> bool:
    """``R.reshape(x, shape)`` or what lowering makes of it, ``call_pure_packed("vm.builtin.reshape", x, shape)``."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, ir.Op):
        return False
    if value.op == _RESHAPE:
        return True
    return value.op == _CALL_PURE_PACKED and bool(value.args) and isinstance(value.args[0], relax.ExternFunc) \
        and value.args[0].global_symbol == "vm.builtin.reshape"


def build_op_graph(mod: tvm.IRModule, fused: dict[str, list[OpInfo]] | None = None,
                   entry: str = "main") -> OpGraph:
    """Walk the dataflow of a lowered entry function (default ``main``) and build its :class:`OpGraph`."""
    fused = fused or {}
    main = mod[entry]
    env: dict[Any, Any] = {}
    input_specs = []
    for i, param in enumerate(main.params):
        ty = param.ty
        env[param] = ArgRef("input", i)
        input_specs.append((param.name, _shape(ty), str(ty.dtype)))
    constants: list[Any] = []
    nodes: list[OpNode] = []
    hashes: dict[str, str] = {}

    def ref(expr: Any) -> Any:
        if isinstance(expr, relax.Var):
            if expr not in env:
                raise OpBenchError(f"variable {expr.name} is used before it is defined")
            return env[expr]
        if isinstance(expr, ir.GenericConst):
            constants.append(expr.value)
            return ArgRef("const", len(constants) - 1)
        if isinstance(expr, relax.Tuple):
            return [ref(f) for f in expr.fields]
        raise OpBenchError(f"unsupported argument in main: {type(expr).__name__}")

    def flat(value: Any) -> list[ArgRef]:
        return [r for v in value for r in flat(v)] if isinstance(value, list) else [value]

    for binding in _bindings(main):
        value = binding.value
        if isinstance(value, relax.Call) and value.op == _CALL_TIR:
            gv = value.args[0]
            func_name = gv.name_hint
            args = flat([ref(a) for a in value.args[1].fields])
            arg_exprs = list(value.args[1].fields)
            out_types = _tensor_types(binding.var.ty)
            prim = mod[gv]
            if func_name not in hashes:
                hashes[func_name] = f"{tvm_ffi.structural_hash(prim, map_free_vars=True) & (2**64 - 1):016x}"
            infos = fused.get(func_name, [])
            ops = [name for name, _ in infos]
            kind = classify(ops, func_name)
            attrs = infos[main_op(ops, kind)][1] if infos else {}
            in_shapes = [_shape(a.ty) for a in arg_exprs]
            in_dtypes = [str(a.ty.dtype) for a in arg_exprs]
            out_shapes = [_shape(t) for t in out_types]
            out_dtypes = [str(t.dtype) for t in out_types]
            moved = sum(tensor_bytes(s, d) for s, d in zip(in_shapes + out_shapes,
                                                            in_dtypes + out_dtypes, strict=True))
            index = len(nodes)
            nodes.append(OpNode(index=index, func=func_name, task=hashes[func_name], kind=kind, ops=ops,
                                attrs=attrs, args=args, input_shapes=in_shapes, input_dtypes=in_dtypes,
                                output_shapes=out_shapes, output_dtypes=out_dtypes, flops=estimate_flops(prim),
                                bytes=moved, var_name=binding.var.name))
            if isinstance(binding.var.ty, relax.TupleType):
                env[binding.var] = [ArgRef("node", index, k) for k in range(len(out_types))]
            else:
                env[binding.var] = ArgRef("node", index)
        elif _is_reshape(value):  # a zero-copy view: the same tensor under the binding's shape
            source = ref(value.args[1] if value.op == _CALL_PURE_PACKED else value.args[0])
            if isinstance(source, list):
                raise OpBenchError(f"unsupported reshape of a tuple in lowered main: {binding.var.name}")
            env[binding.var] = dataclasses.replace(source, shape=_shape(binding.var.ty))
        elif isinstance(value, relax.TupleGetItem):
            env[binding.var] = ref(value.tuple_value)[value.index]
        elif isinstance(value, relax.Var | relax.Tuple | ir.GenericConst):
            env[binding.var] = ref(value)
        else:
            what = value.op.name if isinstance(value, relax.Call) and isinstance(value.op, ir.Op) \
                else type(value).__name__
            if isinstance(value, relax.Call) and value.args and isinstance(value.args[0], relax.ExternFunc):
                what += f"({value.args[0].global_symbol})"
            raise OpBenchError(f"unsupported binding in lowered main: {binding.var.name} = {what}")
    outputs = flat(ref(main.body.body))
    return OpGraph(nodes, input_specs, constants, outputs)


@tvm.transform.module_pass(opt_level=0, name="opbench.ExtractOperators")
class ExtractOperators:
    """Lower a Relax module to fused operators and record its :class:`OpGraph` in ``.graph``.

    Parameters
    ----------
    target:
        Optional target whose context the lowering runs in.
    func_name:
        The Relax function whose operators are extracted (default: ``main``, else the module's
        only Relax function, e.g. ``forward`` of a ``tvm.relax.frontend.nn`` export). The name
        used is kept in ``.entry``.
    """

    def __init__(self, target: Any = None, func_name: str | None = None) -> None:
        self.target = target
        self.func_name = func_name
        self.entry: str | None = None
        self.graph: OpGraph | None = None
        self.error: OpBenchError | None = None

    def transform_module(self, mod: tvm.IRModule, ctx: Any) -> tvm.IRModule:
        self.error = None
        try:
            return self._transform(mod)
        except OpBenchError as err:  # keep it: the FFI boundary turns it into a RuntimeError
            self.error = err
            raise

    def _transform(self, mod: tvm.IRModule) -> tvm.IRModule:
        entry = self.entry = entry_function(mod, self.func_name)
        fused: dict[str, list[OpInfo]] = {}
        if not _is_lowered(mod, entry):
            before, legalize_fuse, fuse_tir = lowering_passes()
            target = tvm.target.Target(self.target if self.target is not None else {"kind": "llvm"})
            with target:
                mod = tvm.transform.Sequential(before)(mod)
                recorded = _record_ops(mod, entry)
                mod = legalize_fuse[0](mod)
                legal = _legalized_ops(mod, recorded, entry)
                mod = tvm.transform.Sequential(legalize_fuse[1:])(mod)
                fused = _fused_ops(mod, legal)
                mod = tvm.transform.Sequential(fuse_tir)(mod)
        self.graph = build_op_graph(mod, fused, entry)
        return mod


def extract_operators(mod: tvm.IRModule, target: Any = None,
                      func_name: str | None = None) -> tuple[tvm.IRModule, OpGraph]:
    """Run :class:`ExtractOperators` and return the lowered module and its graph."""
    extract = ExtractOperators(target, func_name)
    try:
        lowered = extract(mod)
    except Exception:
        if extract.error is not None:
            raise extract.error from None
        raise
    assert extract.graph is not None
    return lowered, extract.graph
