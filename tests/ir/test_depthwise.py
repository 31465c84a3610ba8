"""Depthwise convolutions as sums of shifted products: equal to PyTorch's convolution (strides, padding, dilation,
several filters per channel, no bias, half precision), which calls are unfolded and which are left, outputs of the
unfolded graph equal the model's, an unknown mode is refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opbench.errors import OpBenchError  # noqa: E402
from opbench.ir.depthwise import auto_depthwise, check_depthwise, depthwise_taps, unfold_depthwise  # noqa: E402


@pytest.mark.parametrize("channels, multiplier, k, stride, padding, dilation, bias", [
    (8, 1, 3, 1, 1, 1, True), (6, 1, 5, 2, 2, 1, False), (4, 2, 3, 1, 1, 1, True), (5, 1, 7, 1, 3, 1, True),
    (3, 1, 3, 2, 0, 2, True), (4, 3, (3, 1), (2, 1), (1, 0), 1, False), (4, 1, 3, 2, 2, (2, 3), True)])
@pytest.mark.parametrize("unrolled", [False, True])
def test_taps_equal_the_convolution(channels, multiplier, k, stride, padding, dilation, bias, unrolled):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, channels * multiplier, k, stride, padding, dilation, groups=channels,
                           bias=bias)
    x = torch.randn(2, channels, 11, 9)
    with torch.no_grad():
        want = conv(x)
        got = depthwise_taps(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, unrolled)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("unrolled", [False, True])
def test_taps_keep_a_channels_last_input_s_layout(unrolled):
    """A channels-last input (Inductor's layout in the regions) gives a channels-last output, as the convolution
    does: otherwise Inductor stores the sum in PyTorch's layout and converts it back for the next convolution."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
    x = torch.randn(2, 8, 6, 5).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = conv(x)
        got = depthwise_taps(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, unrolled)
        plain = depthwise_taps(x.contiguous(), conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                               unrolled)
    assert got.is_contiguous(memory_format=torch.channels_last) and plain.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("unrolled", [False, True])
def test_taps_in_bfloat16_accumulate_in_float32_and_keep_the_dtype(unrolled):
    """In bfloat16 the taps are summed in float32 and rounded once: as close to the float32 convolution as one
    rounding of the output, closer than a sum rounded at every tap."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
    x = torch.randn(1, 16, 14, 14, dtype=torch.bfloat16)
    half = conv.to(torch.bfloat16)
    with torch.no_grad():
        exact = torch.nn.functional.conv2d(x.float(), half.weight.float(), half.bias.float(), 1, 3, 1, 16)
        got = depthwise_taps(x, half.weight, half.bias, (1, 1), (3, 3), (1, 1), unrolled)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact.bfloat16().float(), rtol=0, atol=1e-6)


class Net(torch.nn.Module):
    """A depthwise convolution with a batch norm and ReLU after it, one with two filters per channel and no bias,
    and three convolutions left as they are: a dense one, a grouped one that is not depthwise, and a depthwise
    one with ``padding="same"``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw2 = torch.nn.Conv2d(8, 16, 5, padding=2, groups=8, bias=False)
        self.grouped = torch.nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.same = torch.nn.Conv2d(16, 16, 3, padding="same", groups=16)

    def forward(self, x):
        x = torch.relu(self.bn(self.dw(self.stem(x))))
        return self.same(self.grouped(self.dw2(x)))


def test_unfold_replaces_the_depthwise_calls_only_and_keeps_the_outputs():
    from opbench.ir.torch_graph import fx_module

    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 12, 12)
    gm, _ = fx_module(model, [x], "fx")
    assert unfold_depthwise(gm) == 2
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is depthwise_taps]
    modules = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    assert len(calls) == 2 and {"stem", "grouped", "same"} <= modules and not modules & {"dw", "dw2"}
    assert not hasattr(gm, "dw") and not hasattr(gm, "dw2") and not hasattr(gm, "depthwise_1_bias")
    assert gm.depthwise_0_weight is model.dw.weight and gm.depthwise_1_weight is model.dw2.weight
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
    assert unfold_depthwise(gm) == 0  # nothing left to unfold


def test_an_unknown_mode_is_refused_with_the_accepted_ones():
    assert check_depthwise("taps") == "taps"
    with pytest.raises(OpBenchError,
                       match=r"unknown depthwise convolution mode 'cudnn' \(accepted: aten, taps, auto\)"):
        check_depthwise("cudnn")


class Small(torch.nn.Module):
    """Depthwise convolutions of ``kernels`` (each followed by a pointwise one), and optionally a grouped one that
    is not depthwise."""

    def __init__(self, kernels: tuple[int, ...], grouped: bool = False) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 1)
        self.dws = torch.nn.ModuleList([torch.nn.Conv2d(8, 8, k, padding=k // 2, groups=8) for k in kernels])
        self.pws = torch.nn.ModuleList([torch.nn.Conv2d(8, 8, 1) for _ in kernels])
        self.grouped = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2) if grouped else None

    def forward(self, x):
        x = self.stem(x)
        for dw, pw in zip(self.dws, self.pws, strict=True):
            x = pw(torch.relu(dw(x)))
        return self.grouped(x) if self.grouped is not None else x


@pytest.mark.parametrize("kernels, grouped, chosen", [
    ((3, 3), False, "taps"),  # every depthwise convolution 3x3
    ((3, 1), False, "taps"),
    ((3, 5), False, "aten"),  # one of 25 taps: the network keeps PyTorch's convolution
    ((3,), True, "aten"),  # a grouped convolution that is not depthwise stays cuDNN's
    ((), False, "aten"),  # nothing to unfold
])
def test_auto_unfolds_a_network_whose_depthwise_convolutions_are_all_small(kernels, grouped, chosen):
    gm = torch.fx.symbolic_trace(Small(kernels, grouped))
    assert auto_depthwise(gm) == chosen
    assert auto_depthwise(torch.fx.symbolic_trace(Net())) == "aten"  # 5x5, grouped, padding="same"


def test_auto_sees_a_grouped_convolution_called_as_a_function():
    class Functional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)
            self.weight = torch.nn.Parameter(torch.randn(4, 2, 3, 3))

        def forward(self, x):
            return torch.nn.functional.conv2d(self.dw(x), self.weight, None, 1, 1, 1, 2)

    assert auto_depthwise(torch.fx.symbolic_trace(Functional())) == "aten"
    assert check_depthwise("auto") == "auto"
