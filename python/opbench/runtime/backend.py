"""Kernel backends: who launches an operator. The executor and the schedulers only see this API.

``TVMBackend`` launches the per-operator TVM kernels (default or tuned schedules) on static
buffers; ``TorchBackend`` launches the ATen operators of a model's ``torch.export`` graph. Both
launch on PyTorch's current stream on the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import OpBenchError
from ..registry import Registry

if TYPE_CHECKING:  # the names of the backends are read by the command line's help, which imports no TVM
    from ..ir.graph import ArgRef
    from .kernels import OperatorKernels

#: the kinds :meth:`KernelBackend.create` makes (``fused`` registers itself when first asked for)
BackendKind = Literal["tvm", "torch", "fused"]
BACKENDS: tuple[str, ...] = get_args(BackendKind)


def _register_fused() -> None:
    from . import fused  # noqa: F401  (registers the compiler-fused regions)


#: the kernel backends by name (a subclass with a ``name`` registers itself): ``tvm``, ``torch``, ``fused``
BACKEND_KINDS: Registry[KernelBackend] = Registry("backend", load=_register_fused)


class KernelBackend:
    """Base class: a graph of operators and a way to launch each one.

    Attributes
    ----------
    name:
        The backend's name in tables (``tvm``, ``torch``).
    graph:
        The operators (an ``OpGraph``), numbered in a topological order.
    is_cuda:
        True when launches go to the GPU (and can be captured in a CUDA Graph).
    resources:
        Kernel resources by operator index (grid, threads, registers, shared memory), if known.
    """

    name = ""
    graph: Any
    is_cuda: bool = False
    resources: dict[int, dict[str, Any]] | None = None
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            BACKEND_KINDS.register(cls.name, cls)

    @staticmethod
    def check_kind(kind: str) -> type[KernelBackend]:
        """The backend class named ``kind``, or a one-line error naming the kinds there are."""
        return BACKEND_KINDS.factory(kind)  # type: ignore[return-value]

    @staticmethod
    def create(kind: BackendKind, *args: Any, **options: Any) -> KernelBackend:
        """A backend by name, as MetaSchedule's ``Runner.create`` makes a runner: ``tvm`` takes the
        operator kernels and the inputs (``TVMBackend(kernels, inputs, resources)``), ``torch`` a model
        and its inputs (``TorchBackend(model, inputs, fold_bn=, trace=, merge=)``), ``fused`` a model and
        its inputs (``FusedBackend(model, inputs, cut=, regions=, trace=)``: regions compiled by Inductor)."""
        return BACKEND_KINDS.create(kind, *args, **options)

    def schedule_meta(self) -> dict[str, Any]:
        """What a schedule made for this backend records besides the graph and device (e.g. the
        compiler-fused backend's region cut, so that reuse rebuilds the same regions)."""
        return {}

    @property
    def device_name(self) -> str:
        """The device the backend runs on, as schedules record it (``cpu`` on the CPU)."""
        if self.is_cuda:
            import torch

            return torch.cuda.get_device_name(torch.cuda.current_device())
        return "cpu"

    def set_inputs(self, inputs: Sequence[Any]) -> None:
        """Copy ``inputs`` into the static input buffers (same shapes and dtypes)."""
        raise NotImplementedError

    def launch(self, index: int) -> None:
        """Launch operator ``index`` on the current stream, reading its producers' outputs."""
        raise NotImplementedError

    def outputs(self) -> list[Any]:
        """The model's outputs, as the last launches left them."""
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


class TorchBackend(KernelBackend):
    """A torch model's operators, launched one by one: the calls of its :class:`~opbench.ir.torch_graph.TorchGraph`
    (``trace``: ``export``, ``fx`` or ``auto``; ``fold_bn``: batch norm folded into convolutions;
    ``merge``: IOS's merge, ``True`` or groups of node names), run on the values the trace holds.
    """

    name = "torch"

    def __init__(self, model: Any, inputs: Sequence[Any], fold_bn: bool = False, trace: str = "export",
                 merge: bool | Sequence[Sequence[str]] = False) -> None:
        import torch

        from ..ir.torch_graph import TorchGraph

        self.torch = torch
        self.traced = TorchGraph(model, inputs, fold_bn=fold_bn, trace=trace, merge=merge)
        self.trace = self.traced.trace
        self.env = self.traced.env  # the values launches read and write, by traced node
        self.graph = self.traced.graph
        self.is_cuda = self.traced.device.type == "cuda"
        self.resources = None

    @property
    def merged_groups(self) -> list[list[str]]:
        """The groups of convolutions this backend runs merged, by node name."""
        return self.traced.merged_groups

    def merge_groups(self) -> list[list[int]]:
        """Operator indices of every group of sibling convolutions that IOS's merge could run as one."""
        return self.traced.merge_groups()

    def merged_launcher(self, ops: Sequence[int]) -> Any:
        """A callable that runs operators ``ops`` (two or more of one :meth:`merge_groups` group) as
        one merged convolution, on the current stream, leaving the backend's tensors as they are
        (to time what merging them would take)."""
        chosen = {self.traced.ops[i] for i in ops}
        for group in self.traced.sibling_groups():
            members = [(n, sp) for n, sp in group if n in chosen]
            if len(members) == len(chosen) > 1:
                break
        else:
            raise OpBenchError(f"operators {sorted(ops)} are not two or more sibling convolutions that can merge")
        specs = [sp for _, sp in members]
        weight, bias, _ = self.traced.merged_conv(specs)
        x, (stride, padding, dilation) = specs[0][0], specs[0][3:]
        conv = self.torch.nn.functional.conv2d
        return lambda: conv(self.env[x], weight, bias, stride, padding, dilation)

    def set_inputs(self, inputs: Sequence[Any]) -> None:
        for node, x in zip(self.traced.placeholders, inputs, strict=True):
            self.env[node].copy_(x)

    def launch(self, index: int) -> None:
        import torch.fx as fx

        traced = self.traced
        node = traced.ops[index]
        if node in traced.merged:  # one convolution for the merged siblings, its output split among them
            members, x, weight, bias, (stride, padding, dilation), splits = traced.merged[node]
            out = self.torch.nn.functional.conv2d(self.env[x], weight, bias, stride, padding, dilation)
            for member, part in zip(members, out.split(splits, dim=1), strict=True):
                self.env[member] = part
            return
        if node in traced.aliases:  # folded batch norm forwards the convolution's output
            out = self.env[node.args[0]]
            self.env[node] = out if node.target == self.torch.ops.aten.batch_norm.default else (out, None, None)
            return
        if node in traced.overrides:
            args = tuple(fx.node.map_arg(a, lambda x: self.env[x]) if isinstance(a, fx.Node) else a
                         for a in traced.overrides[node])
            self.env[node] = node.target(*args, **fx.node.map_arg(node.kwargs, lambda a: self.env[a]))
            return
        args = fx.node.map_arg(node.args, lambda a: self.env[a])
        kwargs = fx.node.map_arg(node.kwargs, lambda a: self.env[a])
        if node.op == "call_function":
            self.env[node] = node.target(*args, **kwargs)
            return
        with self.torch.no_grad():  # module parameters require grad: record nothing for autograd
            if node.op == "call_module":
                self.env[node] = traced.modules[node](*args, **kwargs)
            else:  # call_method
                self.env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)

    def outputs(self) -> list[Any]:
        return [self.env[n] if hasattr(n, "op") else n for n in self.traced.output_nodes]

