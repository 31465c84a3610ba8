"""--device N: the GPU index reaches every place that chose device 0 (TVM's device, the target's limits,
the device name, PyTorch's device, NVML by UUID), CUDA_VISIBLE_DEVICES is honoured, bad indices are
refused; a fake device list stands in for the GPUs."""

from __future__ import annotations

import types

import pytest

from opbench.errors import OpBenchError
from opbench.runtime import device


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four visible GPUs (CUDA_VISIBLE_DEVICES=3,5,GPU-aaaa,7); CUDA not initialised; index reset after."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,GPU-aaaa,7")
    monkeypatch.setattr(device, "_index", 0)
    monkeypatch.setattr(device, "cuda_initialised", lambda: False)
    yield


def test_before_cuda_starts_the_process_is_narrowed_to_its_gpu(fake_gpus, monkeypatch):
    device.select_gpu(1)
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and device.gpu_index() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,GPU-aaaa,7")
    assert device.child_env(2)["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa"


@pytest.mark.parametrize("index", [4, 9])
def test_an_index_beyond_the_visible_gpus_is_one_line(fake_gpus, index):
    with pytest.raises(OpBenchError, match=rf"--device {index}: this process sees 4 GPUs "
                                           r"\(CUDA_VISIBLE_DEVICES=3,5,GPU-aaaa,7\) \(accepted: 0 to 3\)"):
        device.select_gpu(index)


def test_after_cuda_started_every_gpu_path_uses_the_index(fake_gpus, monkeypatch):
    """Every place that chose device 0 asks gpu_index(): TVM's device and limits, the device name,
    the device properties PyTorch gives, the green contexts' device."""
    import tvm

    from opbench.profile import env
    from opbench.runtime import green, target

    set_to = []
    fake_cuda = types.SimpleNamespace(is_initialized=lambda: True, set_device=set_to.append,
                                      is_available=lambda: True,
                                      get_device_properties=lambda i: types.SimpleNamespace(
                                          multi_processor_count=100 + i, uuid=f"uuid-{i}"))
    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(cuda=fake_cuda))
    monkeypatch.setattr(device, "cuda_initialised", lambda: True)
    device.select_gpu(2)
    assert device.gpu_index() == 2 and set_to == [2]
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert target.device_for(cuda).index == 2
    asked = []
    monkeypatch.setattr(tvm, "cuda", lambda i=0: asked.append(i) or types.SimpleNamespace(
        device_name=f"GPU{i}", exist=False))
    assert env.device_name(cuda) == "GPU2" and asked == [2]
    target.tuning_target(cuda)
    assert asked[-1] == 2
    assert green.sm_count() == 102
    # NVML numbers GPUs physically: the handle is found by the UUID CUDA reports for the chosen GPU
    nvml = types.SimpleNamespace(nvmlDeviceGetHandleByUUID=lambda u: ("uuid", u),
                                 nvmlDeviceGetHandleByIndex=lambda i: ("index", i))
    assert device.nvml_handle(nvml) == ("uuid", "GPU-uuid-2")
    # the profiler's PyTorch device, flush buffer and streams are on the chosen GPU, and its
    # device(target) method (the measurement key's fingerprint) is still a method
    from opbench.profile.cuda import CudaProfiler

    made = []
    fake_cuda.Stream = lambda device: made.append(("stream", device))
    fake_cuda.get_device_properties = lambda d: types.SimpleNamespace(L2_cache_size=1 << 20, device=d, uuid="u")
    fake_torch = types.SimpleNamespace(cuda=fake_cuda, int8="int8", device=lambda kind, i: (kind, i),
                                       empty=lambda n, dtype, device: made.append(("buffer", device)))
    monkeypatch.setitem(__import__("sys").modules, "torch", fake_torch)
    profiler = CudaProfiler(corun_k=2)
    assert profiler.gpu == ("cuda", 2) and profiler.props.device == ("cuda", 2)
    assert made == [("buffer", ("cuda", 2)), ("stream", ("cuda", 2)), ("stream", ("cuda", 2))]
    assert profiler.device(cuda) is None


def test_without_torch_nvml_uses_the_visible_item(fake_gpus, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    nvml = types.SimpleNamespace(nvmlDeviceGetHandleByUUID=lambda u: ("uuid", u),
                                 nvmlDeviceGetHandleByIndex=lambda i: ("index", i))
    assert device.nvml_handle(nvml, 1) == ("index", 5)
    assert device.nvml_handle(nvml, 2) == ("uuid", "GPU-aaaa")


@pytest.mark.parametrize("text", ["", "a", "0,-1", "1,,2"])
def test_bad_device_lists(text):
    with pytest.raises(OpBenchError, match="accepted: GPU indices, comma-separated"):
        device.parse_devices(text)
    assert device.parse_devices("1,0,1") == [1, 0]


def test_cli_refuses_a_gpu_that_is_not_there(tmp_path, monkeypatch):
    from helpers import run

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    proc = run("--modelsource", "simple", "--modelname", "matmul:n=16", "--device", "3",
               "--dataset", str(tmp_path / "d.sqlite"))
    assert proc.returncode == 2 and "--device 3: this process sees 2 GPUs" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "d.sqlite").exists()
