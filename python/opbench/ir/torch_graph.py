"""The operator graph of a PyTorch model: tracing, graph building, batch-norm folding, IOS's merge.

:class:`TorchGraph` traces a model once and describes it as an :class:`~opbench.ir.OpGraph`, the
graph type the schedulers and the executor share:

* ``trace="export"`` takes the ATen operators of ``torch.export(model)``; ``trace="fx"`` takes the
  module, function and method calls of ``torch.fx.symbolic_trace(model)`` (what the user wrote,
  traced in a fraction of the time, for models without data-dependent Python control flow);
  ``trace="auto"`` tries fx and falls back to export; ``trace="graph"`` takes a ``GraphModule`` (e.g.
  one split into regions) as it is.
* ``fold_bn`` folds eval-mode batch norm into the convolution before it.
* ``merge`` applies IOS's merge: convolutions that read the same input with the same kernel size,
  stride, padding and dilation become one convolution on their concatenated weights.

Each node's FLOPs come from its shapes (convolutions and matrix products; one per output element
otherwise) and its bytes from :func:`opbench.ir.features.tensor_bytes`, as for Relax operators.
Launching the operators is :class:`opbench.runtime.backend.TorchBackend`'s job; it runs on the
values this graph holds (``env``: constants and the example inputs, by traced node).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import OpBenchError, first_line
from .conv_relu import fold_into_conv
from .features import tensor_bytes
from .graph import ArgRef, OpGraph, OpNode, recompiled

TRACERS = ("export", "fx", "auto", "graph")  # graph: a torch.fx GraphModule taken as it is


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def meta_tensors(node: Any) -> list[Any]:
    """The tensors (anything with a shape and dtype) a traced node produces: torch.export's ``val``,
    or torch.fx ShapeProp's ``tensor_meta``."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if hasattr(value, "shape") and hasattr(value, "dtype"):  # a tensor, fake tensor or TensorMetadata
            found.append(value)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(node.meta.get("val", node.meta.get("tensor_meta")))
    return found


def _moved(values: Sequence[Any]) -> int:
    return sum(tensor_bytes(tuple(v.shape), v.dtype) for v in values)


def aten_flops(target: str, node: Any, out_shape: Sequence[int]) -> float:
    """FLOPs of an ATen call from its shapes (convolutions, the fused ``opbench::conv_bias_relu`` among them, and
    matrix products; else 1/element)."""
    vals = [(meta_tensors(a) or [None])[0] for a in node.args if hasattr(a, "meta")]
    if "convolution" in target or "conv2d" in target or "conv_bias_relu" in target:
        weight = vals[1] if len(vals) > 1 else None
        if weight is not None:
            return 2.0 * _numel(out_shape) * _numel(weight.shape[1:])
    if any(k in target for k in ("addmm", "mm.", "matmul", "linear", "bmm")):
        a = vals[-2] if "addmm" in target else vals[0]
        if a is not None:
            return 2.0 * _numel(out_shape) * int(a.shape[-1])
    return float(_numel(out_shape))


def module_flops(module: Any, out_shape: Sequence[int]) -> float:
    """FLOPs of a traced module call from its parameters (convolutions and linear layers; else
    1 per output element)."""
    import torch

    if isinstance(module, torch.nn.modules.conv._ConvNd):
        return 2.0 * _numel(out_shape) * _numel(module.weight.shape[1:])
    if isinstance(module, torch.nn.Linear):
        return 2.0 * _numel(out_shape) * module.in_features
    return float(_numel(out_shape))


def fx_module(model: Any, inputs: Sequence[Any], trace: str = "auto") -> tuple[Any, str]:
    """``model`` as a ``torch.fx.GraphModule`` and how it was traced (``fx`` or ``export``): the one place
    that traces a model with ``torch.fx`` where it can, else ``torch.export`` (``trace="auto"``); the
    compiler-fused regions are cut from it, and :class:`TorchGraph` traces with it too."""
    import torch

    if trace not in ("auto", "fx", "export"):
        raise OpBenchError(f"unknown trace '{trace}' (accepted: auto, fx, export)")
    if trace != "export":
        try:
            return torch.fx.symbolic_trace(model), "fx"
        except Exception as err:
            if trace == "fx":
                first = first_line(err)
                raise OpBenchError(f"torch.fx could not trace {type(model).__name__}: {first}") from err
    try:
        with torch.no_grad():
            program = torch.export.export(model, tuple(inputs))
        return program.module(), "export"
    except Exception as err:
        first = first_line(err)
        raise OpBenchError(f"torch.export failed for {type(model).__name__}: {first}") from err


class TorchGraph:
    """A torch model traced once: its launched calls (``ops``, fx nodes in launch order), the values
    they read (``env``), and the :class:`~opbench.ir.OpGraph` describing them (``graph``).

    Intermediate tensors produced by launching stay in ``env`` for the graph's life, so a CUDA
    Graph captured over several streams never reuses a buffer another stream still reads.
    """

    def __init__(self, model: Any, inputs: Sequence[Any], fold_bn: bool = False, trace: str = "export",
                 merge: bool | Sequence[Sequence[str]] = False) -> None:
        import torch

        if trace not in TRACERS:
            raise OpBenchError(f"unknown trace '{trace}' (accepted: {', '.join(TRACERS)})")
        if fold_bn and trace != "export":
            raise OpBenchError("fold_bn needs trace='export' (it rewrites ATen batch norms)")
        self.torch = torch
        self.overrides: dict[Any, tuple[Any, ...]] = {}  # node -> its arguments, rewritten (folded batch norm)
        self.aliases: set[Any] = set()  # batch norms folded away: they forward their input
        self.modules: dict[Any, Any] = {}  # call_module node -> module
        self.merged: dict[Any, tuple[Any, ...]] = {}  # representative -> (members, input, weight, bias, conv, splits)
        self.merged_into: dict[Any, tuple[Any, int]] = {}  # member -> (representative, output item)
        self.device = inputs[0].device if inputs and hasattr(inputs[0], "device") else torch.device("cpu")
        self.env: dict[Any, Any] = {}
        self.placeholders: list[Any] = []
        graph = None
        if trace == "graph" and not isinstance(model, torch.fx.GraphModule):
            raise OpBenchError(f"trace='graph' takes a torch.fx GraphModule, not a {type(model).__name__}")
        if trace != "export":
            try:
                graph = self._trace_fx(model, inputs, trace == "graph")
            except Exception as err:
                if trace in ("fx", "graph"):
                    if isinstance(err, OpBenchError):  # fx_module's own one line
                        raise
                    first = first_line(err)
                    raise OpBenchError(f"torch.fx could not trace {type(model).__name__}: {first}") from err
                self.env, self.placeholders, self.modules = {}, [], {}  # auto: start again with export
        self.trace = "export" if graph is None else "graph" if trace == "graph" else "fx"
        if graph is None:
            graph = self._trace_export(model, inputs)
        self.ops = [n for n in graph.nodes if n.op in ("call_function", "call_module", "call_method")]
        if fold_bn:
            self._fold_batchnorm()
        if merge:
            self._merge_siblings(None if merge is True else merge)
        out_node = next(n for n in graph.nodes if n.op == "output")
        self.output_nodes = list(torch.utils._pytree.tree_leaves(out_node.args[0]))
        self.graph = OpGraph(self._nodes(), [(p.name, tuple(self.env[p].shape), str(self.env[p].dtype))
                                             for p in self.placeholders], [], [])

    # tracing -----------------------------------------------------------------------------------
    def _trace_export(self, model: Any, inputs: Sequence[Any]) -> Any:
        torch = self.torch
        try:
            with torch.no_grad():
                program = torch.export.export(model, tuple(inputs))
        except Exception as err:
            first = first_line(err)
            raise OpBenchError(f"torch.export failed for {type(model).__name__}: {first}") from err
        sig = program.graph_signature
        state = {**program.state_dict, **program.constants}
        lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        for node in program.graph.nodes:
            if node.op == "placeholder":
                if node.name in lifted:
                    self.env[node] = state[lifted[node.name]].detach().to(self.device)
                else:
                    self.placeholders.append(node)
        self._bind_inputs(inputs)
        return program.graph

    def _trace_fx(self, model: Any, inputs: Sequence[Any], as_is: bool = False) -> Any:
        torch = self.torch
        from torch.fx.passes.shape_prop import ShapeProp

        module = model if as_is else fx_module(model, inputs, "fx")[0]
        with torch.no_grad():
            ShapeProp(module).propagate(*inputs)
        for node in module.graph.nodes:
            if node.op == "placeholder":
                self.placeholders.append(node)
            elif node.op == "get_attr":
                value = module
                for part in node.target.split("."):
                    value = getattr(value, part)
                self.env[node] = value.detach() if hasattr(value, "detach") else value
            elif node.op == "call_module":
                self.modules[node] = module.get_submodule(node.target)
        self._bind_inputs(inputs)
        return module.graph

    def _bind_inputs(self, inputs: Sequence[Any]) -> None:
        if len(self.placeholders) != len(inputs):
            raise OpBenchError(f"traced graph takes {len(self.placeholders)} inputs, {len(inputs)} given")
        for node, x in zip(self.placeholders, inputs, strict=True):
            self.env[node] = x.detach().clone()

    # IOS's merge -------------------------------------------------------------------------------
    def conv_spec(self, node: Any) -> tuple[Any, ...] | None:
        """(input node, weight, bias, stride, padding, dilation) of a plain 2-D convolution (one group,
        zero padding given as numbers, weights constant), else None."""
        import torch.fx as fx

        torch = self.torch
        pair = torch.nn.modules.utils._pair
        if node.op == "call_module":
            m = self.modules[node]
            if (type(m) is not torch.nn.Conv2d or m.groups != 1 or m.padding_mode != "zeros"
                    or isinstance(m.padding, str) or len(node.args) != 1 or node.kwargs):
                return None
            bias = m.bias.detach() if m.bias is not None else None
            return node.args[0], m.weight.detach(), bias, pair(m.stride), pair(m.padding), pair(m.dilation)
        if node.op != "call_function" or node.target != torch.ops.aten.conv2d.default or node.kwargs:
            return None
        given = list(self.overrides.get(node, node.args))
        args = given + [None, 1, 0, 1, 1][len(given) - 2:]  # aten.conv2d's defaults after the weight
        x, weight, bias, stride, padding, dilation, groups = args[:7]
        value = (lambda a: self.env.get(a, a) if isinstance(a, fx.Node) else a)  # noqa: E731
        weight, bias = value(weight), value(bias)
        if groups != 1 or isinstance(padding, str) or isinstance(weight, fx.Node) or isinstance(bias, fx.Node):
            return None
        return x, weight, bias, pair(stride), pair(padding), pair(dilation)

    def sibling_groups(self) -> list[list[tuple[Any, tuple[Any, ...]]]]:
        """Convolutions that could merge: (node, conv spec) of those reading the same input with the
        same kernel size, stride, padding and dilation, groups of two or more in launch order."""
        groups: dict[tuple[Any, ...], list[Any]] = {}
        for node in self.ops:
            spec = self.conv_spec(node)
            if spec is None or node in self.merged_into:
                continue
            x, weight, bias, stride, padding, dilation = spec
            key = (x, tuple(weight.shape[1:]), weight.dtype, bias is None, stride, padding, dilation)
            groups.setdefault(key, []).append((node, spec))
        return [g for g in groups.values() if len(g) > 1]

    @property
    def merged_groups(self) -> list[list[str]]:
        """The groups of convolutions this graph runs merged, by node name."""
        return [[m.name for m in members] for members, *_ in self.merged.values()]

    def merge_groups(self) -> list[list[int]]:
        """Operator indices of every group of sibling convolutions that IOS's merge could run as one
        (any two or more of a group can merge)."""
        index = {n: i for i, n in enumerate(self.ops)}
        return [[index[n] for n, _ in g] for g in self.sibling_groups()]

    def merged_conv(self, specs: Sequence[tuple[Any, ...]]) -> tuple[Any, Any, list[int]]:
        """The merged convolution's weight, bias and output-channel split of convolutions ``specs``."""
        weight = self.torch.cat([sp[1] for sp in specs], dim=0)
        bias = None if specs[0][2] is None else self.torch.cat([sp[2] for sp in specs], dim=0)
        return weight, bias, [int(sp[1].shape[0]) for sp in specs]

    def _merge_siblings(self, chosen: Sequence[Sequence[str]] | None = None) -> None:
        """IOS's merge: convolutions that read the same input with the same kernel size, stride,
        padding and dilation become one convolution on their concatenated weights, whose output is
        split (channel views) among them. The merged call takes the first member's place.

        ``chosen``: the groups to merge, by node name (each two or more convolutions of one group
        of siblings); None merges every group whole."""
        groups = self.sibling_groups()
        if chosen is not None:
            by_name = {n.name: (g, k) for g, group in enumerate(groups) for k, (n, _) in enumerate(group)}
            picked = []
            for names in chosen:
                where = [by_name.get(name) for name in names]
                if len(names) < 2 or None in where or len({g for g, _ in where}) != 1:
                    raise OpBenchError(f"cannot merge {list(names)}: give two or more convolutions that read the "
                                       "same input with the same kernel size, stride, padding and dilation")
                picked.append([groups[where[0][0]][k] for _, k in sorted(where)])
            groups = picked
        for members in groups:
            nodes = [n for n, _ in members]
            specs = [sp for _, sp in members]
            weight, bias, splits = self.merged_conv(specs)
            self.merged[nodes[0]] = (nodes, specs[0][0], weight, bias, specs[0][3:], splits)
            for k, node in enumerate(nodes):
                self.merged_into[node] = (nodes[0], k)
        gone = {n for n in self.merged_into if n not in self.merged}
        self.ops = [n for n in self.ops if n not in gone]

    # the OpGraph ------------------------------------------------------------------------------
    def _nodes(self) -> list[OpNode]:
        """One ``OpNode`` per launched call, with shapes, dtypes, FLOPs and bytes from the trace."""
        index = {n: i for i, n in enumerate(self.ops)}

        def ref(a: Any) -> ArgRef | None:
            if a in self.merged_into:
                rep, item = self.merged_into[a]
                return ArgRef("node", index[rep], item)
            return ArgRef("node", index[a]) if a in index else None

        nodes = []
        for i, n in enumerate(self.ops):
            if n in self.merged:
                nodes.append(self._merged_node(i, n, ref))
                continue
            outs = meta_tensors(n)
            ins = list(n.all_input_nodes)
            in_vals = [v for a in ins for v in meta_tensors(a)[:1]]
            shapes = [tuple(v.shape) for v in outs]
            if n.op == "call_module":
                module = self.modules[n]
                kind = type(module).__name__.lower()
                func = f"{type(module).__name__}:{n.target}"
                flops = module_flops(module, shapes[0] if shapes else ())
            else:
                func = str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))
                func = str(n.target) if str(n.target).startswith("aten.") else func
                kind = func.split(".")[1] if func.startswith("aten.") else func
                flops = aten_flops(func, n, shapes[0] if shapes else ())
            args = [r for r in (ref(a) for a in ins) if r is not None]
            nodes.append(OpNode(index=i, func=func, task=func, kind=kind, ops=[func], attrs={}, args=args,
                                input_shapes=[tuple(v.shape) for v in in_vals],
                                input_dtypes=[str(v.dtype) for v in in_vals], output_shapes=shapes,
                                output_dtypes=[str(v.dtype) for v in outs], flops=flops, bytes=_moved(outs + in_vals),
                                var_name=n.name))
        return nodes

    def _merged_node(self, i: int, rep: Any, ref: Any) -> OpNode:
        members, x, weight, bias, conv, splits = self.merged[rep]
        outs = [v for m in members for v in meta_tensors(m)[:1]]
        in_vals = meta_tensors(x)[:1]
        shapes = [tuple(v.shape) for v in outs]
        flops = 2.0 * sum(_numel(s) for s in shapes) * _numel(weight.shape[1:])
        func = f"merged_conv2d:{'+'.join(m.name for m in members)}"
        args = [r for r in [ref(x)] if r is not None]
        return OpNode(index=i, func=func, task=func, kind="conv2d", ops=["merge"] + [m.name for m in members],
                      attrs={"merged": len(members), "out_channels": splits}, args=args,
                      input_shapes=[tuple(v.shape) for v in in_vals], input_dtypes=[str(v.dtype) for v in in_vals],
                      output_shapes=shapes, output_dtypes=[str(v.dtype) for v in outs], flops=flops,
                      bytes=_moved(outs + in_vals), var_name=rep.name)

    # batch norm ---------------------------------------------------------------------------------
    def _fold_batchnorm(self) -> None:
        """Fold eval-mode batch norm into the convolution before it (w' = w*g/s, b' = (b-m)*g/s + beta, in float32
        and rounded once: :func:`~opbench.ir.conv_relu.fold_into_conv`).

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
            old_bias = conv.args[2] if len(conv.args) > 2 else None
            weight, bias = fold_into_conv(self.env[conv.args[1]], self.env.get(old_bias), mean, var,
                                          float(bn.args[bn_targets[bn.target]]), gamma, beta)
            args = list(conv.args)
            while len(args) < 3:
                args.append(None)
            args[1], args[2] = weight, bias
            self.overrides[conv] = tuple(args)
            self.aliases.add(bn)


def merge_into_graph(gm: Any, inputs: Sequence[Any], groups: Sequence[Sequence[str]] | None = None
                     ) -> list[list[str]]:
    """IOS's merge written into a ``GraphModule``, in place: each group of sibling convolutions (those
    :meth:`TorchGraph.sibling_groups` finds: the same input, kernel size, stride, padding and dilation,
    one group, constant weights) becomes one ``torch.conv2d`` on their concatenated weights (a buffer of
    ``gm``), and each former convolution's uses read its channels of the merged output
    (``torch.narrow``), so everything after it is unchanged. A compiler that takes ``gm`` (Inductor) then
    compiles one wider convolution where the model had several.

    ``groups``: the groups to merge, by node name (two or more siblings each); None merges every group
    whole. Returns the groups merged, by the names their convolutions had."""
    import torch

    traced = TorchGraph(gm, inputs, trace="graph", merge=True if groups is None else groups)
    merged = traced.merged_groups
    graph = gm.graph
    for k, (members, x, weight, bias, (stride, padding, dilation), splits) in enumerate(traced.merged.values()):
        gm.register_buffer(f"opbench_merged_weight{k}", weight.detach().clone())
        if bias is not None:
            gm.register_buffer(f"opbench_merged_bias{k}", bias.detach().clone())
        with graph.inserting_before(members[0]):
            w = graph.get_attr(f"opbench_merged_weight{k}")
            b = graph.get_attr(f"opbench_merged_bias{k}") if bias is not None else None
            out = graph.call_function(torch.conv2d, (x, w, b, stride, padding, dilation, 1))
            start = 0
            for member, width in zip(members, splits, strict=True):
                part = graph.call_function(torch.narrow, (out, 1, start, width))
                start += width
                member.replace_all_uses_with(part)
        for member in members:
            graph.erase_node(member)
    graph.eliminate_dead_code()
    recompiled(gm)  # the merged convolutions' own modules dropped (a torch.fx trace)
    return merged


__all__ = ["TRACERS", "TorchGraph", "aten_flops", "fx_module", "merge_into_graph", "meta_tensors", "module_flops"]
