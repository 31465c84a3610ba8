"""Timing with warm-up, repeats, medians and spread."""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ..errors import first_line
from ..utils import PERCENTILES

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TimingConfig:
    """How to time one kernel.

    Attributes
    ----------
    warmup:
        Untimed calls before measuring.
    repeat:
        Timed samples; the median is reported.
    number:
        Calls per sample (at least; grown until a sample lasts ``min_repeat_ms``).
    min_repeat_ms:
        Minimum duration of one sample.
    flush_l2:
        Flush caches before every timed call, the same for every variant compared. CPU: TVM's
        cache flush of all but the first argument before each sample, with one call per sample
        (``number=1``, no ``min_repeat_ms``); GPU: a write of twice the L2 size before each sample
        of one replay.
    """

    warmup: int = 1
    repeat: int = 10
    number: int = 1
    min_repeat_ms: float = 5.0
    flush_l2: bool = False


@dataclasses.dataclass
class Timing:
    """Samples in seconds (each the mean of ``number`` calls) and their statistics."""

    samples: list[float]
    number: int = 1
    #: the GPU's mean board power over the timed samples (W), from NVML's total energy counter read before
    #: and after them (:func:`with_energy`); None on a CPU, without NVML, or when the counter did not move
    power_w: float | None = None
    #: seconds between the two reads of the counter
    energy_window_s: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.samples) if len(self.samples) > 1 else 0.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile of the samples (linear interpolation; 50 is the median). With few
        samples the tails are the extremes: ``--repeat 100`` or more gives a p99 worth reading."""
        return percentile(self.samples, q)

    def percentiles(self, prefix: str = "latency") -> dict[str, float]:
        """``{prefix}_p10_s``, ``_p90_s``, ``_p99_s``: the dataset's percentile columns."""
        return {f"{prefix}_p{q}_s": self.percentile(q) for q in PERCENTILES}

    @property
    def energy_j(self) -> float | None:
        """Energy of one call (J): the mean power over the timed samples times the median latency."""
        return None if self.power_w is None else self.power_w * self.median

    def energy_columns(self, prefix: str = "") -> dict[str, float | None]:
        """``{prefix}energy_j``, ``{prefix}power_w``, ``{prefix}energy_window_s``: the dataset's energy columns."""
        return {f"{prefix}energy_j": self.energy_j, f"{prefix}power_w": self.power_w,
                f"{prefix}energy_window_s": self.energy_window_s}

    def columns(self) -> dict[str, Any]:
        """Dataset columns for this timing."""
        return {
            "latency_median_s": self.median,
            "latency_mean_s": self.mean,
            "latency_std_s": self.std,
            "latency_min_s": min(self.samples),
            "latency_max_s": max(self.samples),
            **self.percentiles(),
            "repeats": len(self.samples),
            "number": self.number,
            **self.energy_columns(),
        }


#: a counter read: (millijoules since the driver loaded, ``time.perf_counter()`` seconds)
EnergyRead = tuple[float, float]


def with_energy(timing: Timing, before: EnergyRead | None, after: EnergyRead | None) -> Timing:
    """``timing`` with the mean power between two reads of a GPU's energy counter (:class:`Timing`'s
    ``power_w`` and ``energy_window_s``). A counter that did not move (a window shorter than its update
    interval) or a missing read leaves them None: no row gets a power of zero."""
    if before is None or after is None or after[0] <= before[0] or after[1] <= before[1]:
        return timing
    window = after[1] - before[1]
    return dataclasses.replace(timing, power_w=(after[0] - before[0]) / 1e3 / window, energy_window_s=window)


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``samples`` (linear interpolation between the closest ranks)."""
    import numpy as np

    return float(np.percentile(np.asarray(samples, dtype=float), q))


def time_evaluator(module: Any, name: str, device: Any, args: Sequence[Any],
                   config: TimingConfig) -> Timing:
    """Time function ``name`` of a TVM module or Relax VM with TVM's ``time_evaluator``.

    ``config.warmup`` untimed calls come first (``time_evaluator`` adds one more of its own).
    TVM takes ``min_repeat_ms`` in whole milliseconds: a fraction is rounded up, never down to 0.
    """
    func = module.get_function(name, query_imports=True) if hasattr(module, "get_function") \
        else module[name]
    for _ in range(config.warmup):
        func(*args)
    device.sync()
    flush_cpu = config.flush_l2 and device.dlpack_device_type() % 128 == 1  # a CPU, here or over RPC
    number = 1 if flush_cpu else config.number
    evaluator = module.time_evaluator(
        name, device, number=number, repeat=config.repeat,
        min_repeat_ms=0 if flush_cpu else math.ceil(config.min_repeat_ms),
        f_preproc="cache_flush_cpu_non_first_arg" if flush_cpu else "",
    )
    result = evaluator(*args)
    return Timing([float(s) for s in result.results], number)


def cuda_event_samples(fn: Any, repeat: int, number: int, warmup: int = 3,
                       before_sample: Any = None) -> list[float]:
    """Seconds per call of ``fn``: ``repeat`` samples, each CUDA events around ``number`` calls.

    ``before_sample`` (e.g. an L2 flush) is enqueued before each sample's start event.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeat):
        if before_sample is not None:
            before_sample()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / number)
    return samples


def host_seconds(fn: Any, number: int, synchronize: Any = None) -> float:
    """Host seconds one call of ``fn`` takes to return, the device not waited for: ``number`` calls between two
    ``synchronize()`` calls (e.g. ``torch.cuda.synchronize``), which stay outside the clock.

    A call that only enqueues work (a CUDA Graph replay) returns in microseconds; one that does Python work
    on every call (``torch.compile``'s guards and CUDA Graph tree) takes a share of its own latency, and when
    that share nears the device's time the call is as fast as the host: a busy host then slows it. Keep
    ``number`` small enough that the calls' launches fit the device's queue (else the host waits on it).
    """
    if synchronize is not None:
        synchronize()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    seconds = (time.perf_counter() - start) / max(1, number)
    if synchronize is not None:
        synchronize()
    return seconds


#: GPU clock cycles of ``torch.cuda._sleep`` per second on each device, measured once (:func:`_sleep_cycles_per_s`)
_SLEEP_RATE: dict[int, float] = {}


def _sleep_cycles_per_s() -> float:
    """Cycles of ``torch.cuda._sleep`` a second on the current device (a 2 ms-ish spin timed by CUDA events)."""
    import torch

    device = torch.cuda.current_device()
    if device not in _SLEEP_RATE:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 4_000_000
        torch.cuda._sleep(cycles // 4)  # the first spin also loads the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_RATE[device] = cycles / max(1e-6, start.elapsed_time(end) / 1e3)
    return _SLEEP_RATE[device]


#: the longest spin :func:`device_seconds` enqueues (s): calls whose launches overflow the device's queue (an
#: eager model's hundreds of kernels a call) cannot all be queued behind a spin, however long
SPIN_LIMIT_S = 0.1


def device_seconds(fn: Any, number: int, host_s: float | None = None, tries: int = 3) -> float | None:
    """GPU seconds one call of ``fn`` keeps the current stream busy, whatever the host's speed; None where that
    cannot be told.

    The stream is held by a spin kernel (``torch.cuda._sleep``) long enough for the host to enqueue ``number``
    calls behind it; the CUDA events around those calls then see them run back to back, with no wait for the
    host in between (the blocking-kernel method of NVIDIA's nvbench). ``host_s`` (the host seconds a call, if
    known) sizes the spin. A try whose calls took the host longer to enqueue than the spin lasted (a call that
    waits for the GPU, or a host slower than expected) is repeated with a spin four times as long, up to
    :data:`SPIN_LIMIT_S`; after ``tries`` such tries, or one at that limit, the answer is None. A call's latency,
    back to back, is about the larger of this and its host time: a call is host-bound where its host time is the
    larger.
    """
    import torch

    try:
        rate = _sleep_cycles_per_s()
        before = torch.cuda.Event(enable_timing=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        spin_s = min(SPIN_LIMIT_S, max(2e-3, 2.0 * number * (host_s if host_s is not None else 1e-3)))
        for _ in range(max(1, tries)):
            torch.cuda.synchronize()
            before.record()
            torch.cuda._sleep(int(spin_s * rate))
            start.record()
            clock = time.perf_counter()
            for _ in range(number):
                fn()
            enqueued_s = time.perf_counter() - clock
            end.record()
            end.synchronize()
            if enqueued_s < 0.8 * before.elapsed_time(start) / 1e3:
                return start.elapsed_time(end) / 1e3 / max(1, number)
            if spin_s >= SPIN_LIMIT_S:
                break
            spin_s = min(SPIN_LIMIT_S, spin_s * 4)
    except (RuntimeError, AttributeError) as err:  # no _sleep in this torch, or a call that failed under it
        log.info("device time not measured: %s", first_line(err))
    return None


def wall_samples(fn: Any, repeat: int, number: int, warmup: int = 0) -> list[float]:
    """Seconds per call of ``fn`` on the host clock: ``repeat`` samples, each ``number`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return samples
