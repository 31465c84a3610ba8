"""Casting a Relax module to another floating-point precision (float16, bfloat16).

TVM's PyTorch importer gives every convolution and matmul ``out_dtype="float32"``, so a model cast
to half precision before import does not import (a float32 convolution meets a float16 bias). A
model is therefore imported in float32 and then cast here, everything at once:

1. every float32 constant (the weights, batch-norm scales, scalars) becomes ``dtype``;
2. every float32 tensor parameter of a function (the model's inputs) becomes ``dtype``;
3. every operator attribute that names float32 as its result (``dtype`` of ``astype``, ``full``,
   ``zeros``, ``arange``...) names ``dtype``; convolutions and matmuls keep accumulating in float32
   (their ``out_dtype``) and are rounded to ``dtype`` by a cast that TVM fuses into their kernel, as
   cuBLAS and cuDNN compute half precision (:data:`ACCUMULATE_FLOAT32`);
4. every binding is re-inferred, so the whole graph computes in ``dtype``: softmax, reductions and
   normalisations too (for PyTorch models, ``torch.autocast`` is the alternative that keeps such
   operators in float32). The exceptions are the operators TVM's kernels cannot compute in
   ``dtype`` (:data:`KEEP_FLOAT32`: layer norm and power in bfloat16), which run in float32 between two casts.

Integer and boolean tensors (token ids, masks, indices) are left as they are.
"""

from __future__ import annotations

from typing import Any

from ..errors import OpBenchError
from ..utils import numpy_dtype

#: attribute fields that name a result dtype
_DTYPE_FIELDS = ("out_dtype", "dtype")
#: operators TVM's kernels cannot compute in a dtype: they stay in float32, between two casts
#: operators that accumulate in float32 (``out_dtype``) and round once to ``dtype``, as cuBLAS and cuDNN do
ACCUMULATE_FLOAT32 = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.matmul")
# TOPI's layer_norm takes float32 and float16 only; TIR's pow does not count bfloat16 as a float
KEEP_FLOAT32 = {"bfloat16": ("relax.nn.layer_norm", "relax.power")}


def _mutator(mod: Any, dtype: str) -> Any:
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax import expr_functor

    def retyped(ty: Any) -> Any:
        if isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32":
            return relax.TensorType(ty.shape, dtype, ty.vdevice) if ty.shape is not None else \
                relax.TensorType(dtype=dtype, ndim=ty.ndim)
        if isinstance(ty, relax.TupleType):
            return relax.TupleType([retyped(f) for f in ty.fields])
        return ty

    def cast_const(expr: Any) -> Any:
        if isinstance(expr, tvm.ir.expr.Constant):
            value = getattr(expr, "value", None)
            if hasattr(value, "numpy") and str(value.dtype) == "float32":
                with np.errstate(over="ignore"):  # a float32 mask's -3.4e38 is -inf in float16, as in PyTorch
                    return relax.const(value.numpy().astype(numpy_dtype(dtype)))
            if isinstance(value, float) and str(getattr(expr.ty, "dtype", "")) == "float32":
                return relax.const(value, dtype)
        elif isinstance(expr, relax.Tuple):
            fields = [cast_const(f) for f in expr.fields]
            if any(a is not b for a, b in zip(fields, expr.fields, strict=True)):
                return relax.Tuple(fields)
        return expr

    @expr_functor.mutator
    class Caster(relax.PyExprMutator):
        def visit_generic_const_(self, const: Any) -> Any:
            return cast_const(const)

        def visit_var_def_(self, var: Any) -> Any:
            ty = retyped(var.ty)
            return var if ty is var.ty else relax.Var(getattr(var, "name_hint", None) or var.name, ty)

        def visit_call_(self, call: Any) -> Any:
            original = call
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) in KEEP_FLOAT32.get(dtype, ()):
                return self.in_float32(call, original)
            args = [cast_const(a) for a in call.args]
            attrs = call.attrs
            info = getattr(type(attrs), "__tvm_ffi_type_info__", None) if attrs is not None else None
            fields = {f.name: getattr(attrs, f.name) for f in info.fields} if info is not None else {}
            if getattr(call.op, "name", None) in ACCUMULATE_FLOAT32 and \
                    str(fields.get("out_dtype")) in ("float32", "None", "void", "") and \
                    str(getattr(original.ty, "dtype", "")) == "float32":
                fields["out_dtype"] = "float32"  # unset means "as the inputs", which are now ``dtype``
                accumulate = tvm.ir.make_node(info.type_key, **fields)
                inner = self.builder_.emit(relax.Call(call.op, args, accumulate, call.ty_args, call.span))
                return relax.op.astype(inner, dtype)
            hits = [k for k in _DTYPE_FIELDS if k in fields and str(fields[k]) == "float32"]
            if not hits and all(a is b for a, b in zip(args, call.args, strict=True)):
                return call
            for key in hits:
                fields[key] = dtype
            new_attrs = tvm.ir.make_node(info.type_key, **fields) if hits else attrs
            return self.builder_.normalize(relax.Call(call.op, args, new_attrs, call.ty_args, call.span))

        def in_float32(self, call: Any, original: Any) -> Any:
            """``call`` computed in float32: its constants as they were, its tensors cast there and back."""
            args = []
            for new, old in zip(call.args, original.args, strict=True):
                if isinstance(old, tvm.ir.expr.Constant):
                    args.append(old)
                elif str(getattr(new.ty, "dtype", "")) == dtype:
                    args.append(self.builder_.emit(relax.op.astype(new, "float32")))
                else:
                    args.append(new)
            inner = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args, call.span))
            return relax.op.astype(inner, dtype)

    return Caster(mod)


def cast_module(mod: Any, dtype: str) -> Any:
    """``mod`` with every float32 constant, input and result cast to ``dtype`` (module docstring).

    ``float32`` returns ``mod`` itself. A module that does not type-check after the cast (an operator
    that takes no ``dtype``) is a one-line error naming the operator.
    """
    if dtype == "float32":
        return mod
    from tvm import relax

    caster = _mutator(mod, dtype)
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        try:
            new = caster.visit_expr(func)
        except Exception as err:  # TVM's type inference names the operator that refused the dtype
            first = str(err).strip().splitlines()
            text = next((line for line in first if "Check failed" in line or "Error" in line), first[0] if first
                        else type(err).__name__)
            name = getattr(gvar, "name_hint", None) or str(gvar)
            raise OpBenchError(f"cannot cast {name} to {dtype}: {text.strip()[:300]}") from err
        caster.builder_.update_func(gvar, new)
    return caster.builder_.get()


__all__ = ["ACCUMULATE_FLOAT32", "KEEP_FLOAT32", "cast_module"]
