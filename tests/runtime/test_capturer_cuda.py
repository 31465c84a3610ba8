"""capturer on the GPU: warning-free capture, static outputs, and models beyond CNNs (a transformer
encoder, a Hugging Face BERT), each equal to the model and, in the capturer's own table, never slower than the model's
own CUDA Graph (timing against that graph side by side is scripts/bench_capturer.py's job)."""

from __future__ import annotations

import warnings

import pytest

from opbench.parallel import capturer
from opbench.runtime.graphs import capture_graph

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _check(run, model, inputs, atol):
    """Outputs equal the model's; what is kept is never slower, in the capturer's own table, than the
    model's own CUDA Graph."""
    with torch.no_grad():
        expected = model(*inputs)
        other = [torch.randn_like(x) if x.is_floating_point() else x for x in inputs]
        torch.testing.assert_close(run(*inputs), expected, rtol=atol, atol=atol)
        torch.testing.assert_close(run(*other), model(*other), rtol=atol, atol=atol)
    kept = next(r for r in run.table if r["kept"])
    base = run.table[0]
    assert base["schedule"] == "model, CUDA Graph" and kept["latency_ms"] <= base["latency_ms"]


def test_empty_capture_is_known_and_silent():
    x = torch.ones(4, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        empty = capture_graph(lambda stream: x.view(2, 2))  # a view launches nothing
        full = capture_graph(lambda stream: x.mul_(1.0))
    assert empty.empty and not full.empty
    empty.replay()  # does nothing, no error


def test_capturer_warning_free_and_static_outputs():
    from opbench.models import load_workload

    w = load_workload("local", "googlenet", 1, image_size=64)
    model = w.torch_module.cuda().eval()
    x = torch.from_numpy(w.example_inputs()[0]).cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "The CUDA Graph is empty" (or any warning) fails the test
        run = capturer([x], model, repeat=5, number=10)
        _check(run, model, [x], 1e-4)
    first = run(x)
    assert run(torch.randn_like(x)) is first  # static outputs, overwritten by the next call


def _encoder(layers: int, d: int, heads: int):
    layer = torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).cuda().eval()


@pytest.mark.parametrize("layers,d,heads", [(4, 256, 4), (12, 768, 12)])
def test_capturer_transformer_encoder(layers, d, heads):
    torch.manual_seed(0)
    model = _encoder(layers, d, heads)
    x = torch.randn(1, 128, d, device="cuda")
    run = capturer([x], model, repeat=10, number=10)
    _check(run, model, [x], 1e-3)


def test_capturer_hugging_face_bert():
    pytest.importorskip("transformers")
    from opbench.models import load_workload

    w = load_workload("transformers", "bert", 1, seqlen=128)
    model = w.torch_module.cuda().eval()
    inputs = [torch.from_numpy(x).cuda() for x in w.example_inputs()]
    run = capturer(inputs, model, repeat=10, number=10)
    with torch.no_grad():
        expected = model(*inputs)
    out = run(*inputs)
    leaf = lambda o: o[0] if isinstance(o, list | tuple) else getattr(o, "last_hidden_state", o)  # noqa: E731
    torch.testing.assert_close(leaf(out), leaf(expected), rtol=1e-3, atol=1e-3)
    kept = next(r for r in run.table if r["kept"])
    assert kept["latency_ms"] <= run.table[0]["latency_ms"]


def test_capturer_with_ios_merge_on_the_gpu():
    """IOS's merge chosen by its dynamic programme on the GPU: each candidate merged convolution is
    timed in its own CUDA Graph, and the captured model still equals the model."""
    from opbench.profile.schedule import merge_cost
    from opbench.runtime.backend import TorchBackend

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({k: torch.nn.Conv2d(64, 64, 3, padding=1) for k in "abc"}).cuda().eval()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = model

        def forward(self, x):
            return torch.cat([self.convs["a"](x), torch.relu(self.convs["b"](x)), self.convs["c"](x)], dim=1)

    block, x = Block().eval(), torch.randn(1, 64, 28, 28, device="cuda")
    cost = merge_cost(TorchBackend(block, [x]))
    assert 0 < cost((0, 1)) < 1e-3 and 0 < cost((0, 1, 3)) < 1e-3 and cost((0, 2)) is None
    run = capturer([x], block, merge="ios", schedulers=["sequential", "opara"])
    with torch.no_grad():
        torch.testing.assert_close(run(x), block(x), rtol=1e-3, atol=1e-3)


def test_fused_capturer_equals_the_model_and_is_not_slower_than_torch_compile():
    """kernels='fused': Inductor-compiled regions on streams, in one CUDA Graph; outputs equal the
    model's (TF32 off: Inductor's and cuDNN's kernels then agree closely), and what capturer keeps is
    no slower than torch.compile's module, measured in the same run."""
    torch.backends.cudnn.allow_tf32 = False
    try:
        model, x = _googlenet()
        run = capturer([x], model, kernels="fused", repeat=5, number=10)
        rows = {r["schedule"]: r for r in run.table}
        kept = next(r for r in run.table if r["kept"])
        assert "torch.compile" in rows and kept["latency_ms"] <= rows["torch.compile"]["latency_ms"]
        assert run.backend.name == "fused" and len(run.backend.regions) > 1 and not run.backend.fallbacks
        with torch.no_grad():
            torch.testing.assert_close(run(x), model(x), rtol=1e-3, atol=1e-3)
        assert all(r["sched_error"] == 0.0 for r in run.table if r.get("streams") and r["measured"]
                   and r["schedule"] not in ("model, CUDA Graph", "torch.compile", "torch.compile + combo kernels"))
        # every measured row has its host and device time a call; a CUDA Graph replay returns at once, and its
        # device time is its latency (nothing of it is host time)
        measured = [r for r in run.table if r["measured"]]
        assert all(r["host_ms"] > 0 and r["device_ms"] > 0 and r["steady_ms"] <= r["latency_ms"] for r in measured)
        graph = rows["model, CUDA Graph"]
        assert graph["host_ms"] < 0.2 * graph["latency_ms"] and abs(graph["device_ms"] / graph["latency_ms"] - 1) < 0.2
        assert sum(r["steady_kept"] for r in run.table) == 1
    finally:
        torch.backends.cudnn.allow_tf32 = True


def test_fused_regions_take_the_strides_their_compiled_producers_hand_them():
    """shufflenet_v2_x1_0 at batch 8: on the GPU, a region's compiled producer hands it padded strides or a
    contiguous tensor where eager passed a ``chunk`` view, not the strides the region's code was first compiled
    for; such regions are compiled again for what they are handed, each region runs, in order, and the outputs
    equal the model's (TF32 off)."""
    from opbench.models import get_source
    from opbench.runtime.fused import FusedBackend

    model, x = get_source("local").torch_model("shufflenet_v2_x1_0", 8)
    model, x = model.cuda().eval(), x.cuda()
    torch.backends.cudnn.allow_tf32 = False
    try:
        backend = FusedBackend(model, [x], store=None)
        backend.set_inputs([x])
        with torch.no_grad():
            for op in range(len(backend.graph)):
                backend.launch(op)
            torch.testing.assert_close(backend.outputs()[0], model(x), rtol=1e-3, atol=1e-3)
        # compiled again for the strides handed to them, so that no call copies its inputs
        assert backend.recompiled, "no region was handed other strides than eager's: this test no longer tests that"
        assert not backend.restrided
    finally:
        torch.backends.cudnn.allow_tf32 = True


def _googlenet():
    from opbench.models import get_source

    model, x = get_source("local").torch_model("googlenet", 1)
    return model.cuda().eval(), x.cuda()


def test_a_captured_schedule_dumps_its_cuda_graph(tmp_path):
    """``CapturedSchedule.dump`` writes the schedule's CUDA Graph as Graphviz DOT: one kernel node per launched
    kernel at least, and the outputs stay what they were."""
    from opbench.models import load_workload
    from opbench.parallel import CapturedSchedule

    w = load_workload("local", "googlenet", 1, image_size=64)
    model = w.torch_module.cuda().eval()
    x = torch.from_numpy(w.example_inputs()[0]).cuda()
    run = capturer([x], model, repeat=3, number=5, schedulers=["sequential", "opara"], tolerance=-10.0)
    assert isinstance(run, CapturedSchedule)  # a negative tolerance keeps the schedule
    with torch.no_grad():
        expected = model(x).clone()
    path = run.dump(tmp_path / "graph.dot")
    text = path.read_text()
    assert text.lstrip().startswith("digraph") and text.count("KERNEL") >= len(run.schedule.stream_of)
    torch.testing.assert_close(run(x), expected, rtol=1e-4, atol=1e-4)


def test_the_pytorch_layout_runs_depthwise_convolutions_on_pytorch_s_own_kernels(tmp_path):
    """Inductor's layout (channels-last) sends depthwise convolutions to cuDNN, whose plans take seconds in each new
    process; ``layout="pytorch"`` keeps the model's layout, where PyTorch runs them with its own kernels. Both equal
    the model (``depthwise="aten"``: the convolutions are PyTorch's, not unfolded as ``auto`` would for 3x3 ones)."""
    from opbench.runtime.executor import ParallelExecutor
    from opbench.runtime.fused import FusedBackend
    from opbench.schedule import get_scheduler

    torch.manual_seed(0)
    c = 32
    model = torch.nn.Sequential(
        torch.nn.Conv2d(c, c, 3, padding=1, groups=c), torch.nn.ReLU(), torch.nn.Conv2d(c, 2 * c, 1), torch.nn.ReLU(),
        torch.nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c), torch.nn.ReLU(), torch.nn.Conv2d(2 * c, c, 1),
    ).cuda().eval()
    x = torch.randn(1, c, 28, 28, device="cuda")
    with torch.no_grad():
        expected = model(x)
    ran = {}
    for layout in ("pytorch", "inductor"):
        backend = FusedBackend(model, [x], store=tmp_path / layout, layout=layout, depthwise="aten")
        (region,) = backend._calls.values()  # one chain: one region, called with the model's input
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.no_grad():
            region(x)
        out = ParallelExecutor(backend, get_scheduler("sequential").schedule(backend.graph)).run()
        torch.testing.assert_close(out[0], expected, rtol=1e-3, atol=1e-3)
        ran[layout] = {e.key for e in prof.key_averages()}
    assert "aten::_conv_depthwise2d" in ran["pytorch"], sorted(ran["pytorch"])
    assert "aten::_conv_depthwise2d" not in ran["inductor"] and "aten::cudnn_convolution" in ran["inductor"], \
        sorted(ran["inductor"])


def test_the_fastest_capture_returns_its_own_outputs():
    """Each capture binds the operators' outputs to its own memory, and the backend's values are the last
    capture's: the capture kept among several (here the first, by a timer that prefers it) must return its own
    outputs, equal to the model's on new inputs, not those of a later capture that is never replayed."""
    from opbench.pipeline.compare import fastest_capture
    from opbench.pipeline.compile import torch_backend
    from opbench.schedule import get_scheduler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).cuda().eval()
    x = torch.randn(1, 3, 16, 16, device="cuda")
    backend = torch_backend(model, [x])
    plan = get_scheduler("sequential").schedule(backend.graph, None)
    labels = []

    def timer(label, run):
        labels.append(label)
        run()
        return [1e-3 if label.endswith("capture 0") else 2e-3]

    executor, rows = fastest_capture(backend, plan, 3, [x], timer)
    assert [r["capture"] for r in rows] == [0, 1, 2] and sorted(set(labels)) == [f"sequential capture {i}"
                                                                                 for i in range(3)]
    assert [r["latency_ms"] for r in rows] == [1.0, 2.0, 2.0] and [r["kept"] for r in rows] == [True, False, False]
    other = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(executor.run([other])[0], model(other))


@pytest.mark.parametrize("scheduler", ["greedy", "sequential"])
def test_the_capturer_keeps_the_fastest_of_its_captures(scheduler):
    """``captures=3``: a kept schedule with concurrent streams (greedy, where it is the faster) lists three
    captures' times and takes the least of the two it timed in full; a one-stream schedule is captured once (no
    ``captures_ms``); the callable returned equals the model on new inputs."""
    from opbench.models import load_workload

    w = load_workload("local", "googlenet", 1, image_size=64)
    model = w.torch_module.cuda().eval()
    x = torch.from_numpy(w.example_inputs()[0]).cuda()
    # a tolerance of -1 keeps a schedule within twice the model's own time: the capture path is what is tested
    # the first scheduler is sequential (the reference every schedule's outputs are checked against)
    run = capturer([x], model, repeat=3, number=5, schedulers=list(dict.fromkeys(["sequential", scheduler])),
                   tolerance=-1.0, captures=3)
    kept = next(r for r in run.table if r["kept"])
    assert kept["schedule"] in ("sequential", scheduler)
    if run.schedule.num_streams > 1:
        assert len(kept["captures_ms"]) == 3 and len(kept["finalists"]) == 2  # the fastest two of a screening
        assert kept["latency_ms"] == min(kept["captures_ms"][i] for i in kept["finalists"]) and kept["compared_ms"] > 0
    else:
        assert "captures_ms" not in kept and "captures_s" not in run.phases
    with torch.no_grad():
        other = torch.randn_like(x)
        torch.testing.assert_close(run(x), model(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(run(other), model(other), rtol=1e-4, atol=1e-4)


def test_googlenet_s_chains_run_as_one_cudnn_call_each_in_both_precisions():
    """On the GPU, fused regions run each of googlenet's 57 convolution -> batch norm -> ReLU chains as one cuDNN
    call, the batch norm folded in float32: in float32 (TF32 off) the outputs equal the model's; in bfloat16 they
    are no further from the float32 model's than the model's own bfloat16 run is, give or take rounding."""
    import copy

    from opbench.runtime.fused import FusedBackend

    model, x = _googlenet()

    def greedy_output(backend):
        from opbench.runtime.executor import ParallelExecutor
        from opbench.schedule import get_scheduler

        return ParallelExecutor(backend, get_scheduler("greedy").schedule(backend.graph)).run()[0]

    def off(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            exact = model(x)
        backend = FusedBackend(model, [x], store=None)
        assert backend.conv_relu_chains == 57 and backend.schedule_meta()["conv_relu"] is True
        torch.testing.assert_close(greedy_output(backend), exact, rtol=1e-3, atol=1e-3)
        low, xb = copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16)
        with torch.no_grad():
            own = off(low(xb), exact)
        backend = FusedBackend(low, [xb], store=None)
        assert backend.conv_relu_chains == 57
        assert off(greedy_output(backend), exact) <= 1.5 * own + 1e-2, (off(greedy_output(backend), exact), own)
    finally:
        torch.backends.cudnn.allow_tf32 = True


def test_fused_regions_run_depthwise_convolutions_as_their_own_kernels_on_the_gpu():
    """On the GPU, fused regions built with ``depthwise="taps"`` unfold depthwise convolutions: equal to the
    model in float32 and bfloat16 (summed in float32); a replay runs no depthwise kernel of PyTorch's, and at least
    one kernel fewer per depthwise convolution than with ``depthwise="aten"`` (the convolution joins the batch norm
    and ReLU after it in one generated kernel)."""
    from opbench.runtime.executor import ParallelExecutor
    from opbench.runtime.fused import FusedBackend
    from opbench.schedule import get_scheduler

    torch.manual_seed(0)
    layers = []
    for cin, cout, k, stride in ((16, 16, 3, 1), (16, 32, 5, 2), (32, 32, 7, 1)):
        layers += [torch.nn.Conv2d(cin, cin, k, stride, k // 2, groups=cin, bias=False), torch.nn.BatchNorm2d(cin),
                   torch.nn.ReLU(), torch.nn.Conv2d(cin, cout, 1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU()]
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), *layers).cuda().eval()
    x = torch.randn(2, 3, 32, 32, device="cuda")

    def kernels(backend):
        run = ParallelExecutor(backend, get_scheduler("greedy").schedule(backend.graph))
        out = run.run()[0]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run.cuda_graph.replay()
            torch.cuda.synchronize()
        return out, [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    for dtype, tol in ((torch.float32, 1e-2), (torch.bfloat16, 5e-2)):
        low, xd = model.to(dtype), x.to(dtype)
        backend = FusedBackend(low, [xd], store=None, depthwise="taps")
        assert backend.depthwise_unfolded == 3 and backend.schedule_meta()["depthwise"] == "taps"
        out, taps = kernels(backend)
        with torch.no_grad():
            torch.testing.assert_close(out.float(), low(xd).float(), rtol=tol, atol=tol)
        aten = FusedBackend(low, [xd], store=None)  # the default
        assert aten.depthwise_unfolded == 0
        _, library = kernels(aten)
        assert taps and not any("depthwise" in n.lower() for n in taps), taps
        assert len(taps) <= len(library) - 3, (taps, library)
