"""Convolution -> batch norm -> ReLU chains as one call: which chains are fused, outputs equal the model's, the
batch norm folded in float32, the operator's fake agrees with its real strides, a shape cuDNN refuses runs apart."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class ConvBnRelu(torch.nn.Module):
    """torchvision's ``BasicConv2d``: a convolution without bias, a batch norm, a functional in-place ReLU."""

    def __init__(self, cin: int, cout: int, k: int, groups: int = 1) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, bias=False, groups=groups)
        self.bn = torch.nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return torch.nn.functional.relu(self.bn(self.conv(x)), inplace=True)


class Net(torch.nn.Module):
    """Two chains to fuse (one with a bias and a ``ReLU`` module), and four that are not chains to fuse: a sigmoid
    after the batch norm, a grouped convolution, a convolution whose output is read twice, a batch norm in
    training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvBnRelu(3, 8, 3)
        self.conv = torch.nn.Conv2d(8, 8, 1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.relu = torch.nn.ReLU()
        self.sig_conv, self.sig_bn = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.grouped = ConvBnRelu(8, 8, 3, groups=2)
        self.twice_conv, self.twice_bn = torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8)
        self.train_bn = ConvBnRelu(8, 8, 1)

    def forward(self, x):
        x = self.stem(x)
        t = self.twice_conv(x)
        return torch.cat([self.relu(self.bn(self.conv(x))), torch.sigmoid(self.sig_bn(self.sig_conv(x))),
                          self.grouped(x), torch.relu(self.twice_bn(t)) + t, self.train_bn(x)], 1)


def _net(dtype=torch.float32):
    torch.manual_seed(0)
    net = Net()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # statistics that make the fold matter
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    net = net.eval().to(dtype)
    net.train_bn.bn.train()
    net.train_bn.bn.momentum = 0.0  # its running statistics stay as they are
    return net, torch.randn(1, 3, 12, 12, dtype=dtype)


def test_chains_become_one_call_each_and_outputs_equal_the_model():
    from opbench.ir.conv_relu import OP_NAME, conv_bias_relu_op, fuse_conv_relu

    net, x = _net()
    params = {name: p.clone() for name, p in net.state_dict().items()}
    gm = torch.fx.symbolic_trace(net)
    with torch.no_grad():
        expected = net(x)
    assert fuse_conv_relu(gm) == 2  # the stem and the conv -> bn -> ReLU module chain
    calls = [n for n in gm.graph.nodes if n.target is conv_bias_relu_op()]
    assert len(calls) == 2 and str(calls[0].target).startswith(OP_NAME.replace("::", "."))
    kept = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    assert {"sig_conv", "sig_bn", "grouped.conv", "grouped.bn", "twice_conv", "twice_bn", "train_bn.conv",
            "train_bn.bn"} <= kept and not {"stem.conv", "stem.bn", "conv", "bn"} & kept
    with torch.no_grad():
        torch.testing.assert_close(gm(x), expected, rtol=1e-5, atol=1e-5)
    # the model keeps its modules and weights
    assert all(torch.equal(p, params[name]) for name, p in net.state_dict().items() if "num_batches" not in name)
    assert isinstance(net.stem.bn, torch.nn.BatchNorm2d) and isinstance(net.conv, torch.nn.Conv2d)
    assert fuse_conv_relu(gm) == 0  # nothing left to fuse
    again = torch.fx.symbolic_trace(gm)  # a graph fused before: its names are kept
    assert fuse_conv_relu(again) == 0


def test_chains_can_take_their_inputs_channels_last():
    from opbench.ir.conv_relu import conv_bias_relu_op, fuse_conv_relu

    net, x = _net()
    gm = torch.fx.symbolic_trace(net)
    with torch.no_grad():
        expected = net(x)
    assert fuse_conv_relu(gm, channels_last_inputs=True) == 2
    calls = [n for n in gm.graph.nodes if n.target is conv_bias_relu_op()]
    made = [n.args[0] for n in calls]
    assert all(n.op == "call_method" and n.target == "contiguous"
               and n.kwargs == {"memory_format": torch.channels_last} for n in made)
    seen = []
    hook = torch.fx.Interpreter(gm)
    run_node = hook.run_node

    def record(n):  # the value each call is given
        out = run_node(n)
        if n in made:
            seen.append(out)
        return out

    hook.run_node = record
    with torch.no_grad():
        torch.testing.assert_close(hook.run(x), expected, rtol=1e-5, atol=1e-5)
    assert len(seen) == 2 and all(t.is_contiguous(memory_format=torch.channels_last) for t in seen)

    class Siblings(torch.nn.Module):  # two chains that read one input: one copy for both
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 4, 1), torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn_a, self.bn_b = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn_a(self.a(x))) + torch.relu(self.bn_b(self.b(x)))

    siblings = Siblings().eval()
    gm = torch.fx.symbolic_trace(siblings)
    assert fuse_conv_relu(gm, channels_last_inputs=True) == 2
    copies = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "contiguous"]
    assert len(copies) == 1 and all(n.args[0] is copies[0] for n in gm.graph.nodes if n.target is conv_bias_relu_op())
    with torch.no_grad():
        torch.testing.assert_close(gm(x), siblings(x), rtol=1e-5, atol=1e-5)


def test_the_batch_norm_is_folded_in_float32_and_rounded_once():
    from opbench.ir.conv_relu import fold_batchnorm

    net, _ = _net(torch.bfloat16)
    conv, bn = net.stem.conv, net.stem.bn
    weight, bias = fold_batchnorm(conv, bn)
    scale = bn.weight.float() / torch.sqrt(bn.running_var.float() + bn.eps)
    assert weight.dtype == bias.dtype == torch.bfloat16
    torch.testing.assert_close(weight, (conv.weight.float() * scale.reshape(-1, 1, 1, 1)).bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(bias, (bn.bias.float() - bn.running_mean.float() * scale).bfloat16(), rtol=1e-2,
                               atol=1e-2)
    in_bf16 = conv.weight * (bn.weight / torch.sqrt(bn.running_var + bn.eps)).reshape(-1, 1, 1, 1)
    assert not torch.equal(weight, in_bf16)  # folding in bfloat16 rounds twice: another result


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_the_operator_s_strides_are_its_fake_s(layout):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opbench.ir.conv_relu import conv_bias_relu_op

    op = conv_bias_relu_op()
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    for size in (12, 1):  # a 1x1 output: strides of size-1 dimensions are the fake's too
        x = torch.randn(1, 8, size, size).to(memory_format=fmt)
        w, b = torch.randn(4, 8, 1, 1).to(memory_format=fmt), torch.randn(4)
        real = op(x, w, b, [1, 1], [0, 0], [1, 1], 1)
        torch.testing.assert_close(real, torch.relu(torch.nn.functional.conv2d(x, w, b)))
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake = op(x, w, b, [1, 1], [0, 0], [1, 1], 1)
        assert (tuple(fake.shape), fake.stride()) == (tuple(real.shape), real.stride())
        assert real.is_contiguous(memory_format=fmt)


def test_a_shape_cudnn_cannot_fuse_runs_apart_and_is_not_tried_again(monkeypatch, caplog):
    from opbench.ir import conv_relu

    tried = []

    def refuse(*args):
        tried.append(args[0].shape)
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(conv_relu, "_fused_on_gpu", lambda x: True)
    monkeypatch.setattr(torch, "cudnn_convolution_relu", refuse)
    monkeypatch.setattr(conv_relu, "_UNFUSED", set())
    x, w, b = torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(4)
    expected = torch.relu(torch.nn.functional.conv2d(x, w, b, 1, 1))
    with caplog.at_level("INFO", logger="opbench"):
        for _ in range(2):
            torch.testing.assert_close(conv_relu._conv_bias_relu(x, w, b, [1, 1], [1, 1], [1, 1], 1), expected)
    assert len(tried) == 1 and len(conv_relu._UNFUSED) == 1
    assert sum("running them apart" in r.message for r in caplog.records) == 1


def test_given_the_inputs_only_chains_whose_shape_cudnn_fuses_are_fused(monkeypatch):
    """With the graph's inputs, each chain's shape is tried once (here on the CPU, cuDNN's fused call replaced by
    one that refuses three input channels): the stem's chain stays as it was, the other is fused, the outputs
    equal the model's; a second pass tries no shape again."""
    from opbench.ir import conv_relu

    tried = []

    def fuses_unless_three_channels(x, w, b, *args):
        tried.append(tuple(x.shape))
        assert x.is_contiguous(memory_format=torch.channels_last) and w.is_contiguous(memory_format=torch.channels_last)
        if x.shape[1] == 3:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")
        return torch.relu(torch.nn.functional.conv2d(x, w, b, *args))

    monkeypatch.setattr(conv_relu, "_probe_device", lambda inputs: torch.device("cpu"))
    monkeypatch.setattr(torch, "cudnn_convolution_relu", fuses_unless_three_channels)
    monkeypatch.setattr(conv_relu, "_UNFUSED", set())
    monkeypatch.setattr(conv_relu, "_FUSED", set())
    net, x = _net()
    with torch.no_grad():
        expected = net(x)
    gm = torch.fx.symbolic_trace(net)
    assert conv_relu.fuse_conv_relu(gm, [x]) == 1
    kept = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    assert {"stem.conv", "stem.bn"} <= kept and not {"conv", "bn"} & kept
    assert sorted(tried) == [(1, 3, 12, 12), (1, 8, 12, 12)]
    with torch.no_grad():
        torch.testing.assert_close(gm(x), expected, rtol=1e-5, atol=1e-5)
    again = torch.fx.symbolic_trace(net)
    assert conv_relu.fuse_conv_relu(again, [x]) == 1 and len(tried) == 2  # each shape tried once per process
    assert conv_relu.fuse_conv_relu(torch.fx.symbolic_trace(net)) == 2  # without the inputs: every chain
