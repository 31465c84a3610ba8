"""A PyTorch model's operator graph: tracing, batch-norm folding, FLOPs and bytes (by dtype)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opbench.ir.features import tensor_bytes  # noqa: E402
from opbench.ir.torch_graph import TorchGraph  # noqa: E402
from opbench.runtime.backend import TorchBackend  # noqa: E402


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=True)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():  # statistics and affine parameters that are not the identity
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_batch_norm_folding_known_answer():
    """The folded convolution's weight and bias are w*g/s and (b-m)*g/s + beta; the batch norm launches
    nothing and the outputs equal the model's."""
    model, x = ConvBN().eval(), torch.randn(2, 3, 6, 6)
    traced = TorchGraph(model, [x], fold_bn=True, trace="export")
    [conv] = list(traced.overrides)
    [bn] = list(traced.aliases)
    weight, bias = traced.overrides[conv][1], traced.overrides[conv][2]
    scale = model.bn.weight / torch.sqrt(model.bn.running_var + model.bn.eps)
    torch.testing.assert_close(weight, model.conv.weight * scale.reshape(-1, 1, 1, 1))
    torch.testing.assert_close(bias, (model.conv.bias - model.bn.running_mean) * scale + model.bn.bias)
    assert bn.args[0] is conv
    backend = TorchBackend(model, [x], fold_bn=True)
    for op in range(len(backend.graph)):
        backend.launch(op)
    with torch.no_grad():
        torch.testing.assert_close(backend.outputs()[0], model(x), rtol=1e-5, atol=1e-5)


def test_batch_norm_folding_in_half_precision_rounds_once_as_the_fused_chains_do():
    """In bfloat16 the ATen path folds in float32 and rounds once, the same tensors as the fused regions' chains
    (``conv_relu.fold_batchnorm``); folding in bfloat16 itself rounds the scale and the product each, and lands
    further from the float32 answer."""
    from opbench.ir.conv_relu import fold_batchnorm

    torch.manual_seed(0)
    model = ConvBN().eval()
    exact_w, _ = fold_batchnorm(model.conv, model.bn)  # float32
    half = copy.deepcopy(model).to(torch.bfloat16)
    traced = TorchGraph(half, [torch.randn(2, 3, 6, 6, dtype=torch.bfloat16)], fold_bn=True, trace="export")
    [conv] = list(traced.overrides)
    weight, bias = traced.overrides[conv][1], traced.overrides[conv][2]
    assert weight.dtype == bias.dtype == torch.bfloat16
    for got, want in zip((weight, bias), fold_batchnorm(half.conv, half.bn), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    scale = half.bn.weight / torch.sqrt(half.bn.running_var + half.bn.eps)  # every step in bfloat16
    naive = half.conv.weight * scale.reshape(-1, 1, 1, 1)
    assert (weight.float() - exact_w).abs().sum() < (naive.float() - exact_w).abs().sum()


def test_fold_bn_needs_export():
    from opbench import OpBenchError

    with pytest.raises(OpBenchError, match="fold_bn needs trace='export'"):
        TorchGraph(ConvBN().eval(), [torch.randn(1, 3, 4, 4)], fold_bn=True, trace="fx")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("trace", ["fx", "export"])
def test_flops_and_bytes_follow_the_dtype(dtype, trace):
    """A linear layer: 2*m*n*k FLOPs; bytes are every input and output at the dtype's size (not 4)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32)).to(dtype).eval()
    x = torch.randn(4, 16, dtype=dtype)
    graph = TorchGraph(model, [x], trace=trace).graph
    [linear] = [n for n in graph if "linear" in n.func.lower() or "addmm" in n.func or "Linear" in n.func]
    assert linear.flops == 2 * 4 * 32 * 16
    expected = sum(tensor_bytes(s, d) for s, d in zip(linear.input_shapes + linear.output_shapes,
                                                       linear.input_dtypes + linear.output_dtypes, strict=True))
    elements = sum(int(np.prod(s)) for s in linear.input_shapes + linear.output_shapes)
    assert linear.bytes == expected == elements * dtype.itemsize and str(dtype) in linear.output_dtypes
