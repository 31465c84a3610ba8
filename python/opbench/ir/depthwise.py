"""Depthwise convolutions as sums of shifted products, for Inductor to compile into its own kernels.

Algorithm (:func:`unfold_depthwise`, a pass over a ``torch.fx`` graph):

1. Find every call of a ``Conv2d`` module whose groups equal its input channels (a depthwise convolution,
   ``m = out_channels / in_channels`` outputs per input channel), with numeric padding and zero padding mode.
2. Replace the call by :func:`depthwise_taps` on the same input, weight and bias: the input padded with zeros
   (each channel repeated ``m`` times where ``m > 1``), then for each of the ``kh * kw`` taps of the kernel the
   strided window of the input the tap reads, times the tap's weight per channel, summed in float32 and rounded
   once to the input's dtype (as cuDNN accumulates), plus the bias. The products are added one after another
   (``unrolled``, the default): Inductor compiles them into one kernel that loads each tap's window in turn.
   ``unrolled=False`` writes the sum as one reduction over the taps of an unfolded view of the padded input
   (``Tensor.unfold``) instead, which Inductor compiles faster (a loop over the taps, not a load of its own for
   each) into a kernel that runs slower: on an H200 at batch 1 in float32, a 7x7 one with its batch norm and
   activation compiled in 1.1 s against 8.3 s, and the kernels of the 55 depthwise convolutions of nasnet and
   mobilenet_v3_large took 424 against 247 us (PyTorch's convolution: 359 us; ``scripts/exp_depthwise_forms.py``).
   Inductor's reduction kernel reads a block of outputs times a block of taps with the taps the fast dimension,
   whose loads (a channel apart) do not coalesce.

Why: in Inductor's channels-last layout PyTorch sends every depthwise convolution to cuDNN, which runs it with a
generic engine and makes its plan anew in every process (seconds for a network of dozens of them: the first run of
a later build's loaded regions). Written as element-wise arithmetic, the convolution is one loop over its output
that Inductor fuses with the operators around it (the batch norm and activation after it, the activation before
it) into one generated kernel: no library call, no plan, no separate kernel for the batch norm.
"""

from __future__ import annotations

import logging
from typing import Any

from .graph import recompiled

log = logging.getLogger(__name__)

#: how a fused region runs a depthwise convolution: ``aten`` (PyTorch's convolution: cuDNN in Inductor's
#: channels-last layout), ``taps`` (:func:`depthwise_taps`, compiled by Inductor into the region's kernels) or
#: ``auto`` (one of the two for the whole network: :func:`auto_depthwise`)
DEPTHWISE = ("aten", "taps", "auto")

#: the most taps (``kh * kw``) a depthwise convolution may have for ``auto`` to unfold the network's: 3x3. On an
#: H200, randwire (48 depthwise convolutions, all 3x3) ran its kept schedule 16-31 % faster with ``taps`` at batch
#: 1 and 8 in float32 and bfloat16, while nasnet (40, 74 % of their multiply-adds in 5x5 and 7x7 kernels) and
#: mobilenet_v3_large (15, half in 5x5) ran 6-8 % slower at batch 8 in float32; a 7x7 sum of 49 loads also
#: compiles for seconds. shufflenet_v2_x1_0 (19, all 3x3) is unfolded too: its schedules ran 20-29 % faster than
#: with PyTorch's convolution once its convolution -> batch norm -> ReLU chains took channels-last inputs (they had
#: copied their inputs to channels-last and back, and run 5-7 % slower); ``auto`` is the default
#: (``docs/results.md``)
AUTO_TAPS = 9


def depthwise_taps(x: Any, weight: Any, bias: Any | None, stride: tuple[int, int], padding: tuple[int, int],
                   dilation: tuple[int, int], unrolled: bool = True) -> Any:
    """``conv2d(x, weight, bias, stride, padding, dilation, groups=x.shape[1])`` as a sum over the kernel's taps,
    accumulated in float32 and returned in ``x``'s dtype (see the module docstring).

    Parameters
    ----------
    x:
        The input, ``(N, C, H, W)``, any floating dtype and layout.
    weight:
        ``(C * m, 1, kh, kw)``: ``m`` filters per input channel.
    bias:
        ``(C * m,)`` or None.
    stride, padding, dilation:
        Per spatial dimension, as ``Conv2d`` has them.
    unrolled:
        Sum the taps as one shifted product after another (the default), or as one reduction over an unfolded
        view of the input (the same values within float32's rounding; see the module docstring).
    """
    import torch

    channels, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    padded = torch.nn.functional.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    if channels != x.shape[1]:  # m filters per channel: each channel read by its m outputs
        padded = padded.repeat_interleave(channels // x.shape[1], dim=1)
    if unrolled:
        ho = (x.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wo = (x.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        taps = weight.float().reshape(channels, kh * kw)
        acc = None
        for i in range(kh):
            for j in range(kw):
                window = padded[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh,
                                j * dw: j * dw + sw * (wo - 1) + 1: sw]
                term = window.float() * taps[:, i * kw + j].reshape(1, channels, 1, 1)
                acc = term if acc is None else acc + term
    else:  # (N, C, ho, wo, kh, kw): the window each output reads, its taps the last two dimensions
        windows = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
        if dh > 1 or dw > 1:
            windows = windows[..., ::dh, ::dw]
        acc = (windows.float() * weight.float().reshape(1, channels, 1, 1, kh, kw)).sum((-2, -1))
        if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            acc = acc.contiguous(memory_format=torch.channels_last)  # as the input (Inductor's regions: NHWC)
    if bias is not None:
        acc = acc + bias.float().reshape(1, channels, 1, 1)
    return acc.to(x.dtype)


def _depthwise(node: Any, modules: dict[str, Any]) -> Any | None:
    """The ``Conv2d`` that ``node`` calls when :func:`unfold_depthwise` unfolds it, else None."""
    import torch

    conv = modules.get(node.target) if node.op == "call_module" else None
    if type(conv) is not torch.nn.Conv2d or conv.groups == 1 or conv.groups != conv.in_channels \
            or isinstance(conv.padding, str) or conv.padding_mode != "zeros" or len(node.args) != 1 or node.kwargs:
        return None
    return conv


def unfold_depthwise(gm: Any, unrolled: bool = True) -> int:
    """Replace, in the ``torch.fx.GraphModule`` ``gm`` (in place), each call of a depthwise ``Conv2d`` by
    :func:`depthwise_taps` (see the module docstring; ``unrolled`` as it takes it); how many.

    The convolutions' weights and biases become parameters of ``gm`` of their own (the same tensors); their
    modules are dropped from ``gm`` and left as they are wherever else they are held."""
    modules = dict(gm.named_modules())
    unfolded, index = 0, 0
    for node in list(gm.graph.nodes):
        conv = _depthwise(node, modules)
        if conv is None:
            continue
        while hasattr(gm, f"depthwise_{index}_weight"):  # a graph unfolded before keeps its names
            index += 1
        names = [f"depthwise_{index}_weight", f"depthwise_{index}_bias" if conv.bias is not None else None]
        for name, value in zip(names, (conv.weight, conv.bias), strict=True):
            if name is not None:
                gm.register_parameter(name, value)
        with gm.graph.inserting_before(node):
            weight, bias = (gm.graph.get_attr(n) if n is not None else None for n in names)
            taps = gm.graph.call_function(depthwise_taps, (node.args[0], weight, bias, tuple(conv.stride),
                                                           tuple(conv.padding), tuple(conv.dilation), unrolled))
        node.replace_all_uses_with(taps)
        gm.graph.erase_node(node)
        unfolded += 1
    if unfolded:
        recompiled(gm)
        log.info("depthwise convolutions: %d unfolded into sums of shifted products", unfolded)
    return unfolded


def grouped_convolutions(module: Any) -> int:
    """How many convolutions of ``module`` (its ``torch.nn`` convolution modules, and the convolution calls of its
    graph where it is a ``GraphModule``) have more than one group."""
    import torch

    count = sum(1 for m in module.modules() if isinstance(m, torch.nn.modules.conv._ConvNd) and m.groups > 1)
    graph = getattr(module, "graph", None)
    where = {torch.nn.functional.conv1d: 6, torch.nn.functional.conv2d: 6, torch.nn.functional.conv3d: 6,
             torch.conv2d: 6, torch.ops.aten.convolution.default: 8, torch.ops.aten.conv2d.default: 6}
    for node in getattr(graph, "nodes", ()):
        at = where.get(node.target) if node.op == "call_function" else None
        if at is not None:
            groups = node.args[at] if len(node.args) > at else node.kwargs.get("groups", 1)
            count += isinstance(groups, int) and groups > 1
    return count


def auto_depthwise(gm: Any) -> str:
    """What ``depthwise="auto"`` runs the traced graph ``gm`` (a ``torch.fx.GraphModule``) with: ``taps`` when it
    calls depthwise convolutions that :func:`unfold_depthwise` unfolds, none of more than :data:`AUTO_TAPS` taps,
    and no other grouped convolution (:func:`grouped_convolutions`; one left would keep cuDNN's grouped path, and
    its plans, in the regions); ``aten`` otherwise. A GPU's choice: on the CPU ``FusedBackend`` keeps ``aten``."""
    modules = dict(gm.named_modules())
    unfolded = {id(c): c for c in (_depthwise(node, modules) for node in gm.graph.nodes) if c is not None}
    if not unfolded or any(c.kernel_size[0] * c.kernel_size[1] > AUTO_TAPS for c in unfolded.values()):
        return "aten"
    return "taps" if grouped_convolutions(gm) == len(unfolded) else "aten"


def check_depthwise(depthwise: str) -> str:
    """``depthwise`` when it is one of :data:`DEPTHWISE`, else a one-line error naming those accepted."""
    from ..errors import OpBenchError

    if depthwise not in DEPTHWISE:
        raise OpBenchError(f"unknown depthwise convolution mode {depthwise!r} (accepted: {', '.join(DEPTHWISE)})")
    return depthwise


__all__ = ["AUTO_TAPS", "DEPTHWISE", "auto_depthwise", "check_depthwise", "depthwise_taps", "grouped_convolutions",
           "unfold_depthwise"]
