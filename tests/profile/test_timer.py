"""Host-clock sampling: the number of calls and the seconds per call."""

from __future__ import annotations

import time

import pytest

from opbench.profile.timer import wall_samples


def test_wall_samples_counts_calls_and_divides_by_number():
    calls = []

    def fn() -> None:
        calls.append(1)
        time.sleep(0.002)

    samples = wall_samples(fn, repeat=3, number=2, warmup=1)
    assert len(calls) == 1 + 3 * 2 and len(samples) == 3
    assert all(0.002 <= s < 0.02 for s in samples)  # per call, not per sample of two calls


class _FakeModule:
    """Records how ``time_evaluator`` is asked to time."""

    def __init__(self) -> None:
        self.asked: dict = {}

    def __getitem__(self, name):
        return lambda *args: None

    def time_evaluator(self, name, device, **kwargs):
        self.asked = kwargs

        class _Result:
            results = [1e-3] * kwargs["repeat"]

        return lambda *args: _Result()


class _Cpu:
    def dlpack_device_type(self) -> int:
        return 1

    def sync(self) -> None:
        pass


def test_fractional_min_repeat_ms_rounds_up_not_to_zero():
    from opbench.profile.timer import TimingConfig, time_evaluator

    module = _FakeModule()
    time_evaluator(module, "f", _Cpu(), [], TimingConfig(repeat=3, min_repeat_ms=0.4))
    assert module.asked["min_repeat_ms"] == 1 and module.asked["f_preproc"] == ""


def test_cpu_flush_before_every_call():
    from opbench.profile.timer import TimingConfig, time_evaluator

    module = _FakeModule()
    timing = time_evaluator(module, "f", _Cpu(), [], TimingConfig(repeat=4, number=5, min_repeat_ms=10,
                                                                    flush_l2=True))
    # one call per sample, no growing of the sample: the flush (run before each sample) precedes every call
    assert module.asked == {"number": 1, "repeat": 4, "min_repeat_ms": 0,
                            "f_preproc": "cache_flush_cpu_non_first_arg"}
    assert timing.number == 1 and timing.columns()["number"] == 1


def test_energy_is_the_mean_power_over_the_window_times_the_median():
    """Two reads of a GPU's energy counter (millijoules, seconds) around the samples: the row's power is
    their difference over the window, its energy per call that power times the median latency."""
    from opbench.profile.timer import Timing, with_energy

    timing = with_energy(Timing([0.002, 0.001, 0.003], 4), (1_000_000.0, 10.0), (1_030_000.0, 10.1))
    assert abs(timing.power_w - 300.0) < 1e-6 and abs(timing.energy_window_s - 0.1) < 1e-12
    assert abs(timing.energy_j - 0.6) < 1e-9  # 300 W x 2 ms
    cols = timing.columns()
    assert cols["energy_j"] == timing.energy_j and cols["power_w"] == timing.power_w and cols["number"] == 4
    assert set(timing.energy_columns("vm_")) == {"vm_energy_j", "vm_power_w", "vm_energy_window_s"}


def test_no_energy_from_a_counter_that_did_not_move_or_was_not_read():
    """A window shorter than the counter's update interval reads no change: NULL, never a power of zero."""
    from opbench.profile.timer import Timing, with_energy

    plain = Timing([0.001])
    for before, after in [((5.0, 1.0), (5.0, 1.2)), (None, (6.0, 1.2)), ((5.0, 1.0), None), ((5.0, 1.0), (9.0, 1.0))]:
        got = with_energy(plain, before, after)
        assert got.power_w is None and got.energy_j is None and got.columns()["energy_window_s"] is None


def test_the_energy_meter_without_nvml_reads_nothing(monkeypatch):
    """Without nvidia-ml-py (or a driver) the meter is unavailable and every read is None: timing goes on."""
    import sys

    import pytest

    pytest.importorskip("torch")
    from opbench.profile.cuda import EnergyMeter

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    meter = EnergyMeter()
    assert not meter.available and meter.read() is None


def test_the_energy_meter_reads_nvmls_counter(monkeypatch):
    """With NVML, a read is the GPU's total energy counter (mJ) and the time it was read."""
    import sys
    import types

    import pytest

    pytest.importorskip("torch")
    from opbench.profile import cuda

    counter = iter([100.0, 2_000.0, 2_500.0])  # the meter's own check, then two reads
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetTotalEnergyConsumption=lambda h: next(counter))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(cuda, "nvml_handle", lambda nvml, index=None: "handle")
    meter = cuda.EnergyMeter()
    first, second = meter.read(), meter.read()
    assert meter.available and (first[0], second[0]) == (2_000.0, 2_500.0) and second[1] >= first[1]


class _FakeHost:
    """The host's clock, standing in for the module ``time`` in :mod:`opbench.profile.timer`: it moves only when
    a test says so, so that no assertion depends on how busy the machine is."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _fake_host(monkeypatch) -> _FakeHost:
    from opbench.profile import timer

    host = _FakeHost()
    monkeypatch.setattr(timer, "time", host)
    return host


def test_host_seconds_is_per_call_with_the_synchronisation_outside_the_clock(monkeypatch):
    """host_seconds times ``number`` calls between two synchronize() calls that the clock leaves out."""
    from opbench.profile.timer import host_seconds

    host, log = _fake_host(monkeypatch), []

    def fn() -> None:
        log.append("call")
        host.now += 0.002

    def synchronize() -> None:
        log.append("sync")
        host.now += 0.05

    seconds = host_seconds(fn, 3, synchronize)
    assert log == ["sync", "call", "call", "call", "sync"]
    assert seconds == pytest.approx(0.002)  # per call, and neither 50 ms wait inside


class _FakeGpu:
    """A stream on a fake clock: a spin of N cycles takes N / 1e9 s, each call of the timed function 1 ms; the
    host's clock (:class:`_FakeHost`) moves by the host time each call is given."""

    rate = 1e9

    def __init__(self, host: _FakeHost):
        self.now, self.spins, self.host = 0.0, [], host
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        self.Event = Event

    def sleep(self, cycles):
        self.spins.append(cycles / self.rate)
        self.now += cycles / self.rate

    def call(self, host_s):
        def fn():
            self.host.now += host_s  # the host's share
            self.now += 1e-3  # the GPU's
        return fn


def _fake_cuda(monkeypatch):
    import torch

    from opbench.profile import timer

    gpu = _FakeGpu(_fake_host(monkeypatch))
    monkeypatch.setattr(torch.cuda, "Event", gpu.Event)
    monkeypatch.setattr(torch.cuda, "_sleep", gpu.sleep, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timer, "_SLEEP_RATE", {0: gpu.rate})
    return gpu


def test_device_seconds_is_the_gpu_time_of_calls_queued_behind_a_long_enough_spin(monkeypatch):
    """The spin is sized from the host time a call (twice the calls' host time); the answer is the GPU time a
    call between the events around the calls, whatever the host took."""
    from opbench.profile.timer import device_seconds

    gpu = _fake_cuda(monkeypatch)
    seconds = device_seconds(gpu.call(2e-3), 5, host_s=2e-3)
    assert seconds == pytest.approx(1e-3) and gpu.spins == pytest.approx([2 * 5 * 2e-3])


def test_device_seconds_lengthens_a_short_spin_and_gives_up_at_its_limit(monkeypatch):
    """A spin shorter than the host took to queue the calls is tried again four times as long; at SPIN_LIMIT_S
    it gives up (None): those calls cannot be queued behind any spin."""
    from opbench.profile.timer import SPIN_LIMIT_S, device_seconds

    gpu = _fake_cuda(monkeypatch)
    assert device_seconds(gpu.call(3e-3), 5, host_s=1e-4) == pytest.approx(1e-3)  # 15 ms of host: 2, 8, 32 ms
    assert gpu.spins == pytest.approx([2e-3, 8e-3, 32e-3])
    gpu.spins.clear()
    assert device_seconds(gpu.call(0.03), 5, host_s=0.03) is None  # 150 ms of host: past the limit
    assert gpu.spins == pytest.approx([SPIN_LIMIT_S])
