"""Timing with warm-up, repeats, medians and spread."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ..utils import PERCENTILES


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
