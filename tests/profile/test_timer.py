"""Host-clock sampling: the number of calls and the seconds per call."""

from __future__ import annotations

import time

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
