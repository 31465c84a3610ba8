"""One cuDNN call for a convolution, its eval batch norm and the ReLU after them.

Algorithm (:func:`fuse_conv_relu`, a pass over a ``torch.fx`` graph):

1. Find every chain ``Conv2d -> BatchNorm2d (eval, running statistics) -> ReLU`` whose convolution and batch
   norm are each read only by the next node of the chain, and whose convolution has one group and numeric
   zero padding, in float32, float16 or bfloat16. Given the graph's inputs on a GPU, keep only the chains whose
   shape cuDNN fuses: the shapes come from one run of the graph, and each shape is tried once on the device,
   channels-last (:func:`cudnn_fuses`). A chain cuDNN cannot fuse stays as it is, for Inductor to
   run its convolution and then one kernel of its own for the batch norm and ReLU, where the operator would run
   three kernels (convolution, bias, ReLU; 67 of the 158 kernels of shufflenet_v2_x1_0's replay were such bias
   and ReLU kernels, H200, float32, batch 1).
2. Fold the batch norm into the convolution: ``w' = w * g / sqrt(v + eps)`` and ``b' = (b - m) * g /
   sqrt(v + eps) + beta``, computed in float32 from the parameters and rounded once to the convolution's dtype
   (folding in bfloat16 itself rounds the scale and the product each: googlenet's output was 0.12 from the
   float32 model against 0.09 for the model's own bfloat16 run).
3. Replace the chain by one call of ``opbench::conv_bias_relu`` (:func:`conv_bias_relu_op`), reading the folded
   weight and bias as parameters of the graph module.

On a GPU the operator is ``torch.cudnn_convolution_relu``: cuDNN's fused convolution, bias and ReLU, one kernel
where Inductor runs cuDNN's convolution and then a Triton kernel for the batch norm and the ReLU. Inductor runs
the operator as an external kernel. A shape cuDNN cannot fuse runs the convolution and the ReLU apart (each
such shape is tried once; a pass given the inputs leaves such chains out). Elsewhere the operator is ``conv2d``
then ``relu``.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import first_line
from .graph import recompiled

log = logging.getLogger(__name__)

#: the fused operator's name
OP_NAME = "opbench::conv_bias_relu"
#: the dtypes whose chains are fused (cuDNN's fused kernels take these)
DTYPES = ("float32", "float16", "bfloat16")
#: the operator's schema: a convolution with bias, then ReLU
_SCHEMA = "(Tensor x, Tensor weight, Tensor bias, int[] stride, int[] padding, int[] dilation, int groups) -> Tensor"
#: shapes (input, weight, dtype, stride, padding, dilation, groups) cuDNN refused to fuse: run apart from then on
_UNFUSED: set[tuple] = set()
#: shapes cuDNN fused when :func:`cudnn_fuses` tried them
_FUSED: set[tuple] = set()


def _memory_format(x: Any, weight: Any) -> Any:
    """The layout of a convolution of ``x`` by ``weight``: channels-last when either is (as PyTorch's
    ``cudnn_conv_suggest_memory_format``), else contiguous. The real call and its fake agree on it."""
    import torch

    def channels_last(t: Any) -> bool:
        return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()

    return torch.channels_last if channels_last(x) or channels_last(weight) else torch.contiguous_format


def _fused_on_gpu(x: Any) -> bool:
    """Whether a call on ``x`` goes to cuDNN's fused kernel (a CUDA tensor, cuDNN enabled)."""
    import torch

    return bool(x.is_cuda) and torch.backends.cudnn.enabled


def _conv_bias_relu(x: Any, weight: Any, bias: Any, stride: list[int], padding: list[int], dilation: list[int],
                    groups: int) -> Any:
    """ReLU of ``conv2d(x, weight, bias, ...)``: one cuDNN call on a GPU where cuDNN fuses it, else two; the
    output in :func:`_memory_format`'s layout with the strides its fake gives (:func:`_fake`)."""
    import torch

    key = _key(x.shape, x.dtype, weight, stride, padding, dilation, groups)
    out = None
    if _fused_on_gpu(x) and key not in _UNFUSED:
        try:
            out = torch.cudnn_convolution_relu(x, weight, bias, stride, padding, dilation, groups)
        except RuntimeError as err:  # no fused cuDNN kernel for this shape: run apart, from now on
            _UNFUSED.add(key)
            log.info("cuDNN cannot fuse the convolution %s with its ReLU; running them apart (%s)", key,
                     first_line(err)[:200])
    if out is None:
        out = torch.relu(torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups))
    fmt = _memory_format(x, weight)
    out = out.contiguous(memory_format=fmt)
    # the same elements; size-1 dimensions get the fake's strides, which Inductor checks
    return out.as_strided(out.shape, torch.empty(out.shape, device="meta", memory_format=fmt).stride())


def _fake(x: Any, weight: Any, bias: Any, stride: list[int], padding: list[int], dilation: list[int],
          groups: int) -> Any:
    """The operator's output for tracing: the convolution's shape, in :func:`_memory_format`'s layout."""
    import torch

    shape = torch.ops.aten.convolution(x, weight, bias, stride, padding, dilation, False, [0, 0], groups).shape
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_memory_format(x, weight))


def conv_bias_relu_op() -> Any:
    """``torch.ops.opbench.conv_bias_relu``, registered on the first call (a custom operator with a fake for
    tracing; a process that loads compiled code calling it registers it first)."""
    import torch

    namespace, name = OP_NAME.split("::")
    if not hasattr(getattr(torch.ops, namespace), name):
        op = torch.library.custom_op(OP_NAME, mutates_args=(), schema=_SCHEMA)(_conv_bias_relu)
        op.register_fake(_fake)
    return getattr(getattr(torch.ops, namespace), name)


def _chain(relu: Any, modules: dict[str, Any]) -> tuple[Any, Any, Any, Any] | None:
    """``(conv node, conv, batch norm node, batch norm)`` when ``relu`` (a node) ends a chain that
    :func:`fuse_conv_relu` fuses, else None."""
    import torch

    def module(node: Any, kind: type) -> Any:
        found = modules.get(node.target) if isinstance(node, torch.fx.Node) and node.op == "call_module" else None
        return found if type(found) is kind and len(node.users) == 1 else None

    is_relu = ((relu.op == "call_function" and relu.target in (torch.relu, torch.nn.functional.relu))
               or (relu.op == "call_method" and relu.target in ("relu", "relu_"))
               or (relu.op == "call_module" and type(modules.get(relu.target)) is torch.nn.ReLU))
    if not is_relu or not relu.args:
        return None
    bn_node = relu.args[0]
    bn = module(bn_node, torch.nn.BatchNorm2d)
    if bn is None or bn.training or bn.running_mean is None or not bn_node.args:
        return None
    conv_node = bn_node.args[0]
    conv = module(conv_node, torch.nn.Conv2d)
    if conv is None or conv.groups != 1 or isinstance(conv.padding, str) or conv.padding_mode != "zeros" \
            or str(conv.weight.dtype).removeprefix("torch.") not in DTYPES:
        return None
    return conv_node, conv, bn_node, bn


def fold_into_conv(weight: Any, bias: Any | None, mean: Any, var: Any, eps: float, gamma: Any | None = None,
                   beta: Any | None = None) -> tuple[Any, Any]:
    """A convolution's ``weight`` and ``bias`` (None: none) with the eval batch norm after it folded in (running
    ``mean`` and ``var``, ``eps``; ``gamma`` and ``beta`` None where it has no affine parameters): ``w * g /
    sqrt(v + eps)`` and ``(b - m) * g / sqrt(v + eps) + beta``, computed in float32 and rounded once to the
    weight's dtype (new tensors). The fused regions' chains and the ATen path's ``fold_bn`` both fold so."""
    import torch

    with torch.no_grad():
        scale = torch.rsqrt(var.float() + eps)
        if gamma is not None:
            scale = gamma.float() * scale
        folded = weight.float() * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        shift = (bias.float() if bias is not None else torch.zeros_like(scale)) - mean.float()
        shift = shift * scale + (beta.float() if beta is not None else 0.0)
    return folded.to(weight.dtype), shift.to(weight.dtype)


def fold_batchnorm(conv: Any, bn: Any) -> tuple[Any, Any]:
    """The weight and bias of ``conv`` with the eval batch norm ``bn`` after it folded in (:func:`fold_into_conv`;
    neither module changes)."""
    return fold_into_conv(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                          bn.weight if bn.affine else None, bn.bias if bn.affine else None)


def _key(shape: Any, dtype: Any, weight: Any, stride: Any, padding: Any, dilation: Any, groups: int) -> tuple:
    """A convolution of an input of ``shape`` and ``dtype`` as :data:`_UNFUSED` and :func:`cudnn_fuses` key it."""
    return (tuple(shape), tuple(weight.shape), str(dtype), tuple(stride), tuple(padding), tuple(dilation), groups)


def cudnn_fuses(shape: Any, dtype: Any, device: Any, weight: Any, stride: Any, padding: Any, dilation: Any) -> bool:
    """Whether cuDNN runs ``conv2d(x, weight, bias) -> relu`` as one fused call for an input ``x`` of ``shape`` and
    ``dtype`` on ``device``: tried once per shape on empty channels-last tensors (the layout Inductor gives the
    regions' convolutions), remembered for the process (:data:`_UNFUSED`, :data:`_FUSED`)."""
    import torch

    key = _key(shape, dtype, weight, stride, padding, dilation, 1)
    if key not in _UNFUSED and key not in _FUSED:
        x = torch.empty(tuple(shape), dtype=dtype, device=device).contiguous(memory_format=torch.channels_last)
        w = torch.empty(weight.shape, dtype=weight.dtype, device=device).contiguous(memory_format=torch.channels_last)
        bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=device)
        try:
            torch.cudnn_convolution_relu(x, w, bias, list(stride), list(padding), list(dilation), 1)
            _FUSED.add(key)
        except RuntimeError as err:
            _UNFUSED.add(key)
            log.info("cuDNN cannot fuse the convolution %s with its ReLU; the chain is left to Inductor (%s)", key,
                     first_line(err)[:200])
    return key in _FUSED


def _input_metas(gm: Any, inputs: Any, convs: set[Any]) -> dict[Any, Any]:
    """Each node of ``convs`` (convolution nodes of ``gm``) -> its input's ``TensorMetadata`` (shape, dtype), from
    one run of ``gm`` on ``inputs`` (``torch.fx``'s ``ShapeProp``: on fake tensors it took seconds where a graph
    holds many small operators); empty where that run fails."""
    import torch
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    except Exception as err:  # a graph that cannot run so: every chain fused, as without inputs
        log.info("convolution shapes not propagated (%s); every chain is fused", first_line(err)[:200])
        return {}
    return {n: n.args[0].meta.get("tensor_meta") for n in convs}


def _probe_device(inputs: Any | None) -> Any | None:
    """The device :func:`fuse_conv_relu` tries chains' shapes on: the first CUDA input's, with cuDNN enabled;
    None otherwise (every chain fused)."""
    import torch

    device = next((x.device for x in inputs or () if getattr(x, "is_cuda", False)), None)
    return device if torch.backends.cudnn.enabled else None


def fuse_conv_relu(gm: Any, inputs: Any | None = None, channels_last_inputs: bool = False) -> int:
    """Replace, in the ``torch.fx.GraphModule`` ``gm`` (in place), each chain of a convolution, its eval batch
    norm and a ReLU by one call of :func:`conv_bias_relu_op` (see the module docstring); how many chains. Given
    ``inputs`` (the graph's, on a GPU with cuDNN), only the chains whose shape cuDNN fuses (:func:`cudnn_fuses`).

    ``channels_last_inputs``: each call's input is made channels-last in the graph first (``contiguous(
    memory_format=torch.channels_last)``, once for the chains that share an input, and nothing to an input already
    so), where Inductor can write it
    so in the kernel that makes it. cuDNN runs a fused chain channels-last: an input in PyTorch's layout (after
    shufflenet_v2_x1_0's channel shuffle, say) is otherwise copied inside the call, and its output copied back to
    the layout the call's input had (``scripts/exp_layout.py``'s ``taps_chains_cl`` variant).

    The folded weights are new parameters of ``gm``; the chains' modules are dropped from ``gm`` and left as
    they are wherever else they are held (the model ``gm`` was traced from keeps its own)."""
    import torch

    modules = dict(gm.named_modules())
    found_chains = [(relu, found) for relu in list(gm.graph.nodes) if (found := _chain(relu, modules)) is not None]
    device = _probe_device(inputs) if found_chains else None
    metas = _input_metas(gm, inputs, {found[0] for _, found in found_chains}) if device is not None else {}
    op = conv_bias_relu_op()
    chains, index, left = 0, 0, 0
    made_cl: dict[Any, Any] = {}  # an input -> its channels-last copy, one for every chain that reads it
    for relu, (conv_node, conv, bn_node, bn) in found_chains:
        meta = metas.get(conv_node)
        if meta is not None and not cudnn_fuses(meta.shape, meta.dtype, device, conv.weight, conv.stride,
                                                conv.padding, conv.dilation):
            left += 1
            continue
        weight, bias = fold_batchnorm(conv, bn)
        while hasattr(gm, f"conv_relu_{index}_weight"):  # a graph fused before keeps its names
            index += 1
        names = [f"conv_relu_{index}_{what}" for what in ("weight", "bias")]
        for name, value in zip(names, (weight, bias), strict=True):
            gm.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        with gm.graph.inserting_before(relu):
            x = conv_node.args[0]
            if channels_last_inputs:  # chains in graph order: the first to read x makes the copy before the others
                if x not in made_cl:
                    made_cl[x] = gm.graph.call_method("contiguous", (x,), {"memory_format": torch.channels_last})
                x = made_cl[x]
            fused = gm.graph.call_function(op, (x, *(gm.graph.get_attr(n) for n in names),
                                                list(conv.stride), list(conv.padding), list(conv.dilation), 1))
        relu.replace_all_uses_with(fused)
        for node in (relu, bn_node, conv_node):
            gm.graph.erase_node(node)
        chains += 1
    if chains:
        recompiled(gm)
        log.info("conv -> batch norm -> ReLU: %d chains run as one cuDNN call each", chains)
    if left:
        log.info("conv -> batch norm -> ReLU: %d chains left to Inductor (cuDNN does not fuse their shapes)", left)
    return chains


__all__ = ["DTYPES", "OP_NAME", "conv_bias_relu_op", "cudnn_fuses", "fold_batchnorm", "fuse_conv_relu"]
