"""Kernel backends: who launches an operator. The executor and the schedulers only see this API.

``TVMBackend`` launches the per-operator TVM kernels (default or tuned schedules) on static
buffers; ``TorchBackend`` launches the ATen operators of a model's ``torch.export`` graph. Both
launch on PyTorch's current stream on the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import OpBenchError
from ..ir.graph import ArgRef, OpGraph, OpNode
from .kernels import OperatorKernels


class KernelBackend:
    """Base class: a graph of operators and a way to launch each one."""

    name = ""
    graph: Any
    is_cuda: bool = False
    resources: dict[int, dict[str, Any]] | None = None

    def set_inputs(self, inputs: Sequence[Any]) -> None:
        raise NotImplementedError

    def launch(self, index: int) -> None:
        raise NotImplementedError

    def outputs(self) -> list[Any]:
        raise NotImplementedError

    def on_stream(self, stream: Any) -> Any:
        """Context in which launches go to ``stream`` (a ``torch.cuda.Stream``)."""
        import torch

        return torch.cuda.stream(stream)


class TVMBackend(KernelBackend):
    """Per-operator TVM kernels over static buffers (allocated once, before any capture)."""

    name = "tvm"

    def __init__(self, kernels: OperatorKernels, inputs: Sequence[Any],
                 resources: dict[int, dict[str, Any]] | None = None) -> None:
        self.kernels = kernels
        self.graph = kernels.graph
        self.is_cuda = kernels.device.dlpack_device_type() == 2
        self.static_inputs = kernels.to_device(inputs)
        self.outs = {n.index: kernels.allocate_outputs(n.index) for n in self.graph}
        self.args = {n.index: kernels.args_for(n.index, self.static_inputs, self.outs) for n in self.graph}
        self.resources = resources

    def _resolve(self, ref: ArgRef) -> Any:
        return self.kernels.resolve(ref, self.static_inputs, self.outs)

    def set_inputs(self, inputs: Sequence[Any]) -> None:
        for dst, src in zip(self.static_inputs, inputs, strict=True):
            dst.copyfrom(src if not hasattr(src, "cpu") else src.cpu().numpy())

    def launch(self, index: int) -> None:
        self.kernels.call(index, self.args[index], self.outs[index])

    def outputs(self) -> list[Any]:
        return [self._resolve(r) for r in self.graph.outputs]

    def on_stream(self, stream: Any) -> Any:
        import torch
        import tvm_ffi

        return tvm_ffi.use_torch_stream(torch.cuda.stream(stream))


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def _torch_flops(target: str, node: Any, out_shape: Sequence[int]) -> float:
    """FLOPs of an ATen call from its shapes (convolutions and matrix products; else 1/element)."""
    vals = [a.meta.get("val") for a in node.args if hasattr(a, "meta")]
    if "convolution" in target or "conv2d" in target:
        weight = vals[1] if len(vals) > 1 else None
        if weight is not None:
            return 2.0 * _numel(out_shape) * _numel(weight.shape[1:])
    if any(k in target for k in ("addmm", "mm.", "matmul", "linear", "bmm")):
        a = vals[-2] if "addmm" in target else vals[0]
        if a is not None:
            return 2.0 * _numel(out_shape) * int(a.shape[-1])
    return float(_numel(out_shape))


class TorchBackend(KernelBackend):
    """The ATen operators of ``torch.export(model)``, launched one by one.

    Intermediate tensors stay alive for the backend's life, so a CUDA Graph captured over several
    streams never reuses a buffer another stream still reads.
    """

    name = "torch"

    def __init__(self, model: Any, inputs: Sequence[Any], fold_bn: bool = False) -> None:
        import torch

        self.torch = torch
        self.fold_bn = fold_bn
        self._overrides: dict[Any, tuple[Any, ...]] = {}
        self._aliases: set[Any] = set()
        device = inputs[0].device if inputs and hasattr(inputs[0], "device") else torch.device("cpu")
        self.is_cuda = device.type == "cuda"
        try:
            with torch.no_grad():
                program = torch.export.export(model, tuple(inputs))
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise OpBenchError(f"torch.export failed for {type(model).__name__}: {first}") from err
        sig = program.graph_signature
        state = {**program.state_dict, **program.constants}
        lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        self.env: dict[Any, Any] = {}
        self.placeholders = []
        for node in program.graph.nodes:
            if node.op == "placeholder":
                if node.name in lifted:
                    self.env[node] = state[lifted[node.name]].to(device)
                else:
                    self.placeholders.append(node)
        if len(self.placeholders) != len(inputs):
            raise OpBenchError(f"exported graph takes {len(self.placeholders)} inputs, {len(inputs)} given")
        for node, x in zip(self.placeholders, inputs, strict=True):
            self.env[node] = x.detach().clone()
        self.ops = [n for n in program.graph.nodes if n.op == "call_function"]
        if fold_bn:
            self._fold_batchnorm()
        index = {n: i for i, n in enumerate(self.ops)}
        out_node = next(n for n in program.graph.nodes if n.op == "output")
        self.output_nodes = list(torch.utils._pytree.tree_leaves(out_node.args[0]))
        nodes = []
        for i, n in enumerate(self.ops):
            val = n.meta.get("val")
            outs = [v for v in (val if isinstance(val, list | tuple) else [val]) if hasattr(v, "shape")]
            ins = [a for a in n.all_input_nodes]
            in_vals = [a.meta["val"] for a in ins if hasattr(a.meta.get("val"), "shape")]
            shapes = [tuple(v.shape) for v in outs]
            in_shapes = [tuple(v.shape) for v in in_vals]
            moved = sum(_numel(v.shape) * v.dtype.itemsize for v in outs + in_vals)
            target = str(n.target)
            kind = target.split(".")[1] if target.startswith("aten.") else target
            args = [ArgRef("node", index[a]) for a in ins if a in index]
            nodes.append(OpNode(i, target, target, kind, [target], {}, args, in_shapes, [], shapes, [],
                                _torch_flops(target, n, shapes[0] if shapes else ()), moved, n.name))
        self.graph = OpGraph(nodes, [(p.name, tuple(self.env[p].shape), str(self.env[p].dtype))
                                     for p in self.placeholders], [], [])
        self.resources = None

    def _fold_batchnorm(self) -> None:
        """Fold eval-mode batch norm into the convolution before it (w' = w*g/s, b' = (b-m)*g/s + beta).

        Applies where the convolution's only user is the batch norm and both have constant
        parameters; the batch norm then forwards the convolution's output without a kernel.
        """
        torch = self.torch
        conv_targets = {torch.ops.aten.conv2d.default, torch.ops.aten.convolution.default}
        aten = torch.ops.aten
        # target -> index of eps; batch_norm returns a tensor, the no_training variant a tuple
        bn_targets = {aten.batch_norm.default: 7, aten._native_batch_norm_legit_no_training.default: 6}
        for bn in self.ops:
            if bn.target not in bn_targets or (bn.target == aten.batch_norm.default and bn.args[5]):
                continue
            conv = bn.args[0]
            if getattr(conv, "target", None) not in conv_targets or len(conv.users) != 1:
                continue
            params = [bn.args[i] for i in range(1, 5)]
            if not all(p in self.env for p in params) or conv.args[1] not in self.env:
                continue
            gamma, beta, mean, var = (self.env[p] for p in params)
            eps = float(bn.args[bn_targets[bn.target]])
            scale = gamma / torch.sqrt(var + eps)
            weight = self.env[conv.args[1]] * scale.reshape(-1, *([1] * (self.env[conv.args[1]].dim() - 1)))
            old_bias = conv.args[2] if len(conv.args) > 2 else None
            bias = self.env[old_bias] if old_bias is not None and old_bias in self.env else torch.zeros_like(mean)
            bias = (bias - mean) * scale + beta
            args = list(conv.args)
            while len(args) < 3:
                args.append(None)
            args[1], args[2] = weight, bias
            self._overrides[conv] = tuple(args)
            self._aliases.add(bn)

    def set_inputs(self, inputs: Sequence[Any]) -> None:
        for node, x in zip(self.placeholders, inputs, strict=True):
            self.env[node].copy_(x)

    def launch(self, index: int) -> None:
        import torch.fx as fx

        node = self.ops[index]
        if node in self._aliases:  # folded batch norm forwards the convolution's output
            out = self.env[node.args[0]]
            self.env[node] = out if node.target == self.torch.ops.aten.batch_norm.default else (out, None, None)
            return
        if node in self._overrides:
            args = tuple(fx.node.map_arg(a, lambda x: self.env[x]) if isinstance(a, fx.Node) else a
                         for a in self._overrides[node])
            self.env[node] = node.target(*args, **fx.node.map_arg(node.kwargs, lambda a: self.env[a]))
            return
        args = fx.node.map_arg(node.args, lambda a: self.env[a])
        kwargs = fx.node.map_arg(node.kwargs, lambda a: self.env[a])
        self.env[node] = node.target(*args, **kwargs)

    def outputs(self) -> list[Any]:
        return [self.env[n] if hasattr(n, "op") else n for n in self.output_nodes]

